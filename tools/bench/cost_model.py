"""``fastar bench cost-model``: what a bounded cache can save, from the model's shapes alone (``flops.py``
counts them), as tables per model and cache length, with the sequence-parallel table of ``cost_parallel.py``."""

from __future__ import annotations

from pathlib import Path

from .flops import (  # noqa: F401 - the shapes and counts are this module's API too
    LONGLIVE2_5B,
    LONGLIVE2_GRID,
    LONGLIVE2_MODES,
    LONGLIVE2_PROMPT_TOKENS,
    PARTS,
    WAN_1_3B,
    WAN_14B,
    CacheCost,
    ModelShape,
    mode_speedup,
    modelled_speedup,
    pass_flops,
    real_prompt_tokens,
    rollout_flops,
    shape_of_scenario,
    video_to_latent_frames,
)
from .report import line_plots, write_json

VIDEO_FRAMES = (81, 241, 481, 961, 1921, 3001)


def cost_table(s: ModelShape, latent_lengths, capacity_frames: int = 21) -> list[dict]:
    rows = []
    for frames in latent_lengths:
        dense = rollout_flops(s, frames)
        shares = {k: round(v / dense["total"], 4) for k, v in dense["parts"].items()}
        rows.append({
            "latent_frames": frames, "video_frames": 4 * (frames - 1) + 1,
            "dense_global_flops": float(f"{dense['total']:.4g}"),
            "dense_global_shares": shares,
            "speedup_limit": round(modelled_speedup(s, frames, CacheCost.bounded(0)), 3),
            f"speedup_window_{capacity_frames}": round(
                modelled_speedup(s, frames, CacheCost.bounded(capacity_frames)), 3),
            f"speedup_tempcache_{capacity_frames}": round(
                modelled_speedup(s, frames, CacheCost.bounded(capacity_frames, tempcache=True)), 3),
        })
    return rows


def longlive2_modes() -> dict:
    """The rollout bench's modes at LongLive 2.0's sizes: dense-window is its own cache (window 32 with the chunk,
    sink 8: 24 frames cached), TempCache holds as many frames' worth of groups, sink 8."""
    from .scenarios import LONGLIVE2_CHUNK, LONGLIVE2_SINK, LONGLIVE2_WINDOW, bench_modes

    modes = bench_modes(capacity=LONGLIVE2_WINDOW - LONGLIVE2_CHUNK, sink=LONGLIVE2_SINK, chunk=LONGLIVE2_CHUNK)
    return {name: modes[name] for name in LONGLIVE2_MODES}


def cache_bytes(s: ModelShape, grid_hw: tuple, spec, frames: int, dtype=None) -> int:
    """Bytes a cache policy allocates for a rollout of ``frames`` latent frames at ``s`` (bf16 by default), as the
    policy class plans them (the number ``fastar generate``'s memory check uses)."""
    import torch

    from ...fastar_core.caches.base import CacheShape

    shape = CacheShape(num_layers=s.layers, batch=1, num_heads=s.heads, head_dim=s.dim // s.heads, grid_hw=grid_hw,
                       dtype=dtype or torch.bfloat16, frames_per_block=s.frames_per_block)
    return spec.policy_class.planned_bytes(spec, shape, frames)


def longlive2_table(s: ModelShape = LONGLIVE2_5B, grid_hw: tuple = LONGLIVE2_GRID, video_lengths=VIDEO_FRAMES,
                    prompt_tokens: int = LONGLIVE2_PROMPT_TOKENS) -> list[dict]:
    """Per video length: each mode's modelled speedup over dense-global and over LongLive 2.0's own window, and
    the cache bytes it allocates (bf16)."""
    modes = longlive2_modes()
    rows = []
    for video in video_lengths:
        frames = video_to_latent_frames(video)
        flops = {name: rollout_flops(s, frames, CacheCost.of(spec, s.frames_per_block),
                                     text_tokens=prompt_tokens + 1 if fastar.annca else None)["total"]
                 for name, (spec, fastar) in modes.items()}
        rows.append({
            "video_frames": video, "latent_frames": frames,
            "flops": {k: float(f"{v:.6g}") for k, v in flops.items()},
            "speedup_vs_dense_global": {k: round(flops["dense-global"] / v, 3) for k, v in flops.items()},
            "speedup_vs_longlive2_window": {k: round(flops["dense-window"] / v, 4) for k, v in flops.items()},
            "cache_gib": {name: round(cache_bytes(s, grid_hw, spec, frames) / 2**30, 3)
                          for name, (spec, _) in modes.items()},
        })
    return rows


