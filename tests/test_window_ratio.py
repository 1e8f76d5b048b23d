"""TempCache's seconds per chunk over the window's: only chunks where both caches are full, per round and repeat."""

import pytest

from comfyui_fastar.tools.bench.interleave import median_rows
from comfyui_fastar.tools.bench.window_ratio import ratio_to_window, round_ratios


def rows(frames_and_seconds):
    """Two repeats of per-chunk rows: (frame_start, [wall per repeat], [cpu per repeat])."""
    runs = [[{"frame_start": f, "seconds": wall[r], "cpu_seconds": cpu[r]} for f, wall, cpu in frames_and_seconds]
            for r in range(2)]
    return median_rows(runs)


def test_ratio_counts_only_full_cache_chunks_and_pairs_chunks_of_one_round():
    # Frame 0 (cache not full) would dominate if it were counted: 10 s against 1 s.
    temp = rows([(0, [10.0, 10.0], [10.0, 10.0]), (3, [1.1, 2.2], [1.0, 2.0]), (6, [1.2, 2.4], [3.0, 1.0])])
    window = rows([(0, [1.0, 1.0], [1.0, 1.0]), (3, [1.0, 2.0], [1.0, 2.0]), (6, [1.0, 2.0], [2.0, 1.0])])
    out = ratio_to_window(temp, window, full_from=3)
    assert out["chunks"] == 2
    cpu = out["cpu"]
    # Per round: 1.0, 1.0 (frame 3); 1.5, 1.0 (frame 6). A burst of load on repeat 2 (everything twice as slow)
    # cancels within its rounds.
    assert cpu["rounds"] == 4 and cpu["round_min"] == 1.0 and cpu["round_max"] == 1.5
    assert cpu["round_median"] == 1.0
    assert cpu["per_repeat"] == [pytest.approx(4.0 / 3.0, abs=1e-4), 1.0]
    # Totals of the medians over repeats: (1.5 + 2.0) / (1.5 + 1.5)
    assert cpu["ratio_of_totals"] == pytest.approx(3.5 / 3.0, abs=1e-4)
    assert out["wall"]["round_median"] == pytest.approx(1.15) and out["wall"]["round_max"] == pytest.approx(1.2)
    xs, ys = round_ratios(temp, window)
    assert xs == [0, 3, 6] and ys == [10.0, 1.0, 1.25]


def test_no_full_chunk_gives_no_ratio():
    temp = rows([(0, [1.0, 1.0], [1.0, 1.0])])
    assert ratio_to_window(temp, temp, full_from=21) == {"chunks": 0, "full_from_frame": 21}
