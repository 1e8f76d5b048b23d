"""The training forward sees exactly what the sampler's chunked rollout sees, and it is differentiable."""

import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheShape, CacheSpec
from comfyui_fastar.fastar_core.forward.attention import DenseAttention, PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.tools.demo.teacher_forcing import (
    TeacherForcingForward,
    split_frames,
    teacher_forcing_mask,
)

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = WanConfig(dim=48, num_heads=2, num_layers=2, ffn_dim=96, in_dim=3, out_dim=3, text_dim=16, freq_dim=32,
                text_len=8, patch_size=(1, 4, 4))
FPB, FRAMES, HW = 3, 12, (8, 12)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(1, 3, FRAMES, *HW, generator=g)
    noisy = torch.randn(1, 3, FRAMES, *HW, generator=g)
    ctx = torch.cat([torch.randn(1, 5, CFG.text_dim, generator=g), torch.zeros(1, 3, CFG.text_dim)], dim=1)
    noisy_t = torch.rand(1, FRAMES, generator=g) * 1000
    clean_t = torch.rand(1, FRAMES, generator=g) * 50  # context at a small noise level, as with context_noise
    return clean, noisy, ctx, clean_t, noisy_t


def test_mask_gives_each_noisy_chunk_the_earlier_clean_chunks_and_itself():
    clean, noisy = split_frames(FRAMES, FPB)
    assert list(clean) == list(range(0, 9)) and list(noisy) == list(range(3, 12))
    visible = teacher_forcing_mask(FRAMES, FPB, 1) == 0  # one token per frame
    n = len(clean)
    row = visible[n + 3]  # noisy twin of frame 6 (chunk 2)
    assert row[:6].all() and not row[6:n].any()  # clean chunks 0, 1 only
    assert row[n + 3:n + 6].all() and not row[n:n + 3].any() and not row[n + 6:].any()
    clean_row = visible[4]  # clean frame 4 (chunk 1)
    assert clean_row[:6].all() and not clean_row[6:].any()


@pytest.mark.parametrize("seed, rope_max_distance", [(0, None), (1, None), (2, 4)])
def test_training_forward_equals_the_chunked_rollout_with_a_global_cache(seed, rope_max_distance):
    """Also with temporal distances clamped shorter than the clip (keys older than the clamp share a position)."""
    model = random_wan(CFG, seed=seed)
    clean, noisy, ctx, clean_t, noisy_t = _inputs(seed)
    tf = TeacherForcingForward(model, FRAMES, FPB, HW, rope_max_distance=rope_max_distance)
    with torch.no_grad():
        trained = tf(clean, noisy, clean_t, noisy_t, tf.encode_text(ctx))

    runner = CausalRunner(model, attention=DenseAttention(rope_max_distance=rope_max_distance))
    text = runner.encode_text(ctx)
    grid = runner.grid_hw(*HW)
    shape = CacheShape(num_layers=CFG.num_layers, batch=1, num_heads=CFG.num_heads, head_dim=CFG.head_dim,
                       grid_hw=grid)
    cache = CacheSpec("global").build(shape, total_frames=FRAMES)
    tpf = grid[0] * grid[1]
    for c in range(FRAMES // FPB):
        f0 = c * FPB
        part = slice(f0, f0 + FPB)
        if c > 0:
            v = runner.forward(noisy[:, :, part], noisy_t[:, part], text, cache, PassInfo(c, 0, 1, f0, FPB, tpf))
            torch.testing.assert_close(trained[:, :, f0 - FPB:f0], v, atol=2e-5, rtol=1e-4)
        runner.forward(clean[:, :, part], clean_t[:, part], text, cache, PassInfo(c, -1, 1, f0, FPB, tpf),
                       commit=True, need_output=False)


def test_training_forward_has_gradients_for_every_weight_it_uses():
    model = random_wan(CFG, seed=0)
    clean, noisy, ctx, clean_t, noisy_t = _inputs()
    tf = TeacherForcingForward(model, FRAMES, FPB, HW)
    out = tf(clean, noisy, clean_t, noisy_t, tf.encode_text(ctx))
    assert out.shape == (1, 3, FRAMES - FPB, *HW)
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_a_clip_needs_two_whole_chunks():
    with pytest.raises(ValueError, match="two whole chunks"):
        split_frames(4, 3)
    with pytest.raises(ValueError, match="two whole chunks"):
        split_frames(3, 3)
