"""``fastar bench pareto``: quality against cost for the bounded caches, at several capacities.

For each capacity (frames' worth of tokens, sink included): ``dense-window`` (sink + the newest frames) and
``tempcache`` at a few merge thresholds (and, with ``variants``, other merge rules), with ``dense-global`` as the
reference. Every point runs in one process, chunk by chunk in turn with every other point (``interleave.py``).
Per point: PSNR pooled over every generated frame and mean SSIM against ``dense-global`` (demo model only; random
weights give no meaningful quality), mean seconds per chunk (each chunk's time the median over repeats), the
steady-state seconds per chunk (median over the chunks after the cache is full), live and allocated cache bytes,
and for TempCache what merged: merges per layer, mean group size, evictions. ``pareto.json`` holds it all and
``pareto.png`` plots PSNR against seconds per chunk, one curve per policy.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from ...fastar_core.errors import FastARError
from ...fastar_core.fastar.metrics import finite_or_none, video_quality
from .flops import mode_speedup, real_prompt_tokens, shape_of_scenario
from .report import line_plots, machine, write_json
from .rollout import timed_rollouts
from .scenarios import SINK_FRAMES, demo_scenario, pareto_modes, wan_shapes_scenario

CAPACITIES = (6, 9, 12, 15, 21, 30)
LENGTHS = (30, 60, 120)
# Merge rules that account for time (TempCacheSettings), each run at threshold 0.9 beside the default.
VARIANTS = {
    "rotated": {"similarity": "rotated"},  # cosine after RoPE, each key at its own position
    "spread6": {"max_spread_frames": 6},  # a group takes no key more than 6 frames after its oldest member
    "weighted": {"position": "weighted"},  # the group sits at its members' count-weighted mean time
    "when-full": {"merge_when": "full"},  # plain entries while the chunk fits, merging only after
}  # shorter rollouts scored from the same run (generation is causal)
THRESHOLDS = (0.8, 0.9, 0.95)


def run_pareto_bench(out_dir, frames: int = 240, model: str = "demo", capacities=CAPACITIES,
                     thresholds=THRESHOLDS, variants: dict | None = None, seed: int = 0, repeats: int = 1,
                     device=None, progress: bool = True, weights=None) -> dict:
    """``model`` ``world``: the steered world model along a path that leaves each view and comes back after
    more frames than the smaller windows hold; every point then also scores its returning views against the
    true views and against its own earlier view of the same place (``revisit``)."""
    out_dir = Path(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model == "world":
        from ..demo_world_command import revisit_scenario

        scenario = revisit_scenario(weights, frames, device)
    elif model == "demo":
        scenario = demo_scenario(seed, device)
    else:
        scenario = wan_shapes_scenario(seed, device)
    if repeats < 1:
        raise FastARError(f"--repeats must be at least 1, got {repeats}")
    fpb = scenario.frames_per_block
    bad = [c for c in capacities if c < SINK_FRAMES + fpb]
    if bad:
        raise FastARError(f"capacities {bad} cannot hold the {SINK_FRAMES} sink frames and one {fpb}-frame chunk; "
                          f"use at least {SINK_FRAMES + fpb}")
    places = scenario.notes.get("places", False)  # the steered world's TempCache groups are places
    points = pareto_modes(capacities, thresholds, variants or {}, chunk=fpb, tempcache={"same_place": True} if places
                          else None)
    modes = {name: (p["spec"], p["fastar"]) for name, p in points.items()}
    results, per_mode = timed_rollouts(scenario, modes, frames, seed, repeats, progress=progress)

    start_frames = scenario.initial_latents.shape[2] if scenario.initial_latents is not None else 0
    shape, prompt_tokens = shape_of_scenario(scenario), real_prompt_tokens(scenario.context)
    reference = results["dense-global"].latent
    rows = {}
    for name, p in points.items():
        chunks = per_mode[name]["chunks"]
        seconds = [r["seconds"] for r in chunks]
        capacity = p["capacity"]
        # Chunks whose cache is already full (every chunk for dense-global: its cost keeps growing).
        full = [r["seconds"] for r in chunks if capacity is None or r["frame_start"] - fpb >= capacity]
        row = {
            "policy": p["policy"], "capacity_frames": capacity, "threshold": p.get("threshold"),
            "variant": p.get("variant"),
            "seconds_per_chunk": round(sum(seconds) / len(seconds), 5),
            "seconds_per_chunk_full": round(statistics.median(full), 5) if full else None,
            "modelled_speedup": round(mode_speedup(shape, frames, *modes[name], prompt_tokens), 3),
            "cache_bytes_max": max(r["cache_bytes"] for r in chunks),
            "cache_bytes_allocated": results[name].cache_stats.get("allocated_bytes"),
            "seconds_each_chunk": [round(s, 5) for s in seconds],
        }
        if scenario.quality:
            quality = video_quality(results[name].latent, reference, start_frames, data_range=2.0)
            q = quality.to_dict()
            row["psnr_db"], row["ssim"] = q["psnr_db"], q["ssim"]
            row["psnr_db_by_length"] = {n: _round(finite_or_none(quality.psnr_over_first(n)), 3)
                                        for n in LENGTHS if n < frames}
            row["per_frame_psnr_db"] = q["per_frame_psnr_db"]
            if "psnr_note" in q:
                row["psnr_note"] = q["psnr_note"]
        if "revisit" in scenario.notes:  # the world: the returning views against the truth and the own past
            row["revisit"] = scenario.notes["revisit"](results[name].latent)
        stats = results[name].cache_stats
        if p["policy"] == "tempcache":
            row["merging"] = {k: stats[k] for k in ("mean_count", "merges_per_layer", "inserted_per_layer",
                                                    "evictions_per_layer", "groups_per_layer") if k in stats}
        rows[name] = row
    dense_s = rows["dense-global"]["seconds_per_chunk"]
    for row in rows.values():
        row["speedup_vs_dense"] = round(dense_s / row["seconds_per_chunk"], 3)
        row["efficiency"] = round(row["speedup_vs_dense"] / row["modelled_speedup"], 3)
    report = {
        "benchmark": "pareto", "model": scenario.name, "frames": frames, "seed": seed, "device": str(device),
        "repeats": repeats, "sink_frames": SINK_FRAMES, "frames_per_block": fpb, "capacities": list(capacities),
        "thresholds": list(thresholds), "variants": {k: dict(v) for k, v in (variants or {}).items()},
        "scenario": {k: v for k, v in scenario.notes.items() if k != "revisit"}, "machine": machine(),
        "points": rows,
        "definitions": {
            "psnr_db": "against dense-global, pooled over every generated frame (MSE first, data range 2)",
            "psnr_db_by_length": "the same over the first N generated frames: what an N-frame rollout scores",
            "ssim": "mean SSIM over every generated frame against dense-global",
            "seconds_per_chunk": f"mean over chunks; each chunk's time the median over {repeats} repeat(s), every "
                                 "point run chunk by chunk in turn with all others",
            "seconds_per_chunk_full": "median over the chunks whose cache was already at capacity",
            "cache_bytes_max": "live entries (TempCache: occupied group slots), the largest over the rollout",
            "modelled_speedup": "dense-global FLOPs / this point's (cost_model.py)",
            "revisit": "world model: frames whose camera position was last seen at least min_gap frames before; "
                       "PSNR pooled over them against the true view and against the point's own earlier view",
        },
    }
    write_json(out_dir / "pareto.json", report)
    _plot(out_dir / "pareto.png", rows, scenario, frames)
    print_pareto(report)
    return report


def _round(x, n):
    return None if x is None else round(x, n)


def curves(rows: dict) -> dict:
    """Policy label -> points sorted by capacity."""
    out = {}
    for r in rows.values():
        if r["policy"] == "global":
            continue
        label = "dense-window" if r["policy"] == "window" else f"tempcache {r['threshold']}" + (
            f" {r['variant']}" if r.get("variant") else "")
        out.setdefault(label, []).append(r)
    return {k: sorted(v, key=lambda r: r["capacity_frames"]) for k, v in out.items()}


def _plot(path, rows, scenario, frames):
    lines = curves(rows)
    dense = rows["dense-global"]
    if scenario.quality:
        panels = [{"title": "quality against cost", "xlabel": "seconds per chunk", "ylabel": "PSNR vs dense-global dB",
                   "series": {k: ([r["seconds_per_chunk"] for r in v], [r["psnr_db"] for r in v])
                              for k, v in lines.items()}, "marker": "o"},
                  {"title": "quality against capacity", "xlabel": "capacity frames (sink included)",
                   "ylabel": "PSNR dB", "series": {k: ([r["capacity_frames"] for r in v], [r["psnr_db"] for r in v])
                                                   for k, v in lines.items()}, "marker": "o"}]
    else:
        panels = [{"title": "seconds per chunk, cache full", "xlabel": "capacity frames (sink included)",
                   "ylabel": "s", "series": {k: ([r["capacity_frames"] for r in v],
                                                 [r["seconds_per_chunk_full"] for r in v]) for k, v in lines.items()},
                   "marker": "o"}]
    panels.append({"title": "live cache", "xlabel": "capacity frames (sink included)", "ylabel": "MiB",
                   "series": {k: ([r["capacity_frames"] for r in v], [r["cache_bytes_max"] / 2**20 for r in v])
                              for k, v in lines.items()}, "marker": "o"})
    line_plots(path, panels, title=f"pareto: {scenario.name}, {frames} latent frames; dense-global "
                                   f"{dense['seconds_per_chunk']:.3f} s/chunk, {dense['cache_bytes_max'] / 2**20:.1f} "
                                   "MiB")


def print_pareto(report: dict) -> None:
    print(f"\n{'point':28s} {'cap':>4s} {'s/chunk':>8s} {'full':>8s} {'speedup':>7s} {'model':>6s} "
          f"{'live MiB':>9s} {'PSNR dB':>8s} {'SSIM':>6s} {'group':>6s}")
    for name, r in report["points"].items():
        def fmt(x, spec):
            return format(x, spec) if isinstance(x, (int, float)) else "-"

        group = r.get("merging", {}).get("mean_count")
        rev = r.get("revisit", {})
        revisit = (f" revisit {fmt(rev.get('psnr_vs_truth_db'), '.2f')} / "
                   f"{fmt(rev.get('psnr_vs_own_earlier_db'), '.2f')}") if rev else ""
        print(f"{name:28s} {fmt(r['capacity_frames'], '4d')} {r['seconds_per_chunk']:8.4f} "
              f"{fmt(r['seconds_per_chunk_full'], '8.4f')} {r['speedup_vs_dense']:7.2f} {r['modelled_speedup']:6.2f} "
              f"{r['cache_bytes_max'] / 2**20:9.2f} {fmt(r.get('psnr_db'), '8.2f')} {fmt(r.get('ssim'), '6.3f')} "
              f"{fmt(group, '6.2f')}{revisit}")
