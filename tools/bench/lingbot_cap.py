"""``fastar bench lingbot-cap``: LingBot-World 2.0 past its release's 1,024-frame cap, at a flat cost per chunk.

The release rotates each key at its absolute latent frame from a RoPE table of 1,024 rows, so it cannot make latent
frame 1,024 (4,093 video frames, 4 min 16 s at 16 fps). The pack computes RoPE from integer positions (no table)
and keeps its caches bounded, so a rollout never runs out of positions and its cost does not grow.

This rolls the ``lingbot`` scenario's random model at reduced widths (2 heads of 128, 2 layers, 8x12 latents = 24
tokens per frame) for ``frames`` latent frames (default 3,000) in two modes: the release's own cache (a window of
18 frames with a 6-frame sink) and TempCache holding as many frames' worth (14, sink 6).

**Measured so it holds on a busy machine** (``steady.py`` says how and why): each of ``rounds`` rounds runs
both rollouts chunk by chunk in turn beside a reference, a fresh rollout's first chunk in the window mode; a
chunk's cost is its **relative cost**, its own CPU time over the reference's nearby, the least over the rounds.

The bar (the printed verdict line): from latent frame 300 on, every chunk's relative cost within 10 % of its
mode's median, and the cache's bytes constant; past the cap; and the window rollout's first 1,024 frames bit for
bit those of a 1,024-frame rollout of the same model, noise and camera. That rollout is the one
``tests/test_lingbot_parity.py::test_the_cap_bench_rollout_matches_the_reference`` holds to the release's own
pipeline within 1e-5 (``cap_setting`` builds it for both): a causal rollout's frames do not depend on how many
come after them, given the same camera input. The release divides every move by the longest of the path it is
given, so the bench divides all its frames by the divisor the release gives the first 1,024 (``release_scale``):
their camera input is then the release's bit for bit. The raw least CPU times are recorded and plotted beside
the relative cost; the final chunk (no clean pass) is left out.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch

from ...fastar_core.families.lingbot.camera import check_path
from .interleave import run_in_turns
from .report import line_plots, machine, write_json
from .rollout import run_mode
from .scenarios import lingbot_path, lingbot_scenario, scenario_modes
from .steady import REFERENCE, chunk_timer, deviation, reference_job, relative_rows, smoothed

FRAMES = 3000  # the claim's length
FROM_FRAME = 300
FLAT_TOLERANCE = 0.10
RELEASE_CAP = 1024  # rows of the release's RoPE table: latent frames it can make
MODES = {"window": "dense-window", "tempcache": "tempcache"}  # this bench's names -> the rollout bench's modes
LATENT_HW = (8, 12)
SEED = 0
PARITY_TEST = "tests/test_lingbot_parity.py::test_the_cap_bench_rollout_matches_the_reference"


def release_scale(frames: int = FRAMES) -> float:
    """The divisor the release gives the translations of the frames it can make of the bench's path: the longest
    move among its first ``min(frames, RELEASE_CAP)`` latent frames (its first ``4 (T - 1) + 1`` poses), as
    float32 computes it.

    The release divides every move by the longest of the path it is given. The bench's path is a walk, whose moves
    are all 0.25 in exact arithmetic, but float32 rounds a move far from the start differently (by up to 1e-4 of it
    over 3,000 frames), so the whole path's longest is not its first 1,024 frames' longest. The bench divides all
    3,000 frames by the latter: its first 1,024 frames are then, bit for bit, the camera the release makes of them."""
    prefix = min(frames, RELEASE_CAP)
    video = 4 * (prefix - 1) + 1
    path = lingbot_path(frames)
    moves = check_path(path.poses[:video], path.intrinsics).latent_motion(prefix, scale=1.0)
    return float(moves[:, :3, 3].norm(dim=-1).max())


def cap_setting(frames: int, seed: int = SEED):
    """(scenario, {name: (cache spec, FAST-AR config)}, conditioning for ``frames`` latent frames): the bench's
    model, modes and camera (every move divided by ``release_scale``), which the parity test also runs through the
    release."""
    scenario = lingbot_scenario(seed, "cpu", latent_hw=LATENT_HW)
    all_modes = scenario_modes(scenario)
    cond = scenario.make_conditioning(frames, scale=release_scale(frames))
    return scenario, {name: all_modes[key] for name, key in MODES.items()}, cond


def _timed_rollout(scenario, mode, frames: int, seed: int, cond):
    """A job for ``run_in_turns``: one rollout, its chunks' own CPU times (``cpu_seconds``) and cache bytes."""

    def job(hand_on):
        rows: list = []
        took, next_chunk = chunk_timer(hand_on)

        def on_chunk(row):
            rows.append({"frame_start": row["frame_start"], "frames": row["frames"], "cpu_seconds": took(),
                         "live_bytes": row["cache_bytes"]})
            next_chunk()

        result, _ = run_mode(scenario, *mode, frames=frames, seed=seed, on_chunk=on_chunk, cond=cond)
        return result, rows

    return job


