"""LongLive 2.0: Wan2.2 TI2V-5B made causal. Its block and inputs are Wan's (48-channel latents from the Wan2.2 VAE);
what it adds is the cache its own inference keeps (``configs/inference.yaml``: ``local_attn_size`` 32, the chunk of
8 included, ``sink_size`` 8). A sampler left on cache 'auto' takes that window, and TempCache's default capacity
holds what it holds (``engine.resolve_settings``).

Every Wan2.2 TI2V-5B module tree is taken for LongLive 2.0: it is the one causal 5B the pack runs.
"""

from __future__ import annotations

from ..caches.spec import CacheSpec
from ..forward.family import ModelFamily, register_family
from ..model.wan_config import WAN22_LATENT_CHANNELS

FRAMES_PER_BLOCK = 8  # num_frame_per_block
WINDOW_FRAMES = 32  # local_attn_size: latent frames a chunk attends to, the sink and the chunk included
SINK_FRAMES = 8  # sink_size


@register_family
class LongLive2Family(ModelFamily):
    name = "longlive2"

    @classmethod
    def matches(cls, model) -> bool:
        weight = getattr(getattr(model, "patch_embedding", None), "weight", None)
        return (hasattr(model, "text_embedding") and weight is not None and weight.ndim == 5
                and weight.shape[1] == WAN22_LATENT_CHANNELS)

    @classmethod
    def for_model(cls, model) -> LongLive2Family:
        return cls()

    def describe(self) -> str:
        return "LongLive 2.0 (Wan2.2 TI2V-5B)"

    def own_cache(self) -> CacheSpec:
        return CacheSpec(policy="window", window_frames=WINDOW_FRAMES, sink_frames=SINK_FRAMES)
