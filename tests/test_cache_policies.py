"""Each cache policy describes itself (frames allocated, attended, matched, rebuilt; sink; memory), the real
caches do what they describe, the cost model counts from it, and a new policy is one class and one registry line."""

import argparse

import pytest
import torch

from comfyui_fastar.fastar_core.caches import POLICIES, CacheShape, CacheSpec, DenseKVCache, TempCacheSettings
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.fastar.config import FastARConfig
from comfyui_fastar.fastar_core.forward.attention import DenseAttention
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.rollout.prompts import PromptSchedule, PromptSegment
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig
from comfyui_fastar.tools import checks
from comfyui_fastar.tools.args import add_cache_arguments, add_fastar_arguments, settings_from_arguments
from comfyui_fastar.tools.bench.cost_model import CacheCost, ModelShape, modelled_speedup, rollout_flops
from comfyui_fastar.tools.bench.scenarios import bench_modes
from comfyui_fastar.tools.checks import planned_cache_bytes

from helpers import TINY, tiny_context, tiny_model

FPB = 3
# One size set for every policy: sink 3; window and recompute attend to 9 frames (6 cached + the chunk); rolling
# holds 12 and attends to 9 (6 cached + the chunk); TempCache holds 6.
SPECS = {
    "global": CacheSpec(policy="global"),
    "window": CacheSpec(policy="window", sink_frames=3, window_frames=9),
    "rolling": CacheSpec(policy="rolling", sink_frames=3, rolling_capacity=12, rolling_attend=9),
    "tempcache": CacheSpec(policy="tempcache", sink_frames=3,
                           tempcache=TempCacheSettings(threshold=1.0, capacity_frames=6)),
    "recompute": CacheSpec(policy="recompute", sink_frames=1, window_frames=9),
}
# Toy shape: one token per frame, one layer, dim 2, FFN 4, one prompt token, one step per chunk. A pass of n = 3
# query tokens over m cached ones, matching r representatives: projections 3*48 + FFN 3*32 + cross-attention
# 3*8 + self-attention 8*3*(m + 3) + matching 4*3*r = 336 + 24 m + 12 r.
TOY = ModelShape("toy", dim=2, heads=1, layers=1, ffn=4, tokens_per_frame=1, text_tokens=1, frames_per_block=FPB,
                 steps=1)


def toy_pass(m, r=0):
    return 336 + 24 * m + 12 * r


# 18 frames = 6 chunks starting at frames 0, 3, .., 15; the last has no clean pass.
HAND_COUNT = {
    # attends to every committed frame: steps over 0, 3, .., 15; clean passes over 0 .. 12
    "global": sum(toy_pass(m) for m in (0, 3, 6, 9, 12, 15)) + sum(toy_pass(m) for m in (0, 3, 6, 9, 12)),
    # 6 cached frames at most (sink 3 + 3 recent)
    "window": sum(toy_pass(m) for m in (0, 3, 6, 6, 6, 6)) + sum(toy_pass(m) for m in (0, 3, 6, 6, 6)),
    "rolling": sum(toy_pass(m) for m in (0, 3, 6, 6, 6, 6)) + sum(toy_pass(m) for m in (0, 3, 6, 6, 6)),
    # the window's attention, plus matching the non-sink keys held (0, 0, 3, 3, 3) at the clean passes
    "tempcache": sum(toy_pass(m) for m in (0, 3, 6, 6, 6, 6))
    + sum(toy_pass(m, r) for m, r in ((0, 0), (3, 0), (6, 3), (6, 3), (6, 3))),
    # no clean pass after a chunk; before it, its context (0, 3, then 6 frames) re-encoded block-causally
    "recompute": sum(toy_pass(m) for m in (0, 3, 6, 6, 6, 6))
    + toy_pass(0) + 4 * (toy_pass(0) + toy_pass(3)),
}


