"""AR Image to Video: a start image, VAE-encoded, becomes the clean first latent frame of the rollout.

The AR models are text-to-video, but a causal model continues whatever is in its cache: the start image's
latent is written to the KV cache before the first chunk (the engine's ``initial_latents``) and kept as frame 0.
"""

from __future__ import annotations

import logging

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.video_geometry import check_pixel_size, check_video_frames
from .constants import CATEGORY, LATENT_CHANNELS, MAX_LENGTH, MAX_RESOLUTION, PIXEL_STEP
from .host import get_host
from .inputs import int_input, link
from .node_long_sampler import LENGTH_TOOLTIP
from .prompting import conditioning_entry, with_initial_latent

log = logging.getLogger("FAST-AR")


class ARImageToVideo:
    DESCRIPTION = ("Image to video for the AR models: encodes the start image with the Wan VAE (one image = one latent "
                   "frame) and attaches it to the prompt, so the AR samplers (the pack's and ComfyUI's own Sampler AR "
                   "Video) commit it to the KV cache before the first chunk and the video continues from it. Also "
                   "gives the empty LATENT that SamplerCustomAdvanced needs.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "positive": link("CONDITIONING", "The prompt (CLIP Text Encode with a 'wan' text encoder)."),
            "vae": link("VAE", "The Wan2.1 VAE (wan_2.1_vae.safetensors)."),
            "start_image": link("IMAGE", "The first frame. Only the first image of a batch is used; it is scaled to "
                                         "cover width x height and centre-cropped."),
            "width": int_input(832, PIXEL_STEP, MAX_RESOLUTION, "Video width; must equal the sampler's width.",
                               step=PIXEL_STEP),
            "height": int_input(480, PIXEL_STEP, MAX_RESOLUTION, "Video height; must equal the sampler's height.",
                                step=PIXEL_STEP),
            "length": int_input(81, 1, MAX_LENGTH, LENGTH_TOOLTIP + " Sizes the LATENT output.", step=4),
            "batch_size": int_input(1, 1, 64, "Videos in the LATENT output: SamplerCustomAdvanced makes one per batch "
                                              "item, all from this start image. The Long Video Sampler has its own "
                                              "batch_size."),
        }}

    RETURN_TYPES = ("CONDITIONING", "LATENT")
    RETURN_NAMES = ("positive", "latent")
    OUTPUT_TOOLTIPS = ("The prompt carrying the start image; connect it to an AR sampler's positive (or to an AR "
                       "Prompt Schedule's conditioning_1).",
                       "An empty video LATENT of the right size, for SamplerCustomAdvanced.")
    FUNCTION = "encode"
    CATEGORY = CATEGORY

    def encode(self, positive, vae, start_image, width, height, length, batch_size=1):
        host = get_host()
        conditioning_entry(positive, "positive")
        total = check_video_frames("length", length)
        latent_w, latent_h = check_pixel_size("width", width), check_pixel_size("height", height)
        if not torch.is_tensor(start_image) or start_image.ndim != 4:
            raise FastARError("start_image is not an IMAGE [batch, height, width, channels]")
        if start_image.shape[0] > 1:
            log.warning("FAST-AR AR Image to Video: start_image holds %d images; the first is the start of every "
                        "video", start_image.shape[0])
        image = host.resize_image(start_image[:1, :, :, :3].float(), width, height)
        latent = vae.encode(image)
        if latent.ndim == 4:
            latent = latent[:, :, None]
        expected = (LATENT_CHANNELS, latent_h, latent_w)
        if latent.ndim != 5 or (latent.shape[1], *latent.shape[3:]) != expected:
            raise FastARError(f"the VAE gave a latent of shape {list(latent.shape)}; a Wan2.1 VAE gives "
                              f"[1, 16, 1, {latent_h}, {latent_w}] here (Wan2.2's 48-channel VAE does not fit)")
        empty = torch.zeros(batch_size, LATENT_CHANNELS, total, latent_h, latent_w,
                            device=host.intermediate_device())
        start = latent[:, :, :1].to(host.intermediate_device())
        # The pack's samplers read the latent from the conditioning; the hook hands it to core's SamplerARVideo.
        hooks, combine = host.start_image_hook(start)
        return (with_initial_latent(positive, start, hooks, combine), {"samples": empty})
