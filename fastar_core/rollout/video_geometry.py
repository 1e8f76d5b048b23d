"""The Wan VAEs' arithmetic in one place: pixels <-> latents, video frames <-> latent frames.

Both VAEs compress 4x in time (4k+1 video frames become k+1 latent frames: the first frame alone, then groups of
four). Wan2.1's compresses 8x in space into 16 channels, Wan2.2's (TI2V-5B's) 16x into 48; with the DiT's 2x2
patches pixel sizes step by 16 and 32. The spatial functions take the stride (default Wan2.1's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FastARError

VAE_SPATIAL = 8
VAE_TEMPORAL = 4
PATCH = 2  # the DiT's spatial patch
PIXEL_STEP = VAE_SPATIAL * PATCH
LATENT_CHANNELS = 16
# latent channels -> pixels per latent row/column, for the two Wan VAEs
VAE_STRIDES = {16: 8, 48: 16}


def vae_stride(channels: int) -> int:
    """Pixels per latent row/column of the Wan VAE whose latents have ``channels`` channels."""
    if channels not in VAE_STRIDES:
        raise FastARError(f"a latent of {channels} channels is from no Wan VAE (Wan2.1: 16, Wan2.2: 48)")
    return VAE_STRIDES[channels]


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


@dataclass(frozen=True)
class VideoGeometry:
    """How a model's latents map to the video a person sees: pixels per latent row/column (``spatial``), video
    frames per latent frame after the first (``temporal``) and the DiT's spatial patch. A Wan VAE's by default;
    the demo world's latent is its video (``spatial`` and ``temporal`` 1, 4x4 patches)."""

    spatial: int = VAE_SPATIAL
    temporal: int = VAE_TEMPORAL
    patch: int = PATCH

    def video_frames(self, latent_frames: int) -> int:
        return 1 + self.temporal * (latent_frames - 1) if latent_frames > 0 else 0

    def check_length(self, name: str, length: int) -> int:
        """Latent frames of a ``length``-frame video (every length where ``temporal`` is 1)."""
        if self.temporal == VAE_TEMPORAL:
            return check_video_frames(name, length)
        if length < 1 or (length - 1) % self.temporal:
            raise FastARError(f"{name} {length}: this model's videos have 1 + {self.temporal}k frames")
        return (length - 1) // self.temporal + 1

    def check_pixels(self, name: str, value: int) -> int:
        if self.patch == PATCH:
            return check_pixel_size(name, value, self.spatial)
        step = self.spatial * self.patch
        if value < step or value % step:
            raise FastARError(f"{name} {value} is not a multiple of {step} (this model's {self.patch}x{self.patch} "
                              "patches)")
        return value // self.spatial

    def pixels(self, latent: int) -> int:
        return latent * self.spatial


def latent_size(pixels: int, stride: int = VAE_SPATIAL) -> int:
    return pixels // stride


def pixel_size(latent: int, stride: int = VAE_SPATIAL) -> int:
    return latent * stride


def check_pixel_size(name: str, value: int, stride: int = VAE_SPATIAL) -> int:
    """The latent size of a ``value``-pixel side; sizes that are not multiples of stride x patch are refused."""
    step = stride * PATCH
    if value < step or value % step:
        lo = max(step, value // step * step)
        vae = "Wan2.1's 8x VAE" if stride == VAE_SPATIAL else f"the {stride}x VAE"
        raise FastARError(f"{name} {value} is not a multiple of {step} ({vae} and 2x2 patches); "
                          f"nearest valid: {lo} or {lo + step}")
    return latent_size(value, stride)
