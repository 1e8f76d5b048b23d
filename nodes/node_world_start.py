"""World Model Start: a Matrix-Game 2.0 rollout's start image, as its CLIP vision tokens and its VAE latent.

Matrix-Game 2.0 has no text: its cross-attention reads the start image's CLIP vision tokens (ViT-H's penultimate
layer, 257 tokens: ComfyUI's CLIP Vision Encode with crop 'none' gives them as ``penultimate_hidden_states``), and
beside every generated frame it reads the VAE latent of the start image followed by blank frames (its inference
encodes the image and ``4(T - 1)`` zero frames as one video, so frames after the first carry the image too, through
the causal VAE). This node encodes that video with the VAE it is given, the same encode ComfyUI's VAE Encode runs.
"""

from __future__ import annotations

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import check_pixel_size, check_video_frames
from .constants import (
    CATEGORY,
    CLIP_VISION_TOKENS,
    LATENT_CHANNELS,
    MAX_LENGTH,
    MAX_RESOLUTION,
    PIXEL_STEP,
    WORLD_HEIGHT,
    WORLD_START_KEY,
    WORLD_WIDTH,
)
from .host import get_host
from .inputs import int_input, link
from .node_long_sampler import LENGTH_TOOLTIP


def clip_tokens(clip_vision_output) -> torch.Tensor:
    """The penultimate hidden states of a CLIP_VISION_OUTPUT, [B, 257, width]."""
    tokens = getattr(clip_vision_output, "penultimate_hidden_states", None)
    if tokens is None and isinstance(clip_vision_output, dict):
        tokens = clip_vision_output.get("penultimate_hidden_states")
    if not torch.is_tensor(tokens):
        raise FastARError("clip_vision_output has no penultimate_hidden_states; connect ComfyUI's CLIP Vision "
                          "Encode (with a ViT-H model such as clip_vision_h.safetensors)")
    if tokens.ndim != 3 or tokens.shape[1] != CLIP_VISION_TOKENS:
        raise FastARError(f"clip_vision_output's penultimate_hidden_states have shape {list(tokens.shape)}; "
                          f"Matrix-Game 2.0 reads [1, {CLIP_VISION_TOKENS}, 1280] from a ViT-H CLIP vision model "
                          "at 224 pixels (clip_vision_h.safetensors)")
    return tokens


class WorldModelStart:
    DESCRIPTION = ("The start of a Matrix-Game 2.0 world: the start image's CLIP vision tokens (from CLIP Vision "
                   "Encode, crop 'none', as Matrix-Game squeezes the whole frame to 224x224) and its VAE latent, "
                   "encoded as the model's inference does: the image followed by blank frames for the whole length. "
                   "Connect the output to the Long Video Sampler's 'positive' (Matrix-Game has no text prompt).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "clip_vision_output": link("CLIP_VISION_OUTPUT", "CLIP Vision Encode's output for the start image (crop "
                                                             "'none'; a ViT-H model: clip_vision_h.safetensors)."),
            "vae": link("VAE", "The Wan2.1 VAE (wan_2.1_vae.safetensors)."),
            "start_image": link("IMAGE", "The first frame. Scaled to cover width x height and centre-cropped (the "
                                         "reference crops the same way); the first image of a batch is used."),
            "width": int_input(WORLD_WIDTH, PIXEL_STEP, MAX_RESOLUTION, "Video width; must equal the sampler's "
                                                                        "(Matrix-Game 2.0 is trained at 640x352).",
                               step=PIXEL_STEP),
            "height": int_input(WORLD_HEIGHT, PIXEL_STEP, MAX_RESOLUTION, "Video height; must equal the sampler's.",
                                step=PIXEL_STEP),
            "length": int_input(57, 1, MAX_LENGTH, LENGTH_TOOLTIP + " Must equal the sampler's length.", step=4),
        }}

    RETURN_TYPES = ("CONDITIONING",)
    RETURN_NAMES = ("positive",)
    OUTPUT_TOOLTIPS = ("The CLIP vision tokens carrying the start latent, for the Long Video Sampler's 'positive'.",)
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, clip_vision_output, vae, start_image, width, height, length):
        host = get_host()
        total = check_video_frames("length", length)
        latent_w, latent_h = check_pixel_size("width", width), check_pixel_size("height", height)
        tokens = clip_tokens(clip_vision_output)
        if not torch.is_tensor(start_image) or start_image.ndim != 4:
            raise FastARError("start_image is not an IMAGE [batch, height, width, channels]")
        image = host.resize_image(start_image[:1, :, :, :3].float(), width, height)
        # Blank frames are zero in the VAE's [-1, 1] range: 0.5 in an IMAGE's [0, 1].
        video = torch.full((length, height, width, 3), 0.5, dtype=image.dtype, device=image.device)
        video[:1] = image
        latent = vae.encode(video)
        expected = (1, LATENT_CHANNELS, total, latent_h, latent_w)
        if tuple(latent.shape) != expected:
            raise FastARError(f"the VAE gave a latent of shape {list(latent.shape)} for {length} frames; a Wan2.1 "
                              f"VAE gives {list(expected)} here")
        start = latent.to(host.intermediate_device())
        return ([[tokens.to(host.intermediate_device()), {WORLD_START_KEY: start}]],)
