"""FAST-AR's TempCache on a tiny Wan2.2 TI2V-5B-shaped model through LongLive 2.0's rollout (UniPC, blocks of 8,
an 8-frame sink), against the dense window cache of the same memory (LongLive 2.0's local_attn_size 32: 24
frames held besides the chunk)."""

import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec, TempCacheSettings
from comfyui_fastar.fastar_core.fastar.metrics import video_quality
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig

TINY_5B = WanConfig(dim=256, num_heads=2, num_layers=2, ffn_dim=512, in_dim=48, out_dim=48, text_dim=32, freq_dim=32)
FRAMES, FPB, SINK, HELD = 64, 8, 8, 24  # 8 chunks: the cache fills at chunk 3 and rolls 5 times


def rollout(cache):
    model = random_wan(TINY_5B, seed=0)
    with torch.no_grad():  # sharper self-attention, so which keys a query sees shows in the output
        for blk in model.blocks:
            blk.self_attn.norm_q.weight.fill_(2.5)
            blk.self_attn.norm_k.weight.fill_(2.5)
    cond = torch.randn(1, 8, TINY_5B.text_dim, generator=torch.Generator().manual_seed(1))
    cfg = RolloutConfig(num_frames=FRAMES, latent_height=4, latent_width=4, frames_per_block=FPB, schedule="longlive2",
                        channels=48, seed=3, cache=cache)
    return ARSampler(CausalRunner(model)).generate(cond, cfg)


def tempcache(threshold):
    return CacheSpec("tempcache", sink_frames=SINK, tempcache=TempCacheSettings(threshold=threshold,
                                                                                  capacity_frames=HELD))


def test_tempcache_runs_the_longlive2_rollout_with_flat_cache_bytes(one_thread):
    """Merging (threshold 0.3 on this random model) bounds the cache: its bytes stop growing once it is full, at
    the window's size (24 frames' tokens, plus TempCache's counts); without merges (0.9: random keys never reach
    it) TempCache holds what the window holds and gives its output; with them the output moves off it, measured
    as pooled PSNR against the window."""
    dense = rollout(CacheSpec("window", sink_frames=SINK, window_frames=HELD + FPB))
    merged, unmerged = rollout(tempcache(0.3)), rollout(tempcache(0.9))
    for result in (merged, unmerged):
        sizes = [c.cache_bytes for c in result.chunks]
        assert sizes == sorted(sizes) and max(sizes) <= result.cache_stats["allocated_bytes"], sizes
        assert sizes[-3:] == [max(sizes)] * 3, sizes  # full, and flat from then on
    assert sum(merged.cache_stats["merges_per_layer"]) > 0 and sum(unmerged.cache_stats["merges_per_layer"]) == 0
    psnr_merged = video_quality(merged.latent, dense.latent).psnr_db
    psnr_unmerged = video_quality(unmerged.latent, dense.latent).psnr_db
    print(f"\nTempCache at 5B shapes vs dense window 32 (sink 8), {FRAMES} frames: pooled PSNR {psnr_merged:.1f} dB "
          f"at threshold 0.3 (mean group {merged.cache_stats['mean_count']:.2f}), {psnr_unmerged:.1f} dB at 0.9 "
          "(no merges)")
    assert psnr_unmerged > 100 and 20 < psnr_merged < psnr_unmerged
