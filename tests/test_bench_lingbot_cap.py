"""``fastar bench lingbot-cap``: every round runs both rollouts chunk by chunk in turn beside a fixed reference, a
chunk's relative cost is its least over the rounds of its CPU time over the reference's (a median of its
neighbours), and the window rollout's first frames are checked against a rollout of that many frames."""

import json

import pytest
import torch

from comfyui_fastar.tools.bench.lingbot_cap import run_lingbot_cap_bench, verdict_line
from comfyui_fastar.tools.bench.steady import smoothed


def test_the_reference_is_each_rounds_median_of_its_neighbours():
    assert smoothed([1.0, 9.0, 1.0, 1.0, 5.0], reach=1) == [5.0, 1.0, 1.0, 1.0, 3.0]
    assert smoothed([2.0, 4.0, 6.0], reach=0) == [2.0, 4.0, 6.0]


def test_the_bench_writes_both_modes_every_rounds_costs_a_plot_and_one_verdict_line(tmp_path, capsys):
    before = torch.get_num_threads()
    report = run_lingbot_cap_bench(tmp_path, frames=20, rounds=2, progress=False)
    assert torch.get_num_threads() == before  # the bench's one thread is given back
    saved = json.loads((tmp_path / "lingbot_cap.json").read_text())
    assert set(saved["modes"]) == {"window", "tempcache"} and saved["rounds"] == 2 and saved["from_frame"] == 10
    for mode in saved["modes"].values():
        assert [r["frame_start"] for r in mode["chunks"]] == [0, 4, 8, 12]  # the final chunk left out
        for row in mode["chunks"]:
            each = row["relative_cost_each_round"]
            cpu, reference = row["cpu_seconds_each_round"], row["reference_cpu_seconds_each_round"]
            assert len(each) == len(cpu) == len(reference) == 2
            assert each == pytest.approx([c / r for c, r in zip(cpu, reference)], rel=1e-3)
            assert row["relative_cost"] == pytest.approx(min(each), abs=1e-5)
        assert len(mode["live_bytes_from_frame"]) == 1  # the window is full by frame 12: flat bytes
    verdict = saved["verdict"]
    assert verdict["first_1024_frames_equal_a_1024_frame_rollout"] and not verdict["past_the_cap"]
    assert not verdict["passed"]  # 20 frames are not past the release's cap, whatever the timings
    line = verdict_line(report)
    assert line.startswith("lingbot-cap FAILED: 20 latent frames (NOT past the release's cap of 1024)")
    assert line in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "lingbot_cap.png").stat().st_size > 0
