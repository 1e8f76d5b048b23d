"""Wan2.1's VAE arithmetic in one place: pixels <-> latents, video frames <-> latent frames.

The VAE compresses 8x in space and 4x in time (4k+1 video frames become k+1 latent frames: the first frame
alone, then groups of four), and the DiT's 2x2 patches make pixel sizes step by 16.
"""

from __future__ import annotations

import math

from .errors import FastARError

VAE_SPATIAL = 8
VAE_TEMPORAL = 4
PIXEL_STEP = 16  # 8x VAE times the 2x2 patch
LATENT_CHANNELS = 16


def latent_frames(video_frames: int) -> int:
    """4k+1 video frames give k+1 latent frames."""
    return (video_frames - 1) // VAE_TEMPORAL + 1


def video_frames(latent_frames: int) -> int:
    """k+1 latent frames decode to 4k+1 video frames (0 for none)."""
    return 1 + VAE_TEMPORAL * (latent_frames - 1) if latent_frames > 0 else 0


def nearest_valid_video_frames(n: int) -> tuple[int, int]:
    lo = max(1, VAE_TEMPORAL * math.floor((n - 1) / VAE_TEMPORAL) + 1)
    return lo, lo + VAE_TEMPORAL


def check_video_frames(name: str, length: int) -> int:
    """Latent frames of a ``length``-frame video; other lengths are refused, naming the valid ones."""
    if length < 1 or (length - 1) % VAE_TEMPORAL:
        lo, hi = nearest_valid_video_frames(length)
        raise FastARError(f"{name} {length} is not a valid Wan video length (4k+1 frames: ..., 77, 81, 85, ...); "
                          f"nearest valid lengths: {lo} or {hi}")
    return latent_frames(length)


def latent_size(pixels: int) -> int:
    return pixels // VAE_SPATIAL


def pixel_size(latent: int) -> int:
    return latent * VAE_SPATIAL


def check_pixel_size(name: str, value: int) -> int:
    """The latent size of a ``value``-pixel side; sizes that are not multiples of 16 are refused."""
    if value < PIXEL_STEP or value % PIXEL_STEP:
        lo = max(PIXEL_STEP, value // PIXEL_STEP * PIXEL_STEP)
        raise FastARError(f"{name} {value} is not a multiple of {PIXEL_STEP} (Wan's 8x VAE and 2x2 patches); "
                          f"nearest valid: {lo} or {lo + PIXEL_STEP}")
    return latent_size(value)
