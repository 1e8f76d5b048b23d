"""What a rollout is conditioned on, for every model family: text, image latents, CLIP-vision features, actions.

Wan2.1 text-to-video reads the prompts only. Image-conditioned families join latent channels to the noisy input
of every frame (``concat``: Matrix-Game 2.0's 4-channel first-frame mask and the start image's 16-channel VAE
latent, ``[B, C, T, h, w]`` over the whole rollout) and take their cross-attention context from CLIP-vision
tokens (``clip``: ``[B, 257, 1280]``). World models add the player's ``actions`` (Matrix-Game 2.0, the demo world,
which also takes the camera's start ``place``) or a ``camera`` path (LingBot-World 2.0: a relative motion per latent
frame, whose rays a pass makes for its own frames). A family says which of these it needs
(``ModelFamily.check_rollout``) and reads them per pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import FastARError
from .actions import Actions
from .prompts import PromptSchedule


@dataclass
class Conditioning:
    prompts: PromptSchedule | None = None  # text (Wan2.1 T2V/I2V, Wan2.2)
    concat: torch.Tensor | None = None  # [B, C, T, h, w] channels joined to the noisy latent, frame by frame
    clip: torch.Tensor | None = None  # [B, tokens, clip_dim] CLIP-vision features: the cross-attention context
    actions: Actions | None = None  # keyboard / mouse per pixel frame
    camera: object = None  # a family's camera path (LingBot-World 2.0: lingbot.camera.CameraConditioning)
    place: tuple | None = None  # the demo world's camera start on its map: (x, y) in patches

    @classmethod
    def coerce(cls, value) -> Conditioning:
        """A ``Conditioning`` as given, or one holding text prompts (what ``ARSampler.generate`` always took)."""
        if isinstance(value, Conditioning):
            return value
        return cls(prompts=PromptSchedule.coerce(value))

    def concat_frames(self, frame_start: int, frames: int) -> torch.Tensor:
        """The joined channels of latent frames ``frame_start ..`` (one clear error past their end)."""
        assert self.concat is not None
        have = self.concat.shape[2]
        if frame_start + frames > have:
            raise FastARError(f"the image conditioning covers {have} latent frames; the rollout reached frame "
                              f"{frame_start + frames - 1}: give it for every frame generated")
        return self.concat[:, :, frame_start:frame_start + frames]


MASK_CHANNELS = 4  # the first-frame mask: one channel per video frame a latent frame packs


def first_frame_conditioning(image_latent: torch.Tensor) -> torch.Tensor:
    """The channels an image-to-video model (Matrix-Game 2.0, LingBot-World 2.0) joins to its noisy latent,
    ``[B, 20, T, h, w]``: a 4-channel mask (1 on latent frame 0, 0 after), then the VAE latent of the start image
    followed by blank frames."""
    if image_latent.ndim != 5 or image_latent.shape[1] != 16:
        raise FastARError(f"the start image latent has shape {list(image_latent.shape)}; expected [batch, 16, "
                          "frames, height, width] (the VAE latent of the start image followed by black frames)")
    mask = torch.zeros_like(image_latent[:, :MASK_CHANNELS])
    mask[:, :, 0] = 1.0
    return torch.cat([mask, image_latent], dim=1)
