"""A Matrix-Game 2.0 rollout as its reference inference sets it up, for callers of the engine API.

The reference encodes the start image followed by ``4 (T - 1)`` black frames with the VAE (``image_latent``,
``[B, 16, T, h, w]``), marks frame 0 in a 4-channel mask, and joins both to every pass's noisy latent; the CLIP
vision features of the start image (``[B, 257, 1280]``) are the cross-attention context. Chunks are 3 latent
frames, the self-attention window ``local_attn_size`` frames with no sink, the step list per variant.

    model, ckpt = load_matrix_game("universal/base_distilled_model/base_distill.safetensors")
    cond = matrix_game_conditioning(image_latent, clip_features, Actions(keyboard, mouse))
    result = ARSampler(CausalRunner(model)).generate(cond, rollout_config(model.config, num_frames=150,
                                                                          latent_height=44, latent_width=80))
"""

from __future__ import annotations

import torch

from ...caches.spec import CacheSpec
from ...rollout.actions import Actions
from ...rollout.conditioning import Conditioning, first_frame_conditioning
from ...rollout.sampler import RolloutConfig
from .config import MatrixGameConfig

FRAMES_PER_BLOCK = 3  # the inference configs' num_frame_per_block


def default_cache(config: MatrixGameConfig) -> CacheSpec:
    """The reference's self-attention cache: a window of ``local_attn_size`` frames (the chunk included), no sink."""
    return CacheSpec(policy="window", window_frames=config.local_attn_size, sink_frames=0)


def rollout_config(config: MatrixGameConfig, num_frames: int, latent_height: int, latent_width: int, seed: int = 0,
                   cache: CacheSpec | None = None, batch: int = 1) -> RolloutConfig:
    return RolloutConfig(num_frames=num_frames, latent_height=latent_height, latent_width=latent_width,
                         frames_per_block=FRAMES_PER_BLOCK, schedule=config.schedule_name, seed=seed,
                         cache=cache or default_cache(config), batch=batch, channels=config.out_dim)


def matrix_game_conditioning(image_latent: torch.Tensor, clip: torch.Tensor, actions: Actions,
                             frame_index: torch.Tensor | None = None) -> Conditioning:
    """``frame_index`` [T]: which frame of ``image_latent`` each latent frame reads, when the blank frames' latents
    repeat and are kept once (frame 0, the image, is read by frame 0 alone)."""
    return Conditioning(concat=first_frame_conditioning(image_latent), clip=clip, actions=actions,
                        concat_index=frame_index)
