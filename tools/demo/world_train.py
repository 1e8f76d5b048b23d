"""Training the steered world model: ``fastar train-demo --world steer``.

The sprite trainer's recipe (teacher forcing through the engine's own block code, flow matching with per-chunk
noise levels on the sampler's sigmas, corrupted and one-step self-predicted context, AdamW, EMA, resumable
checkpoints) with the steered world's clips: a random map, a random start and a random key sequence per clip,
each frame conditioned on its key, its offset from the chunk's reference frame and the camera position
(``actions.ActionEncoder``). The prompt is one fixed sentence: the world is told by its keys, not by words.

The model is trained with one-frame chunks and reads, beside each noisy frame, its reference frame (the context
frame before it: corrupted or the model's own prediction like the rest of the context) moved by the key
(``actions.moved_reference``), exactly what the sampler's ``ActionRunner`` hands it while rolling out. A clean frame
is read as it is: no reference, no key (what the cache keeps of a place then depends on the place's content, not on
how the camera came there). Rotary positions are places on the map, time dropped (``map_rope.py``).

Paths: today's random key runs, and paths that return, so that reading a place back from the cache pays:
back-and-forth and small loops inside a clip, and long returns (a few frames seen 30 to 150 frames before the
camera comes back to them; with time dropped, the model sees them as the cache holds them, without the frames
between).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...fastar_core.families.demo.actions import (
    REFERENCE_INPUT,
    STATE_PREFIX,
    ActionEncoder,
    added_to_time_embedding,
    batch_tracks,
    moved_reference,
    reference_frames,
)
from ...fastar_core.families.demo.map_rope import POSITIONS, MapRoPE, map_positions
from ...fastar_core.families.demo.steer_world import (
    MAP_SIZE,
    STEP,
    VIEW_SIZE,
    Track,
    back_and_forth_actions,
    loop_actions,
    make_map,
    random_actions,
    render_track,
    track_from_actions,
)
from ...fastar_core.families.demo.weights_file import WORLD_KIND
from ...fastar_core.model.rope import apply_rope
from .data import clip_seed, step_generator
from .settings import FRAME_HW, WORLD_FRAMES_PER_BLOCK, WORLD_MODEL_CONFIG, WORLD_SAMPLER
from .teacher_forcing import TeacherForcingAttention, TeacherForcingForward, split_frames
from .train import Trainer, TrainRecipe

WORLD_PROMPT = "a calm and quiet textured background"


# Share of training clips per kind of path. Today's random runs rarely come back; the others do.
PATH_KINDS = {"random": 0.25, "back-and-forth": 0.25, "loop": 0.25, "long-return": 0.25}
LONG_RETURN_GAP = (30, 150)  # frames between the remembered frames and the return, as a real path would take


@dataclass
class ClipPath:
    track: Track
    kind: str
    jump: int | None = None  # long return: the first frame after the frames not shown (its reference is not shown)


def training_path(rng: np.random.Generator, frames: int, patches: int) -> ClipPath:
    """One clip's camera path, of a kind drawn by ``PATH_KINDS``."""
    kinds = list(PATH_KINDS)
    kind = kinds[int(rng.choice(len(kinds), p=list(PATH_KINDS.values())))]
    start = (int(rng.integers(patches)), int(rng.integers(patches)))
    if kind == "random":
        return ClipPath(track_from_actions(random_actions(rng, frames - 1), start, patches), kind)
    if kind == "back-and-forth":
        return ClipPath(track_from_actions(back_and_forth_actions(rng, frames - 1), start, patches), kind)
    if kind == "loop":
        return ClipPath(track_from_actions(loop_actions(rng, frames - 1), start, patches), kind)
    # A long return: a few frames of a random run, then (30-150 frames later, not shown) the camera 4-9 patches
    # away along one axis, heading back over the remembered place and wandering on.
    memory = min(int(rng.integers(3, 7)), frames // 2)  # short clips (tests) keep half their frames for the return
    early = track_from_actions(random_actions(rng, memory - 1), start, patches)
    axis, sign, reach = int(rng.integers(2)), (1 if rng.random() < 0.5 else -1), int(rng.integers(4, 10))
    away = [0, 0]
    away[axis], away[1 - axis] = sign * reach, int(rng.integers(-2, 3))
    end = early.positions[-1].tolist()
    late_start = ((end[0] + away[0]) % patches, (end[1] + away[1]) % patches)
    toward = (("left", "right"), ("up", "down"))[axis][0 if sign > 0 else 1]
    late_frames = frames - memory
    heading = [toward] * min(reach, late_frames - 1)
    late = track_from_actions(heading + random_actions(rng, late_frames - 1 - len(heading)), late_start, patches)
    track = Track(torch.cat([early.actions, late.actions]), torch.cat([early.positions, late.positions]), patches)
    return ClipPath(track, kind, jump=memory)


@dataclass
class WorldBatch:
    video: torch.Tensor  # [B, 3, T, H, W]
    actions: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T, 2]
    jumps: torch.Tensor  # [B, T] bool: frames whose frame before is not the one before them on the path
    kinds: list
    landmarks: torch.Tensor | None = None  # [B, 1, T, H, W] bool: pixels a landmark covers (when asked for)


