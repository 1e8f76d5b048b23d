"""From user settings to a sampler: the one place that decides the cache and FAST-AR's attention.

The command line, the nodes and the benches all describe a rollout the same way (a FAST-AR preset with
overrides, a cache policy with its sizes) and call ``resolve_settings`` to get one ``CacheSpec`` and one
``FastARConfig``; contradictions are refused there, with a message that says what to change. ``build_sampler``
then gives the runner the attention that config asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def describe(self) -> str:
        return f"cache {self.cache.describe()}; FAST-AR attention {self.fastar.preset}"


def _given(overrides: dict | None) -> dict:
    return {k: v for k, v in (overrides or {}).items() if v is not None}


def resolve_settings(*, preset: str = "off", cache_policy: str = "auto", tempcache: bool | None = None,
                     sink_frames: int | None = None, window_frames: int | None = None,
                     rolling_capacity: int | None = None, rolling_attend: int | None = None,
                     tempcache_overrides: dict | None = None, attention_overrides: dict | None = None,
                     num_layers: int | None = None) -> EngineSettings:
    """Settings as users give them -> (cache spec, attention config). ``None`` keeps a default.

    ``tempcache`` forces the preset's TempCache on or off; ``tempcache_overrides`` (threshold,
    capacity_frames, ...) and ``attention_overrides`` (annca, annsa, bits, ...) refine the preset."""
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
    attention = _given(attention_overrides)
    if attention.get("annca_prune"):
        if attention.get("annca") is False:
            raise FastARError("AnnCA pruning contradicts AnnCA turned off: drop one of the two")
        attention["annca"] = True
    fastar = chosen.attention.with_overrides(**attention)
    fastar.validate(num_layers=num_layers)
    return EngineSettings(cache=cache, fastar=fastar)


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
