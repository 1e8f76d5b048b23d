"""The chunked runner with each cache policy equals a full-sequence forward under that policy's mask."""

import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheShape, CacheSpec
from comfyui_fastar.fastar_core.forward.attention import PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner

from helpers import reference_forward, tiny_context, tiny_model

FPB = 3
LATENT_HW = (4, 6)  # grid 2 x 3 = 6 tokens per frame
GRID = (2, 3)


def visible_frames(policy, spec, chunk_start, query_frames, clean=False):
    """Key frames (frame, effective temporal position) that queries of [chunk_start, +query_frames) see;
    ``clean``: in the pass that writes the chunk to the cache."""
    own = [(f, f) for f in range(chunk_start, chunk_start + query_frames)]
    past = list(range(chunk_start))
    if policy == "global":
        return [(f, f) for f in past] + own
    if policy == "window":  # window_frames attended in all, the sink and the queries included
        recent = max(0, spec.window_frames - min(spec.sink_frames, chunk_start) - query_frames)
        keep = [f for f in past if f < spec.sink_frames or f >= max(spec.sink_frames, chunk_start - recent)]
        return [(f, f) for f in keep] + own
    if clean:  # Rolling Forcing's clean pass: the last rolling_attend frames, the sink only while inside them
        span_start = chunk_start + query_frames - spec.rolling_attend
        return [(f, f) for f in past if f >= span_start] + own
    sink = [f for f in past if f < spec.sink_frames]
    working = [f for f in past if f >= spec.sink_frames]
    budget = max(0, spec.rolling_attend - len(sink) - query_frames)
    working = working[len(working) - budget:] if budget else []
    anchor = (working[0] if working else chunk_start) - len(sink)
    return [(f, anchor + j) for j, f in enumerate(sink)] + [(f, f) for f in working] + own


def run_cached(model, spec, prev, current, t_current, ctx):
    runner = CausalRunner(model)
    text = runner.encode_text(ctx)
    g = runner.geometry
    total = sum(x.shape[2] for x in prev) + current.shape[2]
    shape = CacheShape(num_layers=g.num_layers, batch=1, num_heads=g.num_heads, head_dim=g.head_dim, grid_hw=GRID)
    cache = spec.build(shape, total_frames=total)
    f0 = 0
    for x in prev:
        info = PassInfo(chunk=0, step=-1, num_steps=4, frame_start=f0, num_frames=x.shape[2], tokens_per_frame=6)
        runner.forward(x, torch.zeros(1, x.shape[2]), text, cache, info, commit=True, need_output=False)
        f0 += x.shape[2]
    info = PassInfo(chunk=1, step=0, num_steps=4, frame_start=f0, num_frames=current.shape[2], tokens_per_frame=6)
    return runner.forward(current, t_current, text, cache, info), cache


SPECS = {
    "global": CacheSpec(policy="global"),
    "window": CacheSpec(policy="window", sink_frames=3, window_frames=12),
    "rolling": CacheSpec(policy="rolling", sink_frames=3, rolling_capacity=12, rolling_attend=12),
}


@pytest.mark.parametrize("policy", ["global", "window", "rolling"])
@pytest.mark.parametrize("query_chunks", [1, 3])
def test_chunked_runner_matches_masked_full_sequence(policy, query_chunks):
    torch.manual_seed(0)
    model = tiny_model()
    ctx = tiny_context()
    spec = SPECS[policy]
    n_prev = 6
    prev = [torch.randn(1, 16, FPB, *LATENT_HW) for _ in range(n_prev)]
    current = torch.randn(1, 16, FPB * query_chunks, *LATENT_HW)
    # Staggered noise levels when several chunks are denoised jointly (rolling window).
    levels = torch.tensor([937.5, 833.3, 625.0])[:query_chunks].flip(0)
    t_cur = levels.repeat_interleave(FPB)[None]

    out, cache = run_cached(model, spec, prev, current, t_cur, ctx)

    groups = []
    for c in range(n_prev):
        groups.append((range(c * FPB, (c + 1) * FPB), visible_frames(policy, spec, c * FPB, FPB, clean=True)))
    start = n_prev * FPB
    groups.append((range(start, start + current.shape[2]), visible_frames(policy, spec, start, current.shape[2])))
    x_all = torch.cat(prev + [current], dim=2)
    t_all = torch.cat([torch.zeros(1, start), t_cur], dim=1)
    ref = reference_forward(model, x_all, t_all, ctx, groups, GRID)[:, :, start:]

    assert (out - ref).abs().max().item() < 1e-4
    if policy != "global":
        assert cache.stats()["frames"] <= cache.capacity_frames
    # The policy matters: without its mask the result differs (so this test can fail).
    if policy != "global":
        full = [(range(c * FPB, (c + 1) * FPB), visible_frames("global", spec, c * FPB, FPB)) for c in range(n_prev)]
        full.append((range(start, start + current.shape[2]), visible_frames("global", spec, start, current.shape[2])))
        other = reference_forward(model, x_all, t_all, ctx, full, GRID)[:, :, start:]
        assert (other - ref).abs().max().item() > 1e-3


def test_per_frame_timesteps_modulate_each_frame():
    model = tiny_model()
    runner = CausalRunner(model)
    text = runner.encode_text(tiny_context())
    x = torch.randn(1, 16, 3, *LATENT_HW)
    info = PassInfo(chunk=0, step=0, num_steps=1, frame_start=0, num_frames=3, tokens_per_frame=6)
    a = runner.forward(x, torch.tensor([[900.0, 500.0, 100.0]]), text, None, info)
    b = runner.forward(x, torch.tensor([[900.0, 500.0, 700.0]]), text, None, info)
    assert not torch.allclose(a[:, :, 2], b[:, :, 2])
    assert (a[:, :, 0] - b[:, :, 0]).abs().max() > 0  # frames interact through attention
