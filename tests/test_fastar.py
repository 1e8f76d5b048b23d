"""FAST-AR in the engine: config, exactness (Lemma 5.1, pad merge, one bucket), TempCache, a long rollout."""

import math
from dataclasses import replace

import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheSpec, GlobalCache, TempCache, TempCacheSettings
from comfyui_fastar.fastar_core.caches.base import read_figures
from comfyui_fastar.fastar_core.caches.matching import SEARCH_MARGIN, exact_top1, quantized_top1, search_form
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.fastar.ann import LSHMatcher
from comfyui_fastar.fastar_core.fastar.attention import FastARAttention
from comfyui_fastar.fastar_core.fastar.config import PRESETS, FastARConfig, get_preset
from comfyui_fastar.fastar_core.forward.attention import DenseAttention, PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.rope import rope_axes
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig
from comfyui_fastar.kernels import row_max, row_topk

from helpers import tiny_context, tiny_model


def test_presets_validate_and_bad_values_name_the_field():
    for name in PRESETS:
        preset = get_preset(name)
        assert preset.attention.validate(num_layers=4).preset == name
        if preset.tempcache is not None:
            CacheSpec(policy="tempcache", tempcache=preset.tempcache).validate(frames_per_block=3)
    assert not get_preset("off").attention.enabled and get_preset("off").tempcache is None
    for field, value in {"bits": 17, "tables": 0, "dense_warmup": 1.5, "layers": (9,)}.items():
        with pytest.raises(FastARError, match=field):
            FastARConfig(**{field: value}).validate(num_layers=4)
    for field, value in {"threshold": 0.0, "capacity_frames": 0, "matcher": "faiss"}.items():
        with pytest.raises(FastARError, match=field):
            TempCacheSettings(**{field: value}).validate()
    with pytest.raises(FastARError, match="capacity_frames"):
        CacheSpec(policy="tempcache", sink_frames=3, tempcache=TempCacheSettings(capacity_frames=4)).validate(3)
    with pytest.raises(FastARError, match="preset"):
        get_preset("turbo")


def test_hash_projections_have_their_own_seeded_generator():
    state = torch.random.get_rng_state()
    a = LSHMatcher(2, 16, bits=6, tables=2, seed=5)
    b = LSHMatcher(2, 16, bits=6, tables=2, seed=5)
    c = LSHMatcher(2, 16, bits=6, tables=2, seed=6)
    assert torch.equal(a.planes, b.planes) and not torch.equal(a.planes, c.planes)
    assert torch.equal(state, torch.random.get_rng_state())


def test_the_quantized_search_finds_what_the_exact_one_finds_above_the_threshold():
    g = torch.Generator().manual_seed(0)
    reps = torch.randn(1, 2, 300, 32, generator=g)
    valid = torch.ones(1, 2, 300, dtype=torch.bool)
    valid[:, :, :20] = False  # the sink and empty slots: zero in the search form
    search = search_form(reps) * valid[..., None]
    # Near-copies of cached keys (they merge), and fresh keys (they do not).
    noisy = torch.cat([reps[:, :, 20:120] + 0.05 * torch.randn(1, 2, 100, 32, generator=g),
                       torch.randn(1, 2, 100, 32, generator=g)], dim=2)
    idx, sim = exact_top1(noisy, reps, valid, chunk=7)
    q_idx, q_sim = quantized_top1(noisy, search, reps, min_score=0.9)
    merges = sim >= 0.9
    assert merges[..., :100].all() and not merges[..., 100:].any()
    assert torch.equal(q_sim >= 0.9, merges)  # the same keys merge ...
    assert torch.equal(q_idx[merges], idx[merges])  # ... into the same groups
    assert torch.allclose(q_sim[merges], sim[merges], atol=1e-6)  # decided on the exact cosine
    # Near-ties the bfloat16 scores cannot order: among the candidates the exact rescoring decides, so with at least
    # as many candidates as entries in the rounding band the answer is the exact one; with fewer, the best candidate,
    # within twice the bound of the exact best cosine, and merged all the same.
    base = torch.randn(1, 1, 1, 32, generator=g)
    near = base + 1e-3 * torch.randn(1, 1, 6, 32, generator=g)
    query = base + 1e-4 * torch.randn(1, 1, 1, 32, generator=g)
    missed = 0
    for others in (8, 100):
        tie = torch.cat([near, torch.randn(1, 1, others, 32, generator=g)], dim=2)
        e_idx, e_sim = exact_top1(query, tie)
        for candidates in (1, 2, 6, 8):
            t_idx, t_sim = quantized_top1(query, search_form(tie), tie, min_score=0.9, candidates=candidates)
            exact_cos = torch.nn.functional.cosine_similarity(query[0, 0], tie[0, 0, t_idx[0, 0]], dim=-1)
            torch.testing.assert_close(t_sim[0, 0], exact_cos, atol=1e-6, rtol=0)  # decided on the exact cosine
            assert t_idx[0, 0, 0] < 6 and (t_sim >= 0.9).all()  # a near-tie, merged
            assert (t_sim >= e_sim - 2 * SEARCH_MARGIN).all()
            if candidates >= 6:
                assert torch.equal(t_idx, e_idx) and torch.allclose(t_sim, e_sim, atol=1e-6), (others, candidates)
            else:
                missed += int(not torch.equal(t_idx, e_idx))
    assert missed > 0  # control: one or two candidates do miss the exact best among six near-ties


