"""Is a rolled-out demo video still the scene it started from? Measured per frame, with a pass/fail bar.

Three questions, each answerable from pixels and the scene's known clean background:

- **background**: PSNR against the clean background over the pixels sprites cannot explain. Per frame, the
  ``k`` worst pixels are dropped, ``k`` being 1.5x the sprite area of the start frames plus a margin (sprites
  and their anti-aliased edges); the rest must match the static background, clearly better than a flat frame of
  its mean colour would. Noise, a flat or smeared frame, or a background that has drifted score low; sprites
  anywhere on a clean background do not.
- **areas**: pixels near each palette colour, per frame. Every colour present at the start must keep a
  plausible area (within a factor of its start area in most frames; occlusion by another sprite is allowed for
  a minority of frames), and colours absent at the start must not grow into sprite-sized blobs.
- **motion**: each start colour's centroid must move: over sliding windows its trajectory must span a couple of
  pixels in most windows. A frozen frame fails; a bounce does not (the centroid still travels).

Thresholds (``Thresholds``) are set from reference videos (``python -m ...demo.evaluate`` prints them): real
rendered videos score far above them, and noise, flat or frozen videos far below; see the model card.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .world import PALETTE, palette_tensor

PSNR_CAP = 60.0  # a perfect match has infinite PSNR; cap it so curves and means stay finite


@dataclass(frozen=True)
class Thresholds:
    colour_tolerance: float = 0.7  # RGB distance (in [-1, 1] units) within which a pixel counts as a palette colour
    background_psnr_db: float = 24.0  # per-frame trimmed background PSNR ...
    background_quantile: float = 0.05  # ... that this low quantile of frames must reach
    background_margin_db: float = 1.5  # and beat a flat frame of the background's mean colour by this much
    area_factor: float = 3.0  # a colour's area stays within [start / f, start * f] ...
    area_min_fraction: float = 0.6  # ... in at least this fraction of frames (sprites pass over one another)
    spurious_area_fraction: float = 0.5  # new-colour pixels (95th percentile) <= this x the smallest start sprite
    motion_window: int = 12  # frames per motion window
    motion_min_span_px: float = 1.5  # a window "moves" when the centroid's trajectory spans this many pixels ...
    motion_min_fraction: float = 0.6  # ... and this fraction of windows must move, for every start colour
    trim_factor: float = 1.5  # background pixels dropped per frame: factor x start sprite area ...
    trim_margin_px: int = 16  # ... plus this many
    min_start_area_px: float = 5.0  # colours smaller than this in every start frame are not judged


def as_frames(video: torch.Tensor) -> torch.Tensor:
    """``[T, 3, H, W]`` float from that or a latent ``[1, 3, T, H, W]``."""
    if video.ndim == 5:
        if video.shape[0] != 1:
            raise ValueError(f"evaluate one video at a time, got a batch of {video.shape[0]}")
        video = video[0].transpose(0, 1)
    if video.ndim != 4 or video.shape[1] != 3:
        raise ValueError(f"expected frames [T, 3, H, W], got {list(video.shape)}")
    return video.float()


def colour_masks(frames: torch.Tensor, palette: torch.Tensor, tolerance: float) -> torch.Tensor:
    """``[T, K, H, W]`` bool: pixel is within ``tolerance`` of palette colour k (and nearest to it)."""
    # |f - p|^2 = |f|^2 - 2 f.p + |p|^2, without materialising [T, K, 3, H, W]
    dots = torch.einsum("tchw,kc->tkhw", frames, palette)
    sq = frames.square().sum(dim=1, keepdim=True) - 2 * dots + palette.square().sum(dim=1)[None, :, None, None]
    dist = sq.clamp_min(0).sqrt()
    nearest = dist.argmin(dim=1, keepdim=True)
    one_hot = torch.zeros_like(dist, dtype=torch.bool).scatter_(1, nearest, True)
    return one_hot & (dist < tolerance)


def trimmed_background_psnr(frames, background, drop_pixels: int) -> torch.Tensor:
    """Per-frame PSNR (peak-to-peak 2, i.e. [0, 1] scaled) over all but the ``drop_pixels`` worst pixels.
    ``background``: ``[3, H, W]`` (a still camera) or one per frame ``[T, 3, H, W]``."""
    reference = background if background.ndim == 4 else background[None]
    err = (frames.clamp(-1, 1) - reference).square().mean(dim=1).flatten(1)  # [T, H*W]
    keep = err.shape[1] - min(drop_pixels, err.shape[1] - 1)
    kept = err.sort(dim=1).values[:, :keep]
    mse = kept.mean(dim=1)
    return (10 * torch.log10(4.0 / mse.clamp_min(1e-12))).clamp(max=PSNR_CAP)


def centroid_tracks(masks: torch.Tensor) -> torch.Tensor:
    """``[T, K, 2]`` (x, y) centroids of each colour's pixels, NaN where a colour has none."""
    T, K, H, W = masks.shape
    m = masks.float()
    area = m.sum(dim=(2, 3))
    ys = torch.arange(H, dtype=torch.float32) + 0.5
    xs = torch.arange(W, dtype=torch.float32) + 0.5
    cx = (m.sum(dim=2) * xs).sum(dim=-1) / area
    cy = (m.sum(dim=3) * ys).sum(dim=-1) / area
    return torch.stack([cx, cy], dim=-1)  # 0/0 gives NaN where the area is 0


