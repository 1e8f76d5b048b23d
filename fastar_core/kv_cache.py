"""Self-attention KV caches: what a chunk's queries see of the past.

Every cache stores keys *before RoPE* with their (t, h, w) positions, allocates its buffers once per rollout,
and hands the runner a ``CacheView`` per layer: ``k, v, bias, positions``. ``bias`` is 0 for live entries,
``log(count)`` for merged groups (TempCache) and ``-inf`` for empty slots, so compressed caches plug into the
same attention seam as the dense ones.

Dense policies (``DenseKVCache``):
- ``global``: every committed frame (the paper's unbounded dense baseline), sized for the whole rollout;
- ``window``: ``sink`` first frames plus the last ``window`` frames (LongLive-style), a ring buffer;
- ``rolling``: Rolling Forcing's cache: ``capacity`` frames kept, attention reads at most ``attend`` frames
  including the queries, the sink re-positioned to sit just before the working frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import FastARError

CACHE_POLICIES = ("global", "window", "rolling")


@dataclass
class CacheView:
    k: torch.Tensor  # [B, H, L, D] pre-RoPE keys
    v: torch.Tensor  # [B, H, L, D]
    bias: torch.Tensor  # [B|1, H|1, L] float32 additive logit bias
    positions: torch.Tensor  # [H|1, L, 3] int64 (t, h, w); t absolute, re-based where the policy moves a sink
    n_sink: int  # the first n_sink entries are sink tokens
    uniform: bool  # True when bias is 0 everywhere, so attention may skip it
    version: int = 0  # changes whenever the layer's entries change (commit, rewind): lets readers memoise

    @property
    def length(self) -> int:
        return self.k.shape[2]


def element_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def check_fits(device: torch.device, nbytes: int, what: str) -> None:
    """Refuse, before allocating, a cache that cannot fit in the GPU's free memory (one clear message
    instead of an out-of-memory error halfway through a rollout)."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    if nbytes > free:
        raise FastARError(f"{what} needs {nbytes / 2**30:.1f} GiB but {device} has {free / 2**30:.1f} GiB free; "
                          "use the window or rolling cache, or FAST-AR's tempcache, whose memory is bounded")


class KVCache:
    """Interface shared by the dense caches and TempCache."""

    policy = "base"

    def __init__(self, num_layers, batch, num_heads, head_dim, grid_hw, dtype, device):
        self.num_layers = num_layers
        self.batch = batch
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.grid_hw = tuple(grid_hw)
        self.tokens_per_frame = grid_hw[0] * grid_hw[1]
        self.dtype = dtype
        self.device = torch.device(device)
        self.versions = [0] * num_layers

    # -- reading --------------------------------------------------------------------------------------------
    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        raise NotImplementedError

    # -- writing (one clean pass: prepare once, commit per layer, finish once) -------------------------------
    def prepare_commit(self, frame_start: int, num_frames: int) -> None:
        raise NotImplementedError

    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError

    def finish_commit(self) -> None:
        pass

    def rewind(self, frame: int) -> None:
        """Forget entries of frames >= ``frame`` (sink frames excepted), before they are re-encoded."""
        raise NotImplementedError

    # -- accounting -----------------------------------------------------------------------------------------
    def live_bytes(self) -> int:
        raise NotImplementedError

    def allocated_bytes(self) -> int:
        raise NotImplementedError

    def stats(self) -> dict:
        return {"policy": self.policy, "live_bytes": self.live_bytes(), "allocated_bytes": self.allocated_bytes()}

    def free(self) -> None:
        """Drop every buffer (after a rollout, on error or interruption)."""
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) or (isinstance(value, list) and value and torch.is_tensor(value[0])):
                setattr(self, name, None)


