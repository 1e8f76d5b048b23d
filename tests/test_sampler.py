"""The AR sampler: determinism, no RoPE length limit, flat window memory, prompt switches, cancellation, errors."""

import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheShape, CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError, GenerationCancelled
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.prompts import PromptSchedule, PromptSegment
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig, noise_seed
from comfyui_fastar.fastar_core.rollout.schedule import SCHEDULE_PRESETS, get_schedule, training_table

from helpers import tiny_context, tiny_model


def rollout(model=None, prompts=None, **kw):
    model = model or tiny_model()
    cfg = RolloutConfig(**{"num_frames": 12, "latent_height": 4, "latent_width": 4, **kw})
    return ARSampler(CausalRunner(model)).generate(prompts if prompts is not None else tiny_context(), cfg)


def test_schedules_match_the_reference_models():
    sf = SCHEDULE_PRESETS["self-forcing"].sigmas
    assert [round(s, 4) for s in sf] == [1.0, 0.9375, 0.8333, 0.625]
    rf = SCHEDULE_PRESETS["rolling-forcing"].sigmas
    assert [round(s, 3) for s in rf] == [1.0, 0.952, 0.882, 0.769, 0.556]
    # Entries 1000 - s of the float32 shifted table, bit for bit, as the references index it (two of the five
    # are one float32 ulp away when shifted in float64).
    table = training_table(5.0)[0]
    assert torch.equal(torch.tensor(rf, dtype=torch.float32), table[[0, 200, 400, 600, 800]])
    assert torch.equal(torch.tensor(sf, dtype=torch.float32), table[[0, 250, 500, 750]])
    assert get_schedule("1000,757,522").sigmas == (1.0, 0.757, 0.522)
    assert get_schedule(torch.tensor([1.0, 0.5, 0.0])).sigmas == (1.0, 0.5)
    with pytest.raises(FastARError, match="not a preset"):
        get_schedule("euler")


@pytest.mark.parametrize("mode", ["chunk", "rolling"])
def test_same_seed_same_output_bit_for_bit(mode):
    model = tiny_model()  # building modules draws from the global RNG; sampling must not
    state = torch.random.get_rng_state()
    a = rollout(model, seed=7, mode=mode).latent
    b = rollout(model, seed=7, mode=mode).latent
    c = rollout(model, seed=8, mode=mode).latent
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(state, torch.random.get_rng_state()), "the sampler must not touch the global RNG"
    assert len({noise_seed(s, c, t) for s in range(3) for c in range(50) for t in range(6)}) == 3 * 50 * 6


def test_long_rollout_past_rope_table_with_flat_window_memory():
    cfg = WanConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=32, text_dim=32, freq_dim=32)
    model = random_wan(cfg, seed=3)
    reports = []
    spec = CacheSpec(policy="window", sink_frames=3, window_frames=15)  # sink 3 + 9 recent + the chunk
    rc = RolloutConfig(num_frames=1110, latent_height=2, latent_width=2, cache=spec,
                       schedule=get_schedule([1.0, 0.5]))
    result = ARSampler(CausalRunner(model)).generate(tiny_context(), rc, callback=reports.append)
    assert result.latent.shape[2] == 1110
    assert torch.isfinite(result.latent).all()
    sizes = [r.cache_bytes for r in reports]
    full = sizes[4]  # sink 3 + 9 recent = 12 frames held after four 3-frame chunks
    assert all(s == full for s in sizes[4:])
    assert sizes[0] < full
    assert result.cache_stats["evicted_frames"] > 300
    # Late frames still depend on the content (no collapse to a constant from a broken RoPE).
    assert result.latent[:, :, -3:].std() > 0.1


def test_global_cache_grows_and_rolling_mode_runs():
    reports = []
    model = tiny_model()
    cfg = RolloutConfig(num_frames=12, latent_height=4, latent_width=4, mode="rolling",
                        schedule="rolling-forcing", cache=CacheSpec(policy="global"))
    result = ARSampler(CausalRunner(model)).generate(tiny_context(), cfg, callback=reports.append)
    assert [r.index for r in reports] == [0, 1, 2, 3]
    assert [r.frame_start for r in reports] == [0, 3, 6, 9]
    sizes = [r.cache_bytes for r in reports]
    assert sizes == sorted(sizes) and sizes[0] < sizes[2]
    assert torch.isfinite(result.latent).all()


