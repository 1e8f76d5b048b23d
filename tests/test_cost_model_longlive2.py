"""The cost model's LongLive 2.0 figures (Wan2.2-TI2V-5B at 704x1280, 880 tokens per latent frame, chunks of 8, 4
UniPC steps, window 32 with sink 8) against a count by hand, and the rollout bench's LongLive 2.0 scenario at
reduced 5B shapes writing its JSON and plot."""

import json

import pytest

from comfyui_fastar.tools.bench.cost_model import LONGLIVE2_5B, longlive2_table
from comfyui_fastar.tools.cli import main

D, FFN, TEXT, LAYERS, P = 3072, 14336, 512, 30, 880  # width, FFN width, prompt keys, layers, tokens per frame
# A dense cache's token, every layer: K and V in bf16, three int64 positions and a float32 bias (310.1 MiB a frame)
KV_BYTES_PER_FRAME = LAYERS * P * (2 * D * 2 + 3 * 8 + 4)


def linear(n):
    """Per layer and pass: q, k, v, o and cross q, o projections, the FFN and cross-attention, for n queries."""
    return 12 * n * D * D + 4 * n * D * FFN + 4 * n * TEXT * D


def attention(n, m):
    return 4 * n * (m + n) * D


def test_longlive2_at_3001_frames_matches_a_hand_count():
    """3001 video frames = 751 latent frames = 93 chunks of 8 and one of 7. Each full chunk runs 4 steps and a
    clean pass, the last chunk no clean pass. Chunk k has 8k frames before it; the window attends to at most 24 of
    them (32 with the chunk), TempCache to as many and matches each clean pass's new keys against the 16 beside the
    8-frame sink."""
    [row] = longlive2_table(video_lengths=(3001,))
    assert row["latent_frames"] == 751 and LONGLIVE2_5B.tokens_per_frame == P
    n, n_last = 8 * P, 7 * P
    fixed = 93 * 5 * (linear(n) + attention(n, 0)) + 4 * (linear(n_last) + attention(n_last, 0))
    # cached frames attended, summed over the passes: sum over full chunks of 5 x frames, plus 4 x the last's
    window = 5 * (0 + 8 + 16 + 24 * 90) + 4 * 24
    dense = 5 * 8 * (92 * 93 // 2) + 4 * 744
    per_frame = 4 * n * P * D  # attention FLOPs of a full chunk's queries per cached frame
    per_frame_last = 4 * n_last * P * D
    hand = {
        "dense-window": LAYERS * (fixed + per_frame * (window - 4 * 24) + per_frame_last * 4 * 24),
        "dense-global": LAYERS * (fixed + per_frame * (dense - 4 * 744) + per_frame_last * 4 * 744),
    }
    matched = 8 + 16 * 90  # frames beside the sink matched at the clean passes of chunks 2..92
    hand["tempcache"] = hand["dense-window"] + LAYERS * 2 * n * (matched * P) * D
    for mode, flops in hand.items():
        assert row["flops"][mode] == pytest.approx(flops, rel=1e-5), mode
    assert row["speedup_vs_dense_global"]["dense-window"] == pytest.approx(hand["dense-global"] / hand["dense-window"],
                                                                           abs=1e-3)
    assert row["speedup_vs_longlive2_window"]["tempcache"] == pytest.approx(hand["dense-window"] / hand["tempcache"],
                                                                            abs=1e-4)
    # AnnCA's pad merge leaves the 128 real prompt tokens and one pad key of 512: cross-attention shrinks
    annca = hand["tempcache"] - LAYERS * (93 * 5 * 4 * n + 4 * 4 * n_last) * (TEXT - 129) * D
    assert row["flops"]["all"] == pytest.approx(annca, rel=1e-5)

    gib = 2**30
    assert row["cache_gib"]["dense-global"] == pytest.approx(751 * KV_BYTES_PER_FRAME / gib, abs=1e-3)
    assert row["cache_gib"]["dense-window"] == pytest.approx(24 * KV_BYTES_PER_FRAME / gib, abs=1e-3)
    # TempCache's slots: K and V (bf16) plus a count (int32), three int64 (position, last update, oldest) and a
    # float64 sum, per head and layer, for 24 frames of tokens and one trash slot
    slots = 24 * P + 1
    assert row["cache_gib"]["tempcache"] == pytest.approx(LAYERS * 24 * slots * (2 * 128 * 2 + 4 + 3 * 8 + 8) / gib,
                                                          abs=1e-3)


def test_longlive2_rollout_bench_runs_its_modes_at_reduced_5b_shapes(tmp_path, capsys):
    """``fastar bench rollout --scenario longlive2-5b``: 48 channels, chunks of 8, LongLive 2.0's window (32, sink
    8) as dense-window and TempCache at its 24 frames, modes in turns, JSON and plot written."""
    out = tmp_path / "bench"
    assert main(["bench", "rollout", "--scenario", "longlive2-5b", "--frames", "16", "--modes",
                 "dense-global,dense-window,tempcache", "--out", str(out)]) == 0
    report = json.loads((out / "rollout.json").read_text())
    assert (report["model"], report["frames_per_block"], report["capacity_frames"], report["sink_frames"]) == \
        ("longlive2-5b", 8, 24, 8)
    assert report["scenario"]["config"]["in_dim"] == 48 and report["scenario"]["tokens_per_frame"] == 160
    assert set(report["modes"]) == {"dense-global", "dense-window", "tempcache"}
    for mode in report["modes"].values():
        assert len(mode["chunks"]) == 2 and mode["summary"]["modelled_speedup"] > 0
    assert (out / "rollout.png").is_file()
    capsys.readouterr()
    assert main(["bench", "pareto", "--scenario", "longlive2-5b", "--out", str(tmp_path / "p")]) != 0
    assert "--scenario longlive2-5b is a rollout scenario" in capsys.readouterr().err
