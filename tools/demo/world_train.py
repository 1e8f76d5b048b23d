"""Training the steered world model: ``fastar train-demo --world steer``.

The sprite trainer's recipe (teacher forcing through the engine's own block code, flow matching with per-chunk
noise levels on the sampler's sigmas, corrupted and one-step self-predicted context, AdamW, EMA, resumable
checkpoints) with the steered world's clips: a random map, a random start and a random key sequence per clip,
each frame conditioned on its key, its offset from the chunk's reference frame and the camera position
(``actions.ActionEncoder``). The prompt is one fixed sentence: the world is told by its keys, not by words.

The model is trained with one-frame chunks and reads, beside each frame, its reference frame (the context frame
before it: corrupted or the model's own prediction like the rest of the context) moved by the key
(``actions.moved_reference``), exactly what the sampler's ``ActionRunner`` hands it while rolling out.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from ...fastar_core.families.demo.actions import (
    REFERENCE_INPUT,
    STATE_PREFIX,
    ActionEncoder,
    added_to_time_embedding,
    batch_tracks,
    moved_reference,
    reference_frames,
)
from ...fastar_core.families.demo.steer_world import (
    MAP_SIZE,
    STEP,
    VIEW_SIZE,
    make_map,
    random_actions,
    render_track,
    track_from_actions,
)
from ...fastar_core.families.demo.weights_file import WORLD_KIND
from .data import clip_seed, step_generator
from .settings import FRAME_HW, ROPE_MAX_DISTANCE, WORLD_FRAMES_PER_BLOCK, WORLD_MODEL_CONFIG, WORLD_SAMPLER
from .teacher_forcing import TeacherForcingForward
from .train import Trainer, TrainRecipe

WORLD_PROMPT = "a calm and quiet textured background"


@dataclass
class WorldBatch:
    video: torch.Tensor  # [B, 3, T, H, W]
    actions: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T, 2]


def world_batch(seed: int, step: int, batch: int, frames: int, map_size: int = MAP_SIZE) -> WorldBatch:
    videos, tracks = [], []
    for i in range(batch):
        s = clip_seed(seed, step, i)
        world = make_map(s, map_size)
        rng = np.random.default_rng(s + 17)
        patches = map_size // STEP
        start = (int(rng.integers(patches)), int(rng.integers(patches)))
        track = track_from_actions(random_actions(rng, frames - 1), start, patches)
        tracks.append(track)
        videos.append(render_track(world, track).permute(1, 0, 2, 3))
    actions, positions = batch_tracks(tracks)
    return WorldBatch(torch.stack(videos), actions, positions)


# The part of a frame still in view is handed to the model (its moved reference) and costs almost nothing to
# predict, yet it is five sixths of a frame after a move, so the strip a move brings in, the only part the model
# must invent, gets a sixth of the loss. Weighting it more (``--new-region-weight``) was tried from the bundled
# weights: at 4 the strips overshoot the true views' colour spread and edges and the carried region degrades
# (WORLD_MODEL_CARD.md), so the default stays the recipe the bundled file was trained with.
NEW_REGION_LOSS_WEIGHT = 1.0


def world_recipe(**overrides) -> TrainRecipe:
    """The sprite recipe less what is about sprites (their loss weight, text prompts)."""
    return TrainRecipe(**{"sprite_loss_weight": 1.0, "p_rollout_context": 0.0,
                          "new_region_loss_weight": NEW_REGION_LOSS_WEIGHT, **overrides})


def new_region_weights(offset: torch.Tensor, frame_hw: tuple, weight: float) -> torch.Tensor:
    """Per-pixel loss weights ``[B, 1, F, H, W]`` for frames moved by ``offset [B, F, 2]`` from their reference:
    ``weight`` where the move brings in what the reference does not hold, 1 elsewhere."""
    B, F = offset.shape[:2]
    inside = moved_reference(torch.zeros(B, 1, F, *frame_hw), offset)[:, 1:]
    return 1.0 + (weight - 1.0) * (1.0 - inside)


class MovedReferenceForward(TeacherForcingForward):
    """The teacher-forcing forward with each frame's moved reference frame joined to its input channels (the
    same for a frame's clean copy and its noisy twin: the context frame before it, moved by its offset).
    ``offset`` (``[B, T, 2]`` per clip frame) is set for each step's clips."""

    def __init__(self, model, num_frames: int, frames_per_block: int, frame_hw: tuple, **kw):
        super().__init__(model, num_frames, frames_per_block, frame_hw, **kw)
        self.frames_per_block = frames_per_block
        self.offset: torch.Tensor | None = None

    def __call__(self, context_frames, noisy_frames, context_t, noisy_t, text):
        assert self.offset is not None, "the clips' offsets are set before the forward"
        frames = torch.arange(context_frames.shape[2])
        reference = context_frames[:, :, reference_frames(frames, self.frames_per_block)]
        extra = moved_reference(reference, self.offset)
        return super().__call__(torch.cat([context_frames, extra], 1), torch.cat([noisy_frames, extra], 1),
                                context_t, noisy_t, text)


class WorldTrainer(Trainer):
    model_config = WORLD_MODEL_CONFIG
    frames_per_block = WORLD_FRAMES_PER_BLOCK

    def __init__(self, out_dir, recipe: TrainRecipe, seed: int, log, map_size: int = MAP_SIZE):
        super().__init__(out_dir, recipe, seed, log)
        self.map_size = map_size
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

    def make_forward(self) -> TeacherForcingForward:
        return MovedReferenceForward(self.model, self.recipe.clip_frames, self.frames_per_block, FRAME_HW,
                                     rope_max_distance=ROPE_MAX_DISTANCE)

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
        wanted = {"kind": WORLD_KIND, "map_size": self.map_size, "inputs": REFERENCE_INPUT}
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
                         "inputs": REFERENCE_INPUT}
        meta["sampler"] = dict(WORLD_SAMPLER)
        return meta

    def extra_weights(self) -> dict:
        return {STATE_PREFIX: self.ema_action}

    def train_step(self, time_fraction: float = 0.0) -> float:
        r = self.recipe
        batch = world_batch(self.seed, self.step, r.batch, r.clip_frames, self.map_size)
        g = step_generator(self.seed, self.step)
        x0 = batch.video
        sigma, noise, noisy, context = self._noised(x0, g, time_fraction)
        text = self.forward.encode_text(self.text_encoder(self.tokenizer.batch([WORLD_PROMPT] * r.batch)))
        embedding = self.action_encoder.embed(batch.actions, batch.positions, self.sequence_frames)
        self.forward.offset = self.action_encoder.frame_conditions(
            batch.actions, batch.positions, torch.arange(r.clip_frames))[1]
        with added_to_time_embedding(self.model, embedding):
            if r.p_own_context > 0:
                context = self._own_context(context, x0, text, g)
            flow = self.forward(context, noisy, torch.zeros_like(sigma), 1000.0 * sigma, text)
        twins = slice(self.forward.noisy_frames.start, self.forward.noisy_frames.stop)
        weights = new_region_weights(self.forward.offset, FRAME_HW, r.new_region_loss_weight)[:, :, twins]
        loss = ((flow - (noise - x0)[:, :, twins]).square() * weights).mean() / weights.mean()
        return self._apply(loss)

    @torch.no_grad()
    def _update_ema(self) -> None:
        super()._update_ema()
        done = self.step + sum(p["steps"] for p in self.phases)
        decay = min(self.recipe.ema_decay, (1 + done) / (10 + done))
        for e, p in zip(self.ema_action.parameters(), self.action_encoder.parameters()):
            e.lerp_(p, 1 - decay)