def test_prompt_switch_changes_only_later_frames_and_recache_rewrites_the_cache():
    model = tiny_model()
    a, b = tiny_context(seed=1), tiny_context(seed=2)
    single = rollout(model, a).latent
    switched = rollout(model, PromptSchedule([PromptSegment(0, a), PromptSegment(6, b)])).latent
    recached = rollout(model, PromptSchedule([PromptSegment(0, a), PromptSegment(6, b, recache_frames=6)])).latent
    assert torch.equal(single[:, :, :6], switched[:, :, :6])
    assert not torch.allclose(single[:, :, 6:], switched[:, :, 6:])
    assert torch.equal(switched[:, :, :6], recached[:, :, :6])
    assert not torch.allclose(switched[:, :, 6:], recached[:, :, 6:])


def test_prompt_schedule_validation():
    ctx = tiny_context()
    with pytest.raises(FastARError, match="frame 0"):
        PromptSchedule([PromptSegment(3, ctx)])
    with pytest.raises(FastARError, match="same frame"):
        PromptSchedule([PromptSegment(0, ctx), PromptSegment(0, ctx)])
    with pytest.raises(FastARError, match="expected a tensor"):
        PromptSchedule([PromptSegment(0, ctx[0])])


def test_initial_latents_are_kept_and_condition_the_rollout():
    model = tiny_model()
    runner = CausalRunner(model)
    init = torch.randn(1, 16, 3, 4, 4)
    cfg = RolloutConfig(num_frames=6, latent_height=4, latent_width=4)
    with_init = ARSampler(runner).generate(tiny_context(), cfg, initial_latents=init).latent
    assert with_init.shape[2] == 9
    assert torch.equal(with_init[:, :, :3], init)
    other = ARSampler(runner).generate(tiny_context(), cfg, initial_latents=init * 0.0).latent
    assert not torch.allclose(with_init[:, :, 3:], other[:, :, 3:])
    with pytest.raises(FastARError, match="initial latents"):
        ARSampler(runner).generate(tiny_context(), cfg, initial_latents=torch.zeros(1, 16, 3, 8, 8))


def test_cancel_between_steps_frees_the_cache():
    model = tiny_model()
    sampler = ARSampler(CausalRunner(model))
    built = []
    original = sampler.build_cache

    def spy(*args):
        built.append(original(*args))
        return built[-1]

    sampler.build_cache = spy
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 5

    with pytest.raises(GenerationCancelled):
        sampler.generate(tiny_context(), RolloutConfig(num_frames=12, latent_height=4, latent_width=4), cancel=cancel)
    assert built[0].k is None, "the cache must be freed on cancellation"


def test_bad_inputs_stop_before_running():
    model = tiny_model()
    with pytest.raises(FastARError, match="num_frames"):
        rollout(model, num_frames=0)
    with pytest.raises(FastARError, match="divisible by the patch size"):
        rollout(model, latent_height=5)
    with pytest.raises(FastARError, match="expected \\[batch, tokens, 32\\]"):
        rollout(model, torch.zeros(1, 8, 7))
    with pytest.raises(FastARError, match="NaN"):
        rollout(model, torch.full((1, 8, 32), float("nan")))
    with pytest.raises(FastARError, match="cache policy"):
        rollout(model, cache=CacheSpec(policy="lru"))
    with pytest.raises(FastARError, match="window_frames"):
        rollout(model, cache=CacheSpec(policy="window", window_frames=1))


def test_non_finite_model_output_stops_at_the_first_chunk():
    model = tiny_model()
    with torch.no_grad():
        model.head.head.weight.fill_(float("inf"))
    reports = []
    with pytest.raises(FastARError, match="chunk 0 produced NaN"):
        ARSampler(CausalRunner(model)).generate(
            tiny_context(), RolloutConfig(num_frames=9, latent_height=4, latent_width=4), callback=reports.append)
    assert reports == []


