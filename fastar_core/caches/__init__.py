"""Self-attention KV caches: what a chunk's queries see of the past (see ``base`` for the seam)."""

from .base import CacheShape, CacheView, KVCache
from .dense import DenseKVCache, GlobalCache, RecomputeCache, RollingCache, WindowCache
from .spec import CACHE_POLICIES, POLICIES, CacheSpec, TempCacheSettings
from .tempcache import TempCache

__all__ = ["CACHE_POLICIES", "POLICIES", "CacheShape", "CacheSpec", "CacheView", "DenseKVCache", "GlobalCache",
           "KVCache", "RecomputeCache", "RollingCache", "TempCache", "TempCacheSettings", "WindowCache"]
