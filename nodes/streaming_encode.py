"""Encode a start image followed by blank frames with ComfyUI's Wan2.1 VAE, a slice at a time, so that neither the
pixels nor the latents of the whole video are ever held.

Matrix-Game 2.0 reads, beside every frame it makes, the VAE latent of its start image followed by blank frames: its
inference encodes the image and ``4 (T - 1)`` black frames as one video, so the frames after the first carry the
image forward through the causal VAE. ComfyUI's ``WanVAE.encode`` runs its causal encoder over a video in slices
(frame 0 alone, then 4 frames at a time before 0.18, 2 at a time with the last one flushing from 0.18 on), carrying
a feature cache from slice to slice; ``StartVideoEncoder`` calls the encoder on exactly those slices with that
cache, so its latents are ComfyUI's full encode's, bit for bit, while one slice of pixels and activations exists
at a time.

The encoder reaches back a fixed number of frames (causal convolutions, no recurrence). Once the image has left
that reach, every slice of blank frames leaves the cache as it found it. The encoder notices that (the whole cache
compared, bit for bit, with its state one output earlier), stops running the slices whose outputs can only repeat
the last one, and runs the last slices for real (ComfyUI flushes a held-back frame there). Its result is the
distinct latent frames and, per latent frame of the video, which of them it is: the memory of the first ~40 latent
frames however long the video.
"""

from __future__ import annotations

import inspect
import logging
import sys
from contextlib import contextmanager

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.video_geometry import LATENT_CHANNELS, latent_frames
from .streaming_decode import decoder_cache_slots, wan_vae_kind

log = logging.getLogger("FAST-AR")


