"""TempCache: a KV cache bounded by merging temporally corresponding keys.

After each chunk's clean pass, per layer (and per head by default), each new pre-RoPE key is matched to the
cache's representative keys (top-1 cosine: exact, or quantized with exact rescoring; ``matching.py``). At
``cos >= threshold`` it joins that group: count += 1, the value becomes the running mean, the representative key
and its position become the newest (``last``, the paper's choice; ``mean`` as an option). Otherwise it is
inserted as a new group. Attention then adds ``log(count)`` to each group's logit, which is exact for identical
keys at identical positions (Lemma 5.1).

Time (RoPE). Keys are cached before RoPE and rotated at attention time by their position relative to the
query, so merging is exact only for identical keys at identical positions. Two copies of one content at
different times are different keys to a later query (Wan gives 44 of 128 head dims to time), and a group
answers with one position for all its members. Three settings account for it: ``similarity = "rotated"``
compares keys after RoPE, each at its own position (content that moved in time or space then scores lower);
``max_spread_frames`` closes a group to new members once they would lie further than that from its oldest
member; ``position = "weighted"`` places the group at its members' count-weighted mean time instead of the
newest member's. And ``merge_when = "full"`` inserts keys as plain entries while the cache has room for the
whole chunk and merges only once it has not, so a rollout shorter than the capacity is exactly dense.

A hard capacity (tokens, sink included) is allocated once per rollout; when full, the least recently updated
groups are evicted. Sink frames are never merged nor evicted, and a chunk's tokens are never merged into each
other (only into groups that existed before the chunk).

Written for a GPU: a commit and a view read nothing back to the host and make no shape from data. Every decision
(merge or insert, which slot, which group to evict) is a masked write into the preallocated slots; the counts of
merges, inserts and evictions are tensors, read only when reported. How far into the slots the view and the search
go is known on the host without looking: at most to ``reach`` (the sink's slots and one slot per key inserted so
far, since an insert takes the lowest free slot), and, once a chunk's report has read it with its other figures
(``report_figures``: no read of its own), to the highest slot used so far, which it stays at until the next
commit. Slots in that range without a group are empty (count 0, bias -inf); while merging keeps the cache below
its capacity, the report's mark spares attention the empty slots the bound would cover.
"""

from __future__ import annotations

import torch

from ..errors import FastARError
from ..model.rope import RopeTables, rotate, span_of
from .base import CacheShape, CacheView, Figure, KVCache, check_fits, element_size, read_figures
from .matching import SEARCH_DTYPE, SEARCH_MARGIN, exact_top1, quantized_top1, search_form
from .quant import KV_QUANTS, dequantize_int8, quantize_int8

# Equal keys can differ in the last bits after normalisation; a threshold of 1.0 must still merge them.
COSINE_SLACK = 1e-6


