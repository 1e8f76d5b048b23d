"""Decode a long video LATENT piece by piece, so neither the GPU nor RAM ever holds every pixel.

Wan2.1's VAE decoder is causal in time and already decodes one latent frame at a time, carrying a small
feature cache (two frames per causal conv) from frame to frame. Keeping that cache between pieces makes the
piecewise decode *identical* to one full decode (``WanCausalStream``). For any other video VAE the fallback
(``OverlapStream``) decodes each piece with a few earlier latent frames as context and drops their pixels.

Latent frame 0 decodes to 1 video frame, every later latent frame to 4.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

CONTEXT_FRAMES = 3  # latent frames of context per piece in the fallback


def pixel_frames(latent_frames: int) -> int:
    return 1 + 4 * (latent_frames - 1) if latent_frames > 0 else 0


def is_wan21_vae(vae) -> bool:
    fsm = getattr(vae, "first_stage_model", None)
    return (fsm is not None and type(fsm).__name__ == "WanVAE" and type(fsm).__module__.endswith("wan.vae")
            and hasattr(fsm, "decoder") and hasattr(fsm, "conv2"))


class WanCausalStream:
    """Exact streaming decode through ComfyUI's Wan2.1 ``WanVAE`` internals (its decode loop, kept open)."""

    def __init__(self, vae):
        self.vae = vae
        self.fsm = vae.first_stage_model
        convs = sum(1 for m in self.fsm.decoder.modules() if type(m).__name__ == "CausalConv3d")
        self.feat_cache = [None] * convs

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Latent piece [B, 16, n, h, w] (raw VAE space) -> pixels [B, 3, frames, H, W] in 0..1."""
        vae = self.vae
        x = self.fsm.conv2(z.to(device=vae.device, dtype=vae.vae_dtype))
        out = [self.fsm.decoder(x[:, :, i:i + 1], feat_cache=self.feat_cache, feat_idx=[0]) for i in range(x.shape[2])]
        return vae.process_output(torch.cat(out, dim=2).float())


class OverlapStream:
    """Any video VAE with ``decode(latent) -> [B, frames, H, W, 3]``: decode with context, keep the new frames."""

    def __init__(self, vae, latent: torch.Tensor, context: int = CONTEXT_FRAMES):
        self.vae = vae
        self.latent = latent
        self.context = context
        self.position = 0

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        start = self.position
        self.position += z.shape[2]
        first = max(0, start - self.context)
        frames = self.vae.decode(self.latent[:, :, first:self.position])
        if frames.ndim == 4:  # [frames, H, W, 3] for one video
            frames = frames[None]
        keep = pixel_frames(self.position) - pixel_frames(start)
        return frames[:, -keep:].movedim(-1, 1)  # [B, 3, keep, H, W]


def decode_pieces(vae, latent: torch.Tensor, piece: int, load=None) -> Iterator[torch.Tensor]:
    """Yield uint8 frames [B, frames, H, W, 3] on the CPU, ``piece`` latent frames at a time."""
    stream = WanCausalStream(vae) if is_wan21_vae(vae) else OverlapStream(vae, latent)
    if load is not None:
        load(vae, latent[:, :, :piece].shape)
    for start in range(0, latent.shape[2], piece):
        pixels = stream.decode(latent[:, :, start:start + piece])  # [B, 3, f, H, W] in 0..1
        yield (pixels.clamp(0, 1).movedim(1, -1) * 255).round().to(device="cpu", dtype=torch.uint8)
