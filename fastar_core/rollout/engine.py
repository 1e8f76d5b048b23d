"""From user settings to a sampler: the one place that decides the cache and FAST-AR's attention.

The command line, the nodes and the benches all describe a rollout the same way (a FAST-AR preset with
overrides, a cache policy with its sizes) and call ``resolve_settings`` to get one ``CacheSpec`` and one
``FastARConfig``; contradictions are refused there, with a message that says what to change. ``build_sampler``
then gives the runner the attention that config asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..caches.spec import POLICIES, CacheSpec, TempCacheSettings
from ..errors import FastARError
from ..fastar.attention import FastARAttention
from ..fastar.config import FastARConfig, get_preset
from ..forward.attention import DenseAttention
from .sampler import ARSampler


def cache_choices() -> tuple[str, ...]:
    """What users may ask for: a registered policy, or "auto" (TempCache when FAST-AR turns it on, else global)."""
    return ("auto", *POLICIES)


CACHE_CHOICES = cache_choices()  # as registered at import (the nodes' combo lists)


@dataclass(frozen=True)
class EngineSettings:
    """Everything about a rollout that is not the model, the prompt or its length."""

    cache: CacheSpec
    fastar: FastARConfig
    notes: tuple = ()  # where a size came from when it is not what the user or the preset gave (reports say it)

    def describe(self) -> str:
        return f"cache {self.cache.describe()}; FAST-AR attention {self.fastar.preset}"


def _given(overrides: dict | None) -> dict:
    return {k: v for k, v in (overrides or {}).items() if v is not None}


def resolve_settings(*, preset: str = "off", cache_policy: str = "auto", tempcache: bool | None = None,
                     sink_frames: int | None = None, window_frames: int | None = None,
                     rolling_capacity: int | None = None, rolling_attend: int | None = None,
                     tempcache_overrides: dict | None = None, attention_overrides: dict | None = None,
                     num_layers: int | None = None, own_cache: CacheSpec | None = None, frames_per_block: int = 1,
                     family: str = "the model") -> EngineSettings:
    """Settings as users give them -> (cache spec, attention config). ``None`` keeps a default.

    ``tempcache`` forces the preset's TempCache on or off; ``tempcache_overrides`` (threshold,
    capacity_frames, ...) and ``attention_overrides`` (annca, annsa, bits, ...) refine the preset.

    ``own_cache``: the cache ``family``'s own inference keeps (``ModelFamily.own_cache``), if any. Cache 'auto'
    without TempCache is that cache, its sizes replacing the given ones; TempCache whose capacity was not given
    holds what that cache holds at ``frames_per_block`` (a window of 32 with chunks of 8: 24 frames); under cache
    'auto' TempCache keeps the family's sink. ``notes`` say so."""
    chosen = get_preset(preset)
    if cache_policy not in cache_choices():
        raise FastARError(f"cache policy {cache_policy!r} is not one of {', '.join(cache_choices())}")
    wants_tempcache = chosen.tempcache is not None if tempcache is None else tempcache
    policy = cache_policy
    if policy == "auto":
        policy = "tempcache" if wants_tempcache else "global"
    elif policy == "tempcache" and tempcache is False:
        raise FastARError("cache policy 'tempcache' contradicts TempCache turned off: drop one of the two")
    elif policy != "tempcache" and wants_tempcache:
        why = "TempCache turned on" if tempcache else f"FAST-AR preset {preset!r}, which turns TempCache on"
        raise FastARError(f"cache policy {policy!r} contradicts {why}: choose cache policy 'tempcache' (or 'auto'), "
                          "or turn TempCache off and keep the dense cache")
    tc_given = _given(tempcache_overrides)
    if policy != "tempcache" and tc_given:
        raise FastARError(f"{', '.join(sorted(tc_given))} only apply to TempCache, which this rollout does not use "
                          f"(cache policy {policy!r}): drop them or use the tempcache policy")
    settings = (chosen.tempcache or TempCacheSettings()).with_overrides(**tc_given)
    sizes = _given({"sink_frames": sink_frames, "window_frames": window_frames,
                    "rolling_capacity": rolling_capacity, "rolling_attend": rolling_attend})
    cache = CacheSpec(policy=policy, tempcache=settings, **sizes)
    notes: tuple = ()
    if own_cache is not None:
        cache, notes = _own_cache(cache, own_cache, auto=cache_policy == "auto",
                                  capacity_given="capacity_frames" in tc_given, frames_per_block=frames_per_block,
                                  family=family,
                                  default=f"preset {preset}'s" if chosen.tempcache else "TempCache's default")
    attention = _given(attention_overrides)
    if attention.get("annca_prune"):
        if attention.get("annca") is False:
            raise FastARError("AnnCA pruning contradicts AnnCA turned off: drop one of the two")
        attention["annca"] = True
    fastar = chosen.attention.with_overrides(**attention)
    fastar.validate(num_layers=num_layers)
    return EngineSettings(cache=cache, fastar=fastar, notes=notes)


def _own_cache(cache: CacheSpec, own: CacheSpec, *, auto: bool, capacity_given: bool, frames_per_block: int,
               family: str, default: str) -> tuple[CacheSpec, tuple]:
    """The family's own cache where the user left the choice open (see ``resolve_settings``)."""
    if auto and cache.policy == "global":
        return replace(own, kv_quant=cache.kv_quant), (f"cache 'auto' is {family}'s own: {own.describe()}",)
    if cache.policy != "tempcache" or (capacity_given and not auto):
        return cache, ()
    sink = own.sink_frames if auto else cache.sink_frames
    was = cache.tempcache.capacity_frames
    capacity = was if capacity_given else own.policy_class.allocated_frames(own, own.window_frames, frames_per_block)
    cache = replace(cache, sink_frames=sink, tempcache=replace(cache.tempcache, capacity_frames=capacity))
    if capacity_given:
        return cache, (f"TempCache sink {sink}: {family}'s own (cache 'auto')",)
    return cache, (f"TempCache capacity {capacity} frames, sink {sink}: what {family}'s own cache ({own.describe()}) "
                   f"holds with chunks of {frames_per_block}, in place of {default} {was}",)


def attention_for(runner, fastar: FastARConfig, measure: bool = False, rope_max_distance: int | None = None):
    g = runner.geometry
    if fastar.enabled or measure:
        return FastARAttention(fastar, g.num_heads, g.head_dim, measure=measure, rope_max_distance=rope_max_distance,
                               sa_heads=runner.head_range, parallel=runner.parallel)
    return DenseAttention(backend=fastar.backend, rope_max_distance=rope_max_distance,
                          verify_kernels=fastar.verify_kernels)


def build_sampler(runner, fastar: FastARConfig, measure: bool = False,
                  rope_max_distance: int | None = None) -> ARSampler:
    """A sampler whose runner attends as ``fastar`` says; the cache comes from each ``RolloutConfig``."""
    fastar.validate(num_layers=runner.num_layers)
    runner.attention = attention_for(runner, fastar, measure, rope_max_distance)
    return ARSampler(runner)
