"""``fastar bench live-world``: both modes played the way the Live World node plays, with the node's message per
chunk; FAST-AR timed beside a fixed reference, dense by its least CPU time over the rounds; the cache per chunk, a
plot."""

import json

import pytest
import torch

from comfyui_fastar.tools.bench.live_world import HOLDS, held_at, run_live_world_bench


def test_the_scripted_person_holds_each_key_for_its_frames_then_starts_again():
    cycle = sum(n for _, n in HOLDS)
    assert [held_at(t) for t in (0, 11, 12, 24, 36, cycle - 1, cycle)] == \
        [("D",), ("D",), ("S",), ("A",), ("W",), (), ("D",)]


def test_the_bench_writes_both_modes_with_every_rounds_times_and_a_plot(tmp_path):
    before = torch.get_num_threads()
    report = run_live_world_bench(tmp_path, frames=8, rounds=2, progress=False)
    assert torch.get_num_threads() == before
    saved = json.loads((tmp_path / "live_world.json").read_text())
    assert set(saved["modes"]) == {"fastar", "dense"} and saved["rounds"] == 2
    for mode in saved["modes"].values():
        assert [r["frame_start"] for r in mode["chunks"]] == list(range(1, 7))  # one frame a chunk, last left out
        assert all(len(r["cpu_seconds_each_round"]) == 2 for r in mode["chunks"])
        assert mode["frame_rate"] is None  # too few chunks from frame 60 on to judge
    # FAST-AR ran beside the reference: each chunk's cost over the reference's, and back in seconds at its median
    fast = saved["modes"]["fastar"]["chunks"]
    assert saved["reference_cpu_seconds_median"] > 0
    for row in fast:
        assert len(row["reference_cpu_seconds_each_round"]) == 2 and row["raw_cpu_seconds"] > 0
        assert row["relative_cost"] == pytest.approx(min(row["relative_cost_each_round"]), abs=1e-5)
        assert row["cpu_seconds"] == pytest.approx(row["relative_cost"] * saved["reference_cpu_seconds_median"],
                                                   rel=1e-3)
    # dense keeps every frame; FAST-AR's TempCache allocates its capacity up front and fills it
    dense = [r["cache_bytes"] for r in saved["modes"]["dense"]["chunks"]]
    assert dense == sorted(dense) and dense[-1] > dense[0]
    assert report["verdict"] is None
    pytest.importorskip("matplotlib")
    assert (tmp_path / "live_world.png").stat().st_size > 0
