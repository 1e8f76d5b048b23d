"""int8 K/V in the caches (``CacheSpec.kv_quant = "int8"``: a float32 scale per token, or TempCache group, and
head): the round trip's error bound, the bytes it saves and plans, what a dense view gives back, TempCache's
untouched groups kept exactly through a commit, and a rollout's error against the float cache."""

from dataclasses import replace

import pytest
import torch

from comfyui_fastar.fastar_core.caches.base import CacheShape
from comfyui_fastar.fastar_core.caches.quant import dequantize_int8, quantize_int8
from comfyui_fastar.fastar_core.caches.spec import CacheSpec, TempCacheSettings
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig

TEMPCACHE = TempCacheSettings(capacity_frames=7, threshold=0.8)
SHAPE = CacheShape(num_layers=2, batch=1, num_heads=2, head_dim=128, grid_hw=(2, 3), dtype=torch.bfloat16,
                   frames_per_block=3)


def test_round_trip_error_is_half_a_step_of_each_token_s_scale():
    x = torch.randn(1, 2, 40, 128, generator=torch.Generator().manual_seed(0)) * torch.rand(1, 2, 40, 1) * 10
    x[0, 0, 3] = 0.0
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (1, 2, 40, 1) and int(q.abs().max()) == 127
    err = (dequantize_int8(q, scale, torch.float32) - x).abs()
    assert bool((err <= scale / 2 + 1e-6).all()) and float(err.max()) > 0
    assert bool((dequantize_int8(q, scale, torch.float32)[0, 0, 3] == 0).all())


def test_int8_window_holds_about_half_of_bf16_and_plans_what_it_allocates():
    float_spec = CacheSpec("window", sink_frames=1, window_frames=7)
    int8_spec = CacheSpec("window", sink_frames=1, window_frames=7, kv_quant="int8")
    a, b = float_spec.build(SHAPE, 30), int8_spec.build(SHAPE, 30)
    assert b.allocated_bytes() == int8_spec.policy_class.planned_bytes(int8_spec, SHAPE, 30)
    # per token and layer: bf16 K+V 2*2*128*2 = 1024 B, int8 2*2*(128+4) = 528 B; both + 28 B of positions/bias
    assert (a.allocated_bytes(), b.allocated_bytes()) == (4 * 6 * 2 * (1024 + 28), 4 * 6 * 2 * (528 + 28))
    assert "int8" in int8_spec.describe() and "int8" not in float_spec.describe()


def test_a_view_gives_back_the_committed_keys_to_int8_precision():
    spec = CacheSpec("global", kv_quant="int8")
    cache = spec.build(SHAPE, 6)
    k = torch.randn(1, 2, 18, 128, generator=torch.Generator().manual_seed(1))
    v = torch.randn(1, 2, 18, 128, generator=torch.Generator().manual_seed(2))
    cache.prepare_commit(0, 3)
    for layer in range(2):
        cache.commit(layer, k, v)
    cache.finish_commit()
    view = cache.view(0, 3, 3)
    assert view.k.dtype == torch.bfloat16 and view.k.shape == k.shape
    for got, want in ((view.k, k), (view.v, v)):
        err = (got.float() - want).abs()
        bound = want.abs().amax(-1, keepdim=True) / 254 + want.abs() / 128  # int8 step, then bf16 rounding
        assert bool((err <= bound).all()) and float(err.max()) > 0


def test_an_unknown_kv_quant_is_refused():
    with pytest.raises(FastARError, match="kv_quant 'int4' is not one of none, int8"):
        CacheSpec("window", kv_quant="int4").validate(3)


def test_int8_tempcache_plans_what_it_allocates_and_keeps_untouched_groups_exact():
    spec = CacheSpec("tempcache", sink_frames=1, kv_quant="int8",
                     tempcache=TempCacheSettings(capacity_frames=7, threshold=0.5))
    cache = spec.build(SHAPE, 30)
    assert cache.allocated_bytes() == spec.policy_class.planned_bytes(spec, SHAPE, 30)
    float_bytes = CacheSpec("tempcache", sink_frames=1, tempcache=spec.tempcache).build(SHAPE, 30).allocated_bytes()
    assert cache.allocated_bytes() < 0.6 * float_bytes  # bf16 K+V 512 B a slot and head, int8 264 B; +36 B each
    g = torch.Generator().manual_seed(4)
    for chunk in range(3):
        cache.prepare_commit(3 * chunk, 3)
        for layer in range(2):
            if chunk == 2 and layer == 0:
                before = cache.k[0].clone(), cache.k_scale[0].clone(), cache.count[0].clone()
            cache.commit(layer, torch.randn(1, 2, 18, 128, generator=g), torch.randn(1, 2, 18, 128, generator=g))
        cache.finish_commit()
    k, scale, count = before
    untouched = (count > 0) & (cache.count[0] == count) & (cache.pos[0][..., 0] < 6)  # older groups left alone
    assert bool(untouched.any()) and cache.k[0].dtype == torch.int8
    assert torch.equal(cache.k[0][untouched], k[untouched]) and torch.equal(cache.k_scale[0][untouched],
                                                                            scale[untouched])


@pytest.mark.parametrize("policy", ["window", "tempcache"])
def test_an_int8_rollout_stays_close_to_the_float_one(policy):
    """The same seed through a cache of float K/V and of int8 K/V (the cache's dtype float32 here), a window and
    TempCache: the latent moves by well under a percent of its size, and does move (the cache is read every
    step)."""
    cfg = WanConfig(dim=256, num_heads=2, num_layers=2, ffn_dim=512, text_dim=32, freq_dim=32)
    sampler = ARSampler(CausalRunner(random_wan(cfg, seed=0)))
    context = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))

    def run(kv_quant):
        rollout = RolloutConfig(num_frames=12, latent_height=4, latent_width=6, frames_per_block=3, seed=1,
                                cache=replace(CacheSpec(policy, sink_frames=1, window_frames=7, tempcache=TEMPCACHE),
                                              kv_quant=kv_quant))
        return sampler.generate(context, rollout).latent

    ref, got = run("none"), run("int8")
    rel = float((got - ref).norm() / ref.norm())
    assert 0 < rel < 1e-2, rel
