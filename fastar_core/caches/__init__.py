"""Self-attention KV caches: what a chunk's queries see of the past (see ``base`` for the seam).

In FlashDreams' words, the policies are retention (which cached tokens stay addressable: ``dense`` holds the global,
window, rolling and recompute caches, ``tempcache`` merges corresponding keys, matched by ``matching``) and storage
(how K and V are held: ``quant``, int8). ``spec`` is the settings and the registry of policies; ``cache_set`` commits,
rewinds and frees the self-attention cache together with a family's own caches.

Imports: ``errors``, ``memory``, ``model`` (RoPE).
"""

from .base import CacheShape, CacheView, KVCache
from .dense import DenseKVCache, GlobalCache, RecomputeCache, RollingCache, WindowCache
from .spec import CACHE_POLICIES, POLICIES, CacheSpec, TempCacheSettings
from .tempcache import TempCache

__all__ = ["CACHE_POLICIES", "POLICIES", "CacheShape", "CacheSpec", "CacheView", "DenseKVCache", "GlobalCache",
           "KVCache", "RecomputeCache", "RollingCache", "TempCache", "TempCacheSettings", "WindowCache"]
