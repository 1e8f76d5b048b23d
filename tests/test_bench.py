"""``fastar bench rollout`` on a short run writes every figure, for every mode."""

import json

import pytest
import torch

from comfyui_fastar.tools.bench.cross_attention import cross_attention_rows
from comfyui_fastar.tools.cli import main

SUMMARY_FIELDS = {"speedup_vs_dense", "latency_growth", "cache_bytes_max", "cache_bytes_allocated", "psnr_db", "ssim",
                  "density_mean", "recall_mean", "seconds_total", "frame_rate"}


def test_bench_rollout_writes_every_field(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "rollout", "--frames", "51", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads((out / "rollout.json").read_text())
    assert (out / "rollout.png").stat().st_size > 1000
    assert set(report["modes"]) >= {"dense-global", "dense-window", "tempcache", "tempcache+annsa", "all"}
    for name, mode in report["modes"].items():
        assert SUMMARY_FIELDS <= set(mode["summary"]), name
        assert len(mode["chunks"]) == 17
        for chunk in mode["chunks"]:
            assert {"seconds", "cache_bytes", "rss_bytes"} <= set(chunk)
            rounds = chunk["seconds_each_round"]
            assert len(rounds) == 2 and abs(chunk["seconds"] - sum(rounds) / 2) < 1e-4  # median of two
        quality = mode["quality"]
        assert len(quality["per_frame_psnr_db"]) == len(quality["per_frame_ssim"]) == quality["frames"] == 51
        assert mode["summary"]["latency_growth"] > 0
    dense = report["modes"]["dense-global"]["summary"]
    assert dense["speedup_vs_dense"] == 1.0 and dense["psnr_db"] is None and "identical" in dense["psnr_note"]
    window = report["modes"]["dense-window"]["quality"]
    assert 10 < window["psnr_db"] < 80 and 0 < window["ssim"] < 1
    # Every TempCache mode against the window of its capacity, from the chunk at frame 21 on (both full).
    full = sum(c["frame_start"] >= report["capacity_frames"] for c in report["modes"]["dense-window"]["chunks"])
    assert report["capacity_frames"] == 21 and 0 < full < 17
    assert set(report["vs_window"]) >= {"tempcache", "tempcache-quantized", "all"}
    assert "dense-window" not in report["vs_window"] and "dense-global" not in report["vs_window"]
    for name, ratio in report["vs_window"].items():
        assert ratio == report["modes"][name]["summary"]["vs_window"] and ratio["chunks"] == full, name
        for clock in ("cpu", "wall"):
            r = ratio[clock]
            assert r["rounds"] == 2 * full and len(r["per_repeat"]) == 2, name
            assert 0 < r["round_min"] <= r["round_p10"] <= r["round_median"] <= r["round_p90"] <= r["round_max"]
    forced = report["modes"]["all+forced-annsa"]["summary"]
    assert 0 < forced["density_mean"] <= 1 and 0 < forced["recall_mean"] <= 1
    table = capsys.readouterr().out
    assert "speedup" in table and "all+forced-annsa" in table


def test_an_int8_cache_is_compared_with_its_float_twin(tmp_path):
    out = tmp_path / "int8"
    modes = "dense-global,dense-window,dense-window-int8"
    assert main(["bench", "rollout", "--frames", "30", "--modes", modes, "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads((out / "rollout.json").read_text())
    twin = report["modes"]["dense-window-int8"]["vs_float"]
    assert twin["mode"] == "dense-window" and 30 < twin["psnr_db"] < 120 and 0 < twin["ssim"] <= 1
    assert 0 < twin["latent_relative_error"] < 0.2  # rounded, not another video
    assert "vs_float" not in report["modes"]["dense-window"]


def test_bench_rollout_refuses_bad_modes_and_repeats(tmp_path, capsys):
    assert main(["bench", "rollout", "--frames", "6", "--modes", "dense-sparkle", "--out", str(tmp_path)]) == 2
    assert "dense-sparkle" in capsys.readouterr().err
    assert main(["bench", "rollout", "--frames", "6", "--repeats", "0", "--out", str(tmp_path)]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_cross_attention_rows_time_every_path_and_the_pad_merge_is_exact():
    q = torch.randn(1, 2, 3 * 16, 32, generator=torch.Generator().manual_seed(0))
    calls = []

    def timer(fn, *args):
        calls.append(fn)
        fn(*args)
        return 0.001

    rows = cross_attention_rows(q, tokens_per_frame=16, timer=timer, real_tokens=(8, 40))
    assert [r["real_tokens"] for r in rows] == [8, 40] and len(calls) == 6
    for row in rows:
        assert set(row["seconds"]) == {"padded", "pad_merge", "pad_merge+prune"}
        assert row["kept_share"]["pad_merge"] == pytest.approx((row["real_tokens"] + 1) / 512, abs=1e-4)
        assert row["kept_share"]["pad_merge+prune"] <= row["kept_share"]["pad_merge"] + 1e-6
        assert row["output_error_vs_padded"]["pad_merge"] < 1e-5


def test_fastar_demo_runs_both_modes_in_turn_and_reports_pooled_quality(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--world", "sprites", "--frames", "9", "--out", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    fastar = stats["modes"]["fastar"]
    assert len(fastar["chunks"]) == 3 and fastar["quality"]["frames"] == 9
    assert stats["modes"]["dense"]["quality"]["psnr_db"] is None  # dense against itself: no infinity in JSON
    assert stats["speedup"]["cpu_total"] > 0 and stats["speedup"]["wall_total"] > 0 and "in turn" in stats["timing"]
    # Each chunk's CPU time is its own: at most the wall time times the threads that can run it, never the
    # other mode's work done while this one waited for its turn.
    threads = torch.get_num_threads() + 1
    for mode in stats["modes"].values():
        assert all(0 < r["cpu_seconds"] <= r["seconds"] * threads + 0.05 for r in mode["chunks"])
    for name in ("fastar.gif", "dense.gif", "compare.gif", "demo.png"):
        assert (out / name).stat().st_size > 0
    assert "by CPU time" in capsys.readouterr().out


def test_frame_rate_steadiness_tells_a_flat_rate_from_a_falling_one():
    from comfyui_fastar.tools.bench.report import frame_rate_steadiness

    def rows(seconds_of):  # 3-frame chunks from frame 0 to 240
        return [{"frame_start": f, "frames": 3, "seconds": 9.0, "cpu_seconds": seconds_of(f)} for f in range(0, 240, 3)]

    flat = frame_rate_steadiness(rows(lambda f: 0.3 + 0.01 * (f % 2)))
    falling = frame_rate_steadiness(rows(lambda f: 0.1 + 0.002 * f))  # a growing cache: each chunk slower
    assert flat["chunks"] == 60 and flat["within_10_percent"] == 1.0 and flat["max_deviation"] < 0.04
    assert abs(flat["trend_last_over_first"] - 1) < 0.04
    assert falling["within_10_percent"] < 0.5 and falling["trend_last_over_first"] < 0.65
    assert flat["median_fps"] == pytest.approx(3 / 0.305, rel=0.04)  # CPU seconds, not the wall's 9 s
    assert frame_rate_steadiness(rows(lambda f: 0.3)[:30]) is None  # too few chunks past frame 60


def test_rotated_keys_bench_times_the_rotation_it_saves(tmp_path):
    """Rotating every chunk spends more of a chunk on RoPE than rotating once, the bench reports that share
    beside the drop it measured, and the two videos are the same up to rounding."""
    from comfyui_fastar.tools.bench.rotated_keys import run_rotated_keys_bench

    report = run_rotated_keys_bench(tmp_path, frames=18, model="demo")
    once, every = report["modes"]["rotated once"], report["modes"]["rotated every chunk"]
    assert len(once["rope_seconds_each_chunk"]) == len(every["seconds_each_chunk"]) == 6  # 18 frames, 3 a chunk
    assert every["late_chunks_mean_rope_seconds"] > once["late_chunks_mean_rope_seconds"] > 0
    assert 0 < report["rerotation_share"] < 1
    assert report["late_chunk_drop"] == pytest.approx(1 - report["late_chunk_ratio"], abs=1e-3)
    assert report["relative_difference_of_videos"] < 1e-5
    assert (tmp_path / "rotated_keys.json").is_file() and (tmp_path / "rotated_keys.png").is_file()