def test_the_modelled_speedup_of_every_policy_matches_a_count_by_hand():
    assert set(HAND_COUNT) == set(POLICIES), "every registered policy needs its hand count here"
    dense = HAND_COUNT["global"]
    for policy, spec in SPECS.items():
        cost = CacheCost.of(spec.validate(FPB), FPB)
        assert rollout_flops(TOY, 18, cost)["total"] == HAND_COUNT[policy], policy
        assert modelled_speedup(TOY, 18, cost) == pytest.approx(dense / HAND_COUNT[policy]), policy


def test_the_bench_window_is_modelled_as_holding_what_tempcache_holds():
    modes = bench_modes()
    window, temp = CacheCost.of(modes["dense-window"][0], FPB), CacheCost.of(modes["tempcache"][0], FPB)
    assert [window.attended(c) for c in range(0, 60, 3)] == [temp.attended(c) for c in range(0, 60, 3)]
    assert window.attended(60) == 21


class RecordingAttention(DenseAttention):
    """Dense attention that records, per pass, the cache view's length in layer 0."""

    def __init__(self):
        super().__init__(backend="torch")
        self.passes = []

    def self_attention(self, layer, q, k, v, positions, view, info):
        if layer == 0:
            self.passes.append((info.step, info.frame_start, 0 if view is None else view.length))
        return super().self_attention(layer, q, k, v, positions, view, info)


def rollout(spec, frames=18, prompts=None, seed=0):
    runner = CausalRunner(tiny_model(seed), attention=RecordingAttention())
    sampler = build_sampler(runner, FastARConfig(backend="torch"))
    runner.attention = RecordingAttention()
    cfg = RolloutConfig(num_frames=frames, latent_height=2, latent_width=2, frames_per_block=FPB, cache=spec,
                        schedule="self-forcing")
    result = sampler.generate(prompts if prompts is not None else tiny_context(), cfg)
    return result, runner.attention.passes


