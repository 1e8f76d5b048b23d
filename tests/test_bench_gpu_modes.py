"""`fastar bench gpu-modes` as a CPU dry run: every mode eager and with captured steps (captures only happen on
CUDA), in turn, a 3,000-frame extrapolation and the cost model beside it."""

import json

from comfyui_fastar.tools.bench.gpu_modes import extrapolate, run_gpu_modes


def test_dry_run_on_a_cpu(tmp_path):
    report = run_gpu_modes(tmp_path, budget_s=600, chunks=3, device="cpu", layers=1, latent_hw=(8, 8),
                           modes=("dense-global", "tempcache"))
    saved = json.loads((tmp_path / "gpu_modes.json").read_text())
    assert set(saved["modes"]) == {"dense-global", "dense-global +graphs", "tempcache", "tempcache +graphs"}
    for mode in saved["modes"].values():
        assert mode["status"] == "done" and len(mode["chunks"]) == 3 and mode["video_seconds"] > 0
    assert saved["modes"]["tempcache"]["graphs_max_diff"] == 0.0  # no capture on a CPU: the same eager passes
    assert report["cost_model_speedup_at_video"]["tempcache"] > 1


def test_the_extrapolation_of_a_growing_and_a_bounded_cache():
    rows = [{"frame_start": f, "ms": 10.0 + f} for f in (24, 27, 30, 33)]
    # A growing cache: the line through its chunks (the first left out), summed over the chunks to frame 36.
    assert abs(extrapolate(rows, 3, 36, 24, grows=True) - sum(10.0 + f for f in range(24, 36, 3)) / 1e3) < 1e-9
    assert abs(extrapolate(rows, 3, 36, 24, grows=False) - 4 * 40.0 / 1e3) < 1e-9  # the median, 40 ms