def test_the_blocked_row_max_and_topk_give_torch_s_answers_ties_included():
    g = torch.Generator().manual_seed(7)
    for m in (7, 40, 64, 200, 4320):  # no blocks, small blocks, one block, ragged powers of two
        scores = torch.randn(3, 5, m, generator=g).round(decimals=1)  # many exact ties
        scores[0, 0, :] = 0.5  # a row of one value: the first index wins
        val, idx = row_max(scores)
        want_val, want_idx = scores.max(dim=-1)
        assert torch.equal(val, want_val) and torch.equal(idx, want_idx), m
        for k in (1, 4, 9):
            if k > m:
                continue
            top, where = row_topk(scores, k)
            assert torch.equal(top, scores.topk(k, dim=-1).values), (m, k)
            assert torch.equal(scores.gather(-1, where), top) and (where.sort(-1).values.diff(dim=-1) > 0).all()


def test_exact_top1_skips_invalid_entries_like_a_brute_force_search():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 3, 40, 16, generator=g), torch.randn(2, 3, 30, 16, generator=g)
    valid = torch.rand(2, 3, 30, generator=g) > 0.5
    valid[1, 2] = False  # a head with nothing to match
    idx, sim = exact_top1(a, b, valid, chunk=9)
    cos = torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).transpose(-1, -2)
    want_sim, want_idx = cos.masked_fill(~valid[:, :, None], float("-inf")).max(dim=-1)
    ok = valid.any(-1)[..., None].expand_as(idx)
    assert torch.equal(idx[ok], want_idx[ok]) and torch.allclose(sim[ok], want_sim[ok], atol=1e-5)
    assert torch.isinf(sim[1, 2]).all() and (sim[1, 2] < 0).all()


def duplicated_keys(seed=0, groups=12, d=32):
    g = torch.Generator().manual_seed(seed)
    reps = torch.randn(1, 2, groups, d, generator=g)
    mult = torch.randint(1, 6, (groups,), generator=g)
    values = [torch.randn(1, 2, int(m), d, generator=g) for m in mult]
    keys = torch.cat([reps[:, :, i:i + 1].expand(-1, -1, int(m), -1) for i, m in enumerate(mult)], dim=2)
    vals = torch.cat(values, dim=2)
    means = torch.cat([v.mean(dim=2, keepdim=True) for v in values], dim=2)
    return reps, means, mult.float(), keys, vals


def test_lemma_5_1_through_the_engine_attention_paths():
    """Merged keys with mean values and +log(m) equal plain attention over the duplicates."""
    from comfyui_fastar.kernels import attention, build_sparse_layout, sparse_attention

    reps, means, mult, keys, vals = duplicated_keys()
    q = torch.randn(1, 2, 9, 32, generator=torch.Generator().manual_seed(3))
    plain = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(32), -1) @ vals
    bias = mult.log()[None, None]
    for backend in ("torch", "triton", "flex"):
        merged = attention(q, reps, means, bias, backend=backend)
        assert (merged - plain).abs().max() < 1e-5, backend
    # The sparse path with every key visible (one bucket) is the same computation.
    zeros_q = torch.zeros(1, 2, 9, dtype=torch.int32)
    layout = build_sparse_layout(zeros_q, torch.zeros(1, 2, 12, dtype=torch.int32), n_dense=0, block_q=16, block_k=16)
    assert layout.density() == 1.0
    merged = sparse_attention(q, reps, means, layout, bias, backend="torch")
    assert (merged - plain).abs().max() < 1e-5