def window_spans(track: torch.Tensor, window: int) -> torch.Tensor:
    """Diagonal of the bounding box of a centroid track ``[T, 2]`` over each sliding window (NaN points are
    skipped; a window with fewer than two points spans 0)."""
    if track.shape[0] < window:
        return torch.zeros(0)
    w = track.unfold(0, window, 1)  # [n, 2, window]
    valid = ~torch.isnan(w).any(dim=1, keepdim=True)
    hi = torch.where(valid, w, float("-inf")).amax(dim=2)
    lo = torch.where(valid, w, float("inf")).amin(dim=2)
    span = (hi - lo).norm(dim=1)
    return torch.where(valid[:, 0].sum(dim=1) >= 2, span, torch.zeros_like(span))


def evaluate_rollout(frames, background, palette=None, start_frames: int = 3, reference_areas: dict | None = None,
                     thresholds: Thresholds | None = None) -> dict:
    """Per-frame curves and a pass/fail verdict for a rollout ``frames`` that began with ``start_frames``
    rendered frames. ``background``: the clean background ``[3, H, W]``, or one per frame ``[T, 3, H, W]`` for a
    panning camera (``Scene.backgrounds``). ``palette``: a ``{name: (r, g, b) in [0, 1]}`` dict or ``[K, 3]``
    tensor in [-1, 1].

    ``reference_areas``: ``{colour: pixels}`` of the scene's sprites when known (``Scene.sprite_areas``), so a
    sprite half hidden behind another at the start is judged by its real size and is no "new" colour later.
    By default each colour's largest area in the start frames."""
    th = thresholds or Thresholds()
    frames = as_frames(frames)
    background = background.float()
    if background.ndim == 4 and background.shape[0] != frames.shape[0]:
        raise ValueError(f"per-frame backgrounds cover {background.shape[0]} frames, the video {frames.shape[0]}")
    names, pal = _palette(palette)
    masks = colour_masks(frames, pal, th.colour_tolerance)
    areas = masks.sum(dim=(2, 3)).float()  # [T, K]
    # The largest start area: a sprite partly hidden behind another in one start frame is not judged by that.
    start_area = areas[:start_frames].max(dim=0).values
    if reference_areas is not None:
        start_area = torch.tensor([float(reference_areas.get(n, 0.0)) for n in names])
    present = start_area >= th.min_start_area_px
    expected = present if reference_areas is None else start_area > 0

    sprite_pixels = float(start_area[present].sum())
    drop = int(th.trim_factor * sprite_pixels) + th.trim_margin_px
    psnr = trimmed_background_psnr(frames, background, drop)
    if frames.shape[0] <= start_frames:
        raise ValueError(f"nothing to judge: {frames.shape[0]} frames, of which {start_frames} are the start")
    after = slice(start_frames, None)  # judge only what the model made
    psnr_low = float(torch.quantile(psnr[after], th.background_quantile))

    ratios = areas / start_area.clamp_min(1.0)
    in_range = (ratios >= 1 / th.area_factor) & (ratios <= th.area_factor)
    area_ok_fraction = in_range[after][:, present].float().mean(dim=0)
    smallest = float(start_area[present].min()) if present.any() else 1.0
    spurious = areas[:, ~expected].sum(dim=1)
    spurious_p95 = float(torch.quantile(spurious[after], 0.95))

    tracks = centroid_tracks(masks)
    motion = {}
    for k in torch.nonzero(present).flatten().tolist():
        spans = window_spans(tracks[start_frames:, k], th.motion_window)
        motion[names[k]] = float((spans >= th.motion_min_span_px).float().mean()) if len(spans) else 0.0

    per_frame = background if background.ndim == 4 else background[None]
    flat = per_frame.mean(dim=(-2, -1), keepdim=True).expand_as(per_frame)
    flat_psnr = float(trimmed_background_psnr(flat, per_frame, drop).median())
    background_bar = max(th.background_psnr_db, flat_psnr + th.background_margin_db)
    checks = {
        "background": bool(psnr_low >= background_bar),
        "areas": bool(present.any()) and bool((area_ok_fraction >= th.area_min_fraction).all()),
        "no_new_colours": spurious_p95 <= th.spurious_area_fraction * smallest,
        "motion": bool(motion) and all(v >= th.motion_min_fraction for v in motion.values()),
    }
    present_names = [names[k] for k in torch.nonzero(present).flatten().tolist()]
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "summary": {
            "frames": frames.shape[0],
            "background_psnr_low_quantile_db": round(psnr_low, 2),
            "background_psnr_mean_db": round(float(psnr[after].mean()), 2),
            "background_psnr_bar_db": round(background_bar, 2),
            "flat_frame_psnr_db": round(flat_psnr, 2),
            "area_in_range_fraction": {names[k]: round(float(area_ok_fraction[i]), 3)
                                       for i, k in enumerate(torch.nonzero(present).flatten().tolist())},
            "spurious_area_p95_px": round(spurious_p95, 1),
            "moving_window_fraction": {k: round(v, 3) for k, v in motion.items()},
        },
        "colours": present_names,
        "start_area_px": {names[k]: float(start_area[k]) for k in torch.nonzero(present).flatten().tolist()},
        "curves": {
            "background_psnr_db": psnr.tolist(),
            "area_px": {n: areas[:, names.index(n)].tolist() for n in present_names},
            "centroid_xy": {n: tracks[:, names.index(n)].tolist() for n in present_names},
        },
        "thresholds": asdict(th),
    }


def _palette(palette) -> tuple[list, torch.Tensor]:
    if palette is None:
        return list(PALETTE), palette_tensor()
    if isinstance(palette, dict):
        return list(palette), torch.tensor(list(palette.values()), dtype=torch.float32) * 2 - 1
    palette = torch.as_tensor(palette, dtype=torch.float32)
    return [f"colour{k}" for k in range(palette.shape[0])], palette
