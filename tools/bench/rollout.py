"""``fastar bench rollout``: dense against FAST-AR on one model, side by side in one run.

Modes run chunk by chunk in turn (``interleave.py``). Per chunk: seconds, cache bytes, memory (CUDA peak, or
resident memory on a CPU), density. Quality: PSNR pooled over every generated frame and mean SSIM against
``dense-global`` (the paper's unbounded baseline), with the per-frame curves. ``rollout.json`` holds every figure and a
``summary`` per mode; ``rollout.png`` plots them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from ...fastar_core.errors import FastARError
from ...fastar_core.fastar.metrics import video_quality
from ...fastar_core.rollout.engine import build_sampler
from ...fastar_core.rollout.sampler import RolloutConfig
from .flops import mode_speedup, real_prompt_tokens, shape_of_scenario
from .interleave import median_rows, run_in_turns
from .report import frame_rate_steadiness, latency_growth, line_plots, machine, mean, resident_bytes, write_json
from .scenarios import SCENARIOS, Scenario, scenario_modes
from .window_ratio import ratio_to_window, round_ratios

MEASURED_FRAMES = 48  # recall is measured on a separate, shorter run (measuring costs time)


def run_mode(scenario: Scenario, spec, fastar, frames: int, seed: int, measure: bool = False, on_chunk=None,
             cond=None):
    """One rollout of ``scenario`` with cache ``spec`` and attention ``fastar``; rows are per-chunk figures.
    ``cond``: what it is conditioned on (default: the scenario's, for ``frames``)."""
    runner = scenario.runner()
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
    result = sampler.generate(cond if cond is not None else scenario.conditioning(frames), cfg,
                              initial_latents=scenario.initial_latents,
                              callback=record)
    return result, rows


def timed_rollouts(scenario: Scenario, modes: dict, frames: int, seed: int, repeats: int = 1,
                   progress: bool = True):
    """Every mode of ``modes`` (name -> (cache spec, FAST-AR config)) on ``scenario``, chunk by chunk in turn
    (``interleave.py``), ``repeats`` times; returns (results of the first repeat, name -> {"chunks": rows with
    the median seconds, "fastar", "cache"})."""
    # Warm-up: first calls allocate and pick kernels; keep them out of the timings.
    run_mode(scenario, *next(iter(modes.values())), frames=2 * scenario.frames_per_block, seed=seed)
    chunks = -(-frames // scenario.frames_per_block)
    runs = {name: [] for name in modes}
    results = {}
    for repeat in range(repeats):
        start = time.perf_counter()
        done = [0]

        def job(name, spec, fastar, repeat=repeat, done=done):
            def run(hand_on):
                # Only the rollout holding the turn works, so the process's CPU time from taking the turn to the
                # chunk's end is this chunk's own (torch's worker threads included); it holds still when other
                # processes load the machine, where wall time does not.
                cpu_start = [time.process_time()]

                def on_chunk(row):
                    row["cpu_seconds"] = time.process_time() - cpu_start[0]
                    done[0] += 1
                    if progress and sys.stdout.isatty():
                        print(f"\rrepeat {repeat + 1}/{repeats}: {done[0]}/{chunks * len(modes)} chunks of "
                              f"{len(modes)} modes in turn", end="", flush=True)
                    hand_on(row)
                    cpu_start[0] = time.process_time()

                return run_mode(scenario, spec, fastar, frames, seed, on_chunk=on_chunk)
            return run

        out = run_in_turns({name: job(name, *mode) for name, mode in modes.items()})
        if progress:
            print(f"\rrepeat {repeat + 1}/{repeats}: {len(modes)} modes x {chunks} chunks in "
                  f"{time.perf_counter() - start:7.1f} s" + " " * 20)
        for name, (result, rows) in out.items():
            runs[name].append(rows)
            if repeat == 0:  # outputs are the same every repeat (same seed); keep the first
                results[name] = result
    per_mode = {name: {"chunks": median_rows(runs[name]), "fastar": modes[name][1].to_dict(),
                       "cache": modes[name][0].policy} for name in modes}
    return results, per_mode


def run_rollout_bench(out_dir, frames: int = 240, model: str = "demo", modes=None, seed: int = 0, device=None,
                      progress: bool = True, repeats: int | None = None) -> dict:
    """Every mode on one model, chunk by chunk in turn (so a burst of load on a shared machine lands on every
    mode alike); with ``repeats`` > 1 each chunk's time is the median over repeats."""
    out_dir = Path(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model not in SCENARIOS:
        raise FastARError(f"unknown rollout scenario {model!r}; valid: {', '.join(SCENARIOS)}")
    scenario = SCENARIOS[model](seed, device)
    all_modes = scenario_modes(scenario)
    names = list(modes or all_modes)
    if "dense-global" not in names:
        names.insert(0, "dense-global")  # the reference every other mode is compared to
    unknown = [n for n in names if n not in all_modes]
    if unknown:
        raise FastARError(f"unknown modes {unknown}; valid: {', '.join(all_modes)}")

    repeats = (3 if model == "demo" else 1) if repeats is None else repeats
    if repeats < 1:
        raise FastARError(f"--repeats must be at least 1, got {repeats}")

    results, per_mode = timed_rollouts(scenario, {n: all_modes[n] for n in names}, frames, seed, repeats,
                                       progress=progress)
    start_frames = scenario.initial_latents.shape[2] if scenario.initial_latents is not None else 0
    if scenario.quality:
        reference = results["dense-global"].latent
        for name in names:
            per_mode[name]["quality"] = video_quality(results[name].latent, reference, start_frames,
                                                      data_range=2.0).to_dict()
    for name in names:  # an int8 cache against its float twin, same seed: what the rounding alone changes
        twin = name.removesuffix("-int8")
        if twin != name and twin in results:
            a, b = results[name].latent, results[twin].latent
            twin_quality = video_quality(a, b, start_frames, data_range=2.0)
            per_mode[name]["vs_float"] = {"mode": twin, "psnr_db": round(twin_quality.psnr_db, 3),
                                          "ssim": round(twin_quality.ssim, 4),
                                          "latent_relative_error": round(float((a - b).norm() / b.norm()), 4)}

    for name in names:
        spec, fastar = all_modes[name]
        if fastar.annsa:
            _, rows = run_mode(scenario, spec, fastar, min(frames, MEASURED_FRAMES), seed, measure=True)
            per_mode[name]["measured_chunks"] = rows

    shape = shape_of_scenario(scenario)
    prompt_tokens = real_prompt_tokens(scenario.context)
    dense_total = sum(r["seconds"] for r in per_mode["dense-global"]["chunks"])
    for name in names:
        m = per_mode[name]
        seconds = [r["seconds"] for r in m["chunks"]]
        quality = m.get("quality", {})
        m["summary"] = {
            "seconds_total": round(sum(seconds), 4),
            "speedup_vs_dense": round(dense_total / sum(seconds), 3),
            "modelled_speedup": round(mode_speedup(shape, frames, *all_modes[name], prompt_tokens), 3),
            "latency_growth": _round(latency_growth(seconds), 3),
            "frame_rate": frame_rate_steadiness(m["chunks"]),
            "cache_bytes_max": max(r["cache_bytes"] for r in m["chunks"]),
            "cache_bytes_last": m["chunks"][-1]["cache_bytes"],
            "cache_bytes_allocated": results[name].cache_stats.get("allocated_bytes"),
            "psnr_db": quality.get("psnr_db"),
            "ssim": quality.get("ssim"),
            "density_mean": _round(mean(r.get("density") for r in m.get("measured_chunks", [])), 4),
            "recall_mean": _round(mean(r.get("recall") for r in m.get("measured_chunks", [])), 4),
        }
        m["summary"]["efficiency"] = round(m["summary"]["speedup_vs_dense"] / m["summary"]["modelled_speedup"], 3)
        if "psnr_note" in quality:
            m["summary"]["psnr_note"] = quality["psnr_note"]
    # TempCache against the window of the same capacity, once both are full.
    vs_window = {name: ratio_to_window(per_mode[name]["chunks"], per_mode["dense-window"]["chunks"],
                                       scenario.capacity_frames)
                 for name in names if all_modes[name][0].policy == "tempcache" and "dense-window" in per_mode}
    for name, ratio in vs_window.items():
        per_mode[name]["summary"]["vs_window"] = ratio
    report = {
        "benchmark": "rollout", "model": scenario.name, "frames": frames, "seed": seed, "device": str(device),
        "repeats": repeats,
        "capacity_frames": scenario.capacity_frames, "sink_frames": scenario.sink_frames,
        "frames_per_block": scenario.frames_per_block,
        "scenario": scenario.notes, "machine": machine(), "vs_window": vs_window, "modes": per_mode,
        "definitions": {
            "speedup_vs_dense": "total chunk seconds of dense-global / this mode, same run, same seed",
            "modelled_speedup": "the same ratio of matmul FLOPs from the model's shapes and the mode's cache "
                                "capacity (cost_model.py; AnnSA counted dense)",
            "efficiency": "speedup_vs_dense / modelled_speedup",
            "seconds": f"per chunk, median over {repeats} repeat(s); in each, every mode runs chunk by chunk in "
                       "turn, the order rotating every round",
            "latency_growth": "mean seconds of the last 10 chunks / mean of chunks 5 to 15",
            "vs_window": "each TempCache mode's seconds per chunk over dense-window's (equal capacity), chunks from "
                         "the capacity's frame on (both caches full), by CPU time and by wall time: ratio of the "
                         "totals; over rounds (one chunk of every mode in turn, under the same load) the median, "
                         "10th/90th percentile, min and max of the per-round ratios; per repeat, its totals' ratio",
            "frame_rate": "latent frames per second of CPU time per chunk from latent frame 60 on: median, largest "
                          "deviation from it, share of chunks within 10 % of it, last 10 chunks over the first 10",
            "cache_bytes": "live cache entries (TempCache: occupied group slots); cache_bytes_allocated: the "
                           "buffers, allocated once per rollout",
            "vs_float": "an -int8 mode against its float twin (same seed): pooled PSNR, mean SSIM, relative error "
                        "of the latents",
            "psnr_db": "PSNR against dense-global pooled over every generated frame (mean squared error first, "
                       "data range 2); null where identical",
            "ssim": "mean SSIM over every generated frame against dense-global",
            "density": f"executed query-key pairs / dense pairs, mean over self-attention calls of a chunk, first "
                       f"{MEASURED_FRAMES} frames",
            "recall": f"dense attention mass on visited keys, 64 sampled queries per call, first "
                      f"{MEASURED_FRAMES} frames",
        },
    }
    write_json(out_dir / "rollout.json", report)
    _plot(out_dir / "rollout.png", per_mode, scenario.frames_per_block, start_frames, scenario.name, frames,
          list(vs_window))
    return report


def _round(x, n):
    return None if x is None else round(x, n)


def _plot(path, per_mode, fpb, start_frames, model, frames, against_window=()):
    def xs(m):
        return [r["frame_start"] for r in m["chunks"]]

    panels = [
        {"title": "seconds per chunk", "xlabel": "latent frame", "ylabel": "s",
         "series": {n: (xs(m), [r["seconds"] for r in m["chunks"]]) for n, m in per_mode.items()}},
        {"title": "latent frames per CPU second", "xlabel": "latent frame", "ylabel": "frames/s",
         "series": {n: (xs(m), [r["frames"] / r.get("cpu_seconds", r["seconds"]) for r in m["chunks"]])
                    for n, m in per_mode.items()}},
        {"title": "KV cache", "xlabel": "latent frame", "ylabel": "MiB",
         "series": {n: (xs(m), [r["cache_bytes"] / 2**20 for r in m["chunks"]]) for n, m in per_mode.items()}},
    ]
    if against_window:
        ratios = {n: round_ratios(per_mode[n]["chunks"], per_mode["dense-window"]["chunks"]) for n in against_window}
        panels.append({"title": "CPU s per chunk / dense-window's (per round)", "xlabel": "latent frame",
                       "ylabel": "ratio", "series": ratios, "marker": "o"})
    quality = {n: (list(range(start_frames, start_frames + len(m["quality"]["per_frame_psnr_db"]))),
                   [p if p is not None else float("nan") for p in m["quality"]["per_frame_psnr_db"]])
               for n, m in per_mode.items() if "quality" in m and n != "dense-global"}
    if quality:
        panels.append({"title": "per-frame PSNR vs dense-global", "xlabel": "latent frame", "ylabel": "dB",
                       "series": quality})
    line_plots(path, panels, title=f"rollout benchmark: {model}, {frames} latent frames")
