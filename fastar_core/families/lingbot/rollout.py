"""A LingBot-World 2.0 rollout as its release's ``_generate_causal_fast`` sets it up, for callers of the engine API.

The release encodes the start image followed by ``4 (T - 1)`` black frames with the Wan2.1 VAE (``image_latent``,
``[B, 16, T, h, w]``), marks frame 0 in a 4-channel mask and joins both to every pass's noisy latent; the prompt's
UMT5 features are the cross-attention context; the camera path (``camera.py``) gives every latent frame its rays.
As its ``generate.py`` runs it (``run_fast.sh``): chunks of 4 latent frames (``--chunk_size``'s default), four steps
at shift 10 (schedule ``lingbot``: ``generate()``'s step indices, the A14B config's ``sample_shift``), a window of
18 latent frames with a 6-frame sink (``--local_attn_size 18 --sink_size 6``), every chunk starting from its slice
of the initial noise, a clean pass at timestep 0 after every chunk.

    model, ckpt = load_lingbot("lingbot-world-v2-14b-causal-fast/transformers")
    camera = read_camera_folder("examples/03").condition(num_frames, 480, 832)
    cond = lingbot_conditioning(prompt_features, image_latent, camera)
    result = ARSampler(CausalRunner(model)).generate(cond, rollout_config(model.config, num_frames, 60, 104))
"""

from __future__ import annotations

import torch

from ...caches.spec import CacheSpec
from ...rollout.conditioning import Conditioning, first_frame_conditioning
from ...rollout.prompts import PromptSchedule
from ...rollout.sampler import RolloutConfig
from .camera import CameraConditioning
from .config import RELEASED_SINK, RELEASED_WINDOW, LingBotConfig

FRAMES_PER_BLOCK = 4  # generate.py's --chunk_size default (run_fast.sh leaves it)
SCHEDULE = "lingbot"
DEFAULT_SIZE = (480, 832)  # height, width: run_fast.sh's --size


def default_cache(config: LingBotConfig) -> CacheSpec:
    """The release's self-attention cache: ``local_attn_size`` latent frames in all (the sink and the chunk
    included) with a sink of ``sink_size``: run_fast.sh's 18 and 6 unless the config.json sets its own."""
    if config.local_attn_size > 0:
        return CacheSpec(policy="window", window_frames=config.local_attn_size, sink_frames=config.sink_size)
    return CacheSpec(policy="window", window_frames=RELEASED_WINDOW, sink_frames=RELEASED_SINK)


def rollout_config(config: LingBotConfig, num_frames: int, latent_height: int, latent_width: int, seed: int = 0,
                   cache: CacheSpec | None = None, batch: int = 1) -> RolloutConfig:
    return RolloutConfig(num_frames=num_frames, latent_height=latent_height, latent_width=latent_width,
                         frames_per_block=FRAMES_PER_BLOCK, schedule=SCHEDULE, seed=seed,
                         cache=cache or default_cache(config), batch=batch, channels=config.out_dim)


def lingbot_conditioning(prompt, image_latent: torch.Tensor, camera: CameraConditioning) -> Conditioning:
    """``prompt``: UMT5 features ``[B, L, 4096]`` (or a ``PromptSchedule``); ``image_latent``: the start image's
    VAE latent followed by blank frames, ``[B, 16, T, h, w]``; ``camera``: ``CameraPath.condition(T, H, W)``."""
    return Conditioning(prompts=PromptSchedule.coerce(prompt), concat=first_frame_conditioning(image_latent),
                        camera=camera)
