"""Matrix-Game's keyboard and mouse caches: per action layer, the keys and values of the last committed frames.

The reference keeps, per layer, a buffer of ``local_attn_size`` frames that it rolls before each new chunk
(oldest frames out) and reads whole; a chunk of ``T`` frames therefore sees the ``local_attn_size - T`` most recent
committed frames beside its own. The same holds here, the frames kept in order as the reference keeps
them (the oldest shifted out when a chunk is committed), so a chunk's view is a slice of the buffer, not a copy.
Only the clean pass writes: the reference's denoising passes write the chunk's slots too, but every later pass
of the chunk overwrites them and the clean pass writes them last, so what a later chunk reads is the same.

These caches stay dense, for three reasons. They are bounded already: ``local_attn_size`` frames per layer
whatever the rollout's length, so they never grow (what TempCache is for). They are not where the bytes are
that FAST-AR can win: at the released sizes the keyboard cache is 6 tokens of 1024 per action layer (12 K
values, nothing) and the mouse cache 880 locations x 6 frames x 1024 per action layer, about a third of the
self-attention cache's bytes (15 action layers of 30), all of it within the window the model was trained to
read. And merging has nothing to merge into: a mouse key is one location's own history (at most 6 entries, the
window the model reads in full) and a keyboard key one frame's action window, not the spatially repeated
content across frames whose duplicates TempCache folds together.
"""

from __future__ import annotations

import torch

from ...caches.cache_set import FamilyCache
from ...errors import FastARError


def frames_before(held: list, frame: int) -> int:
    """How many of the ordered frames ``held`` come before ``frame``: ``bisect_left``, written out because
    torch.compile cannot trace the C ``bisect`` (a graph break in every action layer); ``held`` is a window's few
    frames."""
    return sum(1 for f in held if f < frame)


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
        """(k, v) ``[rows, L, H, D]`` of the ``window - query_frames`` most recent frames before ``query_start``
        (views of the buffer: read them before the next commit, which shifts it)."""
        held = self.held[layer]
        end = frames_before(held, query_start)  # frames are kept in order
        start = max(0, end - (self.window - query_frames))
        if end <= start:
            return None
        return self.k[layer][:, start:end], self.v[layer][:, start:end]

    def commit(self, layer: int, frame_start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        frames = k.shape[1]
        if frames > self.window:
            raise FastARError(f"a pass of {frames} frames does not fit the {self.name} cache's {self.window} frames")
        older = frames_before(self.held[layer], frame_start)  # frames before this pass stay, the newest of them
        keep = min(older, self.window - frames)
        if keep and keep < older:  # shift the kept frames to the front, as the reference rolls its buffer
            for buf in (self.k[layer], self.v[layer]):
                buf[:, :keep] = buf[:, older - keep:older].clone()
        self.k[layer][:, keep:keep + frames] = k
        self.v[layer][:, keep:keep + frames] = v
        self.held[layer] = self.held[layer][older - keep:older] + list(range(frame_start, frame_start + frames))

    def rewind(self, frame: int) -> None:
        for layer in self.held:
            self.held[layer] = self.held[layer][:frames_before(self.held[layer], frame)]

    def live_bytes(self) -> int:
        return sum(len(h) for h in self.held.values()) * self._row_bytes

    def allocated_bytes(self) -> int:
        return len(self.k) * self.window * self._row_bytes

    def free(self) -> None:
        self.k, self.v, self.held = {}, {}, {}
