"""Wiring: a sampler whose cache and attention follow a ``FastARConfig`` (dense when it is off)."""

from __future__ import annotations

from ..attention import DenseAttention
from ..kv_cache import CacheSpec
from ..sampler import ARSampler
from .attention import FastARAttention
from .config import FastARConfig
from .tempcache import TempCache


def attention_for(runner, fastar: FastARConfig, measure: bool = False, rope_max_distance: int | None = None):
    g = runner.geometry
    if fastar.annca or fastar.annsa or measure:
        return FastARAttention(fastar, g.num_heads, g.head_dim, measure=measure, rope_max_distance=rope_max_distance)
    return DenseAttention(backend=fastar.backend, rope_max_distance=rope_max_distance)


def tempcache_factory(runner, fastar: FastARConfig, frames_per_block: int):
    fastar.validate(num_layers=runner.num_layers, frames_per_block=frames_per_block)
    g = runner.geometry

    def build(total_frames, grid_hw, batch):
        return TempCache(fastar, g.num_layers, batch, g.num_heads, g.head_dim, grid_hw, dtype=runner.dtype,
                         device=runner.device)

    return build


def build_sampler(runner, fastar: FastARConfig, cache: CacheSpec, measure: bool = False,
                  frames_per_block: int = 3, rope_max_distance: int | None = None) -> ARSampler:
    """The runner's attention becomes FAST-AR's when any part is on; ``cache.policy == "tempcache"`` (or
    ``fastar.tempcache``) bounds the cache by merging."""
    fastar.validate(num_layers=runner.num_layers)
    runner.attention = attention_for(runner, fastar, measure, rope_max_distance)
    if fastar.tempcache or cache.policy == "tempcache":
        return ARSampler(runner, tempcache_factory(runner, fastar, frames_per_block))
    return ARSampler(runner)
