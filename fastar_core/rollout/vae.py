"""The VAE in the loop: what a rollout asks of a video VAE when a family's own sampler decodes and re-encodes.

Two families put the VAE inside their loop, not after it:

- CausVid's long videos (``minimal_inference/longvideo_autoregressive_inference.py``) restart a fresh rollout every
  21 latent frames; the new one starts from the VAE re-encode of one decoded pixel frame followed by the last
  latent frames of the old one (``RestartSpec``);
- Krea Realtime with ``keep_first_frame`` off (its server's default) rebuilds its context from the VAE re-encode
  of the oldest context frame's last decoded pixel frame instead of the stored latent (``RecomputeCache``).

The engine never loads a VAE: the caller hands one in (``ARSampler.generate(vae=...)``; the nodes wrap ComfyUI's).

Layout and range, for both methods:

- latents ``[B, C, F, h, w]`` float, in the model's space (what the sampler generates: ComfyUI's
  ``latent_format.process_in`` of the VAE's raw latents, the references' ``(mu - mean) / std``);
- pixels ``[B, 3, T, H, W]`` float in ``[-1, 1]`` (the Wan VAE's own range; ComfyUI's IMAGE is 0..1), with
  ``T = 1 + 4 (F - 1)``: Wan2.1's VAE turns the first latent frame into one pixel frame and every later one into
  four, and encodes a clip of ``1 + 4k`` pixel frames into ``1 + k`` latent frames, the first pixel frame alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..errors import FastARError


@runtime_checkable
class VideoVAE(Protocol):
    """A video VAE as the rollout uses it (see the module docstring for layout and range)."""

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels ``[B, 3, 1 + 4k, H, W]`` in [-1, 1] -> latents ``[B, C, 1 + k, h, w]``, a clip of its own
        (the first pixel frame encoded alone, as a video's first frame)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, F, h, w]`` -> pixels ``[B, 3, 1 + 4 (F - 1), H, W]`` in [-1, 1], from a fresh state."""
        ...


class LatentStream(Protocol):
    """A causal decode kept open: each call decodes the next latent frames with the state the earlier ones left,
    so pieces decode exactly as the whole would (Wan2.1's decoder carries a feature cache in time)."""

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The next latent frames -> their pixel frames (1 for the stream's first latent frame, 4 per later one)."""
        ...


class RedecodeStream:
    """The stream of a VAE that offers only a whole decode: every call decodes from frame 0 again and returns the
    new pixel frames. Exact, and quadratic in the video's length; a VAE with ``stream()`` avoids it."""

    def __init__(self, vae: VideoVAE):
        self.vae = vae
        self.latents: torch.Tensor | None = None

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        done = 0 if self.latents is None else pixel_frames(self.latents.shape[2])
        self.latents = latents if self.latents is None else torch.cat([self.latents, latents], dim=2)
        return self.vae.decode(self.latents)[:, :, done:]


def open_stream(vae: VideoVAE) -> LatentStream:
    """A fresh causal decode: the VAE's own ``stream()`` when it has one, else re-decoding from frame 0."""
    stream = getattr(vae, "stream", None)
    return stream() if callable(stream) else RedecodeStream(vae)


def pixel_frames(latent_frames: int) -> int:
    return 1 + 4 * (latent_frames - 1) if latent_frames > 0 else 0


def check_vae(vae) -> VideoVAE:
    if not (callable(getattr(vae, "encode", None)) and callable(getattr(vae, "decode", None))):
        raise FastARError(f"the VAE given is a {type(vae).__name__}; it needs encode(pixels) and decode(latents) "
                          "(fastar_core.vae.VideoVAE)")
    return vae


def encode_frame(vae: VideoVAE, pixel: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One decoded pixel frame ``[B, 3, 1, H, W]`` re-encoded alone: one latent frame shaped and placed like
    ``like`` (``[B, C, 1, h, w]``), in float32."""
    latent = vae.encode(pixel)
    want = tuple(like.shape)
    if tuple(latent.shape) != want:
        raise FastARError(f"the VAE encoded one pixel frame {list(pixel.shape)} into {list(latent.shape)}; the "
                          f"rollout needs one latent frame {list(want)} (a Wan2.1 VAE for a Wan2.1 model)")
    return latent.to(device=like.device, dtype=torch.float32)


@dataclass(frozen=True)
class RestartSpec:
    """CausVid's long video: a rollout of ``every`` latent frames, then a fresh one (empty cache, positions from
    0) that starts from ``overlap`` clean frames: the VAE re-encode of the pixel frame just before the old
    rollout's last ``overlap - 1`` latent frames, then those latent frames; it denoises ``every - overlap`` new
    ones. Its script: 21 and 3 (``--num_overlap_frames``)."""

    every: int = 0  # 0: no restarts (one rollout that keeps its cache)
    overlap: int = 3

    @property
    def enabled(self) -> bool:
        return self.every > 0

    @property
    def new_frames(self) -> int:
        return self.every - self.overlap

    def validate(self, frames_per_block: int) -> None:
        if not self.enabled:
            return
        if self.every % frames_per_block or self.overlap % frames_per_block:
            raise FastARError(f"restart_every ({self.every}) and restart_overlap ({self.overlap}) must be multiples "
                              f"of frames_per_block ({frames_per_block}): each rollout is whole chunks, as CausVid's")
        if not 0 < self.overlap < self.every:
            raise FastARError(f"restart_overlap ({self.overlap}) must be at least 1 chunk and less than "
                              f"restart_every ({self.every})")

    def segment_start(self, frame: int) -> bool:
        """Whether output frame ``frame`` is the first new frame of a restarted rollout."""
        return self.enabled and frame >= self.every and (frame - self.every) % self.new_frames == 0

    def position(self, frame: int) -> int:
        """Output frame ``frame``'s position in its own rollout (the RoPE and cache position it runs at)."""
        if not self.enabled or frame < self.every:
            return frame
        return self.overlap + (frame - self.every) % self.new_frames


# CausVid's long-video script: rollouts of 21 latent frames (its cache), restarted from 3 (``--num_overlap_frames``)
CAUSVID_RESTART = RestartSpec(every=21, overlap=3)
