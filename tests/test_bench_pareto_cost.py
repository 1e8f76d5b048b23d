"""``fastar bench pareto`` and ``fastar bench cost-model``: figures written, and the FLOP count by hand."""

import json

import pytest

from comfyui_fastar.tools.bench.cost_model import (
    WAN_1_3B,
    CacheCost,
    ModelShape,
    cost_table,
    modelled_speedup,
    rollout_flops,
)
from comfyui_fastar.tools.cli import main


def test_rollout_flops_match_a_count_by_hand():
    s = ModelShape("toy", dim=2, heads=1, layers=1, ffn=4, tokens_per_frame=1, text_tokens=1, frames_per_block=1,
                   steps=1)
    # chunk 0 (nothing cached): projections 48 + FFN 32 + cross 8 + self 8 = 96, twice (step and clean pass);
    # chunk 1 (one frame cached, the last chunk: no clean pass): 48 + 32 + 8 + self 16 = 104.
    assert rollout_flops(s, 2)["total"] == 2 * 96 + 104
    assert rollout_flops(s, 2, CacheCost.bounded(0))["total"] == 2 * 96 + 96
    assert modelled_speedup(s, 2, CacheCost.bounded(0)) == pytest.approx(296 / 288)
    # TempCache's matching: chunk 1's clean pass matches against chunk 0's key (frames 3, no sink).
    matching = rollout_flops(s, 3, CacheCost.bounded(5, tempcache=True, sink_frames=0))["parts"]["tempcache_matching"]
    assert matching == 4


def test_bounded_caches_gain_more_the_longer_the_video():
    rows = cost_table(WAN_1_3B, [21, 241, 751])
    limits = [r["speedup_limit"] for r in rows]
    capped = [r["speedup_window_21"] for r in rows]
    assert limits == sorted(limits) and capped == sorted(capped)
    assert capped[0] == pytest.approx(1.0)  # 21 frames fit the 21-frame cache: nothing saved
    assert all(c < lim for c, lim in zip(capped, limits))
    assert rows[-1]["dense_global_shares"]["self_attention"] > 0.9


def test_bench_pareto_and_cost_model_write_json_and_plots(tmp_path, capsys):
    out = tmp_path / "pareto"
    assert main(["bench", "pareto", "--frames", "9", "--capacities", "6", "--thresholds", "0.9",
                 "--variants", "when-full", "--out", str(out)]) == 0
    report = json.loads((out / "pareto.json").read_text())
    assert set(report["points"]) == {"dense-global", "dense-window@6", "tempcache-0.9@6", "tempcache-when-full@6"}
    for name, p in report["points"].items():
        assert p["seconds_per_chunk"] > 0 and p["modelled_speedup"] > 0, name
        assert (p["psnr_db"] is None) == (name == "dense-global")
    assert "merging" in report["points"]["tempcache-0.9@6"]
    assert (out / "pareto.png").stat().st_size > 1000
    assert main(["bench", "pareto", "--frames", "9", "--variants", "sideways", "--out", str(out)]) == 2
    assert main(["bench", "cost-model", "--out", str(tmp_path / "cost")]) == 0
    cost = json.loads((tmp_path / "cost" / "cost_model.json").read_text())
    assert {"Wan2.1-1.3B 480x832", "Wan2.1-14B 480x832"} <= set(cost["models"])
    parallel = cost["sequence_parallel"]["models"]
    assert {"Wan2.1-1.3B 480x832", "Wan2.2-TI2V-5B 704x1280", "Wan2.1-14B 480x832"} == set(parallel)
    # 12 heads split over 2 and 4 ranks, not 8; each rank holds half, then a quarter, of the cache
    rows = {r["ranks"]: r for r in parallel["Wan2.1-1.3B 480x832"]["rows"]}
    assert not rows[8]["fits"] and rows[1]["all_to_all_gib_per_chunk_per_rank"] == 0
    assert rows[2]["kv_gib_per_rank_dense_global"] * 2 == pytest.approx(rows[1]["kv_gib_per_rank_dense_global"], 1e-3)
    assert (tmp_path / "cost" / "cost_model.png").stat().st_size > 1000
    assert "Wan2.1-14B" in capsys.readouterr().out
