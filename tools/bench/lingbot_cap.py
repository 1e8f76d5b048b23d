"""``fastar bench lingbot-cap``: LingBot-World 2.0 past its release's 1,024-frame cap, at a flat cost per chunk.

The release rotates each key at its absolute latent frame from a RoPE table of 1,024 rows, so it cannot make latent
frame 1,024 (4,093 video frames, 4 min 16 s at 16 fps). The pack computes RoPE from integer positions (no table)
and keeps its caches bounded, so a rollout never runs out of positions and its cost does not grow.

This rolls the ``lingbot`` scenario's random model at reduced widths (2 heads of 128, 2 layers, 8x12 latents = 24
tokens per frame) for ``frames`` latent frames (default 3,000) in two modes: the release's own cache (a window of
18 frames with a 6-frame sink) and TempCache holding as many frames' worth (14, sink 6). The modes run one whole
rollout after the other, ``rounds`` times, their order alternating; a chunk's cost is its least CPU time over the
rounds (the process's CPU time since the chunk before, one torch thread: see ``frame_rate.py`` for why), and its
cache's live and allocated bytes are recorded after it.

The bar: from latent frame 300 on, every chunk's CPU time within 10 % of its mode's median and the cache's bytes
constant; and the window rollout's first 1,024 frames bit for bit those of a 1,024-frame rollout of the same model,
noise and camera, the rollout that ``tests/test_lingbot_parity.py::test_1024_frames_match_the_reference`` holds to
the release's own pipeline (a causal rollout's frames do not depend on how many come after them, given the same
camera input: the release divides every move by the longest of the whole path, so both runs take the 3,000-frame
path's). The final chunk (no clean pass) is left out of the timing.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from .frame_rate import chunk_costs
from .report import frame_rate_steadiness, line_plots, machine, write_json
from .rollout import run_mode
from .scenarios import lingbot_scenario, scenario_modes

FROM_FRAME = 300
FLAT_TOLERANCE = 0.10
RELEASE_CAP = 1024  # rows of the release's RoPE table: latent frames it can make
MODES = {"window": "dense-window", "tempcache": "tempcache"}  # this bench's names -> the rollout bench's modes
LATENT_HW = (8, 12)


def _rollout(scenario, mode, frames: int, seed: int, cond):
    """(result, per-chunk rows with ``cpu_seconds``)."""
    last = [time.process_time()]

    def on_chunk(row):
        now = time.process_time()
        row["cpu_seconds"] = now - last[0]
        last[0] = time.process_time()

    return run_mode(scenario, *mode, frames=frames, seed=seed, on_chunk=on_chunk, cond=cond)


def run_lingbot_cap_bench(out_dir, frames: int = 3000, rounds: int = 5, seed: int = 0, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scenario = lingbot_scenario(seed, "cpu", latent_hw=LATENT_HW)
        all_modes = scenario_modes(scenario)
        modes = {name: all_modes[key] for name, key in MODES.items()}
        # One camera for every run: the release divides every move by the longest of the whole path, so a path of
        # another length would give its first frames other rays.
        cond = scenario.conditioning(frames)
        run_mode(scenario, *modes["window"], frames=2 * scenario.frames_per_block, seed=seed, cond=cond)  # warm-up
        per_round: dict = {name: [] for name in modes}
        latents: dict = {}
        for r in range(rounds):
            for name in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                start = time.perf_counter()
                result, rows = _rollout(scenario, modes[name], frames, seed, cond)
                per_round[name].append(rows[:-1])
                latents.setdefault(name, result.latent)
                if progress:
                    print(f"round {r + 1}/{rounds}: {name} {frames} frames in {time.perf_counter() - start:6.1f} s",
                          flush=True)
        prefix_frames = min(RELEASE_CAP, frames)
        prefix, _ = run_mode(scenario, *modes["window"], frames=prefix_frames, seed=seed, cond=cond)
    finally:
        torch.set_num_threads(before)

    report_modes = {}
    for name in modes:
        best = chunk_costs(per_round[name], min)
        for row, timed in zip(best, per_round[name][0]):
            row["live_bytes"] = timed["cache_bytes"]
        late = [r for r in best if r["frame_start"] >= FROM_FRAME]
        median = statistics.median(r["cpu_seconds"] for r in late)
        worst = max(abs(r["cpu_seconds"] / median - 1) for r in late)
        live = {r["live_bytes"] for r in late}
        report_modes[name] = {
            "cache": modes[name][0].describe(), "chunks": best,
            "from_frame": FROM_FRAME, "median_cpu_seconds": round(median, 6), "max_deviation": round(worst, 4),
            "within_10_percent": round(sum(abs(r["cpu_seconds"] / median - 1) <= FLAT_TOLERANCE for r in late)
                                       / len(late), 4),
            "frame_rate": frame_rate_steadiness(best, FROM_FRAME),
            "live_bytes_from_frame": sorted(live), "live_bytes_max": max(r["live_bytes"] for r in best),
        }
    window = latents["window"]
    same = bool(torch.equal(window[:, :, :prefix_frames], prefix.latent))
    verdict = {name: {"flat_time": m["max_deviation"] <= FLAT_TOLERANCE,
                      "flat_bytes": len(m["live_bytes_from_frame"]) == 1} for name, m in report_modes.items()}
    verdict["past_the_cap"] = frames > RELEASE_CAP and bool(torch.isfinite(window).all())
    verdict["first_1024_frames_equal_a_1024_frame_rollout"] = same
    verdict["passed"] = all(v for m in verdict.values() for v in (m.values() if isinstance(m, dict) else [m]))
    report = {
        "benchmark": "lingbot-cap", "model": scenario.name, "latent_hw": list(LATENT_HW), "frames": frames,
        "rounds": rounds, "seed": seed, "torch_threads": 1, "frames_per_block": scenario.frames_per_block,
        "notes": scenario.notes, "machine": machine(), "release_cap_frames": RELEASE_CAP,
        "prefix_frames": prefix_frames, "modes": report_modes, "verdict": verdict,
        "definitions": {
            "cpu_seconds": "per chunk, the least of its CPU times over the rounds (the process's CPU time since the "
                           "chunk before); cpu_seconds_each_round keeps them all; the final chunk left out",
            "max_deviation": f"largest |cpu_seconds / median - 1| over the chunks from latent frame {FROM_FRAME}",
            "live_bytes_from_frame": f"the distinct cache sizes after every chunk from latent frame {FROM_FRAME}",
            "first_1024_frames_equal_a_1024_frame_rollout": "the window rollout's first frames, bit for bit, against "
                                                           "a rollout of that many frames (the parity test holds "
                                                           "that one to the release)",
        },
    }
    write_json(out_dir / "lingbot_cap.json", report)
    _plot(out_dir / "lingbot_cap.png", report_modes, frames)
    print_lingbot_cap(report)
    return report


def _plot(path, modes: dict, frames: int) -> None:
    times, sizes = {}, {}
    for name, m in modes.items():
        xs = [r["frame_start"] for r in m["chunks"]]
        times[name] = (xs, [r["cpu_seconds"] * 1000 for r in m["chunks"]])
        sizes[name] = (xs, [r["live_bytes"] / 2**20 for r in m["chunks"]])
        late = [x for x in xs if x >= FROM_FRAME]
        for label, k in (("+10 %", 1 + FLAT_TOLERANCE), ("-10 %", 1 - FLAT_TOLERANCE)):
            times[f"{name} median {label}"] = (late, [m["median_cpu_seconds"] * 1000 * k] * len(late))
    line_plots(path, [
        {"title": "CPU time per chunk (least over rounds)", "xlabel": "latent frame", "ylabel": "ms", "series": times},
        {"title": "cache bytes after each chunk", "xlabel": "latent frame", "ylabel": "MiB", "series": sizes},
    ], title=f"LingBot-World 2.0 (tiny), {frames} latent frames: the release stops at {RELEASE_CAP}")


def print_lingbot_cap(report: dict) -> None:
    print(f"\n{report['frames']} latent frames (the release stops at {report['release_cap_frames']}), "
          f"{report['rounds']} rounds, from frame {FROM_FRAME}:")
    for name, m in report["modes"].items():
        print(f"{name:10s} median {m['median_cpu_seconds'] * 1000:7.2f} ms/chunk, largest deviation "
              f"{m['max_deviation'] * 100:5.1f} %, cache {m['live_bytes_max'] / 2**20:.2f} MiB "
              f"({'flat' if len(m['live_bytes_from_frame']) == 1 else 'NOT flat'})")
    print(f"first {report['prefix_frames']} frames equal a {report['prefix_frames']}-frame rollout: "
          f"{report['verdict']['first_1024_frames_equal_a_1024_frame_rollout']}; verdict: "
          f"{'passed' if report['verdict']['passed'] else 'FAILED'}")
