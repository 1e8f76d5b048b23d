"""LingBot World Start: a LingBot-World 2.0 rollout's start, as the prompt's UMT5 features carrying the start video's
VAE latent.

LingBot-World 2.0 reads the prompt through cross-attention (UMT5-XXL, the text encoder of Wan2.1: ComfyUI's CLIP
Text Encode with a CLIPLoader of type 'wan' gives its ``[1, L, 4096]`` features), and beside every frame it makes,
the VAE latent of its start image followed by blank frames: its inference resizes the image to the video's size
(bicubic, the whole image) and encodes it with ``F - 1`` zero frames as one video, so the frames after the first
carry the image forward through the causal VAE. With ComfyUI's Wan2.1 VAE this node encodes that video a slice at a
time, exactly as VAE Encode of the whole video would, and keeps each distinct latent frame once
(``streaming_encode.py``): its memory does not grow with the length, and Cancel stops it within one layer. The node
also sets the video's size and length for the sampler (``video_size.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import check_pixel_size, check_video_frames
from .constants import CATEGORY, MAX_LENGTH, MAX_RESOLUTION, PIXEL_STEP, WORLD_START_INDEX_KEY, WORLD_START_KEY
from .host import get_host
from .inputs import int_input, link
from .lingbot import START_NODE
from .node_long_sampler import LENGTH_TOOLTIP
from .prompting import conditioning_entry
from .streaming_encode import encode_start_video
from .video_size import VideoSize

TEXT_WIDTH = 4096  # UMT5-XXL's features


def resize_like_the_release(image: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """IMAGE ``[1, H, W, 3]`` -> ``[1, height, width, 3]``: bicubic over the whole image (no crop), as the release's
    ``_generate_causal_fast`` resizes its start image."""
    return F.interpolate(image.movedim(-1, 1), size=(height, width), mode="bicubic").movedim(1, -1)


class LingBotWorldStart:
    DESCRIPTION = ("The start of a LingBot-World 2.0 world: the prompt (CLIP Text Encode with a 'wan' text encoder: "
                   "UMT5-XXL) and the start image's VAE latent, encoded as the model's inference does: the image "
                   "resized to the video's size (bicubic, not cropped), followed by blank frames for the whole "
                   "length (a slice at a time, in memory that does not grow with the length). Sets the video's "
                   "width, height and length: link them to the Long Video Sampler's, and 'positive' to its "
                   "'positive'; steer it with a Camera Path or an Action Script of variant lingbot on 'actions'.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "positive": link("CONDITIONING", "The prompt: CLIP Text Encode with a CLIPLoader of type 'wan' "
                                             "(umt5_xxl_fp8_e4m3fn_scaled.safetensors), as for Wan2.1."),
            "vae": link("VAE", "The Wan2.1 VAE (wan_2.1_vae.safetensors), which LingBot-World 2.0 shares."),
            "start_image": link("IMAGE", "The first frame, resized to width x height as the release resizes it "
                                         "(bicubic, the whole image: give a size of the image's aspect); the first "
                                         "image of a batch is used."),
            "width": int_input(832, PIXEL_STEP, MAX_RESOLUTION, "Video width (LingBot-World 2.0 runs at 832x480); the "
                                                                "sampler takes it.", step=PIXEL_STEP),
            "height": int_input(480, PIXEL_STEP, MAX_RESOLUTION, "Video height; the sampler takes it.",
                                step=PIXEL_STEP),
            "length": int_input(161, 1, MAX_LENGTH, LENGTH_TOOLTIP + " The sampler takes it (the release makes a "
                                                                     "multiple of 4 latent frames: 13, 29, ... 61, "
                                                                     "... 161 frames).", step=4),
        }}

    RETURN_TYPES = ("CONDITIONING", "INT", "INT", "INT")
    RETURN_NAMES = ("positive", "width", "height", "length")
    OUTPUT_TOOLTIPS = ("The prompt carrying the start latent, for the Long Video Sampler's 'positive'.",
                       "The video width, for the sampler's width.", "The video height, for the sampler's height.",
                       "The video length in frames, for the sampler's length.")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, positive, vae, start_image, width, height, length):
        host = get_host()
        check_video_frames("length", length)
        check_pixel_size("width", width), check_pixel_size("height", height)
        tokens, extras = conditioning_entry(positive, "positive")
        if tokens.shape[-1] != TEXT_WIDTH:
            raise FastARError(f"'positive' is {tokens.shape[-1]} wide; LingBot-World 2.0 reads UMT5-XXL's "
                              f"{TEXT_WIDTH}-wide features: CLIP Text Encode with a CLIPLoader of type 'wan'")
        if not torch.is_tensor(start_image) or start_image.ndim != 4:
            raise FastARError("start_image is not an IMAGE [batch, height, width, channels]")
        image = resize_like_the_release(start_image[:1, :, :, :3].float(), width, height)
        latent, index = encode_start_video(vae, image, length, host, START_NODE)
        extras = {**extras, WORLD_START_KEY: latent.to(host.intermediate_device()), WORLD_START_INDEX_KEY: index,
                  **VideoSize(width, height, length, START_NODE).as_extras()}
        return ([[tokens, extras]], width, height, length)
