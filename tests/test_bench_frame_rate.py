"""``fastar bench frame-rate``: each mode's rollouts whole, in alternating order, a chunk's cost its least CPU
time over the rounds, the final chunk (no clean pass) left out."""

import json

import pytest
import torch

from comfyui_fastar.tools.bench.frame_rate import chunk_costs, run_frame_rate_bench
from comfyui_fastar.tools.bench.report import frame_rate_steadiness


def test_a_chunks_cost_is_its_least_cpu_time_over_the_rounds():
    rounds = [[{"frame_start": 3, "frames": 3, "seconds": 0.2, "cpu_seconds": s}] for s in (0.12, 0.09, 0.30)]
    assert chunk_costs(rounds, min)[0]["cpu_seconds"] == 0.09
    assert chunk_costs(rounds, max)[0]["cpu_seconds"] == 0.30  # the statistic is the one asked for
    assert chunk_costs(rounds, min)[0]["cpu_seconds_each_round"] == [0.12, 0.09, 0.3]


def test_steadiness_sees_a_rate_that_falls_and_one_that_holds():
    flat = [{"frame_start": 60 + 3 * i, "frames": 3, "seconds": 0.1, "cpu_seconds": 0.1} for i in range(30)]
    falling = [dict(r, cpu_seconds=0.1 * (1 + i / 10)) for i, r in enumerate(flat)]
    assert frame_rate_steadiness(flat)["max_deviation"] == 0 and frame_rate_steadiness(flat)["within_10_percent"] == 1
    assert frame_rate_steadiness(falling)["trend_last_over_first"] < 0.5


def test_the_bench_writes_both_modes_every_rounds_times_and_a_plot(tmp_path):
    before = torch.get_num_threads()
    report = run_frame_rate_bench(tmp_path, frames=12, rounds=2, progress=False)
    assert torch.get_num_threads() == before  # the bench's one thread is given back
    saved = json.loads((tmp_path / "frame_rate.json").read_text())
    assert set(saved["modes"]) == {"dense-global", "fastar"} and saved["rounds"] == 2
    for mode in saved["modes"].values():
        starts = [r["frame_start"] for r in mode["chunks"]]
        assert starts == [3, 6, 9]  # 12 frames after the 3-frame start: 4 chunks, the final one left out
        for row in mode["chunks"]:
            each = row["cpu_seconds_each_round"]
            assert len(each) == 2 and row["cpu_seconds"] == pytest.approx(min(each), abs=1e-6)
        assert mode["frame_rate"] is None  # too few chunks from frame 60 on to judge
    assert report["verdict"] is None
    pytest.importorskip("matplotlib")
    assert (tmp_path / "frame_rate.png").stat().st_size > 0
