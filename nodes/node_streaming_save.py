"""Save Long Video (streaming decode): LATENT -> MP4 without ever holding the whole video's pixels."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import pixel_size
from .constants import CATEGORY
from .host import get_host
from .inputs import float_input, int_input, link, string_input
from .streaming_decode import decode_pieces, pixel_frames, spatial_upscale
from .streaming_encode import cancellable
from .video_file import Mp4Writer


class SaveLongVideoStreaming:
    DESCRIPTION = ("Decodes a long video LATENT a few latent frames at a time and appends them to an MP4 as it goes, "
                   "so a 1000-frame video never sits in GPU memory or RAM as pixels (VAE Decode + Create Video would "
                   "hold all of it). With the Wan2.1 or Wan2.2 VAE the result is identical to a full VAE Decode: the "
                   "decoder's causal cache is carried from piece to piece and the latent is cut where ComfyUI's own "
                   "decode cuts it.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": link("LATENT", "The video LATENT from an AR sampler."),
                "vae": link("VAE", "The model's Wan VAE: wan_2.1_vae.safetensors (Wan2.1 models) or "
                                  "wan2.2_vae.safetensors (Wan2.2 TI2V-5B, LongLive 2.0)."),
                "fps": float_input(16.0, 1.0, 120.0, "Frames per second of the file (Wan models: 16).", step=1.0),
                "filename_prefix": string_input("video/FastAR", "Output file prefix, under ComfyUI's output folder."),
                "frames_per_piece": int_input(8, 1, 256, "Latent frames decoded per step (4 video frames each). "
                                                         "Any value gives the same file as VAE Decode; lower it if "
                                                         "decoding runs out of memory."),
            },
            "hidden": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("filename",)
    OUTPUT_TOOLTIPS = ("Path of the written MP4.",)
    OUTPUT_NODE = True
    FUNCTION = "save"
    CATEGORY = CATEGORY

    def save(self, samples, vae, fps=16.0, filename_prefix="video/FastAR", frames_per_piece=8, prompt=None,
             extra_pnginfo=None):
        host = get_host()
        latent = samples["samples"] if isinstance(samples, dict) else samples
        if not torch.is_tensor(latent) or latent.ndim != 5:
            raise FastARError("samples is not a video LATENT [batch, channels, frames, h, w]")
        batch, channels, frames, h, w = latent.shape
        stride = spatial_upscale(vae, channels)
        width, height = pixel_size(w, stride), pixel_size(h, stride)
        metadata = host.metadata(prompt, extra_pnginfo)
        total = pixel_frames(frames)
        bar = host.progress(batch * total)
        results, paths = [], []
        fsm = getattr(vae, "first_stage_model", None)  # ComfyUI's VAE module: Cancel is checked before each layer
        with cancellable(fsm, host) if isinstance(fsm, torch.nn.Module) else nullcontext():
            for b in range(batch):
                path, subfolder = host.output_path(filename_prefix, width, height)
                writer = Mp4Writer(path, fps, width, height, metadata)
                try:
                    for piece in decode_pieces(vae, latent[b:b + 1], frames_per_piece, load=host.load_vae):
                        if host.interrupted():
                            host.raise_interrupted()
                        writer.write(piece[0])
                        bar.update_absolute(b * total + writer.frames, batch * total)
                    writer.close()
                except BaseException:
                    writer.abort()
                    raise
                finally:
                    host.soft_empty_cache()
                if writer.frames != total:
                    raise FastARError(f"decoded {writer.frames} frames, expected {total}")
                results.append({"filename": path.name, "subfolder": subfolder, "type": "output"})
                paths.append(str(path))
        return {"ui": {"images": results, "animated": (True,)}, "result": ("\n".join(paths),)}
