"""A procedural video world: one to three flat sprites moving and bouncing over a static textured background.

Everything is a pure function of a seed. Frames are float32 tensors in [-1, 1], channel-first (``[T, 3, H, W]``).
Sprite trajectories are closed-form (a triangle wave per axis), so any frame can be rendered without stepping
through the earlier ones, and sprites never leave the frame. The background is low-contrast and unsaturated so
that the saturated palette colours stand out (the evaluator classifies pixels by colour) and stays identical in
every frame (the KV-cache compression has something to merge; the evaluator has a ground truth to compare to).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...fastar_core.families.demo.text import PAD, UNK, split_words

FRAME_SIZE = 24  # 36 tokens per frame with 4x4 patches: small enough to train and roll out on a CPU
CHANNELS = 3
SUPERSAMPLE = 4  # anti-aliased edges, so sub-pixel motion shows in the pixels

# Saturated colours in [0, 1] RGB, far from the muted background tones and from each other.
PALETTE = {
    "red": (0.92, 0.12, 0.12),
    "green": (0.10, 0.78, 0.18),
    "blue": (0.12, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.08),
    "magenta": (0.88, 0.12, 0.85),
    "cyan": (0.08, 0.85, 0.90),
    "white": (0.98, 0.98, 0.98),
}
SHAPES = ("circle", "square", "triangle", "diamond")
# Muted base tones of the background (grey-green, sand, slate, clay, stone).
BACKGROUND_TONES = ((0.42, 0.46, 0.40), (0.52, 0.48, 0.40), (0.38, 0.42, 0.48), (0.50, 0.42, 0.40), (0.45, 0.45, 0.45))
BACKGROUND_CONTRAST = 0.16  # peak luminance deviation of the texture, in [0, 1] units
SIZE_WORDS = {"small": (0.10, 0.12), "big": (0.15, 0.18)}  # sprite radius ranges, in frame widths
SPEED_WORDS = {"slowly": (0.015, 0.027), "quickly": (0.033, 0.05)}  # frame widths per frame
PROMPT_HORIZON = 12  # a prompt says "bounces" when a sprite hits an edge within this many frames


def palette_tensor() -> torch.Tensor:
    """``[K, 3]`` palette colours in [-1, 1], in ``PALETTE`` order."""
    return torch.tensor(list(PALETTE.values()), dtype=torch.float32) * 2 - 1


@dataclass(frozen=True)
class Sprite:
    shape: str
    colour: str
    size: str
    speed: str
    radius: float
    x0: float  # centre at frame 0, pixels
    y0: float
    vx: float  # pixels per frame
    vy: float

    def centre(self, t: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Centre at (float) frames ``t``, bouncing elastically off the frame edges."""
        return _bounce(self.x0 + self.vx * t, self.radius, size), _bounce(self.y0 + self.vy * t, self.radius, size)

    def bounces_within(self, frames: int, size: int) -> bool:
        t = torch.arange(frames, dtype=torch.float64)
        x = self.x0 + self.vx * t
        y = self.y0 + self.vy * t
        lo, hi = self.radius, size - self.radius
        return bool(((x < lo) | (x > hi) | (y < lo) | (y > hi)).any())

    def motion_words(self, size: int) -> str:
        if self.bounces_within(PROMPT_HORIZON, size):
            return f"{self.speed} bounces"
        if abs(self.vx) > 2 * abs(self.vy):
            return f"{self.speed} moves {'right' if self.vx > 0 else 'left'}"
        if abs(self.vy) > 2 * abs(self.vx):
            return f"{self.speed} moves {'down' if self.vy > 0 else 'up'}"
        return f"{self.speed} moves diagonally"

    def phrase(self, size: int) -> str:
        return f"a {self.size} {self.colour} {self.shape} {self.motion_words(size)}"


def _bounce(p: torch.Tensor, radius: float, size: int) -> torch.Tensor:
    """Reflect an unbounded coordinate into [radius, size - radius] (a triangle wave)."""
    span = size - 2 * radius
    u = torch.remainder(p - radius, 2 * span)
    return radius + torch.where(u <= span, u, 2 * span - u)


def _inside(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: float) -> torch.Tensor:
    """Boolean mask of points (offsets from the centre, y pointing down) inside a shape of radius ``r``."""
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return torch.maximum(dx.abs(), dy.abs()) <= 0.85 * r
    if shape == "diamond":
        return dx.abs() + dy.abs() <= 1.2 * r
    if shape == "triangle":  # pointing up, apex at -r, base at +r/2 (equilateral)
        return (dy >= -r) & (dy <= 0.5 * r) & (dx.abs() <= (dy + r) / math.sqrt(3))
    raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")