def test_initial_noise_replaces_each_chunks_first_draw():
    model = tiny_model()
    runner = CausalRunner(model)
    cfg = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=5)
    seeded = ARSampler(runner).generate(tiny_context(), cfg).latent
    # The sampler's own first draws, passed explicitly, reproduce the seeded run bit for bit.
    own = torch.cat([ARSampler(runner).noise_source(cfg)(c, 0, 3) for c in range(2)], dim=2)
    assert torch.equal(ARSampler(runner).generate(tiny_context(), cfg, initial_noise=own).latent, seeded)
    other = ARSampler(runner).generate(tiny_context(), cfg, initial_noise=torch.zeros_like(own)).latent
    assert not torch.allclose(other, seeded)
    with pytest.raises(FastARError, match="initial noise"):
        ARSampler(runner).generate(tiny_context(), cfg, initial_noise=torch.zeros(1, 16, 5, 4, 4))


def test_short_prompt_runs_as_its_zero_padded_form():
    """Wan pads the text context to text_len (512) before text_embedding; the runner does the same."""
    model = tiny_model()
    short = tiny_context(tokens=8)
    padded = torch.cat([short, torch.zeros(1, 512 - 8, short.shape[2])], dim=1)
    a = rollout(model, short, num_frames=6).latent
    assert torch.equal(a, rollout(model, padded, num_frames=6).latent)
    assert not torch.allclose(a, rollout(model, short[:, :4], num_frames=6).latent)


def test_reference_schedules_keep_their_model_timesteps():
    causvid = SCHEDULE_PRESETS["causvid"]
    assert causvid.timesteps == [1000.0, 757.0, 522.0]  # fed unwarped, converted with the shift-8 table's sigma
    assert causvid.sigmas[1] == pytest.approx(0.756757, abs=1e-6) and causvid.sigmas[1] != 0.757
    krea = SCHEDULE_PRESETS["krea"]
    assert [round(t, 1) for t in krea.timesteps] == [1000.0, 937.5, 833.3, 625.0, 0.0]
    assert krea.sigmas[-1] == pytest.approx(0.00498, abs=1e-5)  # the table's smallest sigma, at timestep 0


def test_first_chunk_has_its_own_schedule():
    """Causal Forcing++: the first frame takes the 4-step list, later frames 1 step."""
    model = tiny_model()
    seen = []
    sampler = ARSampler(CausalRunner(model))
    original = sampler.runner.forward

    def spy(x, timesteps, text, cache, info, commit=False, need_output=True):
        if not commit:
            seen.append((info.chunk, round(float(timesteps[0, 0]), 1)))
        return original(x, timesteps, text, cache, info, commit=commit, need_output=need_output)

    sampler.runner.forward = spy
    cfg = RolloutConfig(num_frames=3, latent_height=4, latent_width=4, frames_per_block=1,
                        schedule="causal-forcing++-1step")
    totals = []
    sampler.generate(tiny_context(), cfg, step_callback=lambda done, total: totals.append(total))
    assert seen == [(0, 1000.0), (0, 937.5), (0, 833.3), (0, 625.0), (1, 1000.0), (2, 1000.0)]
    assert totals[-1] == 6 + 3  # every denoising forward and one clean pass per chunk
    with pytest.raises(FastARError, match="first-chunk schedule needs sampler mode 'chunk'"):
        rollout(model, mode="rolling", first_chunk_schedule="causvid")


