"""``fastar bench live-world``: the Live World node's frame rate on the demo world, FAST-AR against dense.

Each round plays the bundled demo world for ``frames`` frames in each mode, the order alternating every round, the
way the Live World node plays it: the world family's runner with its own chunk (one frame) and steps, the actions
pulled from a ``LivePlay`` before every chunk while a scripted person holds keys (right, down, left, up, then
nothing, over and over), and after every chunk the message the node sends the page (``LiveFeed``: the frame as
base64 RGB, the frame rate, the cache's MiB, the camera). FAST-AR is the live workflow's (FAST-AR Attention's
balanced preset, cache 'auto': TempCache with a sink of 3 in 21 frames); dense is the MODEL without it (cache
'auto': every frame kept). A chunk's cost is its CPU time, the least over the rounds, at one torch thread, for the
reasons ``frame_rate.py`` gives; every round's times are kept in the JSON. (The node also waits between chunks to
show at most ``max_fps`` frames a second; that is not the model's rate and is left out.)

The bar: from frame 60 on every FAST-AR chunk's rate is within 10 % of its median; dense's last 10 chunks run
slower than its first 10. The final chunk (no clean pass) is left out.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ...fastar_core.caches.spec import SINK_FRAMES, WINDOW_FRAMES
from ...fastar_core.families.demo.family import attach_world, start_view
from ...fastar_core.forward.family import family_for
from ...fastar_core.forward.runner import runner_for
from ...fastar_core.rollout.conditioning import Conditioning
from ...fastar_core.rollout.engine import build_sampler, resolve_settings
from ...fastar_core.rollout.live_actions import KeyState, LiveFeed, LivePlay
from ...fastar_core.rollout.sampler import RolloutConfig
from ..demo.bundled import load_demo_model
from ..demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
from .frame_rate import FALLING_BELOW, FLAT_TOLERANCE, chunk_costs
from .report import FRAME_RATE_FROM, frame_rate_steadiness, line_plots, machine, write_json

MODES = {"fastar": "balanced", "dense": "off"}  # FAST-AR Attention's preset in the live workflow, or none
START = (12, 12)  # the workflow's Demo World Start: map 1, the middle of the map
MAP_SEED = 1
HOLDS = ((("D",), 12), (("S",), 12), (("A",), 12), (("W",), 12), ((), 6))  # (keys, frames), over and over


def held_at(frame: int) -> tuple:
    """The keys the scripted person holds when frame ``frame`` is asked for."""
    cycle = sum(n for _, n in HOLDS)
    t = frame % cycle
    for keys, n in HOLDS:
        if t < n:
            return keys
        t -= n
    return ()


def play_once(demo, preset: str, frames: int, seed: int) -> list[dict]:
    """One play of ``frames`` frames: per-chunk rows with ``cpu_seconds`` (the process's CPU time since the chunk
    before, the node's message included), the final chunk left out."""
    model = attach_world(demo)
    family = family_for(model)
    engine = resolve_settings(preset=preset, cache_policy="auto", sink_frames=SINK_FRAMES, window_frames=WINDOW_FRAMES,
                              attention_overrides={"backend": "auto"}, num_layers=len(model.blocks))
    sampler = build_sampler(runner_for(model, family), engine.fastar, rope_max_distance=family.rope_max_distance)
    play = LivePlay("demo_world")
    feed = LiveFeed(play, {"play": "bench", "node": "bench"}, latent_is_video=True, camera=family.camera)
    fpb, schedule = family.own_rollout()
    cfg = RolloutConfig(num_frames=frames - fpb, latent_height=demo.frame_size[0], latent_width=demo.frame_size[1],
                        frames_per_block=fpb, schedule=schedule, seed=seed, cache=engine.cache,
                        context_noise=demo.context_noise, channels=demo.channels)
    cond = Conditioning(actions=play.actions(still_frames=fpb), place=START)
    rows: list[dict] = []
    last = [time.process_time()]
    play.update(KeyState(held_at(fpb)))

    def on_chunk(report):
        feed.message(report)  # what the node sends the page after every chunk
        end = report.frame_start + report.frames
        play.update(KeyState(held_at(end)))  # the person's keys for the next chunk
        now = time.process_time()
        rows.append({"frame_start": report.frame_start, "frames": report.frames, "seconds": report.seconds,
                     "cpu_seconds": now - last[0], "cache_bytes": report.cache_bytes})
        last[0] = time.process_time()

    sampler.generate(cond, cfg, initial_latents=start_view(demo, MAP_SEED, START).to(demo.device), callback=on_chunk)
    return rows[:-1]


def run_live_world_bench(out_dir, frames: int = 240, rounds: int = 5, seed: int = 0, threads: int = 1,
                         weights=None, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    demo = load_demo_model(weights or WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    per_round: dict[str, list] = {name: [] for name in MODES}
    try:
        play_once(demo, MODES["fastar"], 2 * demo.frames_per_block + 2, seed)  # warm-up
        for r in range(rounds):
            for name in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                start = time.perf_counter()
                per_round[name].append(play_once(demo, MODES[name], frames, seed))
                if progress:
                    print(f"round {r + 1}/{rounds}: {name} in {time.perf_counter() - start:6.1f} s", flush=True)
    finally:
        torch.set_num_threads(before)
    modes = {}
    for name in MODES:
        best = chunk_costs(per_round[name], min)
        for row, first in zip(best, per_round[name][0]):
            row["cache_bytes"] = first["cache_bytes"]
        modes[name] = {"preset": MODES[name], "chunks": best, "frame_rate": frame_rate_steadiness(best),
                       "frame_rate_median_over_rounds": frame_rate_steadiness(chunk_costs(per_round[name],
                                                                                          statistics.median)),
                       "cache_mib_last": round(best[-1]["cache_bytes"] / 2**20, 3) if best else None}
    fast, dense = modes["fastar"]["frame_rate"], modes["dense"]["frame_rate"]
    verdict = None
    if fast is not None and dense is not None:
        verdict = {"fastar_flat": fast["max_deviation"] <= FLAT_TOLERANCE,
                   "dense_falls": dense["trend_last_over_first"] < FALLING_BELOW}
        verdict["passed"] = verdict["fastar_flat"] and verdict["dense_falls"]
    report = {
        "benchmark": "live-world", "model": "the bundled demo world", "frames": frames, "rounds": rounds,
        "seed": seed, "torch_threads": threads, "frames_per_block": demo.frames_per_block,
        "from_frame": FRAME_RATE_FROM, "keys": [[list(k), n] for k, n in HOLDS], "machine": machine(),
        "modes": modes, "verdict": verdict,
        "definitions": {
            "cpu_seconds": "per chunk (one frame), the least of its CPU times over the rounds: the chunk's forwards, "
                           "its actions pulled from the play and the message the node sends the page; the final "
                           "chunk left out",
            "frame_rate": "frames per CPU second per chunk from frame 60 on: median, largest deviation from it, "
                          "share within 10 % of it, last 10 chunks over the first 10",
            "verdict": f"fastar_flat: largest deviation <= {FLAT_TOLERANCE}; dense_falls: last 10 over first 10 < "
                       f"{FALLING_BELOW}",
        },
    }
    write_json(out_dir / "live_world.json", report)
    _plot(out_dir / "live_world.png", modes, frames)
    return report


def _plot(path, modes: dict, frames: int) -> None:
    def series(value):
        return {n: ([r["frame_start"] for r in m["chunks"]], [value(r) for r in m["chunks"]]) for n, m in modes.items()}

    rates = series(lambda r: r["frames"] / r["cpu_seconds"])
    fast = modes["fastar"]["frame_rate"]
    if fast is not None:
        xs = [x for x in rates["fastar"][0] if x >= FRAME_RATE_FROM]
        for label, k in (("fastar median +10 %", 1 + FLAT_TOLERANCE), ("fastar median -10 %", 1 - FLAT_TOLERANCE)):
            rates[label] = (xs, [fast["median_fps"] * k] * len(xs))
    line_plots(path, [
        {"title": "frames per CPU second (least over rounds)", "xlabel": "frame", "ylabel": "frames/s",
         "series": rates},
        {"title": "cache", "xlabel": "frame", "ylabel": "MiB",
         "series": series(lambda r: r["cache_bytes"] / 2**20)},
    ], title=f"Live World on the demo world: {frames} frames played")
