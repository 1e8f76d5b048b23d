"""AR Image to Video: a start image, VAE-encoded, becomes the clean first latent frame of the rollout.

The AR models are text-to-video, but a causal model continues whatever is in its cache: the start image's
latent is written to the KV cache before the first chunk (the engine's ``initial_latents``) and kept as frame 0.
With a UniPC schedule (LongLive 2.0, Wan2.2 TI2V-5B) the samplers do as LongLive 2.0 does instead: the image is
frame 0 of the first chunk, held there at timestep 0 through every step.
"""

from __future__ import annotations

import logging

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import check_pixel_size, check_video_frames, vae_stride
from .constants import CATEGORY, LATENT_CHANNELS, MAX_LENGTH, MAX_RESOLUTION, PIXEL_STEP
from .host import get_host
from .inputs import int_input, link
from .node_long_sampler import LENGTH_TOOLTIP
from .prompting import conditioning_entry, with_initial_latent
from .video_size import VideoSize

log = logging.getLogger("FAST-AR")


def vae_latent_channels(vae) -> int:
    """What ComfyUI's VAE says it encodes to (16: Wan2.1's VAE, 48: Wan2.2's); Wan2.1's where it does not say."""
    channels = getattr(vae, "latent_channels", LATENT_CHANNELS)
    return channels if isinstance(channels, int) else LATENT_CHANNELS


class ARImageToVideo:
    DESCRIPTION = ("Image to video for the AR models: encodes the start image with the Wan VAE (one image = one latent "
                   "frame) and attaches it to the prompt, so the AR samplers (the pack's and ComfyUI's own Sampler AR "
                   "Video) commit it to the KV cache before the first chunk and the video continues from it. Sets the "
                   "video's width, height and length: gives the empty LATENT that SamplerCustomAdvanced needs, and "
                   "the three values for the Long Video Sampler's.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "positive": link("CONDITIONING", "The prompt (CLIP Text Encode with a 'wan' text encoder)."),
            "vae": link("VAE", "The model's Wan VAE: wan_2.1_vae.safetensors (Wan2.1 models), "
                              "wan2.2_vae.safetensors (Wan2.2 TI2V-5B, LongLive 2.0)."),
            "start_image": link("IMAGE", "The first frame. Only the first image of a batch is used; it is scaled to "
                                         "cover width x height and centre-cropped."),
            "width": int_input(832, PIXEL_STEP, MAX_RESOLUTION, "Video width (a multiple of 32 with the Wan2.2 VAE); "
                                                                "the sampler takes it.", step=PIXEL_STEP),
            "height": int_input(480, PIXEL_STEP, MAX_RESOLUTION, "Video height; the sampler takes it.",
                                step=PIXEL_STEP),
            "length": int_input(81, 1, MAX_LENGTH, LENGTH_TOOLTIP + " Sizes the LATENT output; the Long Video Sampler "
                                                                    "takes it.", step=4),
            "batch_size": int_input(1, 1, 64, "Videos in the LATENT output: SamplerCustomAdvanced makes one per batch "
                                              "item, all from this start image. The Long Video Sampler has its own "
                                              "batch_size."),
        }}

    RETURN_TYPES = ("CONDITIONING", "LATENT", "INT", "INT", "INT")
    RETURN_NAMES = ("positive", "latent", "width", "height", "length")
    OUTPUT_TOOLTIPS = ("The prompt carrying the start image; connect it to an AR sampler's positive (or to an AR "
                       "Prompt Schedule's conditioning_1).",
                       "An empty video LATENT of the right size, for SamplerCustomAdvanced.",
                       "The video width, for the Long Video Sampler's width.",
                       "The video height, for the Long Video Sampler's height.",
                       "The video length in frames, for the Long Video Sampler's length.")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, positive, vae, start_image, width, height, length, batch_size=1):
        host = get_host()
        conditioning_entry(positive, "positive")
        total = check_video_frames("length", length)
        channels = vae_latent_channels(vae)
        stride = vae_stride(channels)  # Wan2.1's VAE: 8 pixels per latent, 16 channels; Wan2.2's: 16 and 48
        latent_w, latent_h = check_pixel_size("width", width, stride), check_pixel_size("height", height, stride)
        if not torch.is_tensor(start_image) or start_image.ndim != 4:
            raise FastARError("start_image is not an IMAGE [batch, height, width, channels]")
        if start_image.shape[0] > 1:
            log.warning("FAST-AR AR Image to Video: start_image holds %d images; the first is the start of every "
                        "video", start_image.shape[0])
        image = host.resize_image(start_image[:1, :, :, :3].float(), width, height)
        latent = vae.encode(image)
        if latent.ndim == 4:
            latent = latent[:, :, None]
        expected = (channels, latent_h, latent_w)
        if latent.ndim != 5 or (latent.shape[1], *latent.shape[3:]) != expected:
            raise FastARError(f"the VAE gave a latent of shape {list(latent.shape)}; a Wan VAE with {channels} "
                              f"channels gives [1, {channels}, 1, {latent_h}, {latent_w}] here")
        empty = torch.zeros(batch_size, channels, total, latent_h, latent_w,
                            device=host.intermediate_device())
        start = latent[:, :, :1].to(host.intermediate_device())
        # The pack's samplers read the latent from the conditioning; the hook hands it to core's SamplerARVideo.
        hooks, combine = host.start_image_hook(start)
        size = VideoSize(width, height, length, "AR Image to Video")
        return (with_initial_latent(positive, start, hooks, combine, size), {"samples": empty}, width, height, length)
