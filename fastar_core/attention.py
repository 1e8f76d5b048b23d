"""The attention seam: one interface that carries the dense reference and every FAST-AR variant.

The runner hands each layer's projected queries, keys and values (keys before RoPE) plus the layer's
``CacheView`` to ``self_attention``, and the prompt's cached K/V to ``cross_attention``. ``DenseAttention``
is the reference: full softmax over (cache view + current tokens) with the view's bias. FAST-AR subclasses
it and changes only what the paper changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import attention as kernel_attention
from .kv_cache import CacheView
from .rope import rotate


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


class DenseAttention:
    """Reference attention over the cache view plus the current tokens.

    ``rope_max_distance``: when set, temporal distances between a query frame and an older key frame are
    clamped to it (e.g. 20 for a model trained on 21 latent frames). Off by default, which reproduces the
    reference models' scores exactly.
    """

    def __init__(self, backend: str = "auto", rope_max_distance: int | None = None):
        self.backend = backend
        self.rope_max_distance = rope_max_distance

    def begin_rollout(self, num_layers: int) -> None:
        """Called once before a rollout; stateful variants reset here."""

    def _min_t(self, info: PassInfo) -> int | None:
        if self.rope_max_distance is None:
            return None
        return info.num_frames - 1 - self.rope_max_distance

    def rotate_inputs(self, q, k, positions, view: CacheView | None, info: PassInfo):
        """RoPE on queries, current keys and cache keys, at positions relative to this pass."""
        cur = relative_positions(positions, info.frame_start, None)[None]
        q_rot, k_rot = rotate(q, cur), rotate(k, cur)
        if view is None:
            return q_rot, k_rot, None
        cache_pos = relative_positions(view.positions, info.frame_start, self._min_t(info))
        return q_rot, k_rot, rotate(view.k.to(k.dtype), cache_pos)

    def self_attention(self, layer: int, q, k, v, positions, view: CacheView | None, info: PassInfo):
        q_rot, k_rot, cache_k = self.rotate_inputs(q, k, positions, view, info)
        if view is None:
            return kernel_attention(q_rot, k_rot, v, backend=self.backend)
        keys = torch.cat([cache_k, k_rot], dim=2)
        values = torch.cat([view.v.to(v.dtype), v], dim=2)
        return kernel_attention(q_rot, keys, values, join_bias(view, k.shape[2]), backend=self.backend)

    def cross_attention(self, layer: int, q, text_k, text_v, info: PassInfo):
        return kernel_attention(q, text_k, text_v, backend=self.backend)
