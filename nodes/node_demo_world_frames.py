"""Demo World Frames: the demo world's latent as IMAGE frames (its latent is the RGB video itself, no VAE)."""

from __future__ import annotations

import torch

from ..fastar_core.errors import FastARError
from .constants import CATEGORY
from .inputs import int_input, link


class DemoWorldFrames:
    DESCRIPTION = ("Turns the demo world's LATENT (from Live World or the Long Video Sampler) into IMAGE frames for "
                   "Create Video or Preview Image: its latent is the video itself, 24x24 pixels in [-1, 1], so no "
                   "VAE is involved. 'scale' enlarges each pixel into a square block.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "latent": link("LATENT", "The demo world's latent: [1, 3, frames, 24, 24]."),
            "scale": int_input(8, 1, 32, "Output pixels per world pixel (nearest neighbour): 8 gives 192x192."),
        }}

    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    OUTPUT_TOOLTIPS = ("The frames, [frames, height, width, 3] in [0, 1].",)
    FUNCTION = "frames"
    CATEGORY = CATEGORY

    def frames(self, latent, scale=8):
        samples = latent.get("samples") if isinstance(latent, dict) else None
        if not torch.is_tensor(samples) or samples.ndim != 5 or samples.shape[1] != 3:
            shape = list(samples.shape) if torch.is_tensor(samples) else type(samples).__name__
            raise FastARError(f"'latent' is {shape}; the demo world's latent is [batch, 3, frames, height, width] (a "
                              "Wan latent has 16 or 48 channels: decode it with VAE Decode)")
        video = samples[0].float().permute(1, 2, 3, 0)  # [frames, h, w, 3]
        video = video.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
        return (((video.clamp(-1, 1) + 1) / 2).contiguous(),)
