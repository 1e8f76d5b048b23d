"""A world that is steered: a camera over a large static procedural map, moved by keys.

The map wraps at its edges (a torus), so any path can come back to where it started. The camera moves by
whole patches (4 pixels, one token of the demo model) per frame: up, down, left, right or not at all. The next
view is the previous one shifted by the action, plus a strip of map that is new or was seen before.

Chosen to be learnable by a 1 M-parameter model on two CPU cores: whole-patch shifts (the carried part of a view
is an exact token copy of the previous frame), a smooth low-contrast ground with distinct saturated landmarks (a
wrong shift shows), and the camera's map position handed to the model with each action (``Track``), so that a
place seen before can in principle be recalled from memory rather than re-invented.

Everything is a pure function of a seed. Frames are float32 in [-1, 1], channel-first (``[T, 3, H, W]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

VIEW_SIZE = 24  # the demo model's frame: 6 x 6 patches of 4 x 4 pixels
STEP = 4  # pixels per move: one patch
MAP_SIZE = 96  # pixels per side (24 patches): 16 views' worth of ground
ACTIONS = ("none", "up", "down", "left", "right")
MOVES = {"none": (0, 0), "up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}  # (dx, dy) in patches
LANDMARK_COLOURS = (
    (0.92, 0.12, 0.12), (0.10, 0.78, 0.18), (0.12, 0.25, 0.95), (0.95, 0.85, 0.08),
    (0.88, 0.12, 0.85), (0.08, 0.85, 0.90), (0.98, 0.98, 0.98), (0.95, 0.50, 0.05),
)
LANDMARK_SHAPES = ("circle", "square", "diamond", "ring", "cross", "triangle")
LANDMARK_SPACING = 9.0  # least distance between landmark centres, pixels (wrap-aware)
GROUND_CONTRAST = 0.12  # peak deviation of the ground from its base tone, in [0, 1] units


def action_index(name: str) -> int:
    if name not in ACTIONS:
        raise ValueError(f"unknown action {name!r}; expected one of {', '.join(ACTIONS)}")
    return ACTIONS.index(name)


def _inside(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: float) -> torch.Tensor:
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return torch.maximum(dx.abs(), dy.abs()) <= 0.8 * r
    if shape == "diamond":
        return dx.abs() + dy.abs() <= 1.1 * r
    if shape == "ring":
        d = (dx * dx + dy * dy).sqrt()
        return (d <= r) & (d >= 0.5 * r)
    if shape == "cross":
        return ((dx.abs() <= 0.35 * r) | (dy.abs() <= 0.35 * r)) & (torch.maximum(dx.abs(), dy.abs()) <= r)
    if shape == "triangle":
        return (dy >= -r) & (dy <= 0.5 * r) & (dx.abs() <= (dy + r) / math.sqrt(3))
    raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(LANDMARK_SHAPES)}")


@dataclass(frozen=True)
class Landmark:
    shape: str
    colour: tuple
    x: float  # centre on the map, pixels
    y: float
    radius: float


def _ground(rng: np.random.Generator, size: int) -> torch.Tensor:
    """A smooth periodic ground ``[3, N, N]`` in [0, 1]: a few low integer frequencies, so it wraps seamlessly."""
    u = np.arange(size) / size
    xx, yy = np.meshgrid(u, u, indexing="xy")
    lum = np.zeros((size, size))
    for kx in range(0, 3):
        for ky in range(-2, 3):
            if kx == 0 and ky <= 0:
                continue
            amp = rng.normal() / (kx * kx + ky * ky)
            lum += amp * np.cos(2 * math.pi * (kx * xx + ky * yy) + rng.uniform(0, 2 * math.pi))
    lum /= np.abs(lum).max()
    tone = np.array([0.45, 0.47, 0.40]) + rng.uniform(-0.05, 0.05, 3)
    tint = np.array([0.8, 1.0, 0.7])  # greener in the bright parts, like grass over soil
    rgb = tone[:, None, None] + GROUND_CONTRAST * lum[None] * tint[:, None, None]
    return torch.from_numpy(rgb.clip(0, 1)).float()


@dataclass(frozen=True)
class WorldMap:
    seed: int
    size: int
    landmarks: tuple

    def image(self) -> torch.Tensor:
        """The whole map ``[3, N, N]`` in [-1, 1] (cached per instance: a map is static)."""
        # Keyed by the whole map (frozen, so hashable): two maps of one seed and size can hold other landmarks.
        cached = _MAP_CACHE.get(self)
        if cached is None:
            cached = _render_map(self)
            if len(_MAP_CACHE) > 64:
                _MAP_CACHE.clear()
            _MAP_CACHE[self] = cached
        return cached

    def view(self, x: int, y: int, size: int = VIEW_SIZE) -> torch.Tensor:
        """The ``[3, size, size]`` view whose top-left corner is at map pixel (x, y), wrapping."""
        img = self.image()
        rows = torch.arange(y, y + size) % self.size
        cols = torch.arange(x, x + size) % self.size
        return img[:, rows][:, :, cols]


_MAP_CACHE: dict = {}


def _render_map(world: WorldMap, supersample: int = 4) -> torch.Tensor:
    n = world.size
    rng = np.random.default_rng(world.seed)
    img = _ground(rng, n)
    for lm in world.landmarks:
        # Only the pixels within a landmark's reach (every shape lies inside its radius; one pixel more for the
        # anti-aliased edge) can change: they are drawn, the rest stays exactly as it was. Wrapped, so a landmark
        # across an edge is drawn on both sides.
        reach = int(math.ceil(lm.radius)) + 1
        cols = torch.arange(int(math.floor(lm.x)) - reach, int(math.floor(lm.x)) + reach + 1) % n
        rows = torch.arange(int(math.floor(lm.y)) - reach, int(math.floor(lm.y)) + reach + 1) % n
        sub = torch.arange(supersample, dtype=torch.float64)
        fine_x = (cols[:, None].double() + (sub + 0.5) / supersample).reshape(-1)
        fine_y = (rows[:, None].double() + (sub + 0.5) / supersample).reshape(-1)
        dx = torch.remainder(fine_x - lm.x + n / 2, n) - n / 2
        dy = torch.remainder(fine_y - lm.y + n / 2, n) - n / 2
        inside = _inside(lm.shape, dx[None, :], dy[:, None], lm.radius).float()
        cover = torch.nn.functional.avg_pool2d(inside[None, None], supersample)[0]
        colour = torch.tensor(lm.colour, dtype=torch.float32)[:, None, None]
        patch = img[:, rows][:, :, cols]
        img[:, rows[:, None], cols[None, :]] = patch * (1 - cover) + colour * cover
    return img * 2 - 1


def make_map(seed: int, size: int = MAP_SIZE, landmarks: int | None = None) -> WorldMap:
    """A map from a seed: smooth ground and 16-24 landmarks (distinct shape-colour pairs where possible),
    at least 9 pixels apart (wrap-aware), so every few views hold something recognisable."""
    if size % STEP or size < VIEW_SIZE:
        raise ValueError(f"map size {size} must be a multiple of {STEP} and at least {VIEW_SIZE}")
    rng = np.random.default_rng(seed)
    count = int(landmarks if landmarks is not None else rng.integers(16, 25)) * size * size // (MAP_SIZE * MAP_SIZE)
    _ground(rng, 4)  # the ground takes the generator's first draws (as many at any size), the landmarks the rest
    placed: list[Landmark] = []
    kinds = [(s, c) for s in LANDMARK_SHAPES for c in LANDMARK_COLOURS]
    order = rng.permutation(len(kinds))
    tries = 0
    while len(placed) < count and tries < 2000:
        tries += 1
        x, y = rng.uniform(0, size, 2)
        if any(wrapped_distance(x, y, p.x, p.y, size) < LANDMARK_SPACING for p in placed):
            continue
        shape, colour = kinds[order[len(placed) % len(kinds)]]
        placed.append(Landmark(shape, colour, float(x), float(y), float(rng.uniform(2.5, 4.0))))
    return WorldMap(seed=seed, size=size, landmarks=tuple(placed))


def wrapped_distance(x0, y0, x1, y1, n) -> float:
    dx = abs(x0 - x1) % n
    dy = abs(y0 - y1) % n
    return math.hypot(min(dx, n - dx), min(dy, n - dy))


@dataclass
class Track:
    """A camera path: per frame the action that led to it and the camera's map position (top-left, patches).

    Frame 0 has the action ``none``; ``positions[t] = positions[t - 1] + move(actions[t])`` (mod the map)."""
    actions: torch.Tensor  # [T] int64 action indices
    positions: torch.Tensor  # [T, 2] int64 (x, y) in patches
    map_patches: int

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def extend(self, action: str) -> None:
        """Append one frame (the live player steers this way)."""
        a = action_index(action)
        dx, dy = MOVES[action]
        last = self.positions[-1]
        step = torch.tensor([[(int(last[0]) + dx) % self.map_patches, (int(last[1]) + dy) % self.map_patches]])
        self.actions = torch.cat([self.actions, torch.tensor([a])])
        self.positions = torch.cat([self.positions, step])

    def names(self) -> list[str]:
        return [ACTIONS[int(a)] for a in self.actions]


def track_from_actions(actions, start=(0, 0), map_patches: int = MAP_SIZE // STEP) -> Track:
    """``actions``: names (or indices) per frame after the first; the track has ``len(actions) + 1`` frames."""
    names = [ACTIONS[a] if isinstance(a, int) else a for a in actions]
    track = Track(torch.zeros(1, dtype=torch.int64), torch.tensor([[start[0] % map_patches, start[1] % map_patches]]),
                  map_patches)
    for name in names:
        track.extend(name)
    return track


def render_track(world: WorldMap, track: Track) -> torch.Tensor:
    """The true views ``[T, 3, VIEW, VIEW]`` along a track."""
    return torch.stack([world.view(int(p[0]) * STEP, int(p[1]) * STEP) for p in track.positions])


def random_actions(rng: np.random.Generator, count: int, keep: float = 0.7) -> list[str]:
    """Training paths: each frame keeps the previous action with probability ``keep``, else draws afresh
    (``none`` as likely as each direction), so runs of motion and stops both occur."""
    out, current = [], ACTIONS[int(rng.integers(len(ACTIONS)))]
    for _ in range(count):
        if rng.random() >= keep:
            current = ACTIONS[int(rng.integers(len(ACTIONS)))]
        out.append(current)
    return out


def scripted_path(frames: int, side: int = 8, pause: int = 2) -> list[str]:
    """Out, around and back: a square loop of ``side`` patches (right, down, left, up) with short pauses at the
    corners, repeated to fill ``frames`` actions; every loop ends where it started, so views come back."""
    loop = []
    for move in ("right", "down", "left", "up"):
        loop += [move] * side + ["none"] * pause
    return [loop[i % len(loop)] for i in range(frames)]


def revisit_path(frames: int, away: int) -> list[str]:
    """Leave a view and return after ``2 * away + 2`` frames: right ``away`` patches, down one, back left, up
    one, repeated. With ``away`` beyond the view (6 patches) the start view leaves the screen entirely."""
    loop = ["right"] * away + ["down"] + ["left"] * away + ["up"]
    return [loop[i % len(loop)] for i in range(frames)]


def back_and_forth_actions(rng: np.random.Generator, count: int) -> list[str]:
    """Training paths that return: out ``2..9`` patches along one axis, a short pause, back the same way, and again
    (a new reach each time), so the strips the way back brings in were seen a few to twenty frames before."""
    out: list[str] = []
    axis = ("left", "right") if rng.random() < 0.5 else ("up", "down")
    go, back = axis if rng.random() < 0.5 else axis[::-1]
    while len(out) < count:
        reach = int(rng.integers(2, 10))
        out += [go] * reach + ["none"] * int(rng.integers(0, 3)) + [back] * reach + ["none"] * int(rng.integers(0, 2))
    return out[:count]


def loop_actions(rng: np.random.Generator, count: int) -> list[str]:
    """Training paths that return: a rectangle of ``2..5`` patches a side, either way round, with pauses of up to
    one frame at its corners, repeated."""
    w, h = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    sides = [("right", w), ("down", h), ("left", w), ("up", h)]
    if rng.random() < 0.5:  # the other way round
        opposite = {"right": "left", "left": "right", "up": "down", "down": "up"}
        sides = [(opposite[m], n) for m, n in sides[::-1]]
    turn = int(rng.integers(4))
    sides = sides[turn:] + sides[:turn]
    pause = int(rng.integers(0, 2))
    loop = [m for move, n in sides for m in [move] * n + ["none"] * pause]
    return [loop[i % len(loop)] for i in range(count)]
