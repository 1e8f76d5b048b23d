"""Decode a long video LATENT piece by piece, so neither the GPU nor RAM ever holds every pixel.

Wan2.1's VAE decoder is causal in time and carries a small feature cache (two frames per causal conv) from call
to call. Keeping that cache between pieces, and calling the decoder on exactly the same slices as ComfyUI's own
``WanVAE.decode`` does, makes the piecewise decode *identical* to one full decode (``WanCausalStream``). ComfyUI
has cut the latent two ways:

- before 0.18 (0.3.64 among them): latent frame 0, then one frame per call; the decoder returns a tensor;
- from 0.18 (0.27.0 among them): latent frame 0 alone, then pairs (1-2, 3-4, ...); the decoder returns a
  list of pixel chunks, and a pair decodes differently from its two frames one at a time.

Both start with frame 0 alone, so the stream decodes frame 0 first and reads the cut from what the decoder
returns (a list means pairs), never from a version number. A piece that ends inside a pair keeps its last frame
back for the next piece, so any ``frames_per_piece`` is exact.

Wan2.2's VAE (``wan/vae2_2.py``, TI2V-5B's 48-channel latents, 16x in space) decodes the same way on both
versions: frame 0 alone marked ``first_chunk``, then one frame per call, each call's pixels 2x2-patched into
channels until ComfyUI's ``unpatchify`` (per frame, so a piece is unpatched alone). ``WanCausalStream`` does that
too. For any other video VAE the fallback (``OverlapStream``) decodes each piece with a few earlier latent
frames as context and drops their pixels.

Latent frame 0 decodes to 1 video frame, every later latent frame to 4.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch

from ..fastar_core.rollout.video_geometry import VAE_SPATIAL, VAE_STRIDES

CONTEXT_FRAMES = 3  # latent frames of context per piece in the fallback


def pixel_frames(latent_frames: int) -> int:
    return 1 + 4 * (latent_frames - 1) if latent_frames > 0 else 0


def wan_vae_kind(vae) -> str | None:
    """"wan2.1" or "wan2.2" for ComfyUI's Wan VAEs (``comfy.ldm.wan.vae`` / ``vae2_2``), else None."""
    fsm = getattr(vae, "first_stage_model", None)
    if fsm is None or type(fsm).__name__ != "WanVAE" or not (hasattr(fsm, "decoder") and hasattr(fsm, "conv2")):
        return None
    module = type(fsm).__module__
    if module.endswith("wan.vae"):
        return "wan2.1"
    if module.endswith("wan.vae2_2") and callable(getattr(sys.modules.get(module), "unpatchify", None)):
        return "wan2.2"
    return None


def spatial_upscale(vae, latent_channels: int) -> int:
    """Pixels per latent row/column: what ComfyUI's VAE says (``upscale_ratio``), else the Wan VAE's of this many
    channels (8 for 16, 16 for 48), else Wan2.1's."""
    ratio = getattr(vae, "upscale_ratio", None)
    if isinstance(ratio, (tuple, list)) and isinstance(ratio[-1], int):
        return ratio[-1]
    if isinstance(ratio, int) and not isinstance(ratio, bool):
        return ratio
    return VAE_STRIDES.get(latent_channels, VAE_SPATIAL)


def decoder_cache_slots(fsm) -> int:
    """How many feature-cache entries the decoder uses: ComfyUI's own counter where the module has one."""
    module = sys.modules.get(type(fsm).__module__)
    for name in ("count_cache_layers", "count_conv3d"):
        counter = getattr(module, name, None)
        if callable(counter):
            return counter(fsm.decoder)
    return sum(1 for m in fsm.decoder.modules() if type(m).__name__ == "CausalConv3d")


