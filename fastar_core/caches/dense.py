"""The dense caches: un-merged keys in a frame-granular ring buffer, one class per policy.

With ``rotated_keys`` (what the dense attention asks for unless it clamps RoPE distances) keys are stored
rotated at their absolute positions, rotated once when committed; only what a policy moves is rotated again
(Rolling Forcing's re-positioned sink, by the shift, in the view's copy).

- ``global``: every committed frame (the paper's unbounded dense baseline), sized for the whole rollout;
- ``window``: LongLive's local attention: a chunk attends to ``window_frames`` frames in all, the ``sink`` first
  frames and the chunk itself included (LongLive's ``local_attn_size``), a ring buffer;
- ``rolling``: Rolling Forcing's cache: ``capacity`` frames kept, attention reads at most ``attend`` frames
  including the queries; denoising passes see the sink re-positioned just before the working frames, the
  clean pass sees the most recent ``attend`` frames ending with its chunk (the sink only while inside them);
- ``recompute``: Krea Realtime's KV recompute: emptied before every chunk and rebuilt by clean passes over a
  short context (anchor frames plus the most recent ones) at positions 0.., the chunk running right after it.
"""

from __future__ import annotations

import torch

from ..errors import FastARError
from ..model.rope import RopeTables, chunk_positions, rotate, span_of
from .base import CacheShape, CacheView, KVCache, check_fits, element_size
from .quant import KV_QUANTS, dequantize_int8, quantize_int8


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
        frames_per_block: int = 1,
        rotated_keys: bool = False,
        kv_quant: str = "none",
    ):
        super().__init__(num_layers, batch, num_heads, head_dim, grid_hw, dtype, device)
        self.frames_per_block = frames_per_block
        self.rotated_keys = rotated_keys
        if kv_quant not in KV_QUANTS:
            raise FastARError(f"kv_quant {kv_quant!r} is not one of {', '.join(KV_QUANTS)}")
        self.kv_quant = kv_quant
        if capacity_frames <= sink_frames:
            raise FastARError(f"cache capacity ({capacity_frames} frames) must exceed the sink ({sink_frames} frames)")
        self.capacity_frames = capacity_frames
        self.sink_frames = sink_frames
        self.attend_frames = attend_frames
        tokens = capacity_frames * self.tokens_per_frame
        shape = (batch, num_heads, tokens, head_dim)
        check_fits(self.device, self.allocated_bytes(), f"the {self.policy} cache for {capacity_frames} latent frames")
        stored = torch.int8 if kv_quant == "int8" else dtype
        self.k = [torch.zeros(shape, dtype=stored, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=stored, device=self.device) for _ in range(num_layers)]
        # int8: one float32 scale per token and head for each of K and V (absmax / 127 of that token's row)
        scales = (batch, num_heads, tokens, 1)
        self.k_scale = ([torch.zeros(scales, device=self.device) for _ in range(num_layers)]
                        if kv_quant == "int8" else None)
        self.v_scale = ([torch.zeros(scales, device=self.device) for _ in range(num_layers)]
                        if kv_quant == "int8" else None)
        self.positions = torch.zeros(num_layers, tokens, 3, dtype=torch.long, device=self.device)
        self.bias = torch.full((num_layers, tokens), float("-inf"), device=self.device)
        self.zero_bias = torch.zeros(1, 1, tokens, device=self.device)  # the bias of a view of live frames
        self.rope: RopeTables = RopeTables(head_dim, self.device)
        # Frame index held by each slot (-1 when empty), and how many slots were ever used, per layer.
        self.slot_frame = [[-1] * capacity_frames for _ in range(num_layers)]
        self.high_water = [0] * num_layers
        self.evicted_frames = 0
        self._pending: tuple[int, int, torch.Tensor] | None = None
        self.pinned: frozenset = frozenset()  # frames never evicted besides the sink (a multi-shot sink)

    def _runs(self, slots) -> list[tuple[int, int]]:
        """Token ranges (start, stop) of ``slots`` in that order, neighbouring slots joined: what a read or write
        of those frames touches, as slices (no index tensor made on the host per call)."""
        tpf = self.tokens_per_frame
        runs: list[tuple[int, int]] = []
        for s in slots:
            if runs and runs[-1][1] == s * tpf:
                runs[-1] = (runs[-1][0], (s + 1) * tpf)
            else:
                runs.append((s * tpf, (s + 1) * tpf))
        return runs

    def _take_slot(self, layer: int, frame: int) -> int:
        slots = self.slot_frame[layer]
        if frame in slots:
            return slots.index(frame)
        if -1 in slots:
            return slots.index(-1)
        candidates = [(f, s) for s, f in enumerate(slots) if f >= self.sink_frames and f not in self.pinned]
        if not candidates:
            raise FastARError(f"the {self.policy} cache is full of sink frames; raise its capacity")
        _, slot = min(candidates)
        if layer == 0:
            self.evicted_frames += 1
        slots[slot] = -1
        return slot

    def prepare_commit(self, frame_start: int, num_frames: int, positions=None) -> None:
        self._pending = (frame_start, num_frames, self.pass_positions(frame_start, num_frames, positions))

    def pin(self, frames) -> None:
        """Protect these frames from eviction from now on, in place of those pinned before."""
        self.pinned = frozenset(frames)

    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        assert self._pending is not None, "commit outside a clean pass (prepare_commit first)"
        frame_start, num_frames, positions = self._pending
        frames = range(frame_start, frame_start + num_frames)
        room = self.capacity_frames - sum(1 for f in self.slot_frame[layer] if 0 <= f < self.sink_frames
                                          and f not in frames)
        kept = list(frames)
        if num_frames > room:
            # More frames than the cache holds (a recache re-encodes a whole window in one pass): the sink frames
            # among them (a recache from frame 0 re-encodes the sink too) and the newest stay.
            sink_here = [f for f in frames if f < self.sink_frames]
            kept = sink_here + kept[num_frames - max(0, room - len(sink_here)):]
        slots: list[int] = []
        for f in kept:
            slot = self._take_slot(layer, f)
            if slot in slots:
                raise FastARError(f"a clean pass of {num_frames} frames does not fit the {self.policy} cache of "
                                  f"{self.capacity_frames} frames ({self.sink_frames} of them sink)")
            self.slot_frame[layer][slot] = f  # reserve now so the chunk's next frame takes another slot
            slots.append(slot)
        if self.rotated_keys:
            k = rotate(k, positions[None], self.rope.ensure(span_of(frame_start + num_frames, *self.grid_hw)))
        k, v = (k, v) if self.kv_quant == "int8" else (k.to(self.dtype), v.to(self.dtype))
        if self.kv_quant == "int8":
            (k, k_scale), (v, v_scale) = quantize_int8(k), quantize_int8(v)
        tpf = self.tokens_per_frame
        # Source tokens of each kept frame, then slices: runs of frames that are neighbours in both.
        pairs = [((f - frame_start) * tpf, slot * tpf) for f, slot in zip(kept, slots)]
        for src, dst, n in _joined_runs(pairs, tpf):
            self.k[layer][:, :, dst:dst + n].copy_(k[:, :, src:src + n])
            self.v[layer][:, :, dst:dst + n].copy_(v[:, :, src:src + n])
            if self.kv_quant == "int8":
                assert self.k_scale is not None and self.v_scale is not None
                self.k_scale[layer][:, :, dst:dst + n].copy_(k_scale[:, :, src:src + n])
                self.v_scale[layer][:, :, dst:dst + n].copy_(v_scale[:, :, src:src + n])
            self.positions[layer, dst:dst + n].copy_(positions[src:src + n])
            self.bias[layer, dst:dst + n].fill_(0.0)
        self.high_water[layer] = max(self.high_water[layer], max(slots) + 1)
        self.versions[layer] += 1

    def finish_commit(self) -> None:
        self._pending = None

    def rewind(self, frame: int) -> None:
        first = frame if frame <= 0 else max(frame, self.sink_frames)  # from frame 0, the sink goes too
        for layer in range(self.num_layers):
            self.versions[layer] += 1
            for slot, f in enumerate(self.slot_frame[layer]):
                if f >= first:
                    self.slot_frame[layer][slot] = -1
                    self.bias[layer, slot * self.tokens_per_frame:(slot + 1) * self.tokens_per_frame].fill_(
                        float("-inf"))

    def reset(self) -> None:
        """Empty every layer, as a fresh cache (Krea's rebuild, CausVid's restart): nothing is read from before."""
        for layer in range(self.num_layers):
            self.versions[layer] += 1
            self.slot_frame[layer] = [-1] * self.capacity_frames
            self.high_water[layer] = 0
        self.bias.fill_(float("-inf"))

    def _read(self, layer: int, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``tokens`` (a slice, or token ranges joined in order) in the cache's dtype: the stored tensors
        themselves (one range is a view), or int8 ones dequantized into a fresh copy."""
        def take(t):
            return t[:, :, tokens] if isinstance(tokens, slice) else _gather_runs(t, tokens, 2)

        if self.kv_quant != "int8":
            return take(self.k[layer]), take(self.v[layer])
        assert self.k_scale is not None and self.v_scale is not None
        return (dequantize_int8(take(self.k[layer]), take(self.k_scale[layer]), self.dtype),
                dequantize_int8(take(self.v[layer]), take(self.v_scale[layer]), self.dtype))

    def _live_slots(self, layer: int = 0) -> list[int]:
        return [s for s, f in enumerate(self.slot_frame[layer]) if f >= 0]

    def _select(self, layer: int, frames_and_slots, n_sink_frames: int) -> CacheView:
        """A view of the given (frame, slot) entries, in that order (sink first): slices of the cache where the
        slots are neighbours, joined where they are not (no index tensor)."""
        runs = self._runs([s for _, s in frames_and_slots])
        k, v = self._read(layer, runs)
        n = len(frames_and_slots) * self.tokens_per_frame
        return CacheView(
            k=k, v=v, bias=self.zero_bias[:, :, :n], positions=_gather_runs(self.positions[layer], runs, 0)[None],
            n_sink=n_sink_frames * self.tokens_per_frame, uniform=True, version=self.versions[layer],
            rotated=self.rotated_keys,
        )

    def _held(self, layer: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """(frame, slot) of the held frames in [lo, hi), oldest first. Empty slots (frame -1) are never held, even
        when ``lo`` is negative: Rolling Forcing's clean pass asks for the ``attend`` frames ending with its chunk
        before that many exist, and reads the frames so far, not zero keys."""
        return sorted((f, s) for s, f in enumerate(self.slot_frame[layer]) if f >= 0 and lo <= f < hi)

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        live = self._live_slots(layer)
        if not live:
            return None
        n_sink = sum(1 for f in self.slot_frame[layer] if 0 <= f < self.sink_frames) * self.tokens_per_frame
        end = self.high_water[layer] * self.tokens_per_frame
        k, v = self._read(layer, slice(0, end))
        # Slots past the high-water mark hold nothing live (a commit takes the lowest free slot, a rewind frees
        # slots below it): lent to attention as scratch for the chunk's own keys, where stored as read.
        lend = self.rotated_keys and self.kv_quant == "none" and end < self.k[layer].shape[2]
        return CacheView(
            k=k, v=v, bias=self.bias[layer, :end][None, None],
            positions=self.positions[layer, :end][None], n_sink=n_sink, uniform=len(live) == self.high_water[layer],
            version=self.versions[layer], rotated=self.rotated_keys,
            room=(self.k[layer], self.v[layer]) if lend else None,
        )

    @staticmethod
    def _token_bytes(num_layers, batch, num_heads, head_dim, dtype, kv_quant: str = "none") -> int:
        """Bytes per cached token over every layer: k and v (int8: with a float32 scale per head each), three
        int64 positions and a float32 bias."""
        if kv_quant == "int8":
            per_layer = 2 * batch * num_heads * (head_dim + 4)
        else:
            per_layer = 2 * batch * num_heads * head_dim * element_size(dtype)
        return (per_layer + 3 * 8 + 4) * num_layers

    def _bytes_per_token(self) -> int:
        return self._token_bytes(self.num_layers, self.batch, self.num_heads, self.head_dim, self.dtype,
                                 self.kv_quant)

    @classmethod
    def planned_bytes(cls, spec, shape: CacheShape, total_frames: int) -> int:
        frames = cls.allocated_frames(spec, total_frames, shape.frames_per_block)
        tokens = frames * shape.grid_hw[0] * shape.grid_hw[1]
        return tokens * cls._token_bytes(shape.num_layers, shape.batch, shape.num_heads, shape.head_dim, shape.dtype,
                                         getattr(spec, "kv_quant", "none"))

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


def _joined_runs(pairs, tpf: int):
    """(source, destination, tokens) copies for frames given as (source token, destination token) pairs: neighbours
    in both join into one copy."""
    runs: list[list[int]] = []
    for src, dst in pairs:
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            runs[-1][2] += tpf
        else:
            runs.append([src, dst, tpf])
    return [tuple(r) for r in runs]


def _gather_runs(t: torch.Tensor, runs, dim: int) -> torch.Tensor:
    """The token ranges ``runs`` of ``t`` along ``dim``, in order: a view for one range, one join for several."""
    pieces = [t.narrow(dim, a, b - a) for a, b in runs]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


class WindowCache(DenseKVCache):
    """LongLive's local attention: a chunk attends to ``window_frames`` latent frames in all, the sink frames and
    the chunk itself included (its ``local_attn_size``; 12 with a 3-frame sink for LongLive 1.0)."""

    policy = "window"
    size_fields = ("sink_frames", "window_frames")
    keeps_sink = True

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> WindowCache:
        return cls(**vars(shape), capacity_frames=cls.allocated_frames(spec, total_frames, shape.frames_per_block),
                   sink_frames=spec.sink_frames, attend_frames=spec.window_frames, kv_quant=spec.kv_quant)

    @classmethod
    def describe(cls, spec) -> str:
        return f"window ({spec.window_frames} frames attended, sink {spec.sink_frames} and the chunk included)"

    @classmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        # What a full chunk reads back: the sink and window_frames - sink - chunk recent frames.
        return spec.window_frames - frames_per_block

    @classmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        return min(committed, spec.window_frames - frames_per_block)

    @classmethod
    def recache_start(cls, spec, frame_start: int, frames: int) -> int:
        # At most the frames a chunk attends (local_attn_size); once clear of frame 0, no more than the window holds
        # besides the sink.
        frames = min(frames, spec.window_frames)
        if frame_start - frames <= 0:
            return 0
        return super().recache_start(spec, frame_start, min(frames, spec.window_frames - cls.sink(spec)))

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        if spec.window_frames < spec.sink_frames + frames_per_block or spec.window_frames < 2:
            raise FastARError(
                f"window_frames ({spec.window_frames}) counts every frame a chunk attends to, the sink and the "
                f"chunk itself included (LongLive's local_attn_size): it must be at least sink_frames + "
                f"frames_per_block ({spec.sink_frames} + {frames_per_block}) and at least 2"
            )

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        if not self._live_slots(layer):
            return None
        sink = self._held(layer, 0, self.sink_frames)
        recent = self._held(layer, self.sink_frames, query_start)
        budget = max(0, (self.attend_frames or self.capacity_frames) - len(sink) - query_frames)
        recent = recent[max(0, len(recent) - budget):] if budget else []
        return self._select(layer, sink + recent, len(sink))


class GlobalCache(DenseKVCache):
    """Every committed frame, sized for the whole rollout up front (fails before the first chunk, not halfway)."""

    policy = "global"

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> GlobalCache:
        return cls(**vars(shape), capacity_frames=total_frames, sink_frames=0, kv_quant=spec.kv_quant)

    @classmethod
    def describe(cls, spec) -> str:
        return "global (every frame kept)"

    @classmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        return total_frames

    @classmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        return committed

    def prepare_commit(self, frame_start: int, num_frames: int, positions=None) -> None:
        if frame_start + num_frames > self.capacity_frames:
            raise FastARError(
                f"the global cache was sized for {self.capacity_frames} frames; frame {frame_start + num_frames - 1} "
                "does not fit"
            )
        super().prepare_commit(frame_start, num_frames, positions)


class RollingCache(DenseKVCache):
    """Rolling Forcing's cache: ``rolling_capacity`` frames kept, at most ``rolling_attend`` attended."""

    policy = "rolling"
    size_fields = ("sink_frames", "rolling_capacity", "rolling_attend")
    keeps_sink = True

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> RollingCache:
        return cls(**vars(shape), capacity_frames=spec.rolling_capacity, sink_frames=spec.sink_frames,
                   attend_frames=spec.rolling_attend, kv_quant=spec.kv_quant)

    @classmethod
    def describe(cls, spec) -> str:
        return f"rolling (sink {spec.sink_frames}, capacity {spec.rolling_capacity}, attend {spec.rolling_attend})"

    @classmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        return spec.rolling_capacity

    @classmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        # A chunk of frames_per_block queries: rolling_attend frames in all, the queries included, in the
        # denoising passes (sink + working frames) and in the clean pass (the most recent frames) alike.
        return min(committed, spec.rolling_attend - frames_per_block, spec.rolling_capacity)

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        if spec.rolling_attend <= spec.sink_frames + frames_per_block:
            raise FastARError(
                f"rolling_attend ({spec.rolling_attend}) must exceed sink ({spec.sink_frames}) plus one block "
                f"({frames_per_block})"
            )

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        """Denoising: sink + the most recent working frames, within ``attend_frames`` including the queries.
        Clean pass (a commit is pending): the most recent ``attend_frames`` frames ending with the chunk, the
        sink included, at its true position, only while it falls inside them (Rolling Forcing's
        ``updating_cache`` branch, which its training uses too)."""
        if not self._live_slots(layer):
            return None
        attend = self.attend_frames or self.capacity_frames
        if self._pending is not None:
            span = self._held(layer, query_start + query_frames - attend, query_start)
            return self._select(layer, span, sum(1 for f, _ in span if f < self.sink_frames))
        sink = self._held(layer, 0, self.sink_frames)
        working = self._held(layer, self.sink_frames, query_start)
        budget = max(0, attend - len(sink) - query_frames)
        working = working[max(0, len(working) - budget):] if budget else []
        view = self._select(layer, sink + working, len(sink))
        if sink:
            # Rolling Forcing keeps the sink un-RoPE'd and places it right before the working frames. The view may
            # be slices of the cache itself: the moved sink goes into copies.
            first_after_sink = working[0][0] if working else query_start
            shift = first_after_sink - len(sink) - sink[0][0]
            n = len(sink) * self.tokens_per_frame
            if shift:
                view.positions = view.positions.clone()
                view.positions[0, :n, 0] += shift
            if self.rotated_keys and shift:  # the sink keys rotated on by the shift, in a copy
                by = chunk_positions(shift, 1, 1, 1, self.device).expand(1, n, 3)
                moved = rotate(view.k[:, :, :n], by, self.rope.ensure(span_of(shift, *self.grid_hw)))
                view.k = torch.cat([moved, view.k[:, :, n:]], dim=2)
        return view


class RecomputeCache(DenseKVCache):
    """Krea Realtime's KV recompute (``release_server.py``: ``get_clean_context_frames``,
    ``recompute_kv_cache``): before every chunk the cache is emptied and rebuilt by clean passes, block-causal
    in chunks, over a context of ``window_frames - frames_per_block`` frames (Krea's ``kv_cache_num_frames``)
    placed at positions 0.., and the chunk is denoised at the position right after it; no clean pass follows
    the chunk. The context is the ``sink_frames`` first frames (Krea's ``keep_first_frame`` is 1) and the most
    recent frames. With sink 0 (``keep_first_frame`` off, its server's default) it is Krea's other rule: once a
    chunk starts ``frames_per_block`` or more frames past the context, the oldest context frame is replaced by
    the VAE re-encode of its last decoded pixel frame (``reencoded_frame``); before that, frame 0 stays first."""

    policy = "recompute"
    rebuilds_each_chunk = True
    size_fields = ("sink_frames", "window_frames")

    def __init__(self, *, window_frames: int, anchor_frames: int, **shape):
        super().__init__(**shape, capacity_frames=window_frames, sink_frames=0)
        self.window_frames = window_frames
        self.anchor_frames = anchor_frames

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> RecomputeCache:
        return cls(window_frames=spec.window_frames, anchor_frames=spec.sink_frames, kv_quant=spec.kv_quant,
                   **vars(shape))

    @classmethod
    def describe(cls, spec) -> str:
        return (f"recompute (rebuilt before every chunk from {spec.sink_frames} first + the most recent frames; "
                f"{spec.window_frames} frames attended, the chunk included)")

    @classmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        return spec.window_frames

    @classmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        return cls.rebuilt_frames(spec, committed, frames_per_block)

    @classmethod
    def rebuilt_frames(cls, spec, frame_start: int, frames_per_block: int) -> int:
        return min(frame_start, spec.window_frames - frames_per_block)

    @classmethod
    def recache_start(cls, spec, frame_start: int, frames: int) -> int:
        return frame_start  # rebuilt under the new prompt before every chunk anyway

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        context = spec.window_frames - frames_per_block
        if context < 1 or spec.sink_frames >= context:
            raise FastARError(
                f"the recompute cache attends to window_frames ({spec.window_frames}) frames: a context of "
                f"window_frames - frames_per_block ({context}) frames, which must be at least 1 and more than "
                f"sink_frames ({spec.sink_frames}), plus the chunk"
            )

    @classmethod
    def vae_needed(cls, spec) -> str | None:
        if spec.sink_frames == 0:
            return ("the recompute cache with sink_frames 0 is Krea's keep_first_frame off, which re-encodes a "
                    "decoded frame through the VAE")
        return None

    def context_frames(self, frame_start: int, frames_per_block: int) -> list[int]:
        """The latent frames the cache is rebuilt from before the chunk starting at ``frame_start``
        (``get_clean_context_frames``: frame 0 first while ``frame_start`` is under the context plus one chunk,
        and always with ``keep_first_frame``)."""
        size = self.window_frames - frames_per_block
        if frame_start <= size:
            return list(range(frame_start))
        anchor = self.anchor_frames if self.anchor_frames or frame_start >= size + frames_per_block else 1
        return list(range(anchor)) + list(range(frame_start - (size - anchor), frame_start))

    def reencoded_frame(self, frame_start: int, frames_per_block: int) -> int | None:
        """The context frame (the first of ``context_frames``) that Krea replaces by the VAE re-encode of its last
        decoded pixel frame, or None: with sink 0, once ``frame_start`` is the context plus a chunk or more
        (its ``(block_idx - 1) * num_frame_per_block >= kv_cache_num_frames``)."""
        size = self.window_frames - frames_per_block
        if self.anchor_frames or frame_start < size + frames_per_block:
            return None
        return frame_start - size
