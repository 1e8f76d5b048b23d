"""The pooled quality metric on hand-made videos whose answer is known."""

import json
import math

import pytest
import torch

from comfyui_fastar.fastar_core.fastar.metrics import per_frame_psnr, video_quality
from comfyui_fastar.tools.bench.report import write_json


def video(frames=13, seed=0):
    return torch.rand(1, 3, frames, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_pooled_psnr_counts_identical_frames_as_zero_error_and_skips_start_frames():
    ref = video()
    x = ref.clone()
    x[:, :, :3] = 0.0  # the three start frames differ but are not generated: excluded
    x[:, :, 7] += 0.1  # one generated frame off by a known mean squared error, 0.01
    x[:, :, 9] += 1e-6  # a rounding-level difference: huge per-frame PSNR, no pooled weight
    q = video_quality(x, ref, start_frames=3, data_range=2.0)
    generated = 10
    mse = (0.1**2 + 1e-12) / generated
    assert q.frames == generated and q.mse == pytest.approx(mse, rel=1e-4)
    assert q.psnr_db == pytest.approx(10 * math.log10(4.0 / mse), abs=1e-3)  # 36.02 dB
    # The old figure, a mean of per-frame PSNRs over non-identical frames, is far from it (~76 dB).
    frames = per_frame_psnr(x[:, :, 3:], ref[:, :, 3:], data_range=2.0)
    old = sum(p for p in frames if math.isfinite(p)) / sum(math.isfinite(p) for p in frames)
    assert old - q.psnr_db > 30
    assert len(q.per_frame_psnr_db) == generated and q.per_frame_psnr_db[4] == pytest.approx(26.02, abs=0.01)
    assert 0.0 < q.ssim < 1.0
    assert q.psnr_over_first(4) == float("inf")  # generated frames 0-3 are identical
    assert q.psnr_over_first(5) == pytest.approx(10 * math.log10(4.0 / (0.01 / 5)), abs=1e-3)


def test_identical_video_has_no_infinity_in_json(tmp_path):
    ref = video()
    q = video_quality(ref.clone(), ref, start_frames=3)
    assert q.psnr_db == float("inf") and q.ssim == pytest.approx(1.0)
    d = q.to_dict()
    assert d["psnr_db"] is None and "identical" in d["psnr_note"]
    assert all(p is None for p in d["per_frame_psnr_db"])
    path = write_json(tmp_path / "q.json", {"quality": d})
    assert json.loads(path.read_text())["quality"]["psnr_db"] is None
    assert json.loads(write_json(tmp_path / "inf.json", {"psnr": float("inf")}).read_text())["psnr"] is None


def test_video_quality_refuses_mismatched_videos():
    with pytest.raises(ValueError, match="same non-empty shape"):
        video_quality(video(13), video(12))
    with pytest.raises(ValueError, match="same non-empty shape"):
        video_quality(video(3), video(3), start_frames=3)
