"""``fastar bench rollout`` on a short run writes every figure, for every mode."""

import json

from comfyui_fastar.fastar_core.cli import main

SUMMARY_FIELDS = {"speedup_vs_dense", "latency_growth", "cache_bytes_max", "psnr_mean", "ssim_mean",
                  "density_mean", "recall_mean", "seconds_total"}


def test_bench_rollout_writes_every_field(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "rollout", "--frames", "51", "--out", str(out)]) == 0
    report = json.loads((out / "rollout.json").read_text())
    assert (out / "rollout.png").stat().st_size > 1000
    assert set(report["modes"]) >= {"dense-global", "dense-window", "tempcache", "tempcache+annsa", "all"}
    for name, mode in report["modes"].items():
        assert SUMMARY_FIELDS <= set(mode["summary"]), name
        assert len(mode["chunks"]) == 17
        for chunk in mode["chunks"]:
            assert {"seconds", "cache_bytes", "rss_bytes"} <= set(chunk)
        assert len(mode["psnr"]) == len(mode["ssim"]) == 51
        assert mode["summary"]["latency_growth"] > 0
    assert report["modes"]["dense-global"]["summary"]["speedup_vs_dense"] == 1.0
    forced = report["modes"]["all+forced-annsa"]["summary"]
    assert 0 < forced["density_mean"] <= 1 and 0 < forced["recall_mean"] <= 1
    table = capsys.readouterr().out
    assert "speedup" in table and "all+forced-annsa" in table
