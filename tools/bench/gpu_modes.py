"""``fastar bench gpu-modes``: the cache modes on one GPU at Wan2.1-1.3B's shapes, eager and with captured steps.

Random weights (speed only) at 480x832 (1,560 tokens per latent frame), bf16, all 30 layers, chunks of 3 frames,
Self-Forcing's 4 steps and a clean pass. Each of dense-global, dense-window, tempcache and all (TempCache, AnnSA,
AnnCA) runs twice, eagerly and with ``cuda_graphs`` (a chunk's denoising passes captured and replayed), each rollout
starting from 24 committed frames so that every bounded cache is full. The eight rollouts run chunk by chunk in
turn (``interleave.py``: the order rotates every round), so the per-chunk milliseconds of every mode come from the
same rounds. The captured rollouts must give the eager latents (their largest difference is reported).

From the per-chunk times it extrapolates a 3,000-frame video (751 latent frames): a bounded mode's chunks cost the
same however long the video, dense-global's grow with its cache (a straight line fitted to its chunks), and prints
that beside the matmul cost model's speedup at the same length and the H200 estimate of ``fastar bench launches``.
Stops adding rounds at the budget. Needs a CUDA GPU; ``device="cpu"`` with a tiny model is a dry run.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ...fastar_core.rollout.engine import build_sampler
from ...fastar_core.rollout.sampler import RolloutConfig
from .interleave import run_in_turns
from .report import line_plots, machine, write_json
from .scenarios import scenario_modes, wan_shapes_scenario

MODES = ("dense-global", "dense-window", "tempcache", "all")
START_FRAMES = 24  # committed before the first timed chunk: every 21-frame cache is full
VIDEO_FRAMES = 3001  # what the extrapolation is for (751 latent frames)
# `fastar bench launches`' H200 estimate per chunk at these shapes (docs/results/launches-wan-shapes/launches.json)
ESTIMATE_FILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "launches-wan-shapes" / "launches.json"


def _job(scenario, spec, fastar, chunks: int, graphs: bool, deadline: float, seed: int, start, outputs: dict, name):
    def job(hand_on):
        runner = scenario.runner()
        sampler = build_sampler(runner, fastar.with_overrides(verify_kernels=True))
        runner.cuda_graphs = graphs
        cfg = RolloutConfig(num_frames=chunks * scenario.frames_per_block, latent_height=scenario.latent_hw[0],
                            latent_width=scenario.latent_hw[1], frames_per_block=scenario.frames_per_block,
                            schedule=scenario.schedule, seed=seed, cache=spec, channels=scenario.channels)
        rows = []

        def on_chunk(report):
            rows.append({"frame_start": report.frame_start, "ms": report.seconds * 1e3})
            hand_on(rows[-1])

        def cancel():
            return time.monotonic() > deadline

        try:
            result = sampler.generate(scenario.context, cfg, initial_latents=start, callback=on_chunk,
                                      cancel=cancel)
            outputs[name] = result.latent
            status = "done"
        except Exception as e:  # noqa: BLE001 - a mode that fails (memory, budget) is reported, the rest go on
            status = f"{type(e).__name__}: {e}"[:300]
        return {"chunks": rows, "status": status, "graphs": graphs,
                "captures": runner.step_graphs.captures, "replays": runner.step_graphs.replays}
    return job


def extrapolate(rows: list[dict], frames_per_block: int, latent_frames: int, start: int, grows: bool) -> float | None:
    """Seconds for chunks from ``start`` to ``latent_frames``, the first timed chunk (which tunes and captures) left
    out: a bounded cache's chunks at their median, a growing cache's as a straight line fitted in the frame (its
    attention grows with every frame it keeps)."""
    timed = rows[1:] if len(rows) > 2 else rows
    if not timed:
        return None
    xs = [r["frame_start"] for r in timed]
    ys = [r["ms"] for r in timed]
    if not grows or len(set(xs)) < 2:
        slope, level = 0.0, statistics.median(ys)
    else:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        level = my - slope * mx
    chunks = range(start, latent_frames, frames_per_block)
    return sum(max(0.0, level + slope * f) for f in chunks) / 1e3


def run_gpu_modes(out_dir, budget_s: float = 540.0, chunks: int = 16, seed: int = 0, device="cuda", layers=None,
                  latent_hw=None, modes=MODES) -> dict:
    cuda = torch.device(device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench gpu-modes needs a CUDA device; none is visible here")
    start_time = time.monotonic()
    out_dir = Path(out_dir)
    scenario = wan_shapes_scenario(seed, device, layers=layers, latent_hw=latent_hw)
    all_modes = scenario_modes(scenario)
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(1, scenario.channels, START_FRAMES, *scenario.latent_hw, generator=g)
    deadline = start_time + budget_s - 30  # room to write the report
    outputs: dict = {}
    jobs = {}
    for name in modes:
        spec, fastar = all_modes[name]
        for graphs in (False, True):
            key = f"{name}{' +graphs' if graphs else ''}"
            jobs[key] = _job(scenario, spec, fastar, chunks, graphs, deadline, seed, start, outputs, key)
    results = run_in_turns(jobs)
    fpb = scenario.frames_per_block
    latent_frames = (VIDEO_FRAMES - 1) // 4 + 1
    estimate = {}
    if ESTIMATE_FILE.exists():
        import json

        estimate = {n: e["ms_per_chunk"] for n, e in json.loads(ESTIMATE_FILE.read_text())["estimate"]["modes"].items()}
    from .flops import CacheCost, modelled_speedup, shape_of_scenario

    shape = shape_of_scenario(scenario)
    for key, r in results.items():
        ms = [row["ms"] for row in r["chunks"][1:]] or [row["ms"] for row in r["chunks"]]
        r["median_ms"] = round(statistics.median(ms), 2) if ms else None
        name = key.split(" ")[0]
        r["video_seconds"] = extrapolate(r["chunks"], fpb, latent_frames, START_FRAMES, grows=name == "dense-global")
        if name in outputs and f"{name} +graphs" in outputs:
            r["graphs_max_diff"] = float((outputs[name] - outputs[f"{name} +graphs"]).abs().max())
        r["h200_estimate_ms"] = estimate.get(name)
    modelled = {"dense-window": modelled_speedup(shape, latent_frames, CacheCost.bounded(21)),
                "tempcache": modelled_speedup(shape, latent_frames, CacheCost.bounded(21, tempcache=True))}
    dense = {g: results.get(f"dense-global{' +graphs' if g else ''}", {}).get("video_seconds") for g in (False, True)}
    for r in results.values():
        base, own = dense[r["graphs"]], r["video_seconds"]
        r["video_speedup_vs_dense_global"] = round(base / own, 3) if base and own else None
    report = {"benchmark": "gpu-modes", "machine": machine(), "shapes": "Wan2.1-1.3B 480x832 (random weights), "
              f"{scenario.model.config.num_layers} layers, bf16" if cuda else "dry run", "start_frames": START_FRAMES,
              "video_frames": VIDEO_FRAMES, "budget_s": budget_s,
              "seconds_used": round(time.monotonic() - start_time, 1),
              "cost_model_speedup_at_video": {k: round(v, 3) for k, v in modelled.items()}, "modes": results}
    write_json(out_dir / "gpu_modes.json", report)
    line_plots(out_dir / "gpu_modes.png", [
        {"title": "ms per chunk", "xlabel": "latent frame", "ylabel": "ms",
         "series": {k: ([row["frame_start"] for row in r["chunks"]], [row["ms"] for row in r["chunks"]])
                    for k, r in results.items()}}], title=report["shapes"])
    print(f"\n{'mode':24s} {'ms/chunk':>9s} {'H200 est.':>9s} {'3000-frame s':>12s} {'vs dense':>8s} "
          f"{'graph diff':>10s}  status")
    for key, r in results.items():
        def f(x, spec):
            return format(x, spec) if isinstance(x, (int, float)) else "-"
        print(f"{key:24s} {f(r['median_ms'], '9.1f')} {f(r['h200_estimate_ms'], '9.1f')} "
              f"{f(r['video_seconds'], '12.1f')} {f(r['video_speedup_vs_dense_global'], '8.2f')} "
              f"{f(r.get('graphs_max_diff'), '10.2g')}  {r['status']} ({r['captures']} captures, {r['replays']} "
              "replays)")
    print("cost model (matmul FLOPs) at 3,001 frames, speedup over dense-global: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in report["cost_model_speedup_at_video"].items()))
    return report