def cap_video(frames: int = FRAMES):
    """(poses [N, 4, 4] float64, intrinsics [4]) of the bench's camera for ``frames`` latent frames, as the release's
    camera folder would hold them."""
    path = lingbot_path(frames)
    return path.poses, path.intrinsics


def run_lingbot_cap_bench(out_dir, frames: int = FRAMES, rounds: int = 5, seed: int = SEED,
                          progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    gc_was_on = gc.isenabled()
    try:
        # One camera for every run: the release divides every move by the longest of the whole path, so a path of
        # another length would give its first frames other rays.
        scenario, modes, cond = cap_setting(frames, seed)
        chunk = scenario.frames_per_block
        run_mode(scenario, *modes["window"], frames=2 * chunk, seed=seed, cond=cond)  # warm-up
        chunks = -(-frames // chunk)
        timed = chunks - 1  # the final chunk (no clean pass) left out
        passes = []
        gc.collect()
        gc.disable()
        for r in range(rounds):
            start = time.perf_counter()
            jobs = {name: _timed_rollout(scenario, modes[name], frames, seed, cond) for name in modes}
            jobs[REFERENCE] = reference_job(lambda: run_mode(scenario, *modes["window"], frames=chunk, seed=seed,
                                                             cond=cond), timed)
            passes.append(run_in_turns(jobs))
            if progress:
                print(f"round {r + 1}/{rounds}: {frames} frames of each mode in turn beside the reference, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
        gc.enable()
        prefix_frames = min(RELEASE_CAP, frames)
        prefix, _ = run_mode(scenario, *modes["window"], frames=prefix_frames, seed=seed, cond=cond)
    finally:
        torch.set_num_threads(before)
        if gc_was_on:
            gc.enable()

    references = [smoothed(done[REFERENCE][1]) for done in passes]
    # A short run (a test) from its middle, and never past its last timed chunk (so every figure has a chunk).
    from_frame = FROM_FRAME if frames >= 2 * FROM_FRAME else min(frames // 2, (timed - 1) * chunk)
    report_modes = {}
    for name in modes:
        rows = relative_rows([done[name][1][:timed] for done in passes], references)
        late = [r for r in rows if r["frame_start"] >= from_frame]
        median, worst, share = deviation([r["relative_cost"] for r in late], FLAT_TOLERANCE)
        raw_median, raw_worst, raw_share = deviation([r["cpu_seconds"] for r in late], FLAT_TOLERANCE)
        live = sorted({r["live_bytes"] for r in late})
        report_modes[name] = {
            "cache": modes[name][0].describe(), "chunks": rows, "from_frame": from_frame,
            "median_relative_cost": round(median, 5), "max_deviation": round(worst, 4),
            "within_10_percent": round(share, 4),
            "cpu_seconds": {"median": round(raw_median, 6), "max_deviation": round(raw_worst, 4),
                            "within_10_percent": round(raw_share, 4)},
            "last_100_over_first_100": round(statistics.median(r["relative_cost"] for r in late[-100:])
                                             / statistics.median(r["relative_cost"] for r in late[:100]), 4),
            "live_bytes_from_frame": live, "live_bytes_max": max(r["live_bytes"] for r in rows),
        }
    window = passes[0]["window"][0].latent
    same = bool(torch.equal(window[:, :, :prefix_frames], prefix.latent))
    verdict = {name: {"flat_time": m["max_deviation"] <= FLAT_TOLERANCE,
                      "flat_bytes": len(m["live_bytes_from_frame"]) == 1} for name, m in report_modes.items()}
    verdict["past_the_cap"] = frames > RELEASE_CAP and bool(torch.isfinite(window).all())
    verdict["first_1024_frames_equal_a_1024_frame_rollout"] = same
    verdict["passed"] = all(v for m in verdict.values() for v in (m.values() if isinstance(m, dict) else [m]))
    all_reference = [v for done in passes for v in done[REFERENCE][1]]
    report = {
        "benchmark": "lingbot-cap", "model": scenario.name, "latent_hw": list(LATENT_HW), "frames": frames,
        "rounds": rounds, "seed": seed, "torch_threads": 1, "frames_per_block": chunk,
        "notes": scenario.notes, "machine": machine(), "release_cap_frames": RELEASE_CAP,
        "prefix_frames": prefix_frames, "parity_test": PARITY_TEST, "from_frame": from_frame,
        "reference_cpu_seconds_median": round(statistics.median(all_reference), 6),
        "modes": report_modes, "verdict": verdict,
        "definitions": {
            "cpu_seconds": "per chunk, the CPU time of its own thread from taking its turn to handing it on, the least "
                           "over the rounds (cpu_seconds_each_round keeps them all)",
            "reference_cpu_seconds_each_round": "in each round, the median over the 11 nearest rounds of chunks of a "
                                                "fixed piece of work run beside them (a fresh rollout's first chunk "
                                                "of 4 frames in the window mode)",
            "relative_cost": "per chunk, the least over the rounds of cpu_seconds / reference_cpu_seconds: the "
                             "chunk's CPU time in units of fixed work measured beside it",
            "max_deviation": f"largest |relative_cost / median - 1| over the chunks from latent frame {from_frame}",
            "live_bytes_from_frame": f"the distinct cache sizes after every chunk from latent frame {from_frame}",
            "first_1024_frames_equal_a_1024_frame_rollout": f"the window rollout's first frames, bit for bit, against "
                                                           f"a rollout of that many frames, which {PARITY_TEST} holds "
                                                           "to the release's pipeline",
        },
    }
    write_json(out_dir / "lingbot_cap.json", report)
    _plot(out_dir / "lingbot_cap.png", report_modes, frames)
    print_lingbot_cap(report)
    return report


def _plot(path, modes: dict, frames: int) -> None:
    relative, raw, sizes = {}, {}, {}
    for name, m in modes.items():
        xs = [r["frame_start"] for r in m["chunks"]]
        relative[name] = (xs, [r["relative_cost"] for r in m["chunks"]])
        raw[name] = (xs, [r["cpu_seconds"] * 1000 for r in m["chunks"]])
        sizes[name] = (xs, [r["live_bytes"] / 2**20 for r in m["chunks"]])
        late = [x for x in xs if x >= m["from_frame"]]
        for label, k in (("+10 %", 1 + FLAT_TOLERANCE), ("-10 %", 1 - FLAT_TOLERANCE)):
            relative[f"{name} median {label}"] = (late, [m["median_relative_cost"] * k] * len(late))
    first = next(iter(modes.values()))["chunks"]
    raw[f"{REFERENCE} (round 1)"] = ([r["frame_start"] for r in first],
                                     [r["reference_cpu_seconds_each_round"][0] * 1000 for r in first])
    line_plots(path, [
        {"title": "CPU time per chunk / the fixed reference beside it", "xlabel": "latent frame",
         "ylabel": "relative cost", "series": relative},
        {"title": "CPU time per chunk (least over rounds)", "xlabel": "latent frame", "ylabel": "ms", "series": raw},
        {"title": "cache bytes after each chunk", "xlabel": "latent frame", "ylabel": "MiB", "series": sizes},
    ], title=f"LingBot-World 2.0 (tiny), {frames} latent frames: the release stops at {RELEASE_CAP}")


def verdict_line(report: dict) -> str:
    """The bench's result in one line."""
    v = report["verdict"]
    parts = []
    for name, m in report["modes"].items():
        parts.append(f"{name} every chunk from frame {m['from_frame']} within {m['max_deviation'] * 100:.1f} % of its "
                     f"median relative cost ({'flat' if v[name]['flat_time'] else 'NOT flat'}), cache "
                     f"{m['live_bytes_max'] / 2**20:.2f} MiB {'flat' if v[name]['flat_bytes'] else 'NOT flat'}")
    prefix = ("equal" if v["first_1024_frames_equal_a_1024_frame_rollout"] else "NOT equal")
    past = "past" if v["past_the_cap"] else "NOT past"
    return (f"lingbot-cap {'PASSED' if v['passed'] else 'FAILED'}: {report['frames']} latent frames ({past} the "
            f"release's cap of {report['release_cap_frames']}); " + "; ".join(parts)
            + f"; first {report['prefix_frames']} frames {prefix} to the {report['prefix_frames']}-frame rollout "
              f"that {report['parity_test']} holds to the release")


def print_lingbot_cap(report: dict) -> None:
    print(f"\n{report['frames']} latent frames, {report['rounds']} rounds of both rollouts in turn beside a fixed "
          f"reference chunk (median {report['reference_cpu_seconds_median'] * 1000:.1f} ms), from frame "
          f"{report['from_frame']}:")
    for name, m in report["modes"].items():
        raw = m["cpu_seconds"]
        print(f"{name:10s} relative cost median {m['median_relative_cost']:.3f}, largest deviation "
              f"{m['max_deviation'] * 100:5.1f} %, last 100 / first 100 {m['last_100_over_first_100']:.3f}; "
              f"raw CPU median {raw['median'] * 1000:.1f} ms, largest deviation {raw['max_deviation'] * 100:.1f} %; "
              f"cache {m['live_bytes_max'] / 2**20:.2f} MiB")
    print(verdict_line(report))
