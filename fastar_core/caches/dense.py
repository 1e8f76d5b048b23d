"""The dense caches: un-merged keys in a frame-granular ring buffer, one class per policy.

- ``global``: every committed frame (the paper's unbounded dense baseline), sized for the whole rollout;
- ``window``: ``sink`` first frames plus the last ``window`` frames (LongLive-style), a ring buffer;
- ``rolling``: Rolling Forcing's cache: ``capacity`` frames kept, attention reads at most ``attend`` frames
  including the queries, the sink re-positioned to sit just before the working frames.
"""

from __future__ import annotations

import torch

from ..errors import FastARError
from ..rope import grid_positions
from .base import CacheShape, CacheView, KVCache, check_fits, element_size


class DenseKVCache(KVCache):
    """Frame-granular ring buffer of un-merged keys; one slot holds one latent frame's tokens. Alone it is the
    window policy's buffer; the global and rolling policies change how it is sized and read.

    Bookkeeping is per layer: during a clean pass layer i commits right after its own attention, so the
    layers that have not run yet still see the cache as it was before the chunk.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_heads: int,
        head_dim: int,
        grid_hw,
        capacity_frames: int,
        sink_frames: int = 0,
        attend_frames: int | None = None,
        dtype=torch.float32,
        device="cpu",
    ):
        super().__init__(num_layers, batch, num_heads, head_dim, grid_hw, dtype, device)
        if capacity_frames <= sink_frames:
            raise FastARError(f"cache capacity ({capacity_frames} frames) must exceed the sink ({sink_frames} frames)")
        self.capacity_frames = capacity_frames
        self.sink_frames = sink_frames
        self.attend_frames = attend_frames
        tokens = capacity_frames * self.tokens_per_frame
        shape = (batch, num_heads, tokens, head_dim)
        check_fits(self.device, self.allocated_bytes(), f"the {self.policy} cache for {capacity_frames} latent frames")
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.positions = torch.zeros(num_layers, tokens, 3, dtype=torch.long, device=self.device)
        self.bias = torch.full((num_layers, tokens), float("-inf"), device=self.device)
        # Frame index held by each slot (-1 when empty), and how many slots were ever used, per layer.
        self.slot_frame = [[-1] * capacity_frames for _ in range(num_layers)]
        self.high_water = [0] * num_layers
        self.evicted_frames = 0
        self._pending: tuple[int, int] | None = None

    def _token_index(self, slots) -> torch.Tensor:
        tpf = self.tokens_per_frame
        base = torch.tensor(slots, device=self.device, dtype=torch.long)[:, None] * tpf
        return (base + torch.arange(tpf, device=self.device)).reshape(-1)

    def _take_slot(self, layer: int, frame: int) -> int:
        slots = self.slot_frame[layer]
        if frame in slots:
            return slots.index(frame)
        if -1 in slots:
            return slots.index(-1)
        candidates = [(f, s) for s, f in enumerate(slots) if f >= self.sink_frames]
        if not candidates:
            raise FastARError(f"the {self.policy} cache is full of sink frames; raise its capacity")
        _, slot = min(candidates)
        if layer == 0:
            self.evicted_frames += 1
        slots[slot] = -1
        return slot

    def prepare_commit(self, frame_start: int, num_frames: int) -> None:
        self._pending = (frame_start, num_frames)

    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        assert self._pending is not None, "commit outside a clean pass (prepare_commit first)"
        frame_start, num_frames = self._pending
        slots = []
        for f in range(frame_start, frame_start + num_frames):
            slot = self._take_slot(layer, f)
            self.slot_frame[layer][slot] = f  # reserve now so the chunk's next frame takes another slot
            slots.append(slot)
        idx = self._token_index(slots)
        self.k[layer].index_copy_(2, idx, k.to(self.dtype))
        self.v[layer].index_copy_(2, idx, v.to(self.dtype))
        self.positions[layer, idx] = grid_positions(frame_start, num_frames, self.grid_hw[0], self.grid_hw[1],
                                                        device=self.device)
        self.bias[layer, idx] = 0.0
        self.high_water[layer] = max(self.high_water[layer], max(slots) + 1)
        self.versions[layer] += 1

    def finish_commit(self) -> None:
        self._pending = None

    def rewind(self, frame: int) -> None:
        for layer in range(self.num_layers):
            self.versions[layer] += 1
            for slot, f in enumerate(self.slot_frame[layer]):
                if f >= max(frame, self.sink_frames):
                    self.slot_frame[layer][slot] = -1
                    self.bias[layer, self._token_index([slot])] = float("-inf")

    def _live_slots(self, layer: int = 0) -> list[int]:
        return [s for s, f in enumerate(self.slot_frame[layer]) if f >= 0]

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        live = self._live_slots(layer)
        if not live:
            return None
        n_sink = sum(1 for f in self.slot_frame[layer] if 0 <= f < self.sink_frames) * self.tokens_per_frame
        end = self.high_water[layer] * self.tokens_per_frame
        return CacheView(
            k=self.k[layer][:, :, :end], v=self.v[layer][:, :, :end], bias=self.bias[layer, :end][None, None],
            positions=self.positions[layer, :end][None], n_sink=n_sink, uniform=len(live) == self.high_water[layer],
            version=self.versions[layer],
        )

    def _bytes_per_token(self) -> int:
        per_layer = 2 * self.batch * self.num_heads * self.head_dim * element_size(self.dtype)
        return (per_layer + 3 * 8 + 4) * self.num_layers

    def live_bytes(self) -> int:
        return len(self._live_slots()) * self.tokens_per_frame * self._bytes_per_token()

    def allocated_bytes(self) -> int:
        return self.capacity_frames * self.tokens_per_frame * self._bytes_per_token()

    def stats(self) -> dict:
        return {
            **super().stats(),
            "frames": len(self._live_slots()),
            "capacity_frames": self.capacity_frames,
            "evicted_frames": self.evicted_frames,
        }


class WindowCache(DenseKVCache):
    """Sink frames plus the most recent ``window_frames`` cached frames (LongLive's local attention)."""

    policy = "window"

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> WindowCache:
        return cls(**vars(shape), capacity_frames=spec.sink_frames + spec.window_frames, sink_frames=spec.sink_frames)

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        if spec.window_frames < frames_per_block:
            raise FastARError(
                f"window_frames ({spec.window_frames}) must hold at least one block ({frames_per_block} frames)"
            )


class GlobalCache(DenseKVCache):
    """Every committed frame, sized for the whole rollout up front (fails before the first chunk, not halfway)."""

    policy = "global"

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> GlobalCache:
        return cls(**vars(shape), capacity_frames=total_frames, sink_frames=0)

    def prepare_commit(self, frame_start: int, num_frames: int) -> None:
        if frame_start + num_frames > self.capacity_frames:
            raise FastARError(
                f"the global cache was sized for {self.capacity_frames} frames; frame {frame_start + num_frames - 1} "
                "does not fit"
            )
        super().prepare_commit(frame_start, num_frames)


class RollingCache(DenseKVCache):
    """Rolling Forcing's cache: ``rolling_capacity`` frames kept, at most ``rolling_attend`` attended."""

    policy = "rolling"

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> RollingCache:
        return cls(**vars(shape), capacity_frames=spec.rolling_capacity, sink_frames=spec.sink_frames,
                   attend_frames=spec.rolling_attend)

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        if spec.rolling_attend <= spec.sink_frames + frames_per_block:
            raise FastARError(
                f"rolling_attend ({spec.rolling_attend}) must exceed sink ({spec.sink_frames}) plus one block "
                f"({frames_per_block})"
            )

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        """Sink + the most recent working frames, within ``attend_frames`` including the queries."""
        if not self._live_slots(layer):
            return None
        held = self.slot_frame[layer]
        sink = sorted((f, s) for s, f in enumerate(held) if 0 <= f < self.sink_frames)
        working = sorted((f, s) for s, f in enumerate(held) if self.sink_frames <= f < query_start)
        attend = self.attend_frames or self.capacity_frames
        budget = max(0, attend - len(sink) - query_frames)
        working = working[len(working) - budget:] if budget else []
        idx = self._token_index([s for _, s in sink] + [s for _, s in working])
        positions = self.positions[layer, idx]
        if sink:
            # Rolling Forcing keeps the sink un-RoPE'd and places it right before the working frames.
            first_after_sink = working[0][0] if working else query_start
            positions[: len(sink) * self.tokens_per_frame, 0] += first_after_sink - len(sink) - sink[0][0]
        return CacheView(
            k=self.k[layer].index_select(2, idx), v=self.v[layer].index_select(2, idx),
            bias=torch.zeros(1, 1, idx.numel(), device=self.device), positions=positions[None],
            n_sink=len(sink) * self.tokens_per_frame, uniform=True, version=self.versions[layer],
        )