def test_recompute_cache_rebuilds_a_short_context_before_every_chunk():
    """Krea's recompute: context = anchor (sink) frames + the most recent ones at positions 0.., the chunk right
    after; the cache never holds more than the context and positions stay bounded however long the video."""
    from comfyui_fastar.fastar_core.caches import RecomputeCache

    spec = CacheSpec(policy="recompute", sink_frames=1, window_frames=6)
    shape = CacheShape(num_layers=1, batch=1, num_heads=1, head_dim=4, grid_hw=(1, 1))
    cache = spec.build(shape, total_frames=30)
    assert isinstance(cache, RecomputeCache)
    assert cache.context_frames(0, 3) == [] and cache.context_frames(3, 3) == [0, 1, 2]
    assert cache.context_frames(12, 3) == [0, 10, 11]
    assert CacheSpec(policy="recompute", sink_frames=0, window_frames=6).build(shape, 30).context_frames(12, 3) == [
        9, 10, 11]
    model = tiny_model()
    runner = CausalRunner(model)
    starts = []
    original = runner.forward

    def spy(x, timesteps, text, cache, info, commit=False, need_output=True):
        starts.append(info.frame_start)
        return original(x, timesteps, text, cache, info, commit=commit, need_output=need_output)

    runner.forward = spy
    reports = []
    cfg = RolloutConfig(num_frames=18, latent_height=4, latent_width=4, cache=spec)
    result = ARSampler(runner).generate(tiny_context(), cfg, callback=reports.append)
    assert max(starts) == 3  # context at 0..2, every chunk at 3
    assert max(r.cache_bytes for r in reports) == reports[-1].cache_bytes  # flat: three frames' worth
    window = rollout(model, num_frames=18, cache=CacheSpec(policy="window", sink_frames=1, window_frames=6)).latent
    assert not torch.allclose(result.latent[:, :, 6:], window[:, :, 6:])  # not a window under another name
    with pytest.raises(FastARError, match="window_frames - frames_per_block"):
        rollout(model, cache=CacheSpec(policy="recompute", sink_frames=3, window_frames=6))
    with pytest.raises(FastARError, match="needs sampler mode 'chunk'"):
        rollout(model, mode="rolling", cache=spec)


@pytest.mark.parametrize("policy", ["window", "tempcache"])
@pytest.mark.parametrize("switch", [3, 6, 12, 15])
def test_recache_from_frame_zero_re_encodes_the_sink(policy, switch):
    """LongLive's recache of a switch within its first window (local_attn_size 12) starts at frame 0 with its
    sink protection off, so the sink takes the new prompt too; a later one keeps the sink and re-encodes the
    last 12 frames after it, a window only the 9 it holds besides the sink."""
    first = 0 if switch <= 12 else {"window": switch - 9, "tempcache": switch - 12}[policy]
    spec = CacheSpec(policy=policy, sink_frames=3, window_frames=12)
    model = tiny_model()
    sampler = ARSampler(CausalRunner(model))
    passes, built = [], []
    original = sampler.build_cache

    def spy(*args):
        cache = original(*args)
        prepare, rewind = cache.prepare_commit, cache.rewind
        cache.prepare_commit = lambda start, n, at=None: (passes.append((start, n)), prepare(start, n, at))[1]
        cache.rewind = lambda frame: (passes.append(("rewind", frame)), rewind(frame))[1]
        built.append(cache)
        return cache

    sampler.build_cache = spy
    a, b = tiny_context(seed=1), tiny_context(seed=2)
    prompts = PromptSchedule([PromptSegment(0, a), PromptSegment(switch, b, recache_frames=12)])
    cfg = RolloutConfig(num_frames=switch + 6, latent_height=4, latent_width=4, cache=spec)
    sampler.generate(prompts, cfg)
    at = passes.index(("rewind", first))
    assert passes[at + 1] == (first, switch - first), passes
    assert passes[at - 1] == (switch - 3, 3) and passes[at + 2] == (switch, 3)  # between the chunks' own passes


