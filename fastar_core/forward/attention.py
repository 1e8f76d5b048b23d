"""The attention seam: one interface that carries the dense reference and every FAST-AR variant.

The runner hands each layer's projected queries, keys and values (keys before RoPE) plus the layer's
``CacheView`` to ``self_attention``, and the prompt's cached K/V to ``cross_attention``. ``DenseAttention``
is the reference: full softmax over (cache view + current tokens) with the view's bias. FAST-AR subclasses
it and changes only what the paper changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels import attention as kernel_attention
from ...kernels import register_host_backend
from ..caches.base import CacheView
from ..model.rope import RopeTables, apply_rope, span_of


def register_host_attention(name: str, fn, *, tolerance: float | None = None) -> None:
    """Let a host's own dense attention `fn(q, k, v, scale)` ([B, H, N, D], no bias) serve the dense calls on
    CUDA under backend `auto` (and under its own name); it is checked against torch at first use like every
    accelerated backend."""
    register_host_backend(name, fn, device_types=("cuda",), tolerance=tolerance)


@dataclass
class PassInfo:
    """What one forward pass is, for attention variants that depend on it."""

    chunk: int  # index of the newest chunk in the pass
    step: int  # denoising step index; -1 for the clean pass that writes the cache
    num_steps: int
    frame_start: int  # first latent frame of the pass
    num_frames: int
    tokens_per_frame: int
    frame_steps: list | None = None  # per frame step index when frames are at different steps (rolling window)

    @property
    def is_clean_pass(self) -> bool:
        return self.step < 0


def relative_positions(positions: torch.Tensor, frame_start: int, min_t: int | None) -> torch.Tensor:
    """Temporal positions relative to the current pass (RoPE is relative: only differences matter)."""
    rel = positions.clone()
    rel[..., 0] -= frame_start
    if min_t is not None:
        rel[..., 0].clamp_(min=min_t)
    return rel


def join_bias(view: CacheView, n_current: int) -> torch.Tensor | None:
    """Bias over (cache entries, current tokens): the view's bias, then 0 for the current chunk (count 1)."""
    if view.uniform:
        return None
    b = view.bias
    current = torch.zeros(*b.shape[:-1], n_current, device=b.device, dtype=torch.float32)
    return torch.cat([b.float(), current], dim=-1)