class TempCache(KVCache):
    policy = "tempcache"
    size_fields = ("sink_frames", "tempcache")
    keeps_sink = True

    def __init__(self, settings, sink_frames, num_layers, batch, num_heads, head_dim, grid_hw, dtype=torch.float32,
                 device="cpu", frames_per_block=1, rotated_keys=False, kv_quant="none"):
        """``settings``: a ``TempCacheSettings`` (threshold, capacity, representative, scope, matcher).

        Merging compares content, so the exact search needs every representative before RoPE, and that is how keys
        are kept. The quantized search keeps its own pre-RoPE copy (``search``) and rescores only a few entries,
        so with it, where attention asks for ``rotated_keys``, the keys are stored rotated at their group's
        position, written when the group is made or changes: no chunk re-rotates the cache (``keys_rotated``)."""
        super().__init__(num_layers, batch, num_heads, head_dim, grid_hw, dtype, device)
        if kv_quant not in KV_QUANTS:
            raise FastARError(f"kv_quant {kv_quant!r} is not one of {', '.join(KV_QUANTS)}")
        self.kv_quant = kv_quant
        self.settings = settings
        self.sink_frames = sink_frames
        self.sink_tokens = sink_frames * self.tokens_per_frame
        self.capacity = settings.capacity_frames * self.tokens_per_frame
        if self.capacity <= self.sink_tokens:
            raise FastARError(f"TempCache capacity ({settings.capacity_frames} frames) must exceed the sink "
                              f"({sink_frames} frames)")
        # One extra slot at the end is a write-only sink for masked scatters; it is never read.
        C = self.capacity + 1
        B, H, D = batch, num_heads, head_dim
        check_fits(self.device, self.allocated_bytes(), f"TempCache with {settings.capacity_frames} frames' capacity")
        stored = torch.int8 if kv_quant == "int8" else dtype
        self.k = [torch.zeros(B, H, C, D, dtype=stored, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(B, H, C, D, dtype=stored, device=self.device) for _ in range(num_layers)]
        # int8: a float32 scale per group slot and head for each of K and V (see dense.quantize_int8)
        self.k_scale = ([torch.zeros(B, H, C, 1, device=self.device) for _ in range(num_layers)]
                        if kv_quant == "int8" else None)
        self.v_scale = ([torch.zeros(B, H, C, 1, device=self.device) for _ in range(num_layers)]
                        if kv_quant == "int8" else None)
        self.count = [torch.zeros(B, H, C, device=self.device) for _ in range(num_layers)]
        self.pos = [torch.zeros(B, H, C, 3, dtype=torch.long, device=self.device) for _ in range(num_layers)]
        self.updated = [torch.zeros(B, H, C, dtype=torch.long, device=self.device) for _ in range(num_layers)]
        # Only where a setting needs them: the oldest member's frame, and the sum of the members' frames.
        self.first = ([torch.zeros(B, H, C, dtype=torch.long, device=self.device) for _ in range(num_layers)]
                      if settings.max_spread_frames else None)
        self.t_sum = ([torch.zeros(B, H, C, dtype=torch.float64, device=self.device) for _ in range(num_layers)]
                      if settings.position == "weighted" else None)
        # Slots [0, reach) may hold groups: the sink's, then one per key ever inserted (host-known, never read).
        self.reach = [0] * num_layers
        # One past the highest slot ever used, on the device (updated by every write), and the value the last
        # report read with the layer's version then: the view's length while the layer has not changed since.
        self.high_water_t = torch.zeros(num_layers, dtype=torch.long, device=self.device)
        self.read_high_water: list = [None] * num_layers
        self.inserted_keys = [0] * num_layers  # non-sink keys committed (each was merged or took a slot)
        # Merges, inserts and evictions per layer (per batch entry and head), counted on the device.
        self.tallies = torch.zeros(3, num_layers, dtype=torch.long, device=self.device)
        # Tokens that left with evicted groups, per (batch, head): live counts + these = tokens committed.
        self.evicted_tokens = [torch.zeros(B, H, device=self.device) for _ in range(num_layers)]
        self.rope: RopeTables = RopeTables(D, self.device)
        self._pending = None
        # The quantized search's copy of every representative, written when the group is made or changes
        # (zero for the sink and empty slots, which then never reach a positive threshold).
        self.search = ([torch.zeros(B, H, C, D, dtype=SEARCH_DTYPE, device=self.device) for _ in range(num_layers)]
                       if self._searches(settings, self.device) else None)
        # Rotated storage needs a group's attention position to be its newest member's, whose key it keeps.
        self.keys_rotated = bool(rotated_keys and self.search is not None and kv_quant == "none"
                                 and settings.representative == "last" and settings.position == "newest")
        self._bias: list = [None] * num_layers  # (version, log-count bias) of each layer's last view

    # -- what the device counted (read only when reported) ----------------------------------------------------
    @property
    def merges(self) -> list[int]:
        return self.tallies[0].tolist()

    @property
    def inserted(self) -> list[int]:
        return self.tallies[1].tolist()

    @property
    def evictions(self) -> list[int]:
        return self.tallies[2].tolist()

    @property
    def high_water(self) -> list[int]:
        """Per layer, one past the highest slot ever used (read from the device: for tests and reports)."""
        return self.high_water_t.tolist()

    def report_figures(self) -> dict:
        """Read with a chunk's report: the high-water mark of every layer (``take_report`` keeps it)."""
        return {"high_water": self.high_water_t}

    def take_report(self, figures: dict) -> None:
        for layer, mark in enumerate(figures["high_water"]):
            self.read_high_water[layer] = (self.versions[layer], int(mark))

    def _length(self, layer: int) -> int:
        """Slots the view and the search cover: the high-water mark the last report read, while the layer is as it
        was then; else the host's bound."""
        read = self.read_high_water[layer]
        if read is not None and read[0] == self.versions[layer]:
            return read[1]
        return self.reach[layer]

    @classmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> TempCache:
        return cls(spec.tempcache, spec.sink_frames, **vars(shape), kv_quant=spec.kv_quant)

    @classmethod
    def describe(cls, spec) -> str:
        t = spec.tempcache
        return (f"tempcache (sink {spec.sink_frames}, capacity {t.capacity_frames} frames, threshold "
                f"{t.threshold}, matcher {t.matcher}{', groups are places' if t.same_place else ''})")

    @classmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        return spec.tempcache.capacity_frames

    @classmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        return min(committed, spec.tempcache.capacity_frames)

    @classmethod
    def matched_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        return max(0, cls.attended_frames(spec, committed, frames_per_block) - spec.sink_frames)

    @staticmethod
    def _slot_bytes(settings, head_dim: int, dtype, kv_quant: str = "none", device="cpu") -> int:
        """Bytes per group slot: k, v (int8: with a float32 scale each), count, position, last update, and the
        optional oldest/sum of times."""
        extra = 8 * (bool(settings.max_spread_frames) + (settings.position == "weighted"))
        search = head_dim * element_size(SEARCH_DTYPE) if TempCache._searches(settings, device) else 0
        kv = 2 * (head_dim + 4) if kv_quant == "int8" else 2 * head_dim * element_size(dtype)
        return kv + 4 + 3 * 8 + 8 + extra + search

    @classmethod
    def planned_bytes(cls, spec, shape: CacheShape, total_frames: int) -> int:
        slots = spec.tempcache.capacity_frames * shape.grid_hw[0] * shape.grid_hw[1] + 1  # + the trash slot
        return shape.num_layers * shape.batch * shape.num_heads * slots * cls._slot_bytes(
            spec.tempcache, shape.head_dim, shape.dtype, getattr(spec, "kv_quant", "none"), shape.device)

    @classmethod
    def check_spec(cls, spec, frames_per_block: int) -> None:
        spec.tempcache.validate()
        if spec.tempcache.capacity_frames < spec.sink_frames + frames_per_block:
            raise FastARError(f"TempCache capacity_frames = {spec.tempcache.capacity_frames} is too small: it must "
                              f"be >= sink_frames + one chunk = {spec.sink_frames + frames_per_block} frames")

    @staticmethod
    def _searches(settings, device="cpu") -> bool:
        """Whether the quantized search runs: it compares content keys per head against every group. Rotated keys
        change with the query's position, a shared scope compares concatenated heads and ``same_place`` allows each
        key its own groups, so those keep the exact search."""
        return (settings.resolved_matcher(device) == "quantized" and settings.similarity == "content"
                and not settings.same_place and settings.merge_scope == "head"
                and settings.threshold - COSINE_SLACK > SEARCH_MARGIN)

    # -- matching -------------------------------------------------------------------------------------------
    def _top1(self, layer, new_k, reps, valid, lo, tables, place=None):
        """Top-1 of ``new_k`` among ``reps``, the slots from ``lo`` on (``valid``: which may take members;
        ``place [B,H,N,M]``: which are at each new key's place, with ``same_place``); the index counts from ``lo``."""
        if place is not None:
            valid = valid[:, :, None, :] & place
        if self.search is not None:
            hi = lo + reps.shape[2]
            search = self.search[layer][:, :, lo:hi]
            if self.settings.merge_when == "full" or self.settings.max_spread_frames:  # candidates beyond the form's
                search = search * valid[..., None].to(search.dtype)
            return quantized_top1(new_k, search, reps, self.settings.threshold - COSINE_SLACK,
                                  candidates=self.settings.matcher_candidates, b_valid=valid,
                                  b_positions=self.pos[layer][:, :, lo:hi] if self.keys_rotated else None,
                                  tables=tables)
        if self.settings.merge_scope == "shared":
            # Mean cosine over heads = cosine of the concatenation of per-head unit vectors.
            def flat(x):
                x = x.float() / x.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
                b, h, n, d = x.shape
                return x.transpose(1, 2).reshape(b, 1, n, h * d)

            idx, sim = exact_top1(flat(new_k), flat(reps), valid.all(dim=1, keepdim=True))  # heads agree
            H = self.num_heads
            return idx.expand(-1, H, -1), sim.expand(-1, H, -1)
        if self.settings.threshold > COSINE_SLACK and place is None:
            # A merge needs a cosine of at least the threshold, above 0, which an excluded entry zeroed out
            # (cosine 0) can never reach: the same merges as masking it to -inf, without a mask over the scores.
            return exact_top1(new_k, reps * valid[..., None].to(reps.dtype))
        return exact_top1(new_k, reps, valid)

    # -- writing --------------------------------------------------------------------------------------------
    def prepare_commit(self, frame_start: int, num_frames: int, positions=None) -> None:
        self._pending = (frame_start, num_frames, self.pass_positions(frame_start, num_frames, positions))

    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.kv_quant != "int8":
            return self._commit(layer, k, v)
        # int8: this layer's groups in the cache's dtype while the chunk merges into them, then stored again. A
        # group left alone comes back with the same int8 values and scale (its largest entry is +-127 x scale).
        assert self.k_scale is not None and self.v_scale is not None
        stored = self.k[layer], self.v[layer]
        self.k[layer] = dequantize_int8(stored[0], self.k_scale[layer], self.dtype)
        self.v[layer] = dequantize_int8(stored[1], self.v_scale[layer], self.dtype)
        try:
            self._commit(layer, k, v)
        finally:
            for store, scale, x, keep in ((self.k, self.k_scale, self.k[layer], stored[0]),
                                          (self.v, self.v_scale, self.v[layer], stored[1])):
                q, x_scale = quantize_int8(x)
                keep.copy_(q)
                scale[layer].copy_(x_scale)
                store[layer] = keep

    def _kv(self, layer: int, hw: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``hw`` slots' K and V in the cache's dtype (int8 ones dequantized into a copy)."""
        if self.kv_quant != "int8":
            return self.k[layer][:, :, :hw], self.v[layer][:, :, :hw]
        assert self.k_scale is not None and self.v_scale is not None
        return (dequantize_int8(self.k[layer][:, :, :hw], self.k_scale[layer][:, :, :hw], self.dtype),
                dequantize_int8(self.v[layer][:, :, :hw], self.v_scale[layer][:, :, :hw], self.dtype))

    def _commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.versions[layer] += 1
        frame_start, num_frames, positions = self._pending
        tpf = self.tokens_per_frame
        tables = self.rope.ensure(span_of(frame_start + num_frames, *self.grid_hw))
        k, v = k.to(self.dtype), v.to(self.dtype)
        frame = frame_start + num_frames - 1
        # The chunk's first frames that fall in the sink (known on the host): written to their own slots.
        n_sink = max(0, min(num_frames, self.sink_frames - frame_start)) * tpf
        if n_sink:
            slots = slice(frame_start * tpf, frame_start * tpf + n_sink)
            self._write(layer, slots, k[:, :, :n_sink], v[:, :, :n_sink], positions[:n_sink], frame, tables)
            self.reach[layer] = max(self.reach[layer], slots.stop)
            self.high_water_t[layer].clamp_(min=slots.stop)
        if n_sink < k.shape[2]:
            self._merge_or_insert(layer, k[:, :, n_sink:], v[:, :, n_sink:], positions[n_sink:], frame, tables)

    def _write(self, layer, slots: slice, k, v, positions, frame, tables):
        """Plain writes of sink tokens (same slots for every batch and head)."""
        self.k[layer][:, :, slots].copy_(rotate(k, positions[None], tables) if self.keys_rotated else k)
        self.v[layer][:, :, slots].copy_(v)
        self.count[layer][:, :, slots].fill_(1.0)
        self.pos[layer][:, :, slots].copy_(positions.expand(*self.pos[layer].shape[:2], -1, -1))
        self.updated[layer][:, :, slots].fill_(frame)
        if self.first is not None:
            self.first[layer][:, :, slots].copy_(positions[:, 0].expand(*self.first[layer].shape[:2], -1))
        if self.t_sum is not None:
            self.t_sum[layer][:, :, slots].copy_(positions[:, 0].double().expand(*self.t_sum[layer].shape[:2], -1))

    def _merge_or_insert(self, layer, k_new, v_new, positions, frame, tables):
        B, H, N, D = k_new.shape
        C = self.capacity
        K, V, count, pos, upd = self.k[layer], self.v[layer], self.count[layer], self.pos[layer], self.updated[layer]
        hw = self._length(layer)
        # The sink never takes members: only slots from ``lo`` on are searched (a seventh of the entries for
        # the benches' 3-frame sink in 21 frames).
        lo = min(self.sink_tokens, hw)
        candidates = count[:, :, lo:hw] > 0
        if self.settings.merge_when == "full":  # room for the whole chunk as plain entries: merge nothing yet
            room = (count[:, :, self.sink_tokens:C] == 0).sum(-1) >= N
            candidates &= ~room[..., None]
        if self.first is not None:  # groups whose oldest member is too far back take no one new
            candidates &= frame - self.first[layer][:, :, lo:hw] <= self.settings.max_spread_frames
        k_cmp, reps = k_new, K[:, :, lo:hw]
        if self.settings.similarity == "rotated" and hw > lo:
            k_cmp = rotate(k_new, positions[None], tables)
            reps = rotate(reps, self._attention_positions(layer, hw)[:, :, lo:], tables)

        place = None
        if self.settings.same_place:  # [B, H, N, M]: the groups at each new key's (h, w)
            place = (pos[:, :, None, lo:hw, 1:] == positions[None, None, :, None, 1:]).all(-1)
        idx, sim = self._top1(layer, k_cmp, reps, candidates, lo, tables, place)
        idx = idx + lo
        accept = sim >= self.settings.threshold - COSINE_SLACK
        trash = torch.full_like(idx, C)
        # What the cache stores of each new key: as it is, or rotated at its position (``keys_rotated``).
        k_store = rotate(k_new, positions[None], tables) if self.keys_rotated else k_new
        if hw > lo:  # nothing to merge into before the first non-sink commit
            self._merge(layer, k_new, v_new, positions, frame, torch.where(accept, idx, trash), accept, k_store)

        # Inserts: empty slots first, then the least recently updated groups; never the sink.
        insert = ~accept
        live = count[:, :, :C] > 0
        # Stable sort: equal priorities keep slot order, so inserts take the lowest free slots.
        priority = torch.where(live, upd[:, :, :C], -1)
        priority[:, :, : self.sink_tokens].fill_(torch.iinfo(torch.long).max)
        free_order = torch.sort(priority, dim=-1, stable=True).indices
        rank = insert.long().cumsum(dim=-1) - 1
        dest = torch.where(insert, free_order.gather(2, rank.clamp_min(0)), trash)
        if N > C - self.sink_tokens and int(insert.sum(dim=-1).max()) > C - self.sink_tokens:
            # Only a pass of more keys than the slots beside the sink (a recache) can get here: the host reads.
            raise FastARError(f"TempCache capacity ({self.settings.capacity_frames} frames) cannot take a chunk of "
                              f"{N // self.tokens_per_frame} frames beside the sink")
        old_count = count.gather(2, dest)
        evicted = (old_count > 0) & insert
        self.tallies[:, layer] += torch.stack([accept.sum(), insert.sum(), evicted.sum()]) // (B * H)
        self.evicted_tokens[layer] += (old_count * evicted).sum(-1)
        dest4 = dest[..., None]
        K.scatter_(2, dest4.expand(-1, -1, -1, D), k_store)
        V.scatter_(2, dest4.expand(-1, -1, -1, D), v_new)
        count.scatter_(2, dest, 1.0)
        pos.scatter_(2, dest4.expand(-1, -1, -1, 3), positions.expand(B, H, N, 3))
        upd.scatter_(2, dest, frame)
        if self.search is not None:
            self.search[layer].scatter_(2, dest4.expand(-1, -1, -1, D), search_form(k_new))
        if self.first is not None:
            self.first[layer].scatter_(2, dest, positions[:, 0].expand(B, H, N))
        if self.t_sum is not None:
            self.t_sum[layer].scatter_(2, dest, positions[:, 0].double().expand(B, H, N))
        # The trash slot absorbed masked writes; keep it empty.
        count[:, :, C].fill_(0.0)
        self.high_water_t[layer] = torch.maximum(self.high_water_t[layer], dest.masked_fill(~insert, -1).max() + 1)
        self.inserted_keys[layer] += N
        self.reach[layer] = max(self.reach[layer], min(C, self.sink_tokens + self.inserted_keys[layer]))

    def _merge(self, layer, k_new, v_new, positions, frame, target, accept, k_store):
        """Accepted keys join their groups (``target``; the trash slot for the others): counts, running-mean
        values, newest key and position per group. ``k_store``: the new keys as the cache stores them.

        Only the rows the chunk's keys point at are read and written: each group the chunk joins is summed in a
        row of its own among the chunk's (its first joining key's), gathered back per key and scattered into the
        cache (keys that share a group write the same values)."""
        B, H, N, D = k_new.shape
        C = self.capacity
        K, V, count, pos, upd = self.k[layer], self.v[layer], self.count[layer], self.pos[layer], self.updated[layer]
        order = torch.arange(N, device=self.device).expand(B, H, N)
        first = torch.full((B, H, C + 1), N, dtype=torch.long, device=self.device)
        group = first.scatter_reduce_(2, target, order, reduce="amin").gather(2, target)  # per key, its group's row
        group4 = group[..., None].expand(-1, -1, -1, D)
        target4 = target[..., None].expand(-1, -1, -1, D)

        def per_group(x):  # sums over each group's joining keys, per key
            return torch.zeros_like(x).scatter_add_(2, group4 if x.dim() == 4 else group, x).gather(
                2, group4 if x.dim() == 4 else group)

        old_n = count.gather(2, target)[..., None]
        new_n = old_n + per_group(accept.float())[..., None]
        denom = new_n.clamp_min(1.0)
        v_mean = (old_n * V.gather(2, target4).float() + per_group(v_new.float())) / denom
        # The newest accepted key of each group (its representative key and position with "last").
        newest = torch.full((B, H, N), -1, dtype=torch.long, device=self.device)
        src = newest.scatter_reduce_(2, group, torch.where(accept, order, -1), reduce="amax").gather(2, group)
        src4 = src.clamp_min(0)[..., None].expand(-1, -1, -1, D)
        if self.settings.representative == "mean":
            rep = (old_n * K.gather(2, target4).float() + per_group(k_new.float())) / denom
        else:
            rep = k_new.float().gather(2, src4)
        stored = rep if k_store is k_new else k_store.float().gather(2, src4)
        V.scatter_(2, target4, v_mean.to(V.dtype))
        K.scatter_(2, target4, stored.to(K.dtype))
        if self.search is not None:
            self.search[layer].scatter_(2, target4, search_form(rep))
        pos.scatter_(2, target[..., None].expand(-1, -1, -1, 3), positions[src.clamp_min(0)])
        upd.scatter_(2, target, frame)
        if self.t_sum is not None:
            times = torch.where(accept, positions[:, 0].double(), 0.0).expand(B, H, N)
            self.t_sum[layer].scatter_add_(2, target, times)
        count.scatter_(2, target, new_n[..., 0])
        count[:, :, C].fill_(0.0)

    def finish_commit(self) -> None:
        self._pending = None

    def rewind(self, frame: int) -> None:
        """Drop groups whose newest member is at or after ``frame`` (their older members go with them)."""
        for layer in range(self.num_layers):
            self.versions[layer] += 1
            stale = self.pos[layer][..., 0] >= frame
            if frame > 0:  # a re-encode from frame 0 replaces the sink too
                stale[:, :, : self.sink_tokens] = False
            self.count[layer].masked_fill_(stale, 0.0)
            if self.search is not None:
                self.search[layer].masked_fill_(stale[..., None], 0)

    # -- reading --------------------------------------------------------------------------------------------
    def _attention_positions(self, layer: int, hw: int) -> torch.Tensor:
        """Where attention places each group: the newest member's (t, h, w), or with ``position = "weighted"``
        the members' count-weighted mean time (to the nearest frame) at the newest member's (h, w)."""
        pos = self.pos[layer][:, :, :hw]
        if self.t_sum is None:
            return pos
        count = self.count[layer][:, :, :hw].double().clamp_min(1.0)
        pos = pos.clone()
        pos[..., 0] = (self.t_sum[layer][:, :, :hw] / count).round().long()
        return pos

    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        hw = self._length(layer)
        if hw == 0:
            return None
        # log(count): 0 for a group of one, -inf for an empty slot (log 0), computed once per layer and commit.
        memo = self._bias[layer]
        if memo is None or memo[0] != self.versions[layer] or memo[1].shape[-1] != hw:
            memo = self._bias[layer] = (self.versions[layer], self.count[layer][:, :, :hw].log())
        k, v = self._kv(layer, hw)
        return CacheView(
            k=k, v=v, bias=memo[1],
            positions=self._attention_positions(layer, hw),
            n_sink=min(self.sink_tokens, hw), uniform=False, version=self.versions[layer],
            rotated=self.keys_rotated,
        )

    # -- accounting -----------------------------------------------------------------------------------------
    def _live(self, layer: int) -> torch.Tensor:
        return self.count[layer][:, :, : self.capacity] > 0

    def groups(self, layer: int) -> float:
        """Live groups per head (sink included), averaged over batch and heads (a host read)."""
        return float(self._live(layer).float().sum(-1).mean())

    def _bytes_per_slot(self) -> int:
        return self._slot_bytes(self.settings, self.head_dim, self.dtype, self.kv_quant, self.device)

    def _live_slots(self) -> torch.Tensor:
        return torch.stack([self._live(layer).sum() for layer in range(self.num_layers)]).sum()

    def live_bytes(self) -> int:
        return int(self._live_slots()) * self._bytes_per_slot()

    def live_bytes_figure(self):
        return self._live_slots() * self._bytes_per_slot()

    def allocated_bytes(self) -> int:
        return self.num_layers * self.batch * self.num_heads * (self.capacity + 1) * self._bytes_per_slot()

    def chunk_stats(self) -> dict:
        """Groups per layer and the mean group size, as device tensors (``read_figures`` reads them with the rest
        of the chunk's report in one transfer)."""
        live = torch.stack([self._live(layer).float().sum(-1).mean() for layer in range(self.num_layers)])
        counts = torch.stack([c[:, :, : self.capacity].sum() for c in self.count]).double()
        slots = torch.stack([self._live(layer).sum() for layer in range(self.num_layers)]).clamp_min(1).double()
        return {"groups": Figure(live, 2), "mean_count": Figure((counts / slots).mean(), 4)}

    def stats(self) -> dict:
        return {
            **super().stats(),
            "capacity_tokens": self.capacity,
            "sink_tokens": self.sink_tokens,
            "groups_per_layer": [round(self.groups(i), 2) for i in range(self.num_layers)],
            "merges_per_layer": self.merges,
            "evictions_per_layer": self.evictions,
            "inserted_per_layer": self.inserted,
            "mean_count": read_figures({"m": self.chunk_stats()["mean_count"]})["m"],
        }