def landmark_pixels(world, track, video: torch.Tensor) -> torch.Tensor:
    """``[T, 1, H, W]``: the pixels of ``video`` (``world`` along ``track``) a landmark covers, anti-aliased edges
    included: those the bare ground would show otherwise."""
    ground = render_track(dataclasses.replace(world, landmarks=()), track)
    return (video - ground).abs().amax(dim=1, keepdim=True) > LANDMARK_EDGE


def world_batch(seed: int, step: int, batch: int, frames: int, map_size: int = MAP_SIZE,
                landmarks: bool = False) -> WorldBatch:
    """``batch`` training clips of step ``step``; with ``landmarks`` each clip's landmark pixels too."""
    videos, paths, marks = [], [], []
    for i in range(batch):
        s = clip_seed(seed, step, i)
        world = make_map(s, map_size)
        rng = np.random.default_rng(s + 17)
        path = training_path(rng, frames, map_size // STEP)
        paths.append(path)
        video = render_track(world, path.track)
        videos.append(video.permute(1, 0, 2, 3))
        if landmarks:
            marks.append(landmark_pixels(world, path.track, video).permute(1, 0, 2, 3))
    actions, positions = batch_tracks([p.track for p in paths])
    jumps = torch.zeros(batch, frames, dtype=torch.bool)
    for i, p in enumerate(paths):
        if p.jump is not None:
            jumps[i, p.jump] = True
    return WorldBatch(torch.stack(videos), actions, positions, jumps, [p.kind for p in paths],
                      torch.stack(marks) if landmarks else None)


# The part of a frame still in view is handed to the model (its moved reference) and costs almost nothing to
# predict, yet it is five sixths of a frame after a move, so the strip a move brings in, the only part the model
# must invent, gets a sixth of the loss. Weighting it more (``--new-region-weight``) was tried from the bundled
# weights: at 4 the strips overshoot the true views' colour spread and edges and the carried region degrades
# (WORLD_MODEL_CARD.md), so the default stays the recipe the bundled file was trained with.
NEW_REGION_LOSS_WEIGHT = 1.0
# Weighting the pixels landmarks cover (``--landmark-weight``) tilts what the model draws towards landmarks. Tried
# from the bundled weights it widens the colour spread of what the model invents, but its edges overshoot the
# perfect world models' first (WORLD_MODEL_CARD.md), so the default stays 1.
LANDMARK_LOSS_WEIGHT = 1.0
LANDMARK_EDGE = 0.05  # a pixel this far from the bare ground (data range 2) belongs to a landmark


def world_recipe(**overrides) -> TrainRecipe:
    """The sprite recipe less what is about sprites (their loss weight, text prompts)."""
    return TrainRecipe(**{"sprite_loss_weight": 1.0, "p_rollout_context": 0.0,
                          "new_region_loss_weight": NEW_REGION_LOSS_WEIGHT,
                          "landmark_loss_weight": LANDMARK_LOSS_WEIGHT, **overrides})


def new_region_weights(offset: torch.Tensor, frame_hw: tuple, weight: float) -> torch.Tensor:
    """Per-pixel loss weights ``[B, 1, F, H, W]`` for frames moved by ``offset [B, F, 2]`` from their reference:
    ``weight`` where the move brings in what the reference does not hold, 1 elsewhere."""
    B, F = offset.shape[:2]
    inside = moved_reference(torch.zeros(B, 1, F, *frame_hw), offset)[:, 1:]
    return 1.0 + (weight - 1.0) * (1.0 - inside)


class MapTeacherForcingAttention(TeacherForcingAttention):
    """The teacher-forcing seam with rotary positions on the map: each clip's own (``set_cameras`` per step), the
    noisy twins at their clean frames' places, time dropped.

    It computes only the blocks the mask lets through, in two calls: the clean copies over the clean copies
    (block-causal), and each noisy chunk over the clean chunks (those before it visible) and itself, the chunks as
    a batch. That is half the score entries of one call over the whole sequence, the same attention."""

    def __init__(self, num_frames: int, frames_per_block: int, grid_hw: tuple, head_dim: int, map_patches: int,
                 device="cpu"):
        super().__init__(num_frames, frames_per_block, grid_hw, head_dim, device=device)
        self.grid_hw, self.head_dim = grid_hw, head_dim
        self.rope = MapRoPE(map_patches, head_dim)
        self.clean, self.noisy = split_frames(num_frames, frames_per_block)
        tpf = grid_hw[0] * grid_hw[1]
        n_clean, chunk = len(self.clean) * tpf, frames_per_block * tpf
        self.n_clean, self.chunk = n_clean, chunk
        self.chunks = len(self.noisy) // frames_per_block
        self.clean_mask = self.mask[:n_clean, :n_clean]
        # Noisy chunk c (clip chunk c + 1) sees the clean tokens of chunks 0..c, then its own tokens.
        ends = (torch.arange(self.chunks, device=device)[:, None] + 1) * chunk
        seen = torch.arange(n_clean, device=device)[None, :] < ends
        visible = torch.cat([seen, torch.ones(self.chunks, chunk, dtype=torch.bool, device=device)], dim=1)
        self.noisy_mask = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))[:, None, None]

    def set_cameras(self, cameras: torch.Tensor) -> None:
        """``cameras [B, T, 2]``: each clip frame's camera (x, y) in patches."""
        m = self.rope.map_patches
        positions = torch.stack([torch.cat([
            map_positions(cam[self.clean.start:self.clean.stop], self.clean.start, self.grid_hw, m),
            map_positions(cam[self.noisy.start:self.noisy.stop], self.noisy.start, self.grid_hw, m)])
            for cam in cameras.to(self.mask.device)])
        cos, sin = self.rope.cos_sin(positions)
        self.cos, self.sin = cos[:, None], sin[:, None]  # [B, 1, L, pairs]: one table per clip, shared by heads

    def self_attention(self, layer, q, k, v, positions, view, info):
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        n, c, chunks = self.n_clean, self.chunk, self.chunks
        B, H, _, D = q.shape
        clean = F.scaled_dot_product_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], attn_mask=self.clean_mask)

        def per_chunk(x):  # [B, H, chunks * c, D] -> [B * chunks, H, c, D]
            return x.view(B, H, chunks, c, D).transpose(1, 2).reshape(B * chunks, H, c, D)

        def with_clean(x):  # every noisy chunk's keys: the clean ones, then its own
            shared = x[:, None, :, :n].expand(B, chunks, H, n, D).reshape(B * chunks, H, n, D)
            return torch.cat([shared, per_chunk(x[:, :, n:])], dim=2)

        noisy = F.scaled_dot_product_attention(per_chunk(q[:, :, n:]), with_clean(k), with_clean(v),
                                               attn_mask=self.noisy_mask.repeat(B, 1, 1, 1))
        noisy = noisy.view(B, chunks, H, c, D).transpose(1, 2).reshape(B, H, chunks * c, D)
        return torch.cat([clean, noisy], dim=2)