def test_window_commit_of_more_frames_than_it_holds_keeps_the_sink_and_the_newest():
    """A recache from frame 0 writes 12 frames into a window that holds 9 (sink 3 + 6 recent): the sink frames
    and the newest 6 stay, each at its own slot's keys and position."""
    spec = CacheSpec(policy="window", sink_frames=3, window_frames=12)
    shape = CacheShape(num_layers=1, batch=1, num_heads=1, head_dim=4, grid_hw=(1, 1), frames_per_block=3)
    cache = spec.build(shape, total_frames=30)
    k = torch.arange(12.0)[None, None, :, None].expand(1, 1, 12, 4)  # key value = frame index
    cache.prepare_commit(0, 12)
    cache.commit(0, k, k)
    cache.finish_commit()
    view = cache.view(0, 12, 3)
    assert view.k[0, 0, :, 0].tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11]
    assert view.positions[0, :, 0].tolist() == [0, 1, 2, 6, 7, 8, 9, 10, 11]
    assert view.n_sink == 3
    cache.rewind(6)  # a later rewind keeps the sink
    assert cache.view(0, 6, 3).k[0, 0, :, 0].tolist() == [0, 1, 2]
    cache.rewind(0)  # from frame 0 the sink goes too
    assert cache.view(0, 0, 3) is None


def test_batch_items_are_successive_draws_and_can_be_remade_alone():
    """As ComfyUI's prepare_noise: item i of a batch is the i-th draw of each stream, whatever the batch size, so
    batch_index (i,) gives item i's noise alone; the batched engine's rows are the same items."""
    runner = CausalRunner(tiny_model())
    both = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=5, batch=2)
    draws = ARSampler(runner).noise_source(both)(1, 2, 3)
    for i in (0, 1):
        alone = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=5, batch_index=(i,))
        assert torch.equal(ARSampler(runner).noise_source(alone)(1, 2, 3), draws[i:i + 1])
    g = torch.Generator().manual_seed(noise_seed(5, 1, 2))
    sequential = torch.cat([torch.randn(1, 16, 3, 4, 4, generator=g) for _ in range(2)])
    assert torch.equal(draws, sequential), "one batch draw equals successive per-item draws"
    swapped = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=5, batch=2, batch_index=(1, 0))
    assert torch.equal(ARSampler(runner).noise_source(swapped)(1, 2, 3), draws.flip(0))
    batched = ARSampler(runner).generate(tiny_context().expand(2, -1, -1), both).latent
    second = ARSampler(runner).generate(tiny_context(), RolloutConfig(num_frames=6, latent_height=4, latent_width=4,
                                                                      seed=5, batch_index=(1,))).latent
    assert torch.allclose(batched[1:], second, atol=1e-5) and not torch.allclose(batched[:1], second, atol=1e-3)
    with pytest.raises(FastARError, match="batch_index"):
        ARSampler(runner).generate(tiny_context(), RolloutConfig(num_frames=6, latent_height=4, latent_width=4,
                                                                 batch_index=(0, 1)))


@pytest.mark.parametrize("policy", ["window", "tempcache"])
def test_rope_tables_are_sized_before_the_rollout_and_never_grow_in_it(monkeypatch, policy):
    """A rollout's RoPE tables (the attention's and the cache's) cover its whole length before its first chunk:
    grown mid-rollout, the chunk crossing each doubling (64, 128 frames, ...) paid for the rebuild, a fifth of a
    chunk at 1,024 and 2,048 frames on the LingBot cap bench, and a captured step would be captured again."""
    from comfyui_fastar.fastar_core.caches.spec import TempCacheSettings
    from comfyui_fastar.fastar_core.model.rope import RopeTables

    grown, started = [], []
    ensure = RopeTables.ensure

    def watched(self, span):
        if span > self.span and started:
            grown.append((self.span, span))
        return ensure(self, span)

    monkeypatch.setattr(RopeTables, "ensure", watched)
    cfg = WanConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=32, text_dim=32, freq_dim=32)
    spec = (CacheSpec(policy="window", sink_frames=3, window_frames=15) if policy == "window" else
            CacheSpec(policy="tempcache", sink_frames=3, tempcache=TempCacheSettings(capacity_frames=12)))
    rc = RolloutConfig(num_frames=150, latent_height=2, latent_width=2, cache=spec, schedule=get_schedule([1.0, 0.5]))
    result = ARSampler(CausalRunner(random_wan(cfg, seed=3))).generate(
        tiny_context(), rc, callback=lambda report: started.append(report.frame_start))
    assert len(started) == 50 and torch.isfinite(result.latent).all()
    assert not grown, f"tables grew mid-rollout (span before, span asked): {grown}"
