"""``fastar bench matcher`` on a short demo run: the quantized search shadows every exact match and agrees."""

from comfyui_fastar.tools.bench.matcher import run_matcher_bench


def test_matcher_bench_tallies_the_exact_matchers_every_match(tmp_path):
    report = run_matcher_bench(tmp_path, frames=27, progress=False)
    assert (tmp_path / "matcher.json").exists()
    for k in ("top4", "top16"):
        a = report["agreement"][k]
        # Every new non-sink key of the exact rollout was searched both ways (4 layers, 36 tokens a frame).
        assert a["keys"] > 0 and a["keys"] % 36 == 0 and a["exact_merges"] > 0
        # The bfloat16 search with exact rescoring may part from the exact search on a near-tie (a score within
        # float32 rounding of the threshold or of the runner-up), which a CPU's summation order decides.
        assert a["decision_agreement"] >= 0.999 and a["same_group_share"] >= 0.999, (k, a)
    modes = report["modes"]
    assert set(modes) == {"dense-global", "tempcache-exact", "tempcache-quantized-top4", "tempcache-quantized-top16"}
    assert modes["tempcache-exact"]["psnr_db_vs_exact"] is None  # identical to itself
    exact, top4 = modes["tempcache-exact"]["psnr_db_vs_dense"], modes["tempcache-quantized-top4"]["psnr_db_vs_dense"]
    if report["agreement"]["top4"]["decision_agreement"] == 1.0:
        assert top4 == exact  # the same decisions make the same video
    else:
        assert abs(top4 - exact) < 1.0, (top4, exact)