class MapForward(TeacherForcingForward):
    """The world's teacher-forcing forward: rotary positions on the map, and each noisy twin reading its moved
    reference frame (the context frame before it, moved by its offset), where a clean copy reads none (zeros, and
    zero in the channel that says where the reference is defined). ``offset`` (``[B, T, 2]``) and ``jumps``
    (``[B, T]``: frames with no reference) are set for each step's clips, with the cameras."""

    def __init__(self, model, num_frames: int, frames_per_block: int, frame_hw: tuple, map_patches: int):
        super().__init__(model, num_frames, frames_per_block, frame_hw)
        self.seam = MapTeacherForcingAttention(num_frames, frames_per_block, self.grid_hw,
                                               self.runner.geometry.head_dim, map_patches, device=self.runner.device)
        self.runner.attention = self.seam
        self.frames_per_block = frames_per_block
        self.offset: torch.Tensor | None = None
        self.jumps: torch.Tensor | None = None

    def set_clips(self, positions: torch.Tensor, offset: torch.Tensor, jumps: torch.Tensor) -> None:
        self.seam.set_cameras(positions)
        self.offset, self.jumps = offset, jumps

    def __call__(self, context_frames, noisy_frames, context_t, noisy_t, text):
        assert self.offset is not None and self.jumps is not None, "the clips are set before the forward"
        frames = torch.arange(context_frames.shape[2])
        reference = context_frames[:, :, reference_frames(frames, self.frames_per_block)]
        extra = moved_reference(reference, self.offset) * (~self.jumps)[:, None, :, None, None].to(reference)
        return super().__call__(torch.cat([context_frames, torch.zeros_like(extra)], 1),
                                torch.cat([noisy_frames, extra], 1), context_t, noisy_t, text)