def check_rollout_matches_its_description(spec, frames=18):
    """The real cache's views, clean passes and memory are what its policy class says."""
    cls = spec.policy_class
    tpf = 1  # a 2x2 latent is one 2x2 patch
    result, passes = rollout(spec, frames)
    starts = [r.frame_start for r in result.chunks]
    steps = [p for p in passes if p[0] >= 0]
    per_chunk = len(steps) // len(starts)
    for i, f0 in enumerate(starts):
        lengths = {length for _, _, length in steps[i * per_chunk:(i + 1) * per_chunk]}
        assert lengths == {cls.attended_frames(spec, f0, FPB) * tpf}, (spec.policy, f0, lengths)
    expected_clean = sum(-(-cls.rebuilt_frames(spec, f0, FPB) // FPB) for f0 in starts)
    expected_clean += (len(starts) - 1) if not cls.rebuilds_each_chunk else 0
    assert sum(1 for p in passes if p[0] < 0) == expected_clean, spec.policy
    shape = CacheShape(num_layers=TINY.num_layers, batch=1, num_heads=TINY.num_heads,
                       head_dim=TINY.dim // TINY.num_heads, grid_hw=(1, 1), frames_per_block=FPB)
    assert result.cache_stats["allocated_bytes"] == cls.planned_bytes(spec, shape, frames), spec.policy
    return result


@pytest.mark.parametrize("policy", sorted(SPECS))
def test_every_real_cache_attends_rebuilds_and_allocates_as_its_policy_says(policy):
    check_rollout_matches_its_description(SPECS[policy].validate(FPB))


def test_generate_plans_the_memory_the_cache_allocates():
    args = argparse.Namespace(height=16, width=16, frames=18, frames_per_block=FPB)
    for spec in SPECS.values():
        shape = CacheShape(num_layers=TINY.num_layers, batch=1, num_heads=TINY.num_heads,
                           head_dim=TINY.dim // TINY.num_heads, grid_hw=(1, 1), frames_per_block=FPB)
        assert planned_cache_bytes(spec, TINY, args, TINY_DTYPE) == spec.build(shape, 18).allocated_bytes()


TINY_DTYPE = tiny_model().blocks[0].self_attn.q.weight.dtype


# -- a new policy: this class and one registry line, nothing else ------------------------------------------------
class PreviousChunkCache(DenseKVCache):
    """Attends to the previous chunk only (no sink), in a ring buffer of one chunk."""

    policy = "previous-chunk"

    @classmethod
    def from_spec(cls, spec, shape, total_frames):
        return cls(**vars(shape), capacity_frames=shape.frames_per_block)

    @classmethod
    def describe(cls, spec):
        return "previous-chunk (the last chunk only)"

    @classmethod
    def allocated_frames(cls, spec, total_frames, frames_per_block):
        return frames_per_block

    @classmethod
    def attended_frames(cls, spec, committed, frames_per_block):
        return min(committed, frames_per_block)


def _cli(*argv):
    p = argparse.ArgumentParser()
    add_cache_arguments(p)
    add_fastar_arguments(p)
    return p.parse_args(list(argv))


def test_a_new_policy_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(POLICIES, "previous-chunk", PreviousChunkCache)  # the registry line

    # Chosen the way users choose: the engine and the command line offer it.
    spec = resolve_settings(cache_policy="previous-chunk").cache
    assert spec == settings_from_arguments(_cli("--cache", "previous-chunk")).cache
    assert spec.describe() == "previous-chunk (the last chunk only)"
    # The sampler runs it, the real cache attends as the class says, its memory is planned right.
    check_rollout_matches_its_description(spec, frames=12)
    # A prompt switch re-encodes what it asks for (no sink to spare).
    a, b = tiny_context(1), tiny_context(2)
    result, passes = rollout(spec, 12, PromptSchedule([PromptSegment(0, a), PromptSegment(6, b, recache_frames=3)]))
    assert (-1, 3, 0) in passes  # frames 3..5 re-encoded from an emptied cache before the chunk at frame 6
    # The cost model counts from it: the window's hand count with 3 cached frames at most.
    hand = (sum(toy_pass(m) for m in (0, 3, 3, 3, 3, 3)) + sum(toy_pass(m) for m in (0, 3, 3, 3, 3)))
    assert rollout_flops(TOY, 18, CacheCost.of(spec, FPB))["total"] == hand
    # The command line's checks refuse the sizes it does not read, naming the policies that do.
    with pytest.raises(FastARError, match="--window sizes the window, recompute caches.*previous-chunk"):
        checks.check_contradictions(_cli("--cache", "previous-chunk", "--window", "9"))
    with pytest.raises(FastARError, match="--sink sizes the window, rolling, tempcache, recompute caches"):
        checks.check_contradictions(_cli("--cache", "previous-chunk", "--sink", "1"))


# -- keys rotated once ----------------------------------------------------------------------------------------
def rollout_noting_rotation(attention, spec):
    """An 18-frame rollout of the tiny model through ``attention``, and whether each cache view it got held keys
    already rotated."""
    seen = []
    runner = CausalRunner(tiny_model(), attention=attention)
    sampler = build_sampler(runner, FastARConfig(backend="torch"))
    runner.attention = attention
    original = attention.self_attention

    def spy(layer, q, k, v, positions, view, info):
        if view is not None:
            seen.append(view.rotated)
        return original(layer, q, k, v, positions, view, info)

    attention.self_attention = spy
    cfg = RolloutConfig(num_frames=18, latent_height=4, latent_width=4, frames_per_block=FPB, cache=spec,
                        schedule="self-forcing")
    return sampler.generate(tiny_context(), cfg), seen


@pytest.mark.parametrize("policy", ["global", "window", "rolling", "recompute"])
def test_keys_rotated_once_give_the_rollout_of_keys_rotated_every_chunk(policy):
    from comfyui_fastar.tools.bench.rotated_keys import PreRopeKeys

    spec = SPECS[policy].validate(FPB)
    out = {}
    for name, attention in (("once", RecordingAttention()), ("every chunk", PreRopeKeys(backend="torch"))):
        result, seen = rollout_noting_rotation(attention, spec)
        out[name] = result.latent
        assert set(seen) == {name == "once"}, name
    # Rounding apart, the same rollout. Rolling's re-positioned sink (rotated on by the shift, from chunk 4 on)
    # perturbs at 1e-7 like the rest, but the tiny random model's attention amplifies it to 1e-5 in those chunks;
    # the views themselves agree to rounding (the next test) and the parity suite holds rolling to its reference.
    tolerance = 1e-4 if policy == "rolling" else 1e-5
    torch.testing.assert_close(out["once"], out["every chunk"], rtol=tolerance, atol=tolerance)


class JoiningAttention(DenseAttention):
    """Dense attention that declines the room a cache lends, so it joins the cache to the chunk's keys."""

    def self_attention(self, layer, q, k, v, positions, view, info):
        import dataclasses

        return super().self_attention(layer, q, k, v, positions,
                                      view if view is None else dataclasses.replace(view, room=None), info)


@pytest.mark.parametrize("policy", ["global", "window"])
def test_writing_the_chunk_into_the_caches_free_slots_gives_the_joined_rollout_bit_for_bit(policy, monkeypatch):
    """The global cache's view is a prefix of its buffers, with the rest of the rollout's slots free after it;
    the window reads a copy of its sink and recent frames (another order than the ring's), so it joins."""
    import comfyui_fastar.fastar_core.forward.attention as attention_module

    spec = SPECS[policy].validate(FPB)
    lent = []
    real = attention_module.joined

    def counting(view, cache_k, k, v):
        keys, values = real(view, cache_k, k, v)
        lent.append(view.room is not None and keys.data_ptr() == view.room[0].data_ptr())
        return keys, values

    monkeypatch.setattr(attention_module, "joined", counting)
    lent_run, _ = rollout_noting_rotation(DenseAttention(backend="torch"), spec)
    used, lent[:] = list(lent), []
    joined_run, _ = rollout_noting_rotation(JoiningAttention(backend="torch"), spec)
    assert not any(lent)
    assert used and all(used) if policy == "global" else not any(used)
    assert torch.equal(lent_run.latent, joined_run.latent)


def test_what_attention_writes_past_the_cache_is_never_read_back():
    cache = SPECS["global"].build(CacheShape(1, 1, 2, 8, (1, 2), frames_per_block=FPB, rotated_keys=True), 12)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 6, 8, generator=g)
    cache.prepare_commit(0, 3)
    cache.commit(0, k, k)
    cache.finish_commit()
    view = cache.view(0, 3, 3)
    assert view.room is not None and view.length == 6
    view.room[0][:, :, 6:].fill_(7.0)  # what a chunk's denoising passes leave there
    view.room[1][:, :, 6:].fill_(7.0)
    again = cache.view(0, 3, 3)
    assert again.length == 6 and not (again.k == 7).any()  # not in a view before the next commit
    cache.rewind(0)
    cache.prepare_commit(0, 3)
    cache.commit(0, k, -k)
    cache.finish_commit()
    after = cache.view(0, 3, 3)
    assert after.length == 6 and torch.equal(after.v, -k) and not (after.k == 7).any()
    quantized = CacheSpec("global", kv_quant="int8").validate(FPB).build(
        CacheShape(1, 1, 2, 8, (1, 2), frames_per_block=FPB, rotated_keys=True), 12)
    quantized.prepare_commit(0, 3)
    quantized.commit(0, k, k)
    assert quantized.view(0, 3, 3).room is None  # a dequantized copy is no prefix of the stored buffer


def test_the_rolling_cache_rotates_its_re_positioned_sink_on_by_the_shift():
    from comfyui_fastar.fastar_core.model.rope import rotate

    spec = SPECS["rolling"]
    g = torch.Generator().manual_seed(0)
    caches = [spec.build(CacheShape(1, 1, 2, 32, (2, 2), frames_per_block=FPB, rotated_keys=r), 30)
              for r in (False, True)]
    for i in range(5):
        k = torch.randn(1, 2, 12, 32, generator=g)
        for c in caches:
            c.prepare_commit(3 * i, 3)
            c.commit(0, k, k)
            if i < 4:
                c.finish_commit()
    clean = [c.view(0, 12, 3) for c in caches]  # the clean pass of frames 12..14: true positions
    for c in caches:
        c.finish_commit()
    denoise = [c.view(0, 15, 3) for c in caches]  # the sink (0..2) placed right before frames 12..14
    assert denoise[0].positions[0, ::4, 0].tolist() == [9, 10, 11, 12, 13, 14]
    for pre, rot in (clean, denoise):
        assert not pre.rotated and rot.rotated and torch.equal(pre.positions, rot.positions)
        torch.testing.assert_close(rotate(pre.k, pre.positions), rot.k, rtol=1e-6, atol=1e-6)


def test_tempcache_with_the_quantized_search_keeps_keys_rotated_and_gives_the_rollout_of_pre_rope_keys():
    """The quantized search rescores a few entries, rotated back; so its cache can store keys ready for attention.
    Same merges and, rounding apart, the same rollout as with keys before RoPE; the exact matcher keeps them
    before RoPE (it compares every representative)."""
    from comfyui_fastar.tools.bench.rotated_keys import PreRopeKeys

    out, merges = {}, {}
    for matcher in ("quantized", "exact"):
        # Threshold 0.5: the tiny random model's keys merge often, so groups change and keys move.
        spec = CacheSpec(policy="tempcache", sink_frames=3, tempcache=TempCacheSettings(
            threshold=0.5, capacity_frames=6, matcher=matcher)).validate(FPB)
        for name, attention in (("once", DenseAttention(backend="torch")),
                                ("every chunk", PreRopeKeys(backend="torch"))):
            result, seen = rollout_noting_rotation(attention, spec)
            out[matcher, name] = result.latent
            merges[matcher, name] = result.cache_stats["merges_per_layer"]
            assert set(seen) == {matcher == "quantized" and name == "once"}, (matcher, name)
    assert sum(merges["quantized", "once"]) > 0
    assert merges["quantized", "once"] == merges["quantized", "every chunk"] == merges["exact", "once"]
    torch.testing.assert_close(out["quantized", "once"], out["quantized", "every chunk"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["quantized", "once"], out["exact", "once"], rtol=1e-5, atol=1e-5)


def test_tempcache_keys_rotated_at_commit_are_its_pre_rope_keys_rotated_at_the_groups_positions():
    """Cache level, where every group changes: keys that repeat with noise, so most merge (newest key and position
    move) and the rest are inserted or evict groups. The rotated cache's keys are the pre-RoPE cache's keys rotated
    at its positions, and both make the same merges."""
    from comfyui_fastar.fastar_core.model.rope import rotate

    settings = TempCacheSettings(threshold=0.9, capacity_frames=6, matcher="quantized")
    spec = CacheSpec(policy="tempcache", sink_frames=3, tempcache=settings).validate(FPB)
    caches = [spec.build(CacheShape(1, 1, 2, 32, (2, 2), frames_per_block=FPB, rotated_keys=r), 30)
              for r in (False, True)]
    assert [c.keys_rotated for c in caches] == [False, True]
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 2, 6, 32, generator=g)
    for i in range(6):  # half of each chunk's keys repeat with noise, half are new
        k = torch.cat([base + 0.2 * torch.randn(1, 2, 6, 32, generator=g), torch.randn(1, 2, 6, 32, generator=g)], 2)
        v = torch.randn(1, 2, 12, 32, generator=g)
        for c in caches:
            c.prepare_commit(3 * i, 3)
            c.commit(0, k, v)
            c.finish_commit()
    plain, rotated = (c.view(0, 18, 3) for c in caches)
    assert caches[1].merges == caches[0].merges and caches[0].merges[0] > 6
    assert caches[1].evictions == caches[0].evictions and caches[0].evictions[0] > 0
    assert not plain.rotated and rotated.rotated
    torch.testing.assert_close(rotated.positions, plain.positions, rtol=0, atol=0)
    torch.testing.assert_close(rotated.v, plain.v, rtol=0, atol=0)
    torch.testing.assert_close(rotated.k, rotate(plain.k, plain.positions), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(rotated.k, plain.k, atol=1e-3)  # control: the rotation is not the identity here
