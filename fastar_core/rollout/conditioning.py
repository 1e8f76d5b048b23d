"""What a rollout is conditioned on, for every model family: text, image latents, CLIP-vision features, actions.

Wan2.1 text-to-video reads the prompts only. Image-conditioned families join latent channels to the noisy input
of every frame (``concat``: Matrix-Game 2.0's 4-channel first-frame mask and the start image's 16-channel VAE
latent, ``[B, C, T, h, w]`` over the whole rollout) and take their cross-attention context from CLIP-vision
tokens (``clip``: ``[B, 257, 1280]``). World models add the player's ``actions`` (Matrix-Game 2.0) or a
``camera`` path (LingBot-World 2.0: a relative motion per latent frame, whose rays a pass makes for its own frames).
A family says which of these it needs (``ModelFamily.check_rollout``) and reads them per pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import FastARError
from ..memory import send_to_device
from .actions import Actions
from .prompts import PromptSchedule


@dataclass
class Conditioning:
    prompts: PromptSchedule | None = None  # text (Wan2.1 T2V/I2V, Wan2.2)
    concat: torch.Tensor | None = None  # [B, C, T, h, w] channels joined to the noisy latent, frame by frame
    # [T] which frame of ``concat`` each latent frame reads, when frames repeat (a start video whose frames stop
    # changing keeps each distinct frame once; ``concat`` is then [B, C, distinct, h, w]); None: frame t reads t
    concat_index: torch.Tensor | None = None
    clip: torch.Tensor | None = None  # [B, tokens, clip_dim] CLIP-vision features: the cross-attention context
    actions: Actions | None = None  # keyboard / mouse per pixel frame
    camera: object = None  # a family's camera path (LingBot-World 2.0: lingbot.camera.CameraConditioning)

    @classmethod
    def coerce(cls, value) -> Conditioning:
        """A ``Conditioning`` as given, or one holding text prompts (what ``ARSampler.generate`` always took)."""
        if isinstance(value, Conditioning):
            return value
        return cls(prompts=PromptSchedule.coerce(value))

    @property
    def concat_length(self) -> int:
        """Latent frames the joined channels cover."""
        assert self.concat is not None
        return self.concat.shape[2] if self.concat_index is None else self.concat_index.shape[0]

    def concat_frames(self, frame_start: int, frames: int) -> torch.Tensor:
        """The joined channels of latent frames ``frame_start ..`` (one clear error past their end)."""
        assert self.concat is not None
        have = self.concat_length
        if frame_start + frames > have:
            raise FastARError(f"the image conditioning covers {have} latent frames; the rollout reached frame "
                              f"{frame_start + frames - 1}: give it for every frame generated")
        if self.concat_index is None:
            return self.concat[:, :, frame_start:frame_start + frames]
        index = self.concat_index[frame_start:frame_start + frames].to(self.concat.device)
        return self.concat.index_select(2, index)


class ChunkConcat:
    """The joined channels as a family's passes read them: a chunk's frames sent to the pass's device and dtype at
    the chunk's first pass and kept for its other passes, which read the same frames. One copy per chunk, not one
    per pass, that the host does not wait for (``send_to_device``); and a captured pass reads the kept tensor
    rather than capturing a copy from the host."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.value: torch.Tensor | None = None

    def __call__(self, cond: Conditioning, frame_start: int, like: torch.Tensor) -> torch.Tensor:
        """``[B, C, F, h, w]`` of frames ``frame_start ..`` for a pass whose latent ``like`` has F frames."""
        frames = like.shape[2]
        key = (id(cond), id(cond.concat), frame_start, frames, like.device, like.dtype)
        if key != self.key:
            self.value = send_to_device(cond.concat_frames(frame_start, frames), like.device, like.dtype)
            self.key = key
        assert self.value is not None
        return self.value


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


def check_first_frame_conditioning(cond: Conditioning, cfg) -> None:
    """Refuse joined channels that are not ``first_frame_conditioning``'s for the rollout ``cfg``: their shape, their
    frame index (frame 0 the start image's alone), their length and their values."""
    channels = MASK_CHANNELS + 16
    concat = cond.concat
    want = (cfg.batch, channels, cfg.latent_height, cfg.latent_width)
    if concat is None or concat.ndim != 5 or (concat.shape[0], concat.shape[1], *concat.shape[3:]) != want:
        got = "none" if concat is None else list(concat.shape)
        raise FastARError(f"the image conditioning has shape {got}; expected [{cfg.batch}, {channels}, frames, "
                          f"{cfg.latent_height}, {cfg.latent_width}] (the 4-channel first-frame mask, then the start "
                          "image's 16-channel latent)")
    index = cond.concat_index
    if index is not None and (index.ndim != 1 or index.dtype != torch.long or not index.numel()
                              or int(index[0]) != 0 or int(index.max()) >= concat.shape[2]
                              or (index.numel() > 1 and int(index[1:].min()) < 1)):
        raise FastARError(f"the image conditioning's frame index must be a 1-D long tensor that reads frame 0 (the "
                          f"start image) at frame 0 only and frames 1..{concat.shape[2] - 1} after it")
    if cond.concat_length < cfg.num_frames:
        raise FastARError(f"the image conditioning covers {cond.concat_length} latent frames; the rollout makes "
                          f"{cfg.num_frames}")
    if not concat.isfinite().all():
        raise FastARError("the image conditioning contains NaN or infinite values")
