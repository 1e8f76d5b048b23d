"""``fastar bench rollout``: dense against FAST-AR on one model, side by side in one run.

Per chunk: seconds, cache bytes, memory (CUDA peak, or resident memory on a CPU), density. Per frame: PSNR
and SSIM against ``dense-global`` (the paper's unbounded baseline). ``rollout.json`` holds every figure and a
``summary`` per mode; ``rollout.png`` plots them.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from ...fastar_core.engine import build_sampler
from ...fastar_core.errors import FastARError
from ...fastar_core.fastar.metrics import per_frame_psnr, per_frame_ssim
from ...fastar_core.runner import CausalRunner
from ...fastar_core.sampler import RolloutConfig
from .report import latency_growth, line_plots, machine, mean, resident_bytes, write_json
from .scenarios import CAPACITY_FRAMES, Scenario, bench_modes, demo_scenario, wan_shapes_scenario

MEASURED_FRAMES = 48  # recall is measured on a separate, shorter run (measuring costs time)


def run_mode(scenario: Scenario, spec, fastar, frames: int, seed: int, measure: bool = False, on_chunk=None):
    """One rollout of ``scenario`` with cache ``spec`` and attention ``fastar``; rows are per-chunk figures."""
    runner = CausalRunner(scenario.model)
    sampler = build_sampler(runner, fastar, measure=measure, rope_max_distance=scenario.rope_max_distance)
    cfg = RolloutConfig(num_frames=frames, latent_height=scenario.latent_hw[0], latent_width=scenario.latent_hw[1],
                        frames_per_block=scenario.frames_per_block, schedule=scenario.schedule, seed=seed, cache=spec,
                        channels=scenario.channels, context_noise=scenario.context_noise)
    cuda = runner.device.type == "cuda"
    rows = []

    def record(report):
        row = report.to_dict()
        if cuda:
            row["peak_bytes"] = torch.cuda.max_memory_allocated(runner.device)
            torch.cuda.reset_peak_memory_stats(runner.device)
        else:
            row["rss_bytes"] = resident_bytes()
        rows.append(row)
        if on_chunk:
            on_chunk(row)

    if cuda:
        torch.cuda.reset_peak_memory_stats(runner.device)
    result = sampler.generate(scenario.context, cfg, initial_latents=scenario.initial_latents, callback=record)
    return result, rows


def run_rollout_bench(out_dir, frames: int = 240, model: str = "demo", modes=None, seed: int = 0, device=None,
                      progress: bool = True, repeats: int | None = None) -> dict:
    """Every mode on one model; with ``repeats`` > 1 the modes run in rotating rounds and each chunk's time is
    the median over rounds, so a burst of load on a shared machine cannot land on one mode only."""
    out_dir = Path(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    scenario = demo_scenario(seed, device) if model == "demo" else wan_shapes_scenario(seed, device)
    all_modes = bench_modes()
    names = list(modes or all_modes)
    if "dense-global" not in names:
        names.insert(0, "dense-global")  # the reference every other mode is compared to
    unknown = [n for n in names if n not in all_modes]
    if unknown:
        raise FastARError(f"unknown modes {unknown}; valid: {', '.join(all_modes)}")

    repeats = (3 if model == "demo" else 1) if repeats is None else repeats
    if repeats < 1:
        raise FastARError(f"--repeats must be at least 1, got {repeats}")

    # Warm-up: first calls allocate and pick kernels; keep them out of the timings.
    run_mode(scenario, *all_modes["dense-global"], frames=2 * scenario.frames_per_block, seed=seed)

    results, per_mode, times = {}, {}, {name: [] for name in names}
    for round_index in range(repeats):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            spec, fastar = all_modes[name]
            start = time.perf_counter()
            label = name if repeats == 1 else f"{name} ({round_index + 1}/{repeats})"

            def show(row, label=label):
                if progress and sys.stdout.isatty():
                    print(f"\r{label:22s} chunk {row['index']:4d} {row['seconds'] * 1000:8.1f} ms "
                          f"cache {row['cache_bytes'] / 2**20:8.2f} MiB", end="", flush=True)

            result, rows = run_mode(scenario, spec, fastar, frames, seed, on_chunk=show)
            if progress:
                print(f"\r{label:22s} done in {time.perf_counter() - start:7.1f} s" + " " * 30)
            times[name].append([r["seconds"] for r in rows])
            if round_index == 0:  # outputs are the same every round (same seed); keep the first
                results[name] = result
                per_mode[name] = {"chunks": rows, "fastar": fastar.to_dict(), "cache": spec.policy}
    for name in names:
        for i, row in enumerate(per_mode[name]["chunks"]):
            row["seconds_each_round"] = [round(run[i], 5) for run in times[name]]
            row["seconds"] = statistics.median(run[i] for run in times[name])

    start_frames = scenario.initial_latents.shape[2] if scenario.initial_latents is not None else 0
    reference = results["dense-global"].latent[:, :, start_frames:].float().cpu()
    if scenario.quality:
        for name in names:
            latent = results[name].latent[:, :, start_frames:].float().cpu()
            per_mode[name]["psnr"] = [round(x, 3) for x in per_frame_psnr(latent, reference, data_range=2.0)]
            per_mode[name]["ssim"] = [round(x, 4) for x in per_frame_ssim(latent, reference, data_range=2.0)]

    for name in names:
        spec, fastar = all_modes[name]
        if fastar.annsa:
            _, rows = run_mode(scenario, spec, fastar, min(frames, MEASURED_FRAMES), seed, measure=True)
            per_mode[name]["measured_chunks"] = rows

    dense_total = sum(r["seconds"] for r in per_mode["dense-global"]["chunks"])
    for name in names:
        m = per_mode[name]
        seconds = [r["seconds"] for r in m["chunks"]]
        finite = [x for x in m.get("psnr", []) if x != float("inf")]
        m["summary"] = {
            "seconds_total": round(sum(seconds), 4),
            "speedup_vs_dense": round(dense_total / sum(seconds), 3),
            "latency_growth": _round(latency_growth(seconds), 3),
            "cache_bytes_max": max(r["cache_bytes"] for r in m["chunks"]),
            "cache_bytes_last": m["chunks"][-1]["cache_bytes"],
            "cache_bytes_allocated": results[name].cache_stats.get("allocated_bytes"),
            "psnr_mean": _round(mean(finite), 3) if scenario.quality else None,
            "ssim_mean": _round(mean(m.get("ssim", [])), 4) if scenario.quality else None,
            "density_mean": _round(mean(r.get("density") for r in m.get("measured_chunks", [])), 4),
            "recall_mean": _round(mean(r.get("recall") for r in m.get("measured_chunks", [])), 4),
        }
        if scenario.quality and name == "dense-global":
            m["summary"]["psnr_mean"] = float("inf")
    report = {
        "benchmark": "rollout", "model": scenario.name, "frames": frames, "seed": seed, "device": str(device),
        "repeats": repeats,
        "capacity_frames": CAPACITY_FRAMES, "frames_per_block": scenario.frames_per_block,
        "scenario": scenario.notes, "machine": machine(), "modes": per_mode,
        "definitions": {
            "speedup_vs_dense": "total chunk seconds of dense-global / this mode, same run, same seed",
            "seconds": f"per chunk, median over {repeats} rotating round(s) of every mode",
            "latency_growth": "mean seconds of the last 10 chunks / mean of chunks 5 to 15",
            "cache_bytes": "live cache entries (TempCache: occupied group slots); cache_bytes_allocated: the "
                           "buffers, allocated once per rollout",
            "psnr_mean": "mean over generated frames of PSNR against dense-global (data range 2)",
            "density": f"executed query-key pairs / dense pairs, mean over self-attention calls of a chunk, first "
                       f"{MEASURED_FRAMES} frames",
            "recall": f"dense attention mass on visited keys, 64 sampled queries per call, first "
                      f"{MEASURED_FRAMES} frames",
        },
    }
    write_json(out_dir / "rollout.json", report)
    _plot(out_dir / "rollout.png", per_mode, scenario.frames_per_block, start_frames, scenario.name, frames)
    return report


def _round(x, n):
    return None if x is None else round(x, n)


def _plot(path, per_mode, fpb, start_frames, model, frames):
    def xs(m):
        return [r["frame_start"] for r in m["chunks"]]

    panels = [
        {"title": "seconds per chunk", "xlabel": "latent frame", "ylabel": "s",
         "series": {n: (xs(m), [r["seconds"] for r in m["chunks"]]) for n, m in per_mode.items()}},
        {"title": "KV cache", "xlabel": "latent frame", "ylabel": "MiB",
         "series": {n: (xs(m), [r["cache_bytes"] / 2**20 for r in m["chunks"]]) for n, m in per_mode.items()}},
    ]
    quality = {n: (list(range(start_frames, start_frames + len(m["psnr"]))), m["psnr"])
               for n, m in per_mode.items() if "psnr" in m and n != "dense-global"}
    if quality:
        panels.append({"title": "PSNR vs dense-global", "xlabel": "latent frame", "ylabel": "dB", "series": quality})
    line_plots(path, panels, title=f"rollout benchmark: {model}, {frames} latent frames")
