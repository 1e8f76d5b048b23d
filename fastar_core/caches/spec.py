"""``CacheSpec``: the one description of a KV cache that users, nodes, the command line and benches choose.

A policy is a ``KVCache`` subclass with ``from_spec`` and ``check_spec``, listed once in ``POLICIES``; the
spec holds every policy's sizes, so switching policy never loses a setting. ``sink_frames`` is shared: the
window, rolling and TempCache policies all keep the first frames for good.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch

from ..errors import FastARError
from .base import CacheShape, KVCache
from .dense import GlobalCache, RecomputeCache, RollingCache, WindowCache
from .quant import KV_QUANTS
from .tempcache import TempCache

# Every cache policy, by the name users type. A new policy is one KVCache subclass and one line here.
POLICIES: dict[str, type[KVCache]] = {
    "global": GlobalCache,
    "window": WindowCache,
    "rolling": RollingCache,
    "tempcache": TempCache,
    "recompute": RecomputeCache,
}
CACHE_POLICIES = tuple(POLICIES)

REPRESENTATIVES = ("last", "mean")
MERGE_SCOPES = ("head", "shared")
MATCHERS = ("auto", "exact", "quantized")
SIMILARITIES = ("content", "rotated")
POSITIONS = ("newest", "weighted")
MERGE_WHEN = ("always", "full")


@dataclass(frozen=True)
class TempCacheSettings:
    """TempCache's own knobs (FAST-AR's bounded cache that merges temporally corresponding keys)."""

    threshold: float = 0.9  # cosine similarity of pre-RoPE keys needed to join a group
    capacity_frames: int = 21  # hard cap in frames' worth of tokens, sink included
    representative: str = "last"  # key kept for a group: the newest ("last", the paper's) or the mean
    merge_scope: str = "head"  # merge decisions per head, or shared across heads
    # Top-1 search (caches/matching.py): "exact" fp32 matmul (the reference), or "quantized": a bfloat16 search
    # over representatives kept in that form, its best matcher_candidates rescored exactly (and the keys then kept
    # rotated for attention, so no chunk re-rotates the cache). "auto": quantized where a bfloat16 matmul runs on
    # tensor cores (CUDA), exact elsewhere (a CPU gains nothing from it at small head dims; see README).
    matcher: str = "auto"
    matcher_candidates: int = 8
    # Time (see caches/tempcache.py): compare keys before RoPE ("content") or after it, each at its own position
    # ("rotated"); close a group to keys further than this many frames from its oldest member (0: never); place
    # a group at its newest member's time or at the count-weighted mean of its members' times.
    similarity: str = "content"
    max_spread_frames: int = 0
    position: str = "newest"
    merge_when: str = "always"  # or "full": insert plain entries while the chunk fits, merge only after
    # A key may join only a group at its own (h, w) position. For a model whose positions are places on a map (the
    # demo's steered world) a group is then one place, and a view that returns to it merges into it; off for
    # screen positions, where content moves across the screen and a group follows it (the paper's matching).
    same_place: bool = False

    def validate(self) -> TempCacheSettings:
        def bad(name, value, valid):
            raise FastARError(f"TempCache {name} = {value!r} is invalid; valid: {valid}")

        if not (0.0 < self.threshold <= 1.0):
            bad("threshold", self.threshold, "a cosine similarity in (0, 1]")
        if self.capacity_frames < 1:
            bad("capacity_frames", self.capacity_frames, "at least 1 frame")
        for name, allowed in (("representative", REPRESENTATIVES), ("merge_scope", MERGE_SCOPES),
                              ("matcher", MATCHERS), ("similarity", SIMILARITIES), ("position", POSITIONS),
                              ("merge_when", MERGE_WHEN)):
            if getattr(self, name) not in allowed:
                bad(name, getattr(self, name), ", ".join(allowed))
        if not (1 <= self.matcher_candidates <= 64):
            bad("matcher_candidates", self.matcher_candidates, "1..64")
        if self.max_spread_frames < 0:
            bad("max_spread_frames", self.max_spread_frames, "0 (no limit) or a number of frames")
        return self

    def resolved_matcher(self, device) -> str:
        """The search this setting runs on ``device``: "auto" decided by the device type."""
        if self.matcher != "auto":
            return self.matcher
        return "quantized" if torch.device(device).type == "cuda" else "exact"

    def with_overrides(self, **changes) -> TempCacheSettings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None}).validate()


# The sizes every entry point (nodes, CLI, benches) offers by default: declared here once.
SINK_FRAMES = 3
WINDOW_FRAMES = 12


@dataclass(frozen=True)
class CacheSpec:
    """A cache policy and its sizes, independent of the model."""

    policy: str = "global"
    # window, rolling and tempcache: first frames kept for good; recompute: anchor frames
    sink_frames: int = SINK_FRAMES
    # window and recompute: frames a chunk attends to, the sink and the chunk itself included (LongLive's
    # local_attn_size; Krea: kv_cache_num_frames + the chunk)
    window_frames: int = WINDOW_FRAMES
    rolling_capacity: int = 24  # rolling: frames held
    rolling_attend: int = 21  # rolling: frames attended, queries included
    tempcache: TempCacheSettings = field(default_factory=TempCacheSettings)
    # How the caches store K and V: in the model's dtype ("none"), or "int8" with a float32 scale per token (a
    # TempCache group) and head, about half of bf16's bytes (caches/quant.py)
    kv_quant: str = "none"

    @property
    def policy_class(self) -> type[KVCache]:
        if self.policy not in POLICIES:
            raise FastARError(f"cache policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        return POLICIES[self.policy]

    def validate(self, frames_per_block: int) -> CacheSpec:
        cls = self.policy_class
        if self.sink_frames < 0:
            raise FastARError(f"sink_frames must be >= 0, got {self.sink_frames}")
        if self.kv_quant not in KV_QUANTS:
            raise FastARError(f"kv_quant {self.kv_quant!r} is not one of {', '.join(KV_QUANTS)}")
        cls.check_spec(self, frames_per_block)
        return self

    def build(self, shape: CacheShape, total_frames: int) -> KVCache:
        cache = self.policy_class.from_spec(self, shape, total_frames)
        cache.reserve_positions(total_frames)
        return cache

    def describe(self) -> str:
        """One line for reports: the policy and the sizes it uses."""
        text = self.policy_class.describe(self)
        return text + (", K/V int8 with per-token scales" if self.kv_quant == "int8" else "")

    def to_dict(self) -> dict:
        return asdict(self)
