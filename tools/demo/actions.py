"""Per-frame keyboard conditioning of the demo world model, and the runner that applies it.

Each latent frame gets one embedding from three things: the key pressed to reach it (``steer_world.ACTIONS``),
its offset in patches from the last frame of the chunk before (the clean frame a chunk's shifts stack onto, so
the second and third frame of a chunk are told their total shift, not only the last step), and the camera's map
position (sines of the wrapping map coordinates: a place seen before can be told apart from a new one).

The embedding is added to the frame's timestep embedding, so it steers every block through the per-frame
adaLN modulation and the head, with no new attention path. That is simpler than Matrix-Game 2.0's keyboard
module (its own per-frame attention layer in each block); the Wan blocks stay as they are, and the engine's
sampler, caches and FAST-AR run the model as any other: the runner looks the conditions up by absolute frame
index, which the sampler already passes with each forward.

A model whose patch embedding takes ``2 * C + 1`` channels (``REFERENCE_INPUT`` in its file's world metadata)
is also handed the key's shift directly, in pixels: each frame's reference frame moved by the frame's offset
(``moved_reference``), beside the noisy frame, with a channel saying where the moved frame is defined. The part
of a view that stays in sight is then in its input, and what the model has to make is the strip the move brings
in; without it (the first world files, still read) a whole-frame shift had to be found through RoPE alone.

A model whose rotary positions are places on the map (``"positions": "map"`` in its file's world metadata,
``map_rope.py``) reads a clean frame as it is: the clean pass that writes the cache gets no key embedding and no
reference (zeros), so what the cache keeps of a place depends on what is there, not on how the camera came.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from ...fastar_core.forward.runner import CausalRunner
from .map_rope import MapRoPE, map_positions
from .steer_world import ACTIONS, STEP, Track

STATE_PREFIX = "action_encoder."
REFERENCE_INPUT = "moved-reference"  # world metadata ``inputs``: the model reads the moved reference frame
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
        reference = reference_frames(frames, self.frames_per_block)
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


def reference_frames(frames: torch.Tensor, frames_per_block: int) -> torch.Tensor:
    """Per absolute frame index, the clean frame its shift is counted from: the last frame of the chunk before
    (frame 0 for the first chunk, which is always given)."""
    return torch.clamp(frames // frames_per_block * frames_per_block - 1, min=0)


def moved_reference(reference: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The reference frames ``[B, C, F, H, W]`` moved by per-frame camera offsets ``offset [B, F, 2]`` ((dx, dy)
    in patches): pixel (i, j) of frame f is reference pixel (i + dy * STEP, j + dx * STEP), i.e. the same map
    pixel, zero where that falls outside the reference; plus one channel, 1 where it falls inside.
    Returns ``[B, C + 1, F, H, W]``."""
    B, C, F, H, W = reference.shape
    dev = reference.device
    rows = torch.arange(H, device=dev) + offset[..., 1:2].to(dev) * STEP  # [B, F, H]
    cols = torch.arange(W, device=dev) + offset[..., 0:1].to(dev) * STEP  # [B, F, W]
    inside = ((rows >= 0) & (rows < H))[..., :, None] & ((cols >= 0) & (cols < W))[..., None, :]  # [B, F, H, W]
    index = (rows.clamp(0, H - 1)[..., :, None] * W + cols.clamp(0, W - 1)[..., None, :]).flatten(2)
    moved = reference.flatten(3).gather(3, index[:, None].expand(B, C, F, H * W)).view(B, C, F, H, W)
    mask = inside[:, None].to(reference.dtype)
    return torch.cat([moved * mask, mask], dim=1)


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
    frames the tracks do not reach yet is refused. With ``moved_reference`` the model also reads each frame's
    reference frame moved by its offset: the runner keeps the last frame of each clean (committed) pass for the
    chunk after it, and the first chunk (the given start) is its own reference. With ``map_positions`` tokens are
    placed on the map (``token_positions``), whatever attention the runner is given rotates by the map's RoPE, and
    a clean pass reads its frame as it is."""

    def __init__(self, model, encoder: ActionEncoder, tracks: list[Track], attention=None,
                 moved_reference: bool = False, map_positions: bool = False, **kw):
        self.map_rope = MapRoPE(encoder.map_patches, model.config.head_dim) if map_positions else None
        super().__init__(model, attention=attention, **kw)
        self.encoder = encoder
        self.tracks = tracks
        self.moved_reference = moved_reference
        self.last_clean: tuple[int, torch.Tensor] | None = None  # (absolute frame index, [B, C, H, W])

    @property
    def attention(self):
        return self._attention

    @attention.setter
    def attention(self, value) -> None:
        # The sampler's builder hands the runner a dense or a FAST-AR attention; either rotates by the map.
        if self.map_rope is not None:
            value.own_rope = self.map_rope
        self._attention = value

    def token_positions(self, frame_start: int, num_frames: int, grid_h: int, grid_w: int) -> torch.Tensor:
        if self.map_rope is None:
            return super().token_positions(frame_start, num_frames, grid_h, grid_w)
        cameras = [t.positions[frame_start:frame_start + num_frames] for t in self.tracks]
        if cameras[0].shape[0] != num_frames:
            raise ValueError(f"frame {frame_start + num_frames - 1} has no camera yet (the track holds "
                             f"{cameras[0].shape[0] + frame_start} frames): extend the track before generating it")
        if any(not torch.equal(c, cameras[0]) for c in cameras[1:]):
            raise ValueError("a batch placed on the map shares one camera path: its tracks' positions differ")
        return map_positions(cameras[0].to(self.device), frame_start, (grid_h, grid_w), self.encoder.map_patches)

    def _reference_input(self, x: torch.Tensor, frames: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        start = int(frames[0])
        refs = []
        for r in reference_frames(frames, self.encoder.frames_per_block).tolist():
            if r >= start:  # the first chunk: its own frame 0
                refs.append(x[:, :, r - start])
            elif self.last_clean is not None and self.last_clean[0] == r:
                refs.append(self.last_clean[1])
            else:
                raise ValueError(f"frame {start} needs the clean pass of frame {r} first (this runner keeps the last "
                                 "committed frame as the next chunk's reference)")
        return moved_reference(torch.stack(refs, dim=2).to(x), offset.to(x.device))

    def forward(self, x, timesteps, text, cache, info, commit=False, need_output=True):
        frames = torch.arange(info.frame_start, info.frame_start + x.shape[2])
        actions, positions = batch_tracks(self.tracks)
        if actions.shape[0] != x.shape[0]:
            raise ValueError(f"{actions.shape[0]} tracks for a batch of {x.shape[0]}")
        with torch.no_grad():
            key, offset, place = self.encoder.frame_conditions(actions.to(self.device), positions.to(self.device),
                                                               frames.to(self.device))
            embedding = self.encoder(key, offset, place)
        as_it_is = commit and self.map_rope is not None  # a clean frame: no key, no reference
        if as_it_is:
            embedding = torch.zeros_like(embedding)
        if not self.moved_reference:
            inputs = x
        elif as_it_is:
            inputs = torch.cat([x, torch.zeros_like(x), torch.zeros_like(x[:, :1])], dim=1)
        else:
            inputs = torch.cat([x, self._reference_input(x, frames, offset)], dim=1)
        with added_to_time_embedding(self.model, embedding):
            out = super().forward(inputs, timesteps, text, cache, info, commit=commit, need_output=need_output)
        if commit and self.moved_reference:
            self.last_clean = (int(frames[-1]), x[:, :, -1].detach().clone())
        return out
