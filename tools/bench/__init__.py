"""Benchmarks: figures as JSON plus PNG plots, measured side by side in one run."""

from __future__ import annotations

import sys
from pathlib import Path


def run_bench(args) -> int:
    out = Path(args.out)
    if args.frames is None:
        from .lingbot_cap import FRAMES

        args.frames = {"lingbot-cap": FRAMES, "world-continuation": 120}.get(args.what, 240)
    if args.what in ("kernels", "gpu-rollout", "gpu-modes"):
        import torch

        if not torch.cuda.is_available():
            print(f"fastar: error: bench {args.what} needs a CUDA GPU and none is visible; on a CPU run "
                  "`fastar bench rollout`, `fastar bench attention` or the tests", file=sys.stderr)
            return 2
    if args.what == "rollout":
        from .rollout import run_rollout_bench

        modes = args.modes.split(",") if args.modes else None
        report = run_rollout_bench(out, frames=args.frames, model=args.model, modes=modes, seed=args.seed,
                                   repeats=args.repeats)
        print_rollout_table(report)
    elif args.what == "pareto":
        from .pareto import CAPACITIES, THRESHOLDS, VARIANTS, run_pareto_bench

        capacities = tuple(int(x) for x in args.capacities.split(",")) if args.capacities else CAPACITIES
        thresholds = tuple(float(x) for x in args.thresholds.split(",")) if args.thresholds else THRESHOLDS
        names = args.variants.split(",") if args.variants else []
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            print(f"fastar: error: unknown variants {unknown}; valid: {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        run_pareto_bench(out, frames=args.frames, model=args.model, capacities=capacities, thresholds=thresholds,
                         variants={n: VARIANTS[n] for n in names}, seed=args.seed, repeats=args.repeats or 1,
                         weights=args.weights)
    elif args.what == "frame-rate":
        from .frame_rate import run_frame_rate_bench

        report = run_frame_rate_bench(out, frames=args.frames, rounds=args.repeats or 5, seed=args.seed)
        for name, mode in report["modes"].items():
            print(f"{name}: {mode['frame_rate']}")
        print(f"verdict: {report['verdict']}")
    elif args.what == "lingbot-cap":
        from .lingbot_cap import run_lingbot_cap_bench

        run_lingbot_cap_bench(out, frames=args.frames, rounds=args.repeats or 5, seed=args.seed)
    elif args.what == "live-world":
        from .live_world import run_live_world_bench

        report = run_live_world_bench(out, frames=args.frames, rounds=args.repeats or 5, seed=args.seed,
                                      weights=args.weights)
        for name, mode in report["modes"].items():
            print(f"{name}: {mode['frame_rate']}, cache at the end {mode['cache_mib_last']} MiB")
        print(f"verdict: {report['verdict']}")
    elif args.what == "world-ceiling":
        from .world_ceiling import run_world_ceiling

        run_world_ceiling(out, draws=args.repeats or 20, frames=args.frames)
    elif args.what == "world-memory":
        from .world_memory import run_world_memory

        seeds = [int(s) for s in args.map_seeds.split(",")] if args.map_seeds else None
        run_world_memory(out, weights=args.weights, frames=args.frames, seeds=seeds, seed=args.seed)
    elif args.what == "world-continuation":
        from .world_continuation import MAP_SEEDS, run_world_continuation

        seeds = [int(s) for s in args.map_seeds.split(",")] if args.map_seeds else MAP_SEEDS
        run_world_continuation(out, weights=args.weights, seeds=seeds, frames=args.frames, seed=args.seed)
    elif args.what == "matcher":
        from .matcher import run_matcher_bench

        run_matcher_bench(out, frames=args.frames, model=args.model, seed=args.seed, repeats=args.repeats or 1)
    elif args.what == "rotated-keys":
        from .rotated_keys import run_rotated_keys_bench

        run_rotated_keys_bench(out, frames=args.frames, model=args.model, seed=args.seed)
    elif args.what == "launches":
        from .launches import run_launches_bench

        modes = args.modes.split(",") if args.modes else None
        run_launches_bench(out, model=args.model, frames=args.frames, modes=modes, seed=args.seed)
    elif args.what == "cost-model":
        from .cost_model import run_cost_model

        run_cost_model(out, cpu_frames=args.frames)
    elif args.what == "attention":
        from .attention import run_attention_bench

        run_attention_bench(out, seed=args.seed)
    elif args.what == "bias-fold":
        from .bias_fold import run_bias_fold_bench

        run_bias_fold_bench(out, rounds=args.repeats or 5, seed=args.seed)
    elif args.what == "kernels":
        from .kernels import run_kernel_bench

        run_kernel_bench(out, time_budget_s=args.budget or 270)
    elif args.what == "gpu-modes":
        from .gpu_modes import run_gpu_modes

        run_gpu_modes(out, budget_s=args.budget or 540, seed=args.seed)
    elif args.what == "gpu-rollout":
        from .gpu_rollout import run_gpu_rollout

        run_gpu_rollout(out, budget_s=args.budget or 360)
    print(f"wrote {out}")
    return 0


def print_rollout_table(report: dict) -> None:
    print(f"\n{'mode':18s} {'speedup':>8s} {'modelled':>8s} {'effic.':>6s} {'growth':>7s} "
          f"{'live MiB':>9s} {'alloc MiB':>10s} {'PSNR dB':>8s} "
          f"{'SSIM':>6s} {'density':>8s} {'recall':>7s}")
    for name, m in report["modes"].items():
        s = m["summary"]

        def fmt(x, spec):
            return format(x, spec) if isinstance(x, (int, float)) else "-"

        alloc = s.get("cache_bytes_allocated")
        print(f"{name:18s} {fmt(s['speedup_vs_dense'], '8.2f')} {fmt(s['modelled_speedup'], '8.2f')} "
              f"{fmt(s['efficiency'], '6.2f')} {fmt(s['latency_growth'], '7.2f')} "
              f"{s['cache_bytes_max'] / 2**20:9.2f} {fmt(alloc and alloc / 2**20, '10.2f')} "
              f"{fmt(s['psnr_db'], '8.2f')} {fmt(s['ssim'], '6.3f')} "
              f"{fmt(s['density_mean'], '8.3f')} {fmt(s['recall_mean'], '7.3f')}")
