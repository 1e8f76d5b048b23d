"""``fastar bench world-memory``: does merging keep a memory that dropping loses, at the same memory?

The steered world model along the world bar's path (out, around and back: a 40-frame square loop, repeated, so
every view of the second loop on returns to a place last seen 40 frames before, further back than a 21-frame
window reaches) on each bar seed, with

- ``dense-global``: every frame kept (the memory a bounded cache is measured against; its cache grows);
- ``dense-window``: the sink and the newest frames, 21 frames' worth in all (drops what is older);
- ``tempcache``: TempCache at the same 21 frames' capacity, its groups places (``same_place``: a returning view's
  keys merge into the group of their place);
- ``tempcache-content``: TempCache at that capacity with the paper's matching (any group whose key is alike,
  wherever it is), to show what places add.

The modes of a seed run chunk by chunk in turn. Per mode and seed: the returning views (camera position last seen
more than 21 frames before) against the model's own earlier view and against the truth, pooled; the live and
allocated cache; CPU seconds; TempCache's groups and merges. ``world_memory.json`` holds it all, ``world_memory.png``
plots the returning views per seed and the live cache over the rollout.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .report import line_plots, machine, write_json

MODES = ("dense-global", "dense-window", "tempcache", "tempcache-content")


def memory_modes(capacity: int) -> dict:
    from ..demo_world_command import world_modes

    places, content = world_modes(True, capacity), world_modes(False, capacity)
    return {"dense-global": places["dense-global"], "dense-window": places["dense-window"],
            "tempcache": places["tempcache"], "tempcache-content": content["tempcache"]}


def run_world_memory(out_dir, weights=None, frames: int = 240, seeds=None, capacity: int = 21, seed: int = 0,
                     log=print) -> dict:
    from ..demo.model import load_demo_model
    from ..demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
    from ..demo.steer_world import make_map
    from ..demo.world_bar import WORLD_SEEDS, bar_track
    from ..demo.world_eval import MIN_GAP, evaluate_world
    from ..demo_world_command import live_plateau, run_world_modes

    out = Path(out_dir)
    demo = load_demo_model(weights or WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
    modes = memory_modes(capacity)
    rows: dict = {name: [] for name in modes}
    live_curves = {}
    for map_seed in seeds or WORLD_SEEDS:
        track = bar_track(map_seed, frames)
        truth, runs = run_world_modes(demo, make_map(map_seed), track, modes, seed)
        for name, run in runs.items():
            e = evaluate_world(run["video"], truth, track, demo.frames_per_block)
            stats = run["cache_stats"]
            row = {"seed": map_seed, "returns": e["revisit"], "keys_followed": e["action_following"],
                   "carried_psnr_db": e["carried_psnr_db"],
                   "cpu_seconds": round(sum(r["cpu_seconds"] for r in run["chunks"]), 3),
                   "allocated_mib": round((run["allocated_bytes"] or 0) / 2**20, 4), **live_plateau(run["chunks"])}
            if "groups_per_layer" in stats:
                row["tempcache"] = {k: stats[k] for k in ("groups_per_layer", "merges_per_layer", "inserted_per_layer",
                                                          "evictions_per_layer", "mean_count")}
            rows[name].append(row)
            if map_seed == (seeds or WORLD_SEEDS)[0]:
                live_curves[name] = ([r["frame_start"] for r in run["chunks"]],
                                     [r["cache_bytes"] / 2**20 for r in run["chunks"]])
        log("seed {}: returns vs own earlier view (dB) {}".format(map_seed, ", ".join(
            f"{n} {rows[n][-1]['returns'].get('psnr_vs_own_earlier_db', float('nan')):.1f}" for n in modes)))
    summary = {}
    for name, rs in rows.items():
        own = [r["returns"]["psnr_vs_own_earlier_db"] for r in rs if r["returns"]["views"]]
        true = [r["returns"]["psnr_vs_truth_db"] for r in rs if r["returns"]["views"]]
        summary[name] = {"returns_vs_own_db": {"median": round(statistics.median(own), 2), "min": min(own),
                                               "max": max(own)} if own else None,
                         "returns_vs_truth_db": {"median": round(statistics.median(true), 2), "min": min(true),
                                                 "max": max(true)} if true else None,
                         "live_mib_max": max(r["live_mib_max"] for r in rs),
                         "allocated_mib": max(r["allocated_mib"] for r in rs),
                         "cpu_seconds_total": round(sum(r["cpu_seconds"] for r in rs), 2)}
    dense_cpu = summary["dense-global"]["cpu_seconds_total"]
    for s in summary.values():
        s["speedup_cpu"] = round(dense_cpu / s["cpu_seconds_total"], 3)
    wins = sum(a["returns"]["psnr_vs_own_earlier_db"] > b["returns"]["psnr_vs_own_earlier_db"]
               for a, b in zip(rows["tempcache"], rows["dense-window"]) if a["returns"]["views"])
    report = {"bench": "world-memory", "machine": machine(), "frames": frames, "capacity_frames": capacity,
              "seeds": list(seeds or WORLD_SEEDS), "min_gap": MIN_GAP, "noise_seed": seed,
              "modes": {n: modes[n][0].describe() for n in modes}, "summary": summary,
              "tempcache_over_window_seeds": wins, "per_seed": rows,
              "definitions": {"returns": f"frames whose camera position was last seen at least {MIN_GAP} frames "
                                         "before: PSNR pooled over them against the mode's own earlier view of "
                                         "the place and against the true view (data range 2)",
                              "cpu_seconds": "the process's CPU time while the mode held the turn (modes chunk by "
                                             "chunk in turn)",
                              "live_mib_max": "live cache entries (TempCache: occupied group slots), the largest"}}
    write_json(out / "world_memory.json", report)
    _plot(out / "world_memory.png", rows, live_curves, capacity)
    for name, s in summary.items():
        own, true = s["returns_vs_own_db"], s["returns_vs_truth_db"]
        log(f"{name:18s} returns vs own {own['median']:6.2f} dB ({own['min']:.1f}-{own['max']:.1f}), vs truth "
            f"{true['median']:6.2f} dB, live {s['live_mib_max']:.2f} / allocated {s['allocated_mib']:.2f} MiB, "
            f"{s['speedup_cpu']:.2f}x dense-global's speed by CPU time")
    log(f"TempCache (places) above the window on {wins} of {len(rows['tempcache'])} seeds")
    return report


def _plot(path: Path, rows: dict, live_curves: dict, capacity: int) -> None:
    def series(key):
        return {n: ([r["seed"] for r in rs if r["returns"]["views"]],
                    [r["returns"][key] for r in rs if r["returns"]["views"]]) for n, rs in rows.items()}

    line_plots(path, [
        {"title": "returning views vs the model's own earlier view", "xlabel": "seed", "ylabel": "PSNR dB",
         "marker": "o", "series": series("psnr_vs_own_earlier_db")},
        {"title": "returning views vs the true view", "xlabel": "seed", "ylabel": "PSNR dB", "marker": "o",
         "series": series("psnr_vs_truth_db")},
        {"title": f"live cache (first seed); bounded modes at {capacity} frames", "xlabel": "frame", "ylabel": "MiB",
         "series": live_curves},
    ], title="merge against drop at the same memory: the steered world along a path that comes back")
