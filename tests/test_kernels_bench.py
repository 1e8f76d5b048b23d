"""The GPU bench: without CUDA it stops at once with a clear message; its density plan hits the targets."""

import pytest

from comfyui_fastar.kernels import bench


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
