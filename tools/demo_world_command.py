"""``fastar demo --world steer``: the steered world model along a scripted path, dense and FAST-AR in turn.

The camera goes out, around and back to where it started (``steer_world.scripted_path``) over one map; both
modes continue the same true first chunk with the same keys and noise, chunk by chunk in turn (the order
rotating every round), each timed by its own CPU time and by wall time. Writes ``world.gif`` (true | dense |
FAST-AR side by side), ``stats.json`` and ``world.png``, and prints speedup, cache MiB, action following, carried
PSNR, PSNR against the true views and the revisit scores of each mode.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .bench.report import line_plots, write_json
from .bench.rollout import timed_rollouts
from .bench.scenarios import Scenario, bench_modes
from .demo.world_eval import evaluate_world
from .demo.world_report import bar_track
from .demo_command import PSNR_CAP_DB, save_gif, to_uint8_frames


def world_scenario(demo, track, truth) -> Scenario:
    start = truth[: demo.frames_per_block].permute(1, 0, 2, 3)[None].to(demo.device)
    return Scenario(name="world", model=demo.model, context=demo.world_prompt(), latent_hw=demo.frame_size,
                    channels=demo.channels, schedule=demo.schedule, frames_per_block=demo.frames_per_block,
                    initial_latents=start, rope_max_distance=demo.rope_max_distance,
                    context_noise=demo.context_noise, make_runner=lambda: demo.world_runner([track]),
                    notes={"path": "out, around and back (square loops of 8 patches)"})


def run_world_demo(out: Path, weights, frames: int = 240, seed: int = 0, map_seed: int = 1) -> int:
    from ..fastar_core.families.demo.steer_world import make_map, render_track
    from .demo.bundled import load_demo_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    demo = load_demo_model(weights)
    if not demo.is_world:
        from ..fastar_core.errors import FastARError

        raise FastARError(f"{weights}: not a steered-world model; train one with `fastar train-demo --world steer`")
    fpb = demo.frames_per_block
    track = bar_track(map_seed, frames + fpb - 1)
    truth = render_track(make_map(map_seed), track)
    scenario = world_scenario(demo, track, truth)
    every = bench_modes()
    modes = {"dense": every["dense-global"], "fastar": every["all"]}  # the sprite demo's two modes
    print(f"steered world model, map {map_seed}, {frames} frames along an out-around-and-back path; dense and "
          "FAST-AR chunk by chunk in turn")
    results, per_mode = timed_rollouts(scenario, modes, frames, seed, repeats=1, progress=True)
    stats = {"frames": frames, "seed": seed, "map_seed": map_seed, "modes": {}}
    videos = {"true": truth}
    for name, m in per_mode.items():
        video = results[name].latent[0].permute(1, 0, 2, 3).float().cpu()
        videos[name] = video
        rows = m["chunks"]
        stats["modes"][name] = {
            "chunks": rows, "evaluation": evaluate_world(video, truth, track, fpb),
            "cpu_seconds_total": round(sum(r["cpu_seconds"] for r in rows), 3),
            "seconds_total": round(sum(r["seconds"] for r in rows), 3),
            "cache_mib_max": round(max(r["cache_bytes"] for r in rows) / 2**20, 3),
        }
    d, f = stats["modes"]["dense"], stats["modes"]["fastar"]
    stats["speedup"] = {"cpu_total": round(d["cpu_seconds_total"] / f["cpu_seconds_total"], 3),
                        "wall_total": round(d["seconds_total"] / f["seconds_total"], 3)}
    side = torch.cat([to_uint8_frames(v.permute(1, 0, 2, 3)[None]) for v in videos.values()], dim=2)
    save_gif(side, out / "world.gif")
    write_json(out / "stats.json", stats)
    _plot(out / "world.png", stats, videos, fpb)
    print(f"\n{'mode':8s} {'CPU s':>7s} {'cache MiB':>9s} {'following':>9s} {'carried dB':>10s} {'vs true dB':>10s} "
          f"{'revisit vs true / own dB':>25s}")
    for name, m in stats["modes"].items():
        e, r = m["evaluation"], m["evaluation"]["revisit"]
        rev = f"{r['psnr_vs_truth_db']:.1f} / {r['psnr_vs_own_earlier_db']:.1f}" if r["views"] else "no revisits"
        print(f"{name:8s} {m['cpu_seconds_total']:7.2f} {m['cache_mib_max']:9.2f} {e['action_following']:9.2f} "
              f"{e['carried_psnr_db']:10.2f} {e['psnr_vs_truth_db']:10.2f} {rev:>25s}")
    print(f"speedup {stats['speedup']['cpu_total']:.2f}x by CPU time (wall {stats['speedup']['wall_total']:.2f}x); "
          f"wrote {out}/world.gif (true | dense | FAST-AR), stats.json, world.png")
    return 0


def _plot(path, stats, videos, fpb) -> None:
    def per_frame_psnr(video, ref):
        mse = (video - ref).square().flatten(1).mean(1)
        return [min(PSNR_CAP_DB, 10 * float(torch.log10(4 / m))) if m > 0 else PSNR_CAP_DB for m in mse]

    frames = list(range(fpb, videos["true"].shape[0]))
    panels = [
        {"title": "CPU seconds per chunk", "xlabel": "frame", "ylabel": "CPU s",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["cpu_seconds"] for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": "KV cache", "xlabel": "frame", "ylabel": "MiB",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["cache_bytes"] / 2**20 for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": f"PSNR vs the true view (capped at {PSNR_CAP_DB:.0f})", "xlabel": "frame", "ylabel": "dB",
         "series": {n: (frames, per_frame_psnr(videos[n][fpb:], videos["true"][fpb:])) for n in stats["modes"]}},
    ]
    line_plots(path, panels, title="steered world: dense against FAST-AR, same keys, same seed")


REVISIT_AWAY = 12  # patches: the path returns to each place after 2 * 12 + 2 = 26 frames, past the smaller windows


def revisit_scenario(weights, frames: int, device="cpu", map_seed: int = 1) -> Scenario:
    """The world model on ``revisit_path``: out of view and back, again and again. ``notes["revisit"]`` scores a
    rollout's latent (start chunk included) on the frames that return to a place seen before."""
    from ..fastar_core.families.demo.steer_world import make_map, render_track, revisit_path, track_from_actions
    from .demo.bundled import load_demo_model
    from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
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
                      "map_seed": map_seed, "revisit": revisit}
    return scenario