@contextmanager
def cancellable(module: torch.nn.Module, host):
    """Check the host's Cancel before every submodule of ``module`` runs, so a long call ends within one layer."""

    def check(*_):
        if host.interrupted():
            host.raise_interrupted()

    handles = [m.register_forward_pre_hook(check) for m in module.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def encoder_cache_slots(fsm) -> int:
    """The feature cache ComfyUI's own encode makes: its counter over the encoder (0.18+), or over the decoder
    (before); two slots per module of the encoder where neither exists (more than any encoder uses)."""
    module = sys.modules.get(type(fsm).__module__)
    if callable(getattr(module, "count_cache_layers", None)):
        return module.count_cache_layers(fsm.encoder)
    if callable(getattr(module, "count_conv3d", None)):
        return decoder_cache_slots(fsm)
    return 2 * sum(1 for _ in fsm.encoder.modules())


def slices(frames: int, step: int) -> list[tuple[int, int]]:
    """The pixel frames of each encoder call: frame 0 alone, then ``step`` at a time (``frames`` is 4k + 1)."""
    return [(0, 1)] + [(start, start + step) for start in range(1, frames, step)]


def snapshot(cache: list) -> list:
    return [entry.clone() if torch.is_tensor(entry) else entry for entry in cache]


def same_state(a: list, b: list | None) -> bool:
    if b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if torch.is_tensor(x) != torch.is_tensor(y):
            return False
        if torch.is_tensor(x):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:  # None, or ComfyUI's 'Rep' marker
            return False
    return True


class StartVideoEncoder:
    """ComfyUI's Wan2.1 encoder kept open over one video: a start image, then blank frames."""

    def __init__(self, vae, host):
        self.vae, self.host = vae, host
        self.fsm = vae.first_stage_model
        # From 0.18 the encoder takes 2 frames a call and holds a lone time-downsampled frame back until the last call
        # (``final``) flushes it; before, it takes 4 frames a call.
        self.flushes = "final" in inspect.signature(self.fsm.encoder.forward).parameters
        self.step = 2 if self.flushes else 4
        self.skipped = 0  # encoder calls the steady state saved

    def _pixels(self, image: torch.Tensor) -> torch.Tensor:
        """IMAGE frames [n, H, W, 3] in 0..1 -> the encoder's input [1, 3, n, H, W], laid out as ComfyUI's encode
        lays out the whole video before slicing it."""
        vae = self.vae
        x = vae.process_input(image.movedim(-1, 1).movedim(1, 0).unsqueeze(0))
        return x.to(vae.vae_dtype).to(vae.device)

    def _latents(self, out: torch.Tensor) -> torch.Tensor:
        mu = self.fsm.conv1(out).chunk(2, dim=1)[0]
        dtype = self.vae.vae_output_dtype() if hasattr(self.vae, "vae_output_dtype") else torch.float32
        return mu.to(self.vae.output_device).to(dtype)

    def encode(self, image: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``image`` [1, H, W, 3] in 0..1 followed by ``frames - 1`` blank frames -> (the distinct latent frames
        [1, 16, D, h, w], and for each of the video's latent frames the index of its distinct frame)."""
        cuts = slices(frames, self.step)
        blank = {}
        cache: list = [None] * encoder_cache_slots(self.fsm)
        distinct: list[torch.Tensor] = []  # [1, 16, n, h, w] blocks, one per encoder output
        index: list[int] = []
        last_state, last_call = None, 0
        i = 0
        with torch.no_grad(), cancellable(self.fsm, self.host):
            while i < len(cuts):
                start, end = cuts[i]
                if i == 0:
                    x = self._pixels(image[:1])
                else:
                    if end - start not in blank:
                        blank[end - start] = self._pixels(torch.full((end - start, *image.shape[1:]), 0.5,
                                                                     dtype=image.dtype, device=image.device))
                    x = blank[end - start]
                extra = {"final": i == len(cuts) - 1} if self.flushes and i else {}
                out = self.fsm.encoder(x, feat_cache=cache, feat_idx=[0], **extra)
                if out is None:  # a frame held back until the next call
                    i += 1
                    continue
                block = self._latents(out)
                first = sum(b.shape[2] for b in distinct)
                distinct.append(block)
                index += range(first, first + block.shape[2])
                state = snapshot(cache) if i else None
                remaining = len(cuts) - 1 - i
                if state is not None and same_state(state, last_state) and remaining:
                    # A fixed point: every further cycle of calls gives this block again. Run the last calls for real.
                    cycle = i - last_call
                    repeats = (remaining - 1) // cycle
                    index += list(range(first, first + block.shape[2])) * repeats
                    self.skipped += repeats * cycle
                    i += repeats * cycle
                    state = None  # the state after the skipped calls is this one; no need to compare again
                last_state, last_call = state, i
                i += 1
        return torch.cat(distinct, dim=2), torch.tensor(index, dtype=torch.long)


def encode_start_video(vae, image: torch.Tensor, length: int, host, node: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A world model's start video, ``image`` [1, H, W, 3] followed by ``length - 1`` blank frames, through ``vae``:
    (the distinct latent frames [1, 16, D, h, w], and per latent frame of the video the index of its distinct frame).
    With ComfyUI's Wan2.1 VAE a slice at a time (``StartVideoEncoder``); any other VAE is handed the whole video."""
    height, width = image.shape[1:3]
    total = latent_frames(length)
    if wan_vae_kind(vae) == "wan2.1":
        log.info("FAST-AR %s: encoding %d frames at %dx%d a slice at a time", node, length, width, height)
        encoder = StartVideoEncoder(vae, host)
        host.load_vae(vae, (1, 3, encoder.step, height, width), encode=True)
        try:
            latent, index = encoder.encode(image, length)
        finally:
            host.soft_empty_cache()
    else:
        # Any other VAE is asked for the whole video at once (its memory grows with the length).
        log.warning("FAST-AR %s: the VAE is not ComfyUI's Wan2.1 VAE; encoding all %d frames at once", node, length)
        video = torch.full((length, height, width, 3), 0.5, dtype=image.dtype, device=image.device)
        video[:1] = image  # blank frames are zero in the VAE's [-1, 1] range: 0.5 in an IMAGE's [0, 1]
        latent, index = vae.encode(video), torch.arange(total)
    got = (*latent.shape[:2], *latent.shape[3:])
    if latent.ndim != 5 or got != (1, LATENT_CHANNELS, height // 8, width // 8) or index.shape != (total,):
        raise FastARError(f"the VAE gave a latent of shape {list(latent.shape)} for {length} frames; a Wan2.1 VAE "
                          f"gives [1, {LATENT_CHANNELS}, {total}, {height // 8}, {width // 8}] here")
    return latent, index