def joined(view: CacheView, cache_k: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Keys and values over (cache entries, current tokens). Where the view's keys are the cache's own, rotated,
    and the cache lends the free slots after them (``view.room``: the buffers ``view.k`` and ``view.v`` are the
    first entries of, as the cache that made the view guarantees), the current ones are written there and one
    slice of each buffer is read; otherwise the cache's are joined to them (a copy of the whole cache per call,
    what made a long dense rollout's late chunks pay for its length twice). Every test is on shapes and object
    identity, never on data pointers, so a compiler traces it."""
    n, end = k.shape[2], view.length
    if view.room is not None and cache_k is view.k:
        room_k, room_v = view.room
        if (room_k.shape[2] >= end + n and room_k.dtype == k.dtype and room_v.dtype == v.dtype
                and room_k.shape[:2] == k.shape[:2] and room_k.shape[3] == k.shape[3]
                and room_v.shape[:2] == v.shape[:2] and room_v.shape[3] == v.shape[3]):
            room_k[:, :, end:end + n].copy_(k)
            room_v[:, :, end:end + n].copy_(v)
            return room_k[:, :, :end + n], room_v[:, :, :end + n]
    return torch.cat([cache_k, k], dim=2), torch.cat([view.v.to(v.dtype), v], dim=2)


class DenseAttention:
    """Reference attention over the cache view plus the current tokens.

    ``rope_max_distance``: when set, temporal distances between a query frame and an older key frame are
    clamped to it (e.g. 20 for a model trained on 21 latent frames). Off by default, which reproduces the
    reference models' scores exactly.
    """

    def __init__(self, backend: str = "auto", rope_max_distance: int | None = None, verify_kernels: bool = True):
        self.backend = backend
        self.rope_max_distance = rope_max_distance
        self.verify_kernels = verify_kernels  # False: no first-use kernel checks during its rollouts (the sampler)
        self._current_tables: tuple = (None, None, None)  # (positions tensor, absolute?, cos/sin) of the pass
        self._rotated_cache: dict = {}  # layer -> (key, rotated cache keys), CPU only
        self._rope: dict = {}  # device -> RopeTables, sized before a rollout (reserve_positions), grown only past it
        self._joined_bias: dict = {}  # layer -> (view's bias, current tokens, joined bias): one join per commit
        # A model whose rotary frequencies differ from Wan's sets its tables here: an object whose
        # ``cos_sin(positions)`` gives cos/sin of positions ``[..., L, 3]`` (the demo's steered world: whole cycles
        # per map, time dropped). None: Wan's RoPE.
        self.own_rope = None

    def begin_rollout(self, num_layers: int) -> None:
        """Called once before a rollout; stateful variants reset here."""
        self._current_tables = (None, None, None)
        self._rotated_cache = {}
        self._joined_bias = {}

    def joined_bias(self, layer: int, view: CacheView, n_current: int) -> torch.Tensor | None:
        """``join_bias``, kept while the view hands over the same bias tensor (a TempCache view's, which changes
        at commits only): every denoising pass of a chunk reuses it."""
        memo = self._joined_bias.get(layer)
        if memo is not None and memo[0] is view.bias and memo[1] == n_current:
            return memo[2]
        joined_bias = join_bias(view, n_current)
        self._joined_bias[layer] = (view.bias, n_current, joined_bias)
        return joined_bias

    def reserve_positions(self, frames: int, tokens_per_frame: int, head_dim: int, device) -> None:
        """Size the RoPE tables ``rope_tables`` hands out for a rollout of ``frames`` latent frames before it starts
        (``RopeTables.reserve``), so that no chunk grows them."""
        if self.own_rope is not None:
            return
        device = torch.empty(0, device=device).device  # "cuda" as the tensors name it: "cuda:0"
        tables = self._rope.get(device)
        if tables is None:
            tables = self._rope[device] = RopeTables(head_dim, device)
        tables.reserve(span_of(frames, tokens_per_frame))

    def rope_tables(self, x: torch.Tensor, info: PassInfo) -> RopeTables:
        """RoPE tables on ``x``'s device covering every position of the pass: its frames, the cache's (earlier, or
        relative to it: negative) and the grid's (at most a frame's tokens per axis); sized from the host's
        ``info``, never from the positions' values. A model's own tables (``own_rope``) in place of Wan's."""
        if self.own_rope is not None:
            return self.own_rope
        tables = self._rope.get(x.device)
        if tables is None:
            tables = self._rope[x.device] = RopeTables(x.shape[-1], x.device)
        return tables.ensure(span_of(info.frame_start + info.num_frames, info.tokens_per_frame))

    @property
    def capturable(self) -> bool:
        """Whether a denoising pass may be captured in a CUDA graph and replayed (no host-side tallies)."""
        return True

    def graph_key(self, info: PassInfo) -> tuple:
        """What of a pass, besides its chunk, changes what this attention does (none for dense attention)."""
        return ()

    @property
    def wants_rotated_keys(self) -> bool:
        """Whether caches may hand over keys rotated at absolute positions: not when distances are clamped to
        each query (``rope_max_distance``), which rotates every key relative to the pass, nor for a model with rotary
        tables of its own (the caches rotate by Wan's)."""
        return self.rope_max_distance is None and self.own_rope is None

    def chunk_stats(self) -> dict:
        """Figures reported with every finished chunk (FAST-AR: density, recall, prompt tokens kept)."""
        return {}

    def _min_t(self, info: PassInfo) -> int | None:
        if self.rope_max_distance is None:
            return None
        return info.num_frames - 1 - self.rope_max_distance

    def rotate_inputs(self, layer: int, q, k, positions, view: CacheView | None, info: PassInfo):
        """RoPE on queries, current keys and cache keys, at positions relative to this pass; or, where the cache
        holds keys rotated already (``view.rotated``), on the queries and current keys alone at their absolute
        positions.

        The runner passes one positions tensor per forward, so the current tokens' tables are computed once per
        pass, not per layer. On a CPU, rotated cache keys are also kept while the layer's cache is unchanged
        (every denoising step of a chunk reads the same entries at the same relative positions); on a GPU
        rotating is cheap and the extra copy of the keys would cost memory."""
        absolute = view is not None and view.rotated  # the cache's keys are rotated at absolute positions
        tables = self.rope_tables(q, info)
        if self._current_tables[0] is not positions or self._current_tables[1] != absolute:
            cur = positions[None] if absolute else relative_positions(positions, info.frame_start, None)[None]
            self._current_tables = (positions, absolute, tables.cos_sin(cur))
        cos, sin = self._current_tables[2]
        q_rot, k_rot = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if view is None:
            return q_rot, k_rot, None
        if view.rotated:
            return q_rot, k_rot, view.k.to(k.dtype)
        min_t = self._min_t(info)
        key = (view.version, view.length, info.frame_start, info.num_frames, min_t, k.dtype)
        memo = self._rotated_cache.get(layer) if view.k.device.type == "cpu" else None
        if memo is not None and memo[0] == key:
            return q_rot, k_rot, memo[1]
        cache_pos = relative_positions(view.positions, info.frame_start, min_t)
        cos_k, sin_k = tables.cos_sin(cache_pos)
        cache_k = apply_rope(view.k.to(k.dtype), cos_k, sin_k)
        if view.k.device.type == "cpu":
            self._rotated_cache[layer] = (key, cache_k)
        return q_rot, k_rot, cache_k

    def self_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                       view: CacheView | None, info: PassInfo) -> torch.Tensor:
        """Queries ``q [B, H, N, D]`` over the cache view plus the chunk's own keys ``k`` (both before RoPE)."""
        q_rot, k_rot, cache_k = self.rotate_inputs(layer, q, k, positions, view, info)
        if view is None:
            return kernel_attention(q_rot, k_rot, v, backend=self.backend)
        keys, values = joined(view, cache_k, k_rot, v)
        # The cache's biases are finite or -inf by construction (no host read to check them), and the chunk's own
        # keys are among the keys (no query sees nothing).
        return kernel_attention(q_rot, keys, values, self.joined_bias(layer, view, k.shape[2]), backend=self.backend,
                                check_values=False, may_be_blind=False)

    def cross_attention(self, layer: int, q: torch.Tensor, text_k: torch.Tensor, text_v: torch.Tensor,
                        info: PassInfo) -> torch.Tensor:
        return kernel_attention(q, text_k, text_v, backend=self.backend)
