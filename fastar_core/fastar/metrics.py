"""How far an approximation is from the dense reference.

- attention density: executed query-key pairs over dense pairs;
- attention recall: share of the dense attention mass (softmax over all keys, with the cache bias) that falls on
  the keys a query actually visits, on sampled queries;
- attention-output relative error: ||approx - dense|| / ||dense|| on the same queries;
- video quality against the dense output for the same seed: PSNR pooled over every generated frame (the mean
  squared error over all of them first, then PSNR, so frames identical to the reference count as zero error and
  near-identical ones cannot inflate a mean of per-frame PSNRs), mean SSIM, and the per-frame curves for plots.
  ``VideoQuality.to_dict`` never writes an infinity: an identical video's PSNR is ``null`` with a reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def sample_queries(n: int, k: int, seed: int, device) -> torch.Tensor:
    """``k`` query indices out of ``n`` from a private generator (the global RNG is never touched)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[: min(k, n)].to(device)


def dense_probabilities(q, k, bias=None, scale=None) -> torch.Tensor:
    """Softmax attention weights ``[B, H, n, Nk]`` (fp32) for a few queries; rows that see nothing are 0."""
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.float().unsqueeze(-2)
    return torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)


def attention_recall(probs: torch.Tensor, visible: torch.Tensor) -> float:
    """Mean over queries of the dense mass on visible keys; ``visible`` broadcasts to ``probs``."""
    return float((probs * visible).sum(-1).mean())


def relative_error(approx: torch.Tensor, reference: torch.Tensor) -> float:
    return float((approx.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-12))


def psnr(x: torch.Tensor, ref: torch.Tensor, data_range: float | None = None) -> float:
    """Peak signal-to-noise ratio in dB; ``data_range`` defaults to the reference's value range."""
    x, ref = x.float(), ref.float()
    if data_range is None:
        data_range = float(ref.max() - ref.min()) or 1.0
    mse = float(((x - ref) ** 2).mean())
    if mse == 0.0:
        return float("inf")
    return 10.0 * math.log10(data_range**2 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5, device=None) -> torch.Tensor:
    g = torch.exp(-((torch.arange(size, device=device) - size // 2) ** 2).float() / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(x: torch.Tensor, ref: torch.Tensor, data_range: float | None = None) -> float:
    """Mean SSIM (Gaussian window 11, sigma 1.5) over images ``[N, C, H, W]`` (channels averaged)."""
    x, ref = x.float(), ref.float()
    if data_range is None:
        data_range = float(ref.max() - ref.min()) or 1.0
    n, c, h, w = x.shape
    size = min(11, h, w)
    size -= 1 - size % 2  # an odd window that fits the image
    win = _gaussian_window(size, 1.5, x.device)
    xs, rs = x.reshape(n * c, 1, h, w), ref.reshape(n * c, 1, h, w)

    def blur(t):
        return F.conv2d(t, win)

    mu_x, mu_r = blur(xs), blur(rs)
    var_x = blur(xs * xs) - mu_x**2
    var_r = blur(rs * rs) - mu_r**2
    cov = blur(xs * rs) - mu_x * mu_r
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_x * mu_r + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_r**2 + c1) * (var_x + var_r + c2))
    return float(s.mean())


def video_frames(latent_or_video: torch.Tensor) -> torch.Tensor:
    """``[B, C, T, H, W]`` -> ``[B*T, C, H, W]`` for per-frame image metrics."""
    b, c, t, h, w = latent_or_video.shape
    return latent_or_video.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def per_frame_psnr(x: torch.Tensor, ref: torch.Tensor, data_range: float | None = None) -> list[float]:
    if data_range is None:
        data_range = float(ref.max() - ref.min()) or 1.0
    return [psnr(x[:, :, t], ref[:, :, t], data_range) for t in range(x.shape[2])]


def per_frame_ssim(x: torch.Tensor, ref: torch.Tensor, data_range: float | None = None) -> list[float]:
    if data_range is None:
        data_range = float(ref.max() - ref.min()) or 1.0
    return [ssim(x[:, :, t], ref[:, :, t], data_range) for t in range(x.shape[2])]


IDENTICAL = "identical to the reference (mean squared error 0): PSNR is infinite"


def finite_or_none(x: float) -> float | None:
    """A figure fit for JSON: ``None`` for an infinite or NaN value."""
    return x if math.isfinite(x) else None


@dataclass
class VideoQuality:
    """One output video against the reference, over the generated frames only."""

    psnr_db: float  # pooled: 10 log10(range^2 / MSE over every generated frame); inf when identical
    ssim: float  # mean SSIM over every generated frame (identical frames count 1)
    mse: float
    frames: int
    data_range: float
    per_frame_psnr_db: list  # per-frame curve, for plots only (inf where a frame is identical)
    per_frame_ssim: list
    per_frame_mse: list

    def psnr_over_first(self, frames: int) -> float:
        """Pooled PSNR of the first ``frames`` generated frames: what a rollout of that length scores, since
        generation is causal and a frame never depends on later ones."""
        mse = sum(self.per_frame_mse[:frames]) / len(self.per_frame_mse[:frames])
        return 10.0 * math.log10(self.data_range**2 / mse) if mse > 0 else float("inf")

    def to_dict(self, curves: bool = True) -> dict:
        d = {"psnr_db": _round(finite_or_none(self.psnr_db), 3), "ssim": round(self.ssim, 4), "mse": self.mse,
             "frames": self.frames, "data_range": self.data_range}
        if not math.isfinite(self.psnr_db):
            d["psnr_note"] = IDENTICAL
        if curves:
            d["per_frame_psnr_db"] = [_round(finite_or_none(p), 3) for p in self.per_frame_psnr_db]
            d["per_frame_ssim"] = [round(s, 4) for s in self.per_frame_ssim]
        return d


def _round(x, n):
    return None if x is None else round(x, n)


def video_quality(x: torch.Tensor, ref: torch.Tensor, start_frames: int = 0,
                  data_range: float | None = None) -> VideoQuality:
    """``x`` against ``ref`` (``[B, C, T, H, W]``), frames ``start_frames:`` only (given start frames are not
    generated and would dilute the error). ``data_range`` defaults to the reference's value range."""
    x, ref = x[:, :, start_frames:].float().cpu(), ref[:, :, start_frames:].float().cpu()
    if x.shape != ref.shape or x.shape[2] == 0:
        raise ValueError(f"video_quality needs two videos of the same non-empty shape, got {list(x.shape)} and "
                         f"{list(ref.shape)}")
    if data_range is None:
        data_range = float(ref.max() - ref.min()) or 1.0
    frame_mse = ((x.double() - ref.double()) ** 2).transpose(0, 2).reshape(x.shape[2], -1).mean(-1).tolist()
    mse = sum(frame_mse) / len(frame_mse)
    pooled = 10.0 * math.log10(data_range**2 / mse) if mse > 0 else float("inf")
    frame_ssim = per_frame_ssim(x, ref, data_range)
    return VideoQuality(psnr_db=pooled, ssim=sum(frame_ssim) / len(frame_ssim), mse=mse, frames=x.shape[2],
                        data_range=data_range, per_frame_psnr_db=per_frame_psnr(x, ref, data_range),
                        per_frame_ssim=frame_ssim, per_frame_mse=frame_mse)
