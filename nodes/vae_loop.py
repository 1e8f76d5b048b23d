"""ComfyUI's VAE in the engine's protocol (``fastar_core.vae.VideoVAE``), for the loops that decode and re-encode
frames while they sample (CausVid's long-video restarts, Krea's recompute without its first frame).

ComfyUI's ``VAE.encode`` takes an IMAGE ``[frames, H, W, 3]`` in 0..1 and gives raw latents ``[1, C, 1 + (frames -
1) // 4, h, w]``; ``VAE.decode`` takes raw latents ``[B, C, T, h, w]`` and gives ``[B, 1 + 4 (T - 1), H, W, 3]`` in
0..1 (0.3.64 and 0.27.0 alike). The engine works in the model's latent space (``latent_format.process_in``) and
in pixels ``[B, 3, T, H, W]`` in [-1, 1], the Wan VAE's own range, which ComfyUI's VAE maps 0..1 to and back
(``image * 2 - 1``, ``(image + 1) / 2`` clamped), so this wrapper converts at its edges and nothing else.

The streaming decode (Krea decodes as it goes) runs ComfyUI's Wan2.1 decoder one latent frame per call with its
feature cache kept (``WanCausalStream``), as both references decode; any other VAE is decoded again from frame 0
at every call (exact, slower). The MODEL is loaded again after each VAE call: ComfyUI may have offloaded it to
make room for the VAE.
"""

from __future__ import annotations

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.vae import RedecodeStream
from .streaming_decode import WanCausalStream, wan_vae_kind


class ComfyVideoVAE:
    def __init__(self, vae, latent_format, host, model_patcher=None):
        if not (callable(getattr(vae, "encode", None)) and callable(getattr(vae, "decode", None))):
            raise FastARError(f"'vae' is a {type(vae).__name__}, not a VAE: connect a Load VAE node (a Wan2.1 VAE)")
        self.vae, self.latent_format, self.host, self.model_patcher = vae, latent_format, host, model_patcher

    def _model_back(self):
        if self.model_patcher is not None:
            self.host.load_model(self.model_patcher)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        latents = []
        for video in pixels:  # one IMAGE per video: ComfyUI crops a 5-D input along time too
            image = ((video.float() + 1.0) / 2.0).clamp(0.0, 1.0).movedim(0, -1)  # [T, H, W, 3]
            latents.append(self.vae.encode(image).float())
        self._model_back()
        return self.latent_format.process_in(torch.cat(latents))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        images = self.vae.decode(self.latent_format.process_out(latents.float()))  # [B, T, H, W, 3]
        self._model_back()
        return images.float().movedim(-1, 1) * 2.0 - 1.0

    def stream(self):
        if wan_vae_kind(self.vae) != "wan2.1":
            return RedecodeStream(self)
        return ComfyWanStream(self)


class ComfyWanStream:
    """ComfyUI's Wan2.1 decoder kept open, one latent frame per call (``WanCausalStream``)."""

    def __init__(self, owner: ComfyVideoVAE):
        self.owner = owner
        self.stream = WanCausalStream(owner.vae)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        owner = self.owner
        raw = owner.latent_format.process_out(latents.float())
        owner.host.load_vae(owner.vae, raw[:, :, :1].shape)
        pixels = [self.stream.decode(raw[:, :, i:i + 1], final=True) for i in range(raw.shape[2])]
        owner._model_back()
        return torch.cat(pixels, dim=2).float() * 2.0 - 1.0  # [B, 3, frames, H, W] in 0..1 -> [-1, 1]
