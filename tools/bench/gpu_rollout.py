"""``fastar bench gpu-rollout``: Wan-1.3B shapes at 480x832 on CUDA, dense against FAST-AR, within a budget.

Random weights (speed and memory only), 1,560 tokens per latent frame, bf16. Dense keeps every frame
(``global``), so its cache is sized for the whole rollout up front: the longest rollout whose dense cache fits
in free GPU memory is chosen and the rest is reported as "does not fit". FAST-AR (``all``: TempCache + AnnSA +
AnnCA) runs the same number of frames, then as far as the budget allows. Per chunk: latency and peak memory.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ...fastar_core.errors import GenerationCancelled
from ...fastar_core.forward.runner import CausalRunner
from ...fastar_core.rollout.engine import build_sampler
from ...fastar_core.rollout.sampler import RolloutConfig
from .report import line_plots, machine, resident_bytes, write_json
from .scenarios import bench_modes, wan_shapes_scenario


def _run(scenario, spec, fastar, frames, deadline, seed=0, device="cuda"):
    cuda = torch.device(device).type == "cuda"
    runner = CausalRunner(scenario.model)
    sampler = build_sampler(runner, fastar)
    cfg = RolloutConfig(num_frames=frames, latent_height=scenario.latent_hw[0], latent_width=scenario.latent_hw[1],
                        schedule=scenario.schedule, seed=seed, cache=spec)
    rows = []

    def record(report):
        row = report.to_dict()
        row["peak_bytes"] = torch.cuda.max_memory_allocated() if cuda else resident_bytes()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        rows.append(row)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    status = "done"
    try:
        sampler.generate(scenario.conditioning(cfg.num_frames), cfg, callback=record,
                         cancel=lambda: time.monotonic() > deadline)
    except GenerationCancelled:
        status = "budget"
    except torch.cuda.OutOfMemoryError:
        status = "out of memory"
    if cuda:
        torch.cuda.empty_cache()
    return rows, status


def run_gpu_rollout(out_dir, budget_s: float = 360.0, layers: int = 10, max_frames: int = 750, seed: int = 0,
                    device="cuda", latent_hw=None):
    """On CUDA as described above; `device="cpu"` (with a small `latent_hw`) runs the same plan as a dry run,
    peak memory then being the process's resident size."""
    cuda = torch.device(device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench gpu-rollout needs a CUDA device; none is visible here")
    out_dir = Path(out_dir)
    start = time.monotonic()
    scenario = wan_shapes_scenario(seed, device, layers=layers, latent_hw=latent_hw)
    cfg = scenario.model.config
    tpf = scenario.notes["tokens_per_frame"]
    resolution = f"{scenario.latent_hw[0] * 8}x{scenario.latent_hw[1] * 8}"
    per_frame = 2 * cfg.num_layers * tpf * cfg.dim * 2  # bf16 K and V of one latent frame, all layers
    free = torch.cuda.mem_get_info()[0] if cuda else max_frames * per_frame / 0.85
    fits = int(0.85 * free // per_frame)
    dense_frames = max(3, min(max_frames, fits) // 3 * 3)
    modes = bench_modes()
    results = {}
    half = start + budget_s / 2
    rows, status = _run(scenario, *modes["dense-global"], dense_frames, deadline=half, seed=seed, device=device)
    results["dense-global"] = {"chunks": rows, "status": status, "frames_requested": dense_frames}
    rows, status = _run(scenario, *modes["all"], max_frames, deadline=start + budget_s, seed=seed, device=device)
    results["all"] = {"chunks": rows, "status": status, "frames_requested": max_frames}
    report = {
        "benchmark": "gpu-rollout", "machine": machine(), "layers": layers, "tokens_per_frame": tpf,
        "resolution": resolution, "kv_bytes_per_latent_frame": per_frame,
        "dense_frames_that_fit": fits, "budget_s": budget_s, "seconds_used": round(time.monotonic() - start, 1),
        "modes": results,
    }
    for m in results.values():
        secs = [r["seconds"] for r in m["chunks"]]
        m["summary"] = {"chunks": len(secs), "frames": 3 * len(secs),
                        "first_chunks_s": secs[1:6], "last_chunks_s": secs[-5:],
                        "peak_bytes_max": max((r["peak_bytes"] for r in m["chunks"]), default=0)}
    write_json(out_dir / "gpu_rollout.json", report)
    line_plots(out_dir / "gpu_rollout.png", [
        {"title": "seconds per chunk", "xlabel": "latent frame", "ylabel": "s",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["seconds"] for r in m["chunks"]])
                    for n, m in results.items()}},
        {"title": "peak GPU memory", "xlabel": "latent frame", "ylabel": "GiB",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["peak_bytes"] / 2**30 for r in m["chunks"]])
                    for n, m in results.items()}},
    ], title=f"Wan-1.3B shapes ({layers} layers), {resolution}")
    for name, m in results.items():
        print(f"{name:14s} {m['status']:14s} {m['summary']['frames']:5d} frames, "
              f"last chunks {[f'{s:.3f}' for s in m['summary']['last_chunks_s']]} s, "
              f"peak {m['summary']['peak_bytes_max'] / 2**30:.1f} GiB")
    return report