@dataclass(frozen=True)
class Scene:
    seed: int
    size: int
    tone: tuple
    background_seed: int
    sprites: tuple

    def background(self) -> torch.Tensor:
        """The clean static background ``[3, H, W]`` in [-1, 1]."""
        return _background(self.background_seed, self.tone, self.size)

    def render(self, num_frames: int, start: int = 0) -> torch.Tensor:
        """Frames ``start .. start + num_frames - 1`` as ``[T, 3, H, W]`` float32 in [-1, 1]."""
        s, n = self.size, self.size * SUPERSAMPLE
        frames = self.background()[None].repeat(num_frames, 1, 1, 1)
        t = torch.arange(start, start + num_frames, dtype=torch.float64)
        grid = (torch.arange(n, dtype=torch.float64) + 0.5) / SUPERSAMPLE  # sample points in pixel units
        for sprite in self.sprites:  # later sprites are drawn on top
            cx, cy = sprite.centre(t, s)
            dx = grid[None, None, :] - cx[:, None, None]
            dy = grid[None, :, None] - cy[:, None, None]
            fine = _inside(sprite.shape, dx, dy, sprite.radius).float()
            coverage = torch.nn.functional.avg_pool2d(fine[:, None], SUPERSAMPLE)  # [T, 1, H, W]
            colour = torch.tensor(PALETTE[sprite.colour], dtype=torch.float32)[None, :, None, None] * 2 - 1
            frames = frames * (1 - coverage) + colour * coverage
        return frames

    def sprite_areas(self) -> dict:
        """Each sprite's area in pixels when nothing covers it (its anti-aliased coverage summed)."""
        n = self.size * SUPERSAMPLE
        grid = (torch.arange(n, dtype=torch.float64) + 0.5) / SUPERSAMPLE
        dx, dy = grid[None, :] - self.size / 2, grid[:, None] - self.size / 2
        return {sp.colour: float(_inside(sp.shape, dx, dy, sp.radius).sum()) / SUPERSAMPLE**2 for sp in self.sprites}

    def prompt(self, long: bool = False) -> str:
        """What happens, in the demo vocabulary; the long form pads it with filler words (prunable tokens)."""
        phrases = [sp.phrase(self.size) for sp in self.sprites]
        if not long:
            return " , ".join(phrases)
        rng = np.random.default_rng(self.seed + 7919)
        joined = " , while ".join(phrases)
        opening = FILLER_OPENINGS[rng.integers(len(FILLER_OPENINGS))]
        closing = FILLER_CLOSINGS[rng.integers(len(FILLER_CLOSINGS))]
        return f"{opening} {joined} {closing}"

    @property
    def colours(self) -> list[str]:
        return [sp.colour for sp in self.sprites]


FILLER_OPENINGS = (
    "in this short video clip , on a calm and quiet textured background ,",
    "the scene shows a still textured background , and in the middle of it all",
    "we can see a soft textured background where",
)
FILLER_CLOSINGS = (
    ", and nothing else happens in the whole scene .",
    ", all over the same quiet background .",
    ", and the background itself stays perfectly still .",
)


_CORE_WORDS = ("a", "the", ",", ".", "moves", "bounces", "left", "right", "up", "down", "diagonally", "while")


def default_vocabulary() -> list[str]:
    """The text encoder's vocabulary: special tokens first (padding is id 0), then every word the scenes' prompts
    use, sorted."""
    words = set(_CORE_WORDS) | set(PALETTE) | set(SHAPES) | set(SIZE_WORDS) | set(SPEED_WORDS)
    for sentence in FILLER_OPENINGS + FILLER_CLOSINGS:
        words |= set(split_words(sentence))
    return [PAD, UNK, *sorted(words)]


def _background(seed: int, tone: tuple, size: int) -> torch.Tensor:
    """A smooth texture: low-frequency value noise (bicubic from a coarse grid) plus faint diagonal stripes."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, 1, 5, 5, generator=g, dtype=torch.float64)
    lum = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=True)[0, 0]
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float64), torch.arange(size, dtype=torch.float64),
                            indexing="ij")
    angle = float(torch.rand((), generator=g, dtype=torch.float64)) * math.pi
    stripes = torch.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / 9.0)
    lum = lum / lum.abs().max() * 0.75 + 0.25 * stripes
    tint = (torch.rand(3, generator=g, dtype=torch.float64) - 0.5) * 0.04  # a faint per-channel shift
    rgb = torch.tensor(tone, dtype=torch.float64)[:, None, None] + tint[:, None, None] + BACKGROUND_CONTRAST * lum
    return (rgb.clamp(0, 1) * 2 - 1).float()


def make_scene(seed: int, size: int = FRAME_SIZE, num_sprites: int | None = None) -> Scene:
    """A random scene from a seed: background, 1-3 sprites of distinct colours, starting fully inside the frame."""
    rng = np.random.default_rng(seed)
    n = int(num_sprites if num_sprites is not None else rng.integers(1, 4))
    colours = rng.choice(list(PALETTE), size=n, replace=False)
    sprites = []
    for colour in colours:
        size_word = str(rng.choice(list(SIZE_WORDS)))
        speed_word = str(rng.choice(list(SPEED_WORDS)))
        radius = float(rng.uniform(*SIZE_WORDS[size_word])) * size
        speed = float(rng.uniform(*SPEED_WORDS[speed_word])) * size
        angle = float(rng.uniform(0, 2 * math.pi))
        sprites.append(Sprite(
            shape=str(rng.choice(SHAPES)), colour=str(colour), size=size_word, speed=speed_word, radius=radius,
            x0=float(rng.uniform(radius, size - radius)), y0=float(rng.uniform(radius, size - radius)),
            vx=speed * math.cos(angle), vy=speed * math.sin(angle),
        ))
    tone = BACKGROUND_TONES[int(rng.integers(len(BACKGROUND_TONES)))]
    return Scene(seed=seed, size=size, tone=tone, background_seed=int(rng.integers(2**31)), sprites=tuple(sprites))


def render_clip(seed: int, num_frames: int, start: int = 0, size: int = FRAME_SIZE) -> tuple[torch.Tensor, Scene]:
    """Frames ``[T, 3, H, W]`` of the scene of ``seed`` and the scene itself."""
    scene = make_scene(seed, size)
    return scene.render(num_frames, start), scene
