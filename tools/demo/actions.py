"""Per-frame keyboard conditioning of the demo world model, and the runner that applies it.

Each latent frame gets one embedding from three things: the key pressed to reach it (``steer_world.ACTIONS``),
its offset in patches from the last frame of the chunk before (the clean frame a chunk's shifts stack onto, so
the second and third frame of a chunk are told their total shift, not only the last step), and the camera's map
position (sines of the wrapping map coordinates: a place seen before can be told apart from a new one).

The embedding is added to the frame's timestep embedding, so it steers every block through the per-frame
adaLN modulation and the head, with no new attention path. That is simpler than Matrix-Game 2.0's keyboard
module (its own per-frame attention layer in each block); the Wan blocks and their weights stay unchanged, and
the engine's sampler, caches and FAST-AR run the model as any other: the runner looks the conditions up by
absolute frame index, which the sampler already passes with each forward.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from ...fastar_core.runner import CausalRunner
from .steer_world import ACTIONS, Track

STATE_PREFIX = "action_encoder."
POSITION_FREQS = 3  # sine/cosine pairs per axis over the wrapping map: periods of 1, 1/2, 1/3 of the map


class ActionEncoder(nn.Module):
    def __init__(self, dim: int, map_patches: int, frames_per_block: int):
        super().__init__()
        self.map_patches = map_patches
        self.frames_per_block = frames_per_block
        self.max_offset = frames_per_block  # a chunk's last frame is at most this many moves past the reference
        self.key = nn.Embedding(len(ACTIONS), dim)
        self.offset_x = nn.Embedding(2 * self.max_offset + 1, dim)
        self.offset_y = nn.Embedding(2 * self.max_offset + 1, dim)
        self.position = nn.Linear(4 * POSITION_FREQS, dim)
        self.out = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim))
        with torch.no_grad():  # starts as no conditioning at all: training grows it from zero, as DiT's head
            self.out[1].weight.mul_(0.1)
            self.out[1].bias.zero_()

    def frame_conditions(self, actions: torch.Tensor, positions: torch.Tensor, frames: torch.Tensor):
        """Per frame of ``frames`` (absolute indices ``[F]``): (key ``[B, F]``, offset ``[B, F, 2]``, position
        ``[B, F, 2]``) from batched tracks ``actions [B, T]``, ``positions [B, T, 2]``."""
        if int(frames.max()) >= actions.shape[1]:
            raise ValueError(f"frame {int(frames.max())} has no action yet (the track holds {actions.shape[1]} "
                             "frames): extend the track before generating it")
        fpb = self.frames_per_block
        reference = torch.clamp(frames // fpb * fpb - 1, min=0)
        m = self.map_patches
        offset = torch.remainder(positions[:, frames] - positions[:, reference] + m // 2, m) - m // 2
        return actions[:, frames], offset.clamp(-self.max_offset, self.max_offset), positions[:, frames]

    def forward(self, key: torch.Tensor, offset: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """``[B, F, dim]`` embeddings."""
        k = self.max_offset
        angles = position.float()[..., None] * (2 * math.pi / self.map_patches) \
            * torch.arange(1, POSITION_FREQS + 1, device=position.device)  # [B, F, 2, freqs]
        waves = torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(-2)
        h = self.key(key) + self.offset_x(offset[..., 0] + k) + self.offset_y(offset[..., 1] + k)
        return self.out(h + self.position(waves))

    def embed(self, actions, positions, frames) -> torch.Tensor:
        return self(*self.frame_conditions(actions, positions, frames))


@contextmanager
def added_to_time_embedding(model, embedding: torch.Tensor):
    """Add ``embedding [B, F, dim]`` to the model's per-frame timestep embedding for the forwards inside."""
    flat = embedding.reshape(-1, embedding.shape[-1])

    def hook(module, inputs, output):
        if output.shape != flat.shape:
            raise ValueError(f"action embedding has {flat.shape[0]} rows for {output.shape[0]} frame embeddings")
        return output + flat.to(output.dtype)

    handle = model.time_embedding.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def batch_tracks(tracks: list[Track]) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal-length tracks -> (actions ``[B, T]``, positions ``[B, T, 2]``)."""
    return torch.stack([t.actions for t in tracks]), torch.stack([t.positions for t in tracks])


class ActionRunner(CausalRunner):
    """A ``CausalRunner`` whose every forward is conditioned on the frames' keys and camera positions.

    ``tracks`` may grow between chunks (the live player appends each key as it is pressed); a forward over
    frames the tracks do not reach yet is refused."""

    def __init__(self, model, encoder: ActionEncoder, tracks: list[Track], attention=None, **kw):
        super().__init__(model, attention=attention, **kw)
        self.encoder = encoder
        self.tracks = tracks

    def forward(self, x, timesteps, text, cache, info, commit=False, need_output=True):
        frames = torch.arange(info.frame_start, info.frame_start + x.shape[2])
        actions, positions = batch_tracks(self.tracks)
        if actions.shape[0] != x.shape[0]:
            raise ValueError(f"{actions.shape[0]} tracks for a batch of {x.shape[0]}")
        with torch.no_grad():
            embedding = self.encoder.embed(actions.to(self.device), positions.to(self.device), frames.to(self.device))
        with added_to_time_embedding(self.model, embedding):
            return super().forward(x, timesteps, text, cache, info, commit=commit, need_output=need_output)