LONGLIVE2_CPU_FRAMES = (24, 48, 96)  # latent frames: one, two and three windows


def longlive2_cpu_rows(scenario) -> dict:
    shape = shape_of_scenario(scenario)
    grid = (scenario.latent_hw[0] // 2, scenario.latent_hw[1] // 2)
    videos = [4 * (f - 1) + 1 for f in LONGLIVE2_CPU_FRAMES]
    return {"shape": shape.to_dict(), "grid_hw": list(grid),
            "rows": longlive2_table(shape, grid, videos, prompt_tokens=real_prompt_tokens(scenario.context) - 1)}


def run_cost_model(out_dir, cpu_frames: int = 240, capacity_frames: int = 21) -> dict:
    from .scenarios import demo_scenario, longlive2_scenario, wan_shapes_scenario

    out_dir = Path(out_dir)
    lengths = [video_to_latent_frames(v) for v in VIDEO_FRAMES]
    models = {}
    for shape in (WAN_1_3B, WAN_14B):
        models[shape.name] = {"shape": shape.to_dict(), "rows": cost_table(shape, lengths, capacity_frames)}
    for scenario in (demo_scenario(0), wan_shapes_scenario(0)):
        shape = shape_of_scenario(scenario)
        cpu_lengths = sorted({min(cpu_frames, x) for x in (21, 60, 120, cpu_frames)})
        models[f"{shape.name} (CPU bench)"] = {"shape": shape.to_dict(),
                                               "rows": cost_table(shape, cpu_lengths, capacity_frames)}
    report = {"benchmark": "cost-model", "capacity_frames": capacity_frames, "models": models,
              "definitions": {
                  "speedup_limit": "dense-global FLOPs / FLOPs with no cache at all: no bounded cache can beat it",
                  f"speedup_window_{capacity_frames}": f"dense-global / a dense cache of {capacity_frames} frames",
                  f"speedup_tempcache_{capacity_frames}": "the same plus TempCache's matching at each clean pass",
                  "dense_global_shares": "share of dense-global's FLOPs by part",
                  "counted": "matmul FLOPs of the transformer (see tools/bench/cost_model.py)"}}
    from .cost_parallel import parallel_report, print_parallel

    report["sequence_parallel"] = parallel_report(capacity_frames=capacity_frames)
    report["longlive2"] = {
        "shape": LONGLIVE2_5B.to_dict(), "grid_hw": list(LONGLIVE2_GRID), "window_frames": 32, "sink_frames": 8,
        "prompt_tokens_for_annca": LONGLIVE2_PROMPT_TOKENS, "cache_dtype": "bfloat16",
        "modes": {name: {"cache": spec.describe(), "fastar": fastar.to_dict()}
                  for name, (spec, fastar) in longlive2_modes().items()},
        "rows": longlive2_table(),
        # the rollout bench's reduced shapes (--scenario longlive2-5b on a CPU), at the 96 latent frames it is run at
        "cpu_bench": longlive2_cpu_rows(longlive2_scenario(0)),
        "definitions": {
            "dense-window": "LongLive 2.0's own cache: the sink and the most recent frames, 32 with the chunk",
            "tempcache": "FAST-AR's TempCache holding as many frames' worth of groups (24), sink 8",
            "all": f"TempCache with AnnSA (counted dense) and AnnCA's pad merge ({LONGLIVE2_PROMPT_TOKENS} real "
                   "prompt tokens + 1 merged pad key)",
            "cache_gib": "bytes the policy allocates for the rollout (K and V in bf16 with their positions; "
                         "TempCache's groups with their counts and positions)"}}
    write_json(out_dir / "cost_model.json", report)
    series_speed, series_share = {}, {}
    for name, m in models.items():
        if "CPU" in name:
            continue
        xs = [r["video_frames"] for r in m["rows"]]
        series_speed[f"{name}: limit"] = (xs, [r["speedup_limit"] for r in m["rows"]])
        series_speed[f"{name}: {capacity_frames}-frame cache"] = (
            xs, [r[f"speedup_window_{capacity_frames}"] for r in m["rows"]])
        series_share[name] = (xs, [r["dense_global_shares"]["self_attention"] for r in m["rows"]])
    line_plots(out_dir / "cost_model.png", [
        {"title": "modelled end-to-end speedup over dense-global", "xlabel": "video frames", "ylabel": "x",
         "series": series_speed},
        {"title": "self-attention share of dense-global FLOPs", "xlabel": "video frames", "ylabel": "share",
         "series": series_share},
    ], title="cost model (matmul FLOPs), Self-Forcing schedule")
    ll2 = report["longlive2"]["rows"]
    xs = [r["video_frames"] for r in ll2]
    line_plots(out_dir / "cost_model_longlive2.png", [
        {"title": "modelled speedup over dense-global", "xlabel": "video frames", "ylabel": "x",
         "series": {m: (xs, [r["speedup_vs_dense_global"][m] for r in ll2]) for m in LONGLIVE2_MODES}},
        {"title": "KV cache allocated (bf16)", "xlabel": "video frames", "ylabel": "GiB",
         "series": {m: (xs, [r["cache_gib"][m] for r in ll2]) for m in LONGLIVE2_MODES}},
    ], title="LongLive 2.0 (Wan2.2-TI2V-5B) 704x1280, blocks of 8, window 32 sink 8")
    print_cost_model(report)
    print_longlive2(report["longlive2"])
    print_parallel(report["sequence_parallel"])
    return report


def print_longlive2(section: dict) -> None:
    print(f"\n{section['shape']['name']}: modelled speedup over dense-global (over LongLive 2.0's window) and "
          "cache allocated, bf16")
    print(f"{'video fr':>8s} {'latent fr':>9s} " + " ".join(f"{m:>26s}" for m in LONGLIVE2_MODES))
    for r in section["rows"]:
        cells = [f"{r['speedup_vs_dense_global'][m]:6.2f}x ({r['speedup_vs_longlive2_window'][m]:5.3f}) "
                 f"{r['cache_gib'][m]:7.2f} GiB" for m in LONGLIVE2_MODES]
        print(f"{r['video_frames']:8d} {r['latent_frames']:9d} " + " ".join(f"{c:>26s}" for c in cells))


def print_cost_model(report: dict) -> None:
    c = report["capacity_frames"]
    for name, m in report["models"].items():
        print(f"\n{name}" + ("" if "CPU" in name else " (video frames = 4 x (latent frames - 1) + 1)"))
        print(f"{'video fr':>8s} {'latent fr':>9s} {'dense FLOP':>11s} {'self-attn share':>15s} {'limit':>7s} "
              f"{f'{c}-fr cache':>11s} {'tempcache':>9s}")
        for r in m["rows"]:
            video = "-" if "CPU" in name else str(r["video_frames"])  # CPU models' frames are latent frames only
            print(f"{video:>8s} {r['latent_frames']:9d} {r['dense_global_flops']:11.3g} "
                  f"{r['dense_global_shares']['self_attention']:15.3f} {r['speedup_limit']:7.2f} "
                  f"{r[f'speedup_window_{c}']:11.2f} {r[f'speedup_tempcache_{c}']:9.2f}")
