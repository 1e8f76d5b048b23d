"""Matrix-Game's keyboard and mouse caches: per action layer, the keys and values of the last committed frames.

The reference keeps, per layer, a buffer of ``local_attn_size`` frames that it rolls before each new chunk
(oldest frames out) and reads whole; a chunk of ``T`` frames therefore sees the ``local_attn_size - T`` most recent
committed frames beside its own. The same holds here with a ring of ``local_attn_size`` slots (frame ``f`` in
slot ``f mod size``), written by the clean pass only: the reference's denoising passes write the chunk's slots too,
but every later pass of the chunk overwrites them and the clean pass writes them last, so what a later chunk
reads is the same.

These caches stay dense: per layer they hold ``local_attn_size`` frames of one token per location (mouse) or one
token per frame (keyboard), a few percent of the self-attention cache's ``local_attn_size x tokens`` per layer,
and their keys are not spatially redundant the way TempCache's merging needs (a location's own history, or one
token per frame).
"""

from __future__ import annotations

import torch

from ..cache_set import FamilyCache
from ..errors import FastARError


class FrameWindowCache(FamilyCache):
    def __init__(self, name: str, layers, rows: int, heads: int, head_dim: int, window: int, dtype, device):
        self.name = name
        self.window = window
        shape = (rows, window, heads, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.held: dict[int, list[int]] = {i: [] for i in layers}  # committed frames per layer, oldest first
        self._element = torch.empty((), dtype=dtype).element_size()
        self._row_bytes = 2 * rows * heads * head_dim * self._element  # k and v of one frame in one layer

    def view(self, layer: int, query_start: int, query_frames: int):
        """(k, v) ``[rows, L, H, D]`` of the ``window - query_frames`` most recent frames before ``query_start``."""
        budget = self.window - query_frames
        frames = [f for f in self.held[layer] if f < query_start]
        frames = frames[max(0, len(frames) - budget):] if budget > 0 else []
        if not frames:
            return None
        slots = torch.tensor([f % self.window for f in frames], device=self.k[layer].device)
        return self.k[layer].index_select(1, slots), self.v[layer].index_select(1, slots)

    def commit(self, layer: int, frame_start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        frames = k.shape[1]
        if frames > self.window:
            raise FastARError(f"a pass of {frames} frames does not fit the {self.name} cache's {self.window} frames")
        for j in range(frames):
            slot = (frame_start + j) % self.window
            self.k[layer][:, slot] = k[:, j]
            self.v[layer][:, slot] = v[:, j]
        held = [f for f in self.held[layer] if f < frame_start] + list(range(frame_start, frame_start + frames))
        self.held[layer] = held[-self.window:]

    def rewind(self, frame: int) -> None:
        for layer in self.held:
            self.held[layer] = [f for f in self.held[layer] if f < frame]

    def live_bytes(self) -> int:
        return sum(len(h) for h in self.held.values()) * self._row_bytes

    def allocated_bytes(self) -> int:
        return len(self.k) * self.window * self._row_bytes

    def free(self) -> None:
        self.k, self.v, self.held = {}, {}, {}
