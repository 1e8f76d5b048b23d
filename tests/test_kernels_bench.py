"""The GPU bench: without CUDA it stops at once with a clear message; its density plan hits the targets."""

import pytest

from comfyui_fastar.tools.bench import kernels as bench


def test_bench_without_cuda_exits_with_a_clear_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "kernels.json").exists()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.run_kernel_bench(tmp_path, device="cuda")


@pytest.mark.parametrize("density", bench.DENSITIES)
def test_bucket_plan_gives_the_target_density(density):
    n_dense, buckets = bench._bucket_plan(density, bench.N_QUERIES, bench.KEY_COUNTS[-1])
    n_keys = bench.KEY_COUNTS[-1]
    expected = (n_dense + (n_keys - n_dense) / buckets) / n_keys
    assert abs(expected - density) < 0.07
    assert n_dense in (0, bench.N_QUERIES)


def test_bench_dry_run_on_cpu_with_tiny_shapes(tmp_path, monkeypatch):
    """The whole measurement flow (conventions, dense, sparse, LSH, compiling backends, targets, JSON) on CPU."""
    import json

    tiny = {"HEADS": 2, "N_QUERIES": 100, "KEY_COUNTS": (160,), "DENSITIES": (0.2, 1.0), "HEAD_DIM": 64, "WARMUP": 1,
            "REPS": 1}
    for name, value in tiny.items():
        monkeypatch.setattr(bench, name, value)
    report = bench.measure_all(tmp_path, bench.Budget(600), bench.torch.device("cpu"))
    saved = json.loads((tmp_path / "kernels.json").read_text())
    assert saved["targets"] == report["targets"]
    rows = saved["conventions"] + saved["dense"] + saved["sparse"] + saved["lsh"]
    assert not [r for r in rows if "error" in r]
    assert {r["backend"] for r in saved["dense"]} == {"triton", "torch", "flex"}
    assert {r["backend"] for r in saved["sparse"]} == {"triton", "torch", "flex"}
    assert len([r for r in saved["sparse"] if r["backend"] == "triton"]) == len(bench.DENSITIES)
    assert all(r["max_abs_err"] < 3e-2 for r in saved["dense"] + saved["sparse"])
    assert all(r["dense_blind_head_is_zero"] and r["sparse_blind_head_is_zero"] for r in saved["conventions"])
    assert saved["lsh"][0]["mismatch_fraction"] < 1e-3
