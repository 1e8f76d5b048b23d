"""World Model Start: a Matrix-Game 2.0 rollout's start image, as its CLIP vision tokens and its VAE latent.

Matrix-Game 2.0 has no text: its cross-attention reads the start image's CLIP vision tokens (ViT-H's penultimate
layer, 257 tokens: ComfyUI's CLIP Vision Encode with crop 'none' gives them as ``penultimate_hidden_states``), and
beside every generated frame it reads the VAE latent of the start image followed by blank frames (its inference
encodes the image and ``4(T - 1)`` zero frames as one video, so frames after the first carry the image too, through
the causal VAE). With ComfyUI's Wan2.1 VAE this node encodes that video a slice at a time, exactly as VAE Encode
would (``streaming_encode.py``), and keeps each distinct latent frame once, so its memory does not grow with the
length; Cancel stops it within one layer. The node also sets the video's size and length for the sampler
(``video_size.py``).
"""

from __future__ import annotations

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import check_pixel_size, check_video_frames
from .constants import (
    CATEGORY,
    CLIP_VISION_TOKENS,
    MAX_LENGTH,
    MAX_RESOLUTION,
    PIXEL_STEP,
    WORLD_HEIGHT,
    WORLD_START_INDEX_KEY,
    WORLD_START_KEY,
    WORLD_WIDTH,
)
from .host import get_host
from .inputs import int_input, link
from .node_long_sampler import LENGTH_TOOLTIP
from .streaming_encode import encode_start_video
from .video_size import VideoSize

NODE_NAME = "World Model Start"


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
                   "encoded as the model's inference does: the image followed by blank frames for the whole length "
                   "(a slice at a time, in memory that does not grow with the length). Sets the video's width, height "
                   "and length: link them to the Long Video Sampler's, and 'positive' to its 'positive' (Matrix-Game "
                   "has no text prompt).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "clip_vision_output": link("CLIP_VISION_OUTPUT", "CLIP Vision Encode's output for the start image (crop "
                                                             "'none'; a ViT-H model: clip_vision_h.safetensors)."),
            "vae": link("VAE", "The Wan2.1 VAE (wan_2.1_vae.safetensors)."),
            "start_image": link("IMAGE", "The first frame. Scaled to cover width x height and centre-cropped (the "
                                         "reference crops the same way); the first image of a batch is used."),
            "width": int_input(WORLD_WIDTH, PIXEL_STEP, MAX_RESOLUTION, "Video width (Matrix-Game 2.0 is trained at "
                                                                        "640x352); the sampler takes it.",
                               step=PIXEL_STEP),
            "height": int_input(WORLD_HEIGHT, PIXEL_STEP, MAX_RESOLUTION, "Video height; the sampler takes it.",
                                step=PIXEL_STEP),
            "length": int_input(57, 1, MAX_LENGTH, LENGTH_TOOLTIP + " The sampler takes it.", step=4),
        }}

    RETURN_TYPES = ("CONDITIONING", "INT", "INT", "INT")
    RETURN_NAMES = ("positive", "width", "height", "length")
    OUTPUT_TOOLTIPS = ("The CLIP vision tokens carrying the start latent, for the Long Video Sampler's 'positive'.",
                       "The video width, for the sampler's width.", "The video height, for the sampler's height.",
                       "The video length in frames, for the sampler's length.")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, clip_vision_output, vae, start_image, width, height, length):
        host = get_host()
        check_video_frames("length", length)
        check_pixel_size("width", width), check_pixel_size("height", height)
        tokens = clip_tokens(clip_vision_output)
        if not torch.is_tensor(start_image) or start_image.ndim != 4:
            raise FastARError("start_image is not an IMAGE [batch, height, width, channels]")
        image = host.resize_image(start_image[:1, :, :, :3].float(), width, height)
        latent, index = encode_start_video(vae, image, length, host, NODE_NAME)
        extras = {WORLD_START_KEY: latent.to(host.intermediate_device()), WORLD_START_INDEX_KEY: index,
                  **VideoSize(width, height, length, NODE_NAME).as_extras()}
        return ([[tokens.to(host.intermediate_device()), extras]], width, height, length)