class DenseKVCache(KVCache):
    """Frame-granular ring buffer of un-merged keys; one slot holds one latent frame's tokens.

    Bookkeeping is per layer: during a clean pass layer i commits right after its own attention, so the
    layers that have not run yet still see the cache as it was before the chunk.
    """

    def __init__(
        self,
        policy: str,
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
        if policy not in CACHE_POLICIES:
            raise FastARError(f"cache policy {policy!r} is not one of {', '.join(CACHE_POLICIES)}")
        if capacity_frames <= sink_frames and policy != "global":
            raise FastARError(f"cache capacity ({capacity_frames} frames) must exceed the sink ({sink_frames} frames)")
        self.policy = policy
        self.capacity_frames = capacity_frames
        self.sink_frames = sink_frames
        self.attend_frames = attend_frames
        tokens = capacity_frames * self.tokens_per_frame
        shape = (batch, num_heads, tokens, head_dim)
        check_fits(self.device, self.allocated_bytes(), f"the {policy} cache for {capacity_frames} latent frames")
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
        if self.policy == "global" and frame_start + num_frames > self.capacity_frames:
            raise FastARError(
                f"the global cache was sized for {self.capacity_frames} frames; frame {frame_start + num_frames - 1} "
                "does not fit"
            )
        self._pending = (frame_start, num_frames)

    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        from .rope import grid_positions

        frame_start, num_frames = self._pending
        slots = []
        for f in range(frame_start, frame_start + num_frames):
            slot = self._take_slot(layer, f)
            self.slot_frame[layer][slot] = f  # reserve now so the chunk's next frame takes another slot
            slots.append(slot)
        idx = self._token_index(slots)
        self.k[layer].index_copy_(2, idx, k.to(self.dtype))
        self.v[layer].index_copy_(2, idx, v.to(self.dtype))
        self.positions[layer, idx] = grid_positions(frame_start, num_frames, *self.grid_hw, device=self.device)
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
        if self.policy == "rolling":
            return self._rolling_view(layer, query_start, query_frames)
        n_sink = sum(1 for f in self.slot_frame[layer] if 0 <= f < self.sink_frames) * self.tokens_per_frame
        end = self.high_water[layer] * self.tokens_per_frame
        return CacheView(
            k=self.k[layer][:, :, :end], v=self.v[layer][:, :, :end], bias=self.bias[layer, :end][None, None],
            positions=self.positions[layer, :end][None], n_sink=n_sink, uniform=len(live) == self.high_water[layer],
            version=self.versions[layer],
        )

    def _rolling_view(self, layer, query_start, query_frames) -> CacheView:
        """Sink + the most recent working frames, within ``attend_frames`` including the queries."""
        held = self.slot_frame[layer]
        sink = sorted((f, s) for s, f in enumerate(held) if 0 <= f < self.sink_frames)
        working = sorted((f, s) for s, f in enumerate(held) if self.sink_frames <= f < query_start)
        budget = max(0, self.attend_frames - len(sink) - query_frames)
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


@dataclass(frozen=True)
class CacheSpec:
    """A cache policy and its sizes, independent of the model (what users and nodes choose)."""

    policy: str = "global"
    sink_frames: int = 3
    window_frames: int = 12
    rolling_capacity: int = 24
    rolling_attend: int = 21

    def validate(self, frames_per_block: int) -> None:
        valid = CACHE_POLICIES + ("tempcache",)
        if self.policy not in valid:
            raise FastARError(f"cache policy {self.policy!r} is not one of {', '.join(valid)}")
        if self.sink_frames < 0:
            raise FastARError(f"sink_frames must be >= 0, got {self.sink_frames}")
        if self.policy == "window" and self.window_frames < frames_per_block:
            raise FastARError(
                f"window_frames ({self.window_frames}) must hold at least one block ({frames_per_block} frames)"
            )
        if self.policy == "rolling" and self.rolling_attend <= self.sink_frames + frames_per_block:
            raise FastARError(
                f"rolling_attend ({self.rolling_attend}) must exceed sink ({self.sink_frames}) plus one block "
                f"({frames_per_block})"
            )

    def build(self, *, num_layers, batch, num_heads, head_dim, grid_hw, total_frames, dtype, device) -> KVCache:
        common = dict(num_layers=num_layers, batch=batch, num_heads=num_heads, head_dim=head_dim, grid_hw=grid_hw,
                      dtype=dtype, device=device)
        if self.policy == "global":
            return DenseKVCache("global", capacity_frames=total_frames, sink_frames=0, **common)
        if self.policy == "window":
            return DenseKVCache("window", capacity_frames=self.sink_frames + self.window_frames,
                                sink_frames=self.sink_frames, **common)
        if self.policy == "rolling":
            return DenseKVCache("rolling", capacity_frames=self.rolling_capacity, sink_frames=self.sink_frames,
                                attend_frames=self.rolling_attend, **common)
        raise FastARError("the tempcache policy is built from a FastARConfig (FAST-AR on), not a CacheSpec")