def temporal_free(model):
    """Zero the temporal RoPE dims of q/k so that repeated frames have identical rotated keys."""
    cfg = model.config
    t_dims = 2 * rope_axes(cfg.head_dim)[0]
    with torch.no_grad():
        for blk in model.blocks:
            for norm in (blk.self_attn.norm_q, blk.self_attn.norm_k):
                w = norm.weight.view(cfg.num_heads, cfg.head_dim)
                w[:, :t_dims] = 0.0
    return model


def commit_frames(runner, text, cache, frames):
    for f, x in enumerate(frames):
        info = PassInfo(chunk=f, step=-1, num_steps=4, frame_start=f, num_frames=1, tokens_per_frame=4)
        runner.forward(x, torch.zeros(1, 1), text, cache, info, commit=True, need_output=False)


def query_after(runner, text, cache, n):
    x = torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    info = PassInfo(chunk=n, step=0, num_steps=4, frame_start=n, num_frames=1, tokens_per_frame=4)
    return runner.forward(x, torch.full((1, 1), 937.5), text, cache, info)


def make_tempcache(threshold=1.0, capacity=8, sink=1):
    settings = TempCacheSettings(threshold=threshold, capacity_frames=capacity)
    return TempCache(settings, sink, num_layers=2, batch=1, num_heads=2, head_dim=32, grid_hw=(2, 2))


def test_threshold_one_on_repeated_frames_equals_dense_only_without_temporal_rope():
    """With the temporal RoPE dims zeroed, copies of a frame are identical keys to every query: exact. Real RoPE:
    tests/test_tempcache_rope.py."""
    model = temporal_free(tiny_model())
    runner = CausalRunner(model)
    text = runner.encode_text(tiny_context())
    frame = torch.randn(1, 16, 1, 4, 4, generator=torch.Generator().manual_seed(4))
    n = 12
    dense = GlobalCache(2, 1, 2, 32, (2, 2), capacity_frames=n)
    commit_frames(runner, text, dense, [frame] * n)
    temp = make_tempcache()
    commit_frames(runner, text, temp, [frame] * n)
    out_dense = query_after(runner, text, dense, n)
    out_temp = query_after(runner, text, temp, n)
    assert (out_dense - out_temp).abs().max() < 1e-4
    for layer in range(2):
        assert temp.groups(layer) == 4 + 4  # the sink frame + one frame's worth of groups
    assert temp.merges[0] == (n - 2) * 4


def test_threshold_one_never_merges_random_frames():
    model = tiny_model()
    runner = CausalRunner(model)
    text = runner.encode_text(tiny_context())
    g = torch.Generator().manual_seed(5)
    temp = make_tempcache(capacity=20)
    commit_frames(runner, text, temp, [torch.randn(1, 16, 1, 4, 4, generator=g) for _ in range(12)])
    assert temp.merges == [0, 0]
    assert temp.groups(0) == 12 * 4


def test_pad_merge_alone_is_exact_and_pruning_drops_tokens():
    model = tiny_model()
    runner = CausalRunner(model)
    text = runner.encode_text(tiny_context(tokens=6, pad=58))
    q = torch.randn(1, 2, 8, 32, generator=torch.Generator().manual_seed(1))
    info = PassInfo(chunk=0, step=1, num_steps=4, frame_start=0, num_frames=2, tokens_per_frame=4)
    dense = DenseAttention().cross_attention(0, q, text.k[0], text.v[0], info)
    exact = FastARAttention(FastARConfig(annca=True, annca_prune=False), 2, 32)
    out = exact.cross_attention(0, q, text.k[0], text.v[0], info)
    assert (out - dense).abs().max() < 1e-5
    # 6 words + 1 merged pad key, out of the prompt zero-padded to the model's text_len (512)
    assert exact.chunk_stats()["ca_kept"] == pytest.approx(7 / runner.geometry.text_len, abs=1e-4)
    pruned = FastARAttention(FastARConfig(annca=True, annca_prune=True, bits=8, multiprobe=False), 2, 32,
                             measure=True)
    pruned.begin_rollout(2)
    pruned.cross_attention(0, q, text.k[0], text.v[0], info)
    stats = read_figures(pruned.chunk_stats())
    assert stats["ca_kept"] < 1.0 and 0.0 < stats["ca_recall"] <= 1.0