class WorldTrainer(Trainer):
    model_config = WORLD_MODEL_CONFIG
    frames_per_block = WORLD_FRAMES_PER_BLOCK

    def __init__(self, out_dir, recipe: TrainRecipe, seed: int, log, map_size: int = MAP_SIZE):
        self.map_size = map_size  # before the trainer builds its forward, which places tokens on this map
        super().__init__(out_dir, recipe, seed, log)
        with torch.random.fork_rng():
            torch.manual_seed(seed + 1)
            self.action_encoder = ActionEncoder(self.model_config.dim, map_size // STEP, self.frames_per_block)
        self.ema_action = copy.deepcopy(self.action_encoder).requires_grad_(False)
        params = [*self.model.parameters(), *self.text_encoder.parameters(), *self.action_encoder.parameters()]
        self.optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.99))
        # Absolute frame index of every row of the teacher-forcing sequence (clean copies, then noisy twins).
        f = self.forward
        self.sequence_frames = torch.cat([torch.arange(f.clean_frames.start, f.clean_frames.stop),
                                          torch.arange(f.noisy_frames.start, f.noisy_frames.stop)])
        self.sequence_rows_noisy = torch.arange(len(self.sequence_frames)) >= len(f.clean_frames)

    def make_forward(self) -> TeacherForcingForward:
        return MapForward(self.model, self.recipe.clip_frames, self.frames_per_block, FRAME_HW,
                          self.map_size // STEP)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "action_encoder": self.action_encoder.state_dict(),
                "ema_action": self.ema_action.state_dict(), "world": WORLD_KIND, "map_size": self.map_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("world") != WORLD_KIND:
            raise ValueError("the saved training state is not a steered-world run; use a fresh --out")
        super().load_state_dict(state)

    def _load_weights(self, state: dict) -> None:
        self.action_encoder.load_state_dict(state["action_encoder"])
        self.ema_action.load_state_dict(state["ema_action"])
        super()._load_weights(state)

    def check_weights_file(self, path, meta: dict) -> None:
        from ...fastar_core.errors import CheckpointError

        world = meta.get("world") or {}
        wanted = {"kind": WORLD_KIND, "map_size": self.map_size, "inputs": REFERENCE_INPUT, "positions": POSITIONS}
        if any(world.get(k) != v for k, v in wanted.items()):
            raise CheckpointError(path, f"is not a steered-world weights file of this design (its world entry should "
                                        f"hold {wanted})")

    def warm_start_from_weights(self, path) -> dict:
        """Start from a steered-world weights file of this design (e.g. the bundled one): the sprite trainer's
        warm start, plus the action encoder's weights."""
        tensors = super().warm_start_from_weights(path)
        state = {k[len(STATE_PREFIX):]: v.float() for k, v in tensors.items() if k.startswith(STATE_PREFIX)}
        self.action_encoder.load_state_dict(state)
        self.ema_action.load_state_dict(state)
        return tensors

    def demo_metadata(self) -> dict:
        meta = super().demo_metadata()
        meta["world"] = {"kind": WORLD_KIND, "map_size": self.map_size, "step_pixels": STEP,
                         "view_size": VIEW_SIZE, "prompt": WORLD_PROMPT,
                         "inputs": REFERENCE_INPUT, "positions": POSITIONS, "path_kinds": dict(PATH_KINDS),
                         "long_return_gap": list(LONG_RETURN_GAP)}
        meta["sampler"] = dict(WORLD_SAMPLER)
        meta["rope_max_distance"] = 0  # time is dropped from the rotary positions (map_rope.py)
        return meta

    def extra_weights(self) -> dict:
        return {STATE_PREFIX: self.ema_action}

    def train_step(self, time_fraction: float = 0.0) -> float:
        r = self.recipe
        batch = world_batch(self.seed, self.step, r.batch, r.clip_frames, self.map_size,
                            landmarks=r.landmark_loss_weight != 1.0)
        g = step_generator(self.seed, self.step)
        x0 = batch.video
        sigma, noise, noisy, context = self._noised(x0, g, time_fraction)
        text = self.forward.encode_text(self.text_encoder(self.tokenizer.batch([WORLD_PROMPT] * r.batch)))
        # The keys steer the noisy twins only: a clean copy is read as it is (what the cache keeps of a place).
        embedding = self.action_encoder.embed(batch.actions, batch.positions, self.sequence_frames)
        embedding = embedding * (self.sequence_rows_noisy[None, :, None]).to(embedding)
        offset = self.action_encoder.frame_conditions(batch.actions, batch.positions, torch.arange(r.clip_frames))[1]
        self.forward.set_clips(batch.positions, offset * (~batch.jumps)[..., None], batch.jumps)
        with added_to_time_embedding(self.model, embedding):
            if r.p_own_context > 0:
                context = self._own_context(context, x0, text, g)
            flow = self.forward(context, noisy, torch.zeros_like(sigma), 1000.0 * sigma, text)
        twins = slice(self.forward.noisy_frames.start, self.forward.noisy_frames.stop)
        weights = new_region_weights(self.forward.offset, FRAME_HW, r.new_region_loss_weight)[:, :, twins]
        if batch.landmarks is not None:
            weights = weights * (1.0 + (r.landmark_loss_weight - 1.0) * batch.landmarks[:, :, twins].to(weights))
        weights = weights * (~batch.jumps[:, twins])[:, None, :, None, None].to(weights)  # no reference: not taught
        loss = ((flow - (noise - x0)[:, :, twins]).square() * weights).sum() / (weights.sum() * x0.shape[1])
        return self._apply(loss)

    @torch.no_grad()
    def _update_ema(self) -> None:
        super()._update_ema()
        done = self.step + sum(p["steps"] for p in self.phases)
        decay = min(self.recipe.ema_decay, (1 + done) / (10 + done))
        for e, p in zip(self.ema_action.parameters(), self.action_encoder.parameters()):
            e.lerp_(p, 1 - decay)