class WanCausalStream:
    """Exact streaming decode through ComfyUI's Wan ``WanVAE`` internals (its decode loop, kept open): Wan2.1's
    VAE or Wan2.2's."""

    def __init__(self, vae):
        self.vae = vae
        self.fsm = vae.first_stage_model
        self.wan22 = wan_vae_kind(vae) == "wan2.2"
        self.feat_cache = [None] * decoder_cache_slots(self.fsm)
        self.started = False  # frame 0 decoded
        self.step = 1  # latent frames per decoder call after frame 0; 2 once the decoder shows it cuts in pairs
        self.pending = None  # latent frames (after conv2) waiting to complete a decoder call

    def _call(self, x: torch.Tensor, first: bool = False) -> list:
        extra = {"first_chunk": True} if self.wan22 and first else {}
        out = self.fsm.decoder(x, feat_cache=self.feat_cache, feat_idx=[0], **extra)
        if isinstance(out, (list, tuple)):  # the chunked decoder: WanVAE.decode feeds it pairs
            self.step = 2
            return list(out)
        return [out]

    def decode(self, z: torch.Tensor, final: bool = False) -> torch.Tensor | None:
        """Latent piece [B, C, n, h, w] (raw VAE space) -> pixels [B, 3, frames, H, W] in 0..1.

        Frames that complete no decoder call yet are held back (``final`` flushes them), so a piece may give
        fewer pixel frames than ``pixel_frames`` of its length (None for none) and the next one more."""
        vae = self.vae
        x = self.fsm.conv2(z.to(device=vae.device, dtype=vae.vae_dtype))
        if self.pending is not None:
            x, self.pending = torch.cat([self.pending, x], dim=2), None
        out, i, n = [], 0, x.shape[2]
        if not self.started and n:
            out += self._call(x[:, :, :1], first=True)
            self.started, i = True, 1
        while n - i >= self.step or (final and i < n):
            out += self._call(x[:, :, i:i + self.step])
            i += self.step
        if i < n:
            self.pending = x[:, :, i:]
        if not out:
            return None
        dtype = vae.vae_output_dtype() if hasattr(vae, "vae_output_dtype") else torch.float32
        pixels = torch.cat(out, dim=2)
        if self.wan22:  # the decoder's 12 channels per pixel pair back to 3 channels at full size
            pixels = sys.modules[type(self.fsm).__module__].unpatchify(pixels, patch_size=2)
        return vae.process_output(pixels.to(dtype))


class OverlapStream:
    """Any video VAE with ``decode(latent) -> [B, frames, H, W, 3]``: decode with context, keep the new frames."""

    def __init__(self, vae, latent: torch.Tensor, context: int = CONTEXT_FRAMES):
        self.vae = vae
        self.latent = latent
        self.context = context
        self.position = 0

    def decode(self, z: torch.Tensor, final: bool = False) -> torch.Tensor:
        start = self.position
        self.position += z.shape[2]
        first = max(0, start - self.context)
        frames = self.vae.decode(self.latent[:, :, first:self.position])
        if frames.ndim == 4:  # [frames, H, W, 3] for one video
            frames = frames[None]
        keep = pixel_frames(self.position) - pixel_frames(start)
        return frames[:, -keep:].movedim(-1, 1)  # [B, 3, keep, H, W]


def stream_pixels(vae, latent: torch.Tensor, piece: int, load=None) -> Iterator[torch.Tensor]:
    """Yield pixels [B, 3, frames, H, W] in 0..1, ``piece`` latent frames at a time (pieces with no finished
    frame are skipped)."""
    stream = WanCausalStream(vae) if wan_vae_kind(vae) is not None else OverlapStream(vae, latent)
    if load is not None:
        load(vae, latent[:, :, :piece + 1].shape)  # a held-back frame can make a call one frame longer
    total = latent.shape[2]
    for start in range(0, total, piece):
        pixels = stream.decode(latent[:, :, start:start + piece], final=start + piece >= total)
        if pixels is not None:
            yield pixels


def decode_pieces(vae, latent: torch.Tensor, piece: int, load=None) -> Iterator[torch.Tensor]:
    """Yield uint8 frames [B, frames, H, W, 3] on the CPU, ``piece`` latent frames at a time."""
    for pixels in stream_pixels(vae, latent, piece, load):
        yield (pixels.clamp(0, 1).movedim(1, -1) * 255).round().to(device="cpu", dtype=torch.uint8)