def test_annsa_with_one_bucket_is_exact():
    model = tiny_model()
    runner = CausalRunner(model)
    text = runner.encode_text(tiny_context())
    cache = make_tempcache(threshold=0.9, capacity=10)
    g = torch.Generator().manual_seed(2)
    commit_frames(runner, text, cache, [torch.randn(1, 16, 1, 4, 4, generator=g) for _ in range(8)])
    view = cache.view(0, 8, 1)
    q, k, v = (torch.randn(1, 2, 4, 32, generator=g) for _ in range(3))
    from comfyui_fastar.fastar_core.model.rope import grid_positions

    pos = grid_positions(8, 1, 2, 2)
    info = PassInfo(chunk=8, step=3, num_steps=4, frame_start=8, num_frames=1, tokens_per_frame=4)
    dense = DenseAttention().self_attention(0, q, k, v, pos, view, info)
    # One bit with Hamming-1 probes: every code is within reach of every other, i.e. a single bucket.
    one_bucket = FastARAttention(
        FastARConfig(annsa=True, bits=1, multiprobe=True, dense_warmup=0.0, annsa_min_keys=0), 2, 32, measure=True)
    one_bucket.begin_rollout(2)
    out = one_bucket.self_attention(0, q, k, v, pos, view, info)
    assert (out - dense).abs().max() < 1e-5
    assert one_bucket.chunk_stats()["density"] == 1.0
    narrow = FastARAttention(
        FastARConfig(annsa=True, bits=6, multiprobe=False, dense_warmup=0.0, annsa_min_keys=0), 2, 32, measure=True)
    narrow.begin_rollout(2)
    narrow.self_attention(0, q, k, v, pos, view, info)
    assert narrow.chunk_stats()["density"] < 1.0
    warm = FastARAttention(FastARConfig(annsa=True, bits=6, multiprobe=False, annsa_min_keys=0), 2, 32)
    warm.begin_rollout(2)
    first_step = PassInfo(chunk=8, step=0, num_steps=4, frame_start=8, num_frames=1, tokens_per_frame=4)
    assert (warm.self_attention(0, q, k, v, pos, view, first_step) - dense).abs().max() < 1e-6


def test_fastar_never_changes_the_sampling_noise():
    model = tiny_model()
    cfg = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=3)
    state = torch.random.get_rng_state()
    dense = build_sampler(CausalRunner(model), FastARConfig()).generate(tiny_context(), cfg)
    # AnnCA off: its exact pad merge of the prompt (zero-padded to text_len) rounds differently from dense.
    fast = resolve_settings(preset="balanced", attention_overrides={"annsa_min_keys": 0, "annca": False})
    temp = build_sampler(CausalRunner(model), fast.fastar).generate(tiny_context(), replace(cfg, cache=fast.cache))
    assert torch.equal(state, torch.random.get_rng_state())
    # The first chunk sees an empty cache, so only the noise decides it: identical bit for bit.
    assert torch.equal(dense.latent[:, :, :3], temp.latent[:, :, :3])


def test_long_rollout_with_everything_on_has_flat_cache_memory():
    model = tiny_model()
    settings = resolve_settings(preset="balanced", tempcache_overrides={"capacity_frames": 12},
                                attention_overrides={"annsa_min_keys": 0})
    spec = settings.cache
    sampler = build_sampler(CausalRunner(model), settings.fastar, measure=True)
    reports = []
    cfg = RolloutConfig(num_frames=201, latent_height=4, latent_width=4, cache=spec, schedule="1.0,0.8,0.5")
    result = sampler.generate(tiny_context(pad=24), cfg, callback=reports.append)
    assert torch.isfinite(result.latent).all()
    sizes = [r.cache_bytes for r in reports]
    full = max(sizes)
    first_full = sizes.index(full)
    assert first_full <= 4  # capacity 12 frames: full after four 3-frame chunks
    assert all(s == full for s in sizes[first_full:])
    late = reports[-2].extra
    assert len(late["groups"]) == 2 and all(g <= 12 * 4 for g in late["groups"])
    assert 0.0 < late["density"] <= 1.0 and 0.0 < late["recall"] <= 1.0
    assert "ca_kept" in late
