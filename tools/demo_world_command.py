"""``fastar demo``: the steered world model along an out-around-and-back path, with dense-global, the window and
TempCache at the window's memory, chunk by chunk in turn.

The camera goes out, around and back to where it started (``steer_world.scripted_path``: a square loop of 8
patches, 40 frames, repeated) over one map, so every view of the second loop on returns to a place last seen 40
frames before, further back than the window's 21 frames reach. Every mode continues the same true first frame with
the same keys and noise, the modes in rotating rounds (``bench/interleave.py``), each chunk timed by its own CPU
time and by wall time. Writes ``world.gif`` (true | dense-global | window | TempCache, panes labelled),
``world.png`` and ``stats.json``, and prints per mode: the speedup over dense-global by CPU time, the cache
(allocated and live MiB, and from which frame live stays flat), the keys followed, the carried region, and the
returning views against the model's own earlier view and against the truth.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from .bench.report import line_plots, write_json
from .bench.rollout import timed_rollouts
from .bench.scenarios import Scenario, bench_modes
from .demo.world_bar import bar_track
from .demo.world_eval import MIN_GAP, evaluate_world
from .demo_command import PSNR_CAP_DB, labelled_side_by_side, save_gif

DEFAULT_FRAMES = 240
WINDOW_CAPACITY = 21  # frames cached by the window (sink included), and TempCache's capacity: the same memory
DEMO_MODES = {"dense-global": "dense-global", "dense-window": "window", "tempcache": "TempCache"}  # mode -> pane


def world_scenario(demo, track, truth) -> Scenario:
    start = truth[: demo.frames_per_block].permute(1, 0, 2, 3)[None].to(demo.device)
    return Scenario(name="world", model=demo.model, context=demo.world_prompt(), latent_hw=demo.frame_size,
                    channels=demo.channels, schedule=demo.schedule, frames_per_block=demo.frames_per_block,
                    initial_latents=start, rope_max_distance=demo.rope_max_distance,
                    context_noise=demo.context_noise, make_runner=lambda: demo.world_runner([track]),
                    notes={"path": "out, around and back (square loops of 8 patches)"})


def world_modes(places: bool, capacity: int = WINDOW_CAPACITY) -> dict:
    """The steered world's modes, every bounded one holding ``capacity`` frames' worth of keys (sink included):
    ``dense-global``, ``fastar`` (the default preset: TempCache, AnnSA, AnnCA), ``tempcache`` alone, and
    ``dense-window`` (its sink and newest frames; one-frame chunks, so it attends to ``capacity + 1`` frames).
    For a model whose positions are places on its map (``places``) TempCache's groups are places
    (``same_place``)."""
    every = bench_modes(capacity=capacity, chunk=1)

    def placed(mode):
        cache, fastar = mode
        return (replace(cache, tempcache=replace(cache.tempcache, same_place=places)), fastar)

    return {"dense-global": every["dense-global"], "fastar": placed(every["all"]),
            "tempcache": placed(every["tempcache"]), "dense-window": every["dense-window"]}


def run_world_modes(demo, world_map, track, modes: dict, seed: int = 0, progress: bool = False):
    """Every mode of ``modes`` (name -> (cache spec, FAST-AR config)) along ``track`` over ``world_map``, chunk by
    chunk in turn. Returns (the true views, name -> {"video" ``[T, 3, H, W]``, "chunks", "allocated_bytes",
    "cache_stats"})."""
    from .demo.steer_world import render_track

    truth = render_track(world_map, track)
    scenario = world_scenario(demo, track, truth)
    frames = len(track) - demo.frames_per_block
    results, per_mode = timed_rollouts(scenario, modes, frames, seed, repeats=1, progress=progress)
    return truth, {name: {"video": results[name].latent[0].permute(1, 0, 2, 3).float().cpu(),
                          "chunks": per_mode[name]["chunks"],
                          "allocated_bytes": results[name].cache_stats.get("allocated_bytes"),
                          "cache_stats": results[name].cache_stats} for name in modes}


def live_plateau(chunks: list[dict]) -> dict:
    """Live cache MiB at its largest and last, and the first frame from which it stays within 1 % of its largest
    (None while it still grows over the last tenth of the rollout: dense-global's never stops). The final chunk
    commits nothing (no clean pass follows it), so it is left out of the plateau."""
    live = [r["cache_bytes"] for r in chunks]
    top = max(live)
    committed = live[:-1] or live
    first = next(i for i, b in enumerate(committed) if all(x >= 0.99 * top for x in committed[i:]))
    flat = first < 0.9 * (len(committed) - 1)
    return {"live_mib_max": round(top / 2**20, 3), "live_mib_last": round(live[-1] / 2**20, 3),
            "plateau_from_frame": chunks[first]["frame_start"] if flat else None}


def run_world_demo(out: Path, weights, frames: int = DEFAULT_FRAMES, seed: int = 0, map_seed: int = 1) -> int:
    from .demo.model import load_demo_model
    from .demo.steer_world import make_map

    demo = load_demo_model(weights)
    if not demo.is_world:
        from ..fastar_core.errors import FastARError

        raise FastARError(f"{weights}: not a steered-world model; train one with `fastar train-demo --world steer`")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fpb = demo.frames_per_block
    track = bar_track(map_seed, frames + fpb - 1)
    every = world_modes(demo.places_on_map)
    modes = {name: every[name] for name in DEMO_MODES}
    print(f"steered world model, map {map_seed}, {frames} frames out, around and back (a 40-frame loop, repeated): "
          "dense-global, the window and TempCache at the window's memory (21 frames), chunk by chunk in turn",
          flush=True)
    truth, runs = run_world_modes(demo, make_map(map_seed), track, modes, seed, progress=True)
    stats = {"frames": frames, "seed": seed, "map_seed": map_seed, "window_capacity_frames": WINDOW_CAPACITY,
             "timing": "modes run chunk by chunk in turn (the order rotating every round); cpu_seconds is the "
                       "process's CPU time while the mode held the turn", "modes": {}}
    for name, run in runs.items():
        rows = run["chunks"]
        stats["modes"][name] = {
            "cache": modes[name][0].describe(), "chunks": rows,
            "evaluation": evaluate_world(run["video"], truth, track, fpb),
            "cpu_seconds_total": round(sum(r["cpu_seconds"] for r in rows), 3),
            "seconds_total": round(sum(r["seconds"] for r in rows), 3),
            "cache_mib_allocated": round((run["allocated_bytes"] or 0) / 2**20, 3), **live_plateau(rows),
        }
    dense = stats["modes"]["dense-global"]
    for m in stats["modes"].values():
        m["speedup_cpu"] = round(dense["cpu_seconds_total"] / m["cpu_seconds_total"], 3)
        m["speedup_wall"] = round(dense["seconds_total"] / m["seconds_total"], 3)
    videos = {"true": truth, **{DEMO_MODES[n]: r["video"] for n, r in runs.items()}}
    save_gif(labelled_side_by_side(videos), out / "world.gif")
    write_json(out / "stats.json", stats)
    _plot(out / "world.png", stats, videos, track, fpb)
    print(f"\n{'mode':13s} {'CPU s':>7s} {'speedup':>7s} {'cache MiB alloc / live':>23s} {'live flat from':>14s} "
          f"{'keys':>5s} {'carried dB':>10s} {'return vs own / true dB':>24s}")
    for name, m in stats["modes"].items():
        e, r = m["evaluation"], m["evaluation"]["revisit"]
        rev = f"{r['psnr_vs_own_earlier_db']:.1f} / {r['psnr_vs_truth_db']:.1f}" if r["views"] else "no returns"
        flat = "still growing" if m["plateau_from_frame"] is None else f"frame {m['plateau_from_frame']}"
        print(f"{name:13s} {m['cpu_seconds_total']:7.2f} {m['speedup_cpu']:6.2f}x "
              f"{m['cache_mib_allocated']:10.2f} / {m['live_mib_max']:<10.2f} {flat:>14s} "
              f"{e['action_following']:5.2f} {e['carried_psnr_db']:10.2f} {rev:>24s}")
    views = stats["modes"]["dense-global"]["evaluation"]["revisit"]["views"]
    print(f"speedup: dense-global's CPU seconds over each mode's. keys: share of frames that moved as told. returns: "
          f"the {views} views whose camera position was last seen more than {MIN_GAP - 1} frames before, pooled PSNR "
          f"against the model's own earlier view and against the truth.\nwrote {out}/world.gif (true | dense-global "
          "| window | TempCache), world.png, stats.json")
    return 0


def _plot(path, stats, videos, track, fpb) -> None:
    def per_frame_psnr(video, ref):
        mse = (video - ref).square().flatten(1).mean(1)
        return [min(PSNR_CAP_DB, 10 * float(torch.log10(4 / m))) if m > 0 else PSNR_CAP_DB for m in mse]

    returns, last = [], {}
    for t, p in enumerate(track.positions.tolist()):
        if t >= fpb and tuple(p) in last and t - last[tuple(p)] >= MIN_GAP:
            returns.append((t, last[tuple(p)]))
        last[tuple(p)] = t
    panes = {n: DEMO_MODES[n] for n in stats["modes"]}
    panels = [
        {"title": "CPU seconds per chunk", "xlabel": "frame", "ylabel": "CPU s",
         "series": {panes[n]: ([r["frame_start"] for r in m["chunks"]], [r["cpu_seconds"] for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": "live KV cache", "xlabel": "frame", "ylabel": "MiB",
         "series": {panes[n]: ([r["frame_start"] for r in m["chunks"]], [r["cache_bytes"] / 2**20 for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": f"returning views vs the model's own earlier view (capped at {PSNR_CAP_DB:.0f})", "xlabel": "frame",
         "ylabel": "dB", "marker": ".",
         "series": {p: ([t for t, _ in returns],
                        per_frame_psnr(torch.stack([videos[p][t] for t, _ in returns]),
                                       torch.stack([videos[p][e] for _, e in returns])) if returns else [])
                    for p in panes.values()}},
        {"title": "PSNR vs the true view", "xlabel": "frame", "ylabel": "dB",
         "series": {p: (list(range(fpb, videos["true"].shape[0])),
                        per_frame_psnr(videos[p][fpb:], videos["true"][fpb:])) for p in panes.values()}},
    ]
    line_plots(path, panels, title="steered world: dense-global, the window and TempCache at the same memory")


REVISIT_AWAY = 12  # patches: the path returns to each place after 2 * 12 + 2 = 26 frames, past the smaller windows


def revisit_scenario(weights, frames: int, device="cpu", map_seed: int = 1) -> Scenario:
    """The world model on ``revisit_path``: out of view and back, again and again. ``notes["revisit"]`` scores a
    rollout's latent (start chunk included) on the frames that return to a place seen before."""
    from .demo.model import load_demo_model
    from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
    from .demo.steer_world import make_map, render_track, revisit_path, track_from_actions
    from .demo.world_eval import revisit_scores

    demo = load_demo_model(weights or WEIGHTS_DIR / WORLD_WEIGHTS_FILE, device=device)
    fpb = demo.frames_per_block
    track = track_from_actions(revisit_path(frames + fpb - 1, REVISIT_AWAY), start=(2, 2))
    truth = render_track(make_map(map_seed), track)
    scenario = world_scenario(demo, track, truth)
    scenario.name = "world-revisit"

    def revisit(latent):
        video = latent[0].permute(1, 0, 2, 3).float().cpu()
        return revisit_scores(video, truth, track, fpb, min_gap=2 * REVISIT_AWAY + 2)

    scenario.notes = {"path": f"right {REVISIT_AWAY} patches, down 1, left {REVISIT_AWAY}, up 1, repeated",
                      "map_seed": map_seed, "revisit": revisit, "places": demo.places_on_map}
    return scenario
