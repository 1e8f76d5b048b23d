"""``fastar bench live-world``: the Live World node's frame rate on the demo world, FAST-AR against dense.

Each round plays the bundled demo world for ``frames`` frames in each mode, the order alternating every round, the
way the Live World node plays it: the world family's runner with its own chunk (one frame) and steps, the actions
pulled from a ``LivePlay`` before every chunk while a scripted person holds keys (right, down, left, up, then
nothing, over and over), and after every chunk the message the node sends the page (``LiveFeed``: the frame as
base64 RGB, the frame rate, the cache's MiB, the camera). FAST-AR is the live workflow's (FAST-AR Attention's
balanced preset, cache 'auto': TempCache with a sink of 3 in 21 frames); dense is the MODEL without it (cache
'auto': every frame kept). (The node also waits between chunks to show at most ``max_fps`` frames a second; that is
not the model's rate and is left out.) Everything runs at one torch thread.

**FAST-AR is measured so its flatness holds on a busy machine** (``steady.py`` says how and why): in every round
its play runs chunk by chunk in turn beside a reference, a fresh FAST-AR play's first chunk, and a chunk's cost is
its relative cost, its own CPU time over the reference's nearby, the least over the rounds; it is reported as
seconds at the reference's median speed. **Dense is played whole**, apart from the reference: its cache grows to
tens of MiB and would push the reference's weights out of the CPU's caches as it grows (``frame_rate.py``); its
cost is its least CPU time over the rounds. Every round's times are kept in the JSON.

The bar: from frame 60 on every FAST-AR chunk's rate is within 10 % of its median; dense's last 10 chunks run
slower than its first 10. The final chunk (no clean pass) is left out.
"""

from __future__ import annotations

import gc
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
from .interleave import run_in_turns
from .report import FRAME_RATE_FROM, frame_rate_steadiness, line_plots, machine, write_json
from .steady import REFERENCE, chunk_timer, reference_job, relative_rows, smoothed

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


def play_once(demo, preset: str, frames: int, seed: int, hand_on=None) -> list[dict]:
    """One play of ``frames`` frames: per-chunk rows with ``cpu_seconds`` (this thread's CPU time for the chunk:
    its forwards, its actions pulled from the play, the node's message), the final chunk left out. ``hand_on``:
    called after every chunk when the play runs in turns (``run_in_turns``)."""
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
    play.update(KeyState(held_at(fpb)))
    took, next_chunk = chunk_timer(hand_on or (lambda _row: None))

    def on_chunk(report):
        feed.message(report)  # what the node sends the page after every chunk
        end = report.frame_start + report.frames
        play.update(KeyState(held_at(end)))  # the person's keys for the next chunk
        rows.append({"frame_start": report.frame_start, "frames": report.frames, "seconds": report.seconds,
                     "cpu_seconds": took(), "cache_bytes": report.cache_bytes})
        next_chunk()

    sampler.generate(cond, cfg, initial_latents=start_view(demo, MAP_SEED, START).to(demo.device), callback=on_chunk)
    return rows[:-1]


def _fastar_beside_reference(demo, frames: int, seed: int) -> tuple[list[dict], list[float]]:
    """One FAST-AR play in turn with the reference (a fresh play's first chunk, once per chunk of it): (its rows,
    the reference's smoothed CPU time at each of its chunks)."""
    fpb = demo.frames_per_block
    chunks = -(-(frames - fpb) // fpb)
    done = run_in_turns({
        "fastar": lambda hand_on: play_once(demo, MODES["fastar"], frames, seed, hand_on),
        REFERENCE: reference_job(lambda: play_once(demo, MODES["fastar"], 2 * fpb, seed), chunks),
    })
    return done["fastar"], smoothed(done[REFERENCE][1])[:len(done["fastar"])]


def run_live_world_bench(out_dir, frames: int = 240, rounds: int = 5, seed: int = 0, threads: int = 1,
                         weights=None, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    demo = load_demo_model(weights or WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    per_round: dict[str, list] = {name: [] for name in MODES}
    references: list[list[float]] = []
    gc_was_on = gc.isenabled()
    try:
        play_once(demo, MODES["fastar"], 2 * demo.frames_per_block + 2, seed)  # warm-up
        gc.collect()
        gc.disable()
        for r in range(rounds):
            for name in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                start = time.perf_counter()
                if name == "fastar":
                    rows, reference = _fastar_beside_reference(demo, frames, seed)
                    references.append(reference)
                else:
                    rows = play_once(demo, MODES[name], frames, seed)
                per_round[name].append(rows)
                if progress:
                    print(f"round {r + 1}/{rounds}: {name} in {time.perf_counter() - start:6.1f} s", flush=True)
    finally:
        torch.set_num_threads(before)
        if gc_was_on:
            gc.enable()
    all_reference = [v for ref in references for v in ref]
    scale = statistics.median(all_reference) if all_reference else 0.0
    modes = {}
    for name in MODES:
        if name == "fastar":
            # seconds at the reference's median speed, the least raw time kept beside them
            best = [dict(r, raw_cpu_seconds=r["cpu_seconds"], cpu_seconds=r["relative_cost"] * scale)
                    for r in relative_rows(per_round[name], references)]
        else:
            best = chunk_costs(per_round[name], min)
            for row, first in zip(best, per_round[name][0]):
                row["cache_bytes"] = first["cache_bytes"]
        modes[name] = {"preset": MODES[name], "chunks": best, "frame_rate": frame_rate_steadiness(best),
                       "frame_rate_median_over_rounds": frame_rate_steadiness(chunk_costs(per_round[name],
                                                                                          statistics.median)),
                       "cache_mib_last": round(best[-1]["cache_bytes"] / 2**20, 3) if best else None}
    modes["fastar"]["frame_rate_raw_least"] = frame_rate_steadiness(
        [dict(r, cpu_seconds=r["raw_cpu_seconds"]) for r in modes["fastar"]["chunks"]])
    fast, dense = modes["fastar"]["frame_rate"], modes["dense"]["frame_rate"]
    verdict = None
    if fast is not None and dense is not None:
        verdict = {"fastar_flat": fast["max_deviation"] <= FLAT_TOLERANCE,
                   "dense_falls": dense["trend_last_over_first"] < FALLING_BELOW}
        verdict["passed"] = verdict["fastar_flat"] and verdict["dense_falls"]
    report = {
        "benchmark": "live-world", "model": "the bundled demo world", "frames": frames, "rounds": rounds,
        "seed": seed, "torch_threads": threads, "frames_per_block": demo.frames_per_block,
        "reference_cpu_seconds_median": round(scale, 6),
        "from_frame": FRAME_RATE_FROM, "keys": [[list(k), n] for k, n in HOLDS], "machine": machine(),
        "modes": modes, "verdict": verdict,
        "definitions": {
            "cpu_seconds": "per chunk (one frame), its thread's CPU time for the chunk's forwards, its actions pulled "
                           "from the play and the message the node sends the page; FAST-AR: relative_cost times "
                           "reference_cpu_seconds_median (raw_cpu_seconds: the least raw time); dense: the least over "
                           "the rounds; the final chunk left out",
            "relative_cost": "FAST-AR, per chunk: the least over the rounds of its CPU time over the reference's (a "
                             "fresh FAST-AR play's first chunk, run in turn with its chunks; median over the 11 "
                             "nearest)",
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
