"""``fastar bench matcher`` on a short demo run: the quantized search shadows every exact match and agrees."""

from comfyui_fastar.tools.bench.matcher import run_matcher_bench


def test_matcher_bench_tallies_the_exact_matchers_every_match(tmp_path):
    report = run_matcher_bench(tmp_path, frames=27, progress=False)
    assert (tmp_path / "matcher.json").exists()
    shares = []
    for k in ("top4", "top8", "top16"):
        a = report["agreement"][k]
        # Every new non-sink key of the exact rollout was searched both ways (4 layers, 36 tokens a frame).
        assert a["keys"] > 0 and a["keys"] % 36 == 0 and a["exact_merges"] > 0
        # The bfloat16 search rescoring its k best candidates may part from the exact search on a near-tie (a
        # score within rounding of the threshold): the decisions to merge agree all but never.
        assert a["decision_agreement"] >= 0.999, (k, a)
        # Where more groups than k lie close to the best (the demo's 16-dim heads make many near-equal keys), it
        # takes one of its candidates: as good as the best within NEAR_BEST, or, rarely, a little worse.
        assert a["same_group_share"] <= a["near_best_share"], (k, a)
        shares.append(a["near_best_share"])
    # More candidates rescored, more often a group as good as the best (16 all but always).
    assert shares == sorted(shares) and shares[-1] >= 0.99, shares
    modes = report["modes"]
    assert set(modes) == {"dense-global", "tempcache-exact", *(f"tempcache-quantized-top{k}" for k in (4, 8, 16))}
    assert modes["tempcache-exact"]["psnr_db_vs_exact"] is None  # identical to itself
    exact, top4 = modes["tempcache-exact"]["psnr_db_vs_dense"], modes["tempcache-quantized-top4"]["psnr_db_vs_dense"]
    assert abs(top4 - exact) < 1.0, (top4, exact)  # near-equal groups picked: a video close to the exact one
