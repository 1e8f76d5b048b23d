"""The demo model's fixed choices, shared by the trainer, the loader and the evaluator.

The "latent" is the RGB video itself (no VAE exists here): 24x24 frames, 3 channels in [-1, 1], cut into 4x4
patches, so one latent frame is 36 tokens and a 240-frame rollout stays cheap on a CPU.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...fastar_core.families.demo.text import TEXT_DIM, TEXT_LEN
from ...fastar_core.model.wan_config import WanConfig
from .world import CHANNELS, FRAME_SIZE

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS_FILE = "demo_model.safetensors"
WORLD_WEIGHTS_FILE = "world_model.safetensors"  # the steered-world model (``fastar play``, ``demo --world steer``)
MODEL_PREFIX = "model.diffusion_model."  # ComfyUI's bundle layout, so the engine's loader reads the file as is

MODEL_CONFIG = WanConfig(
    dim=128, num_heads=4, num_layers=4, ffn_dim=512, in_dim=CHANNELS, out_dim=CHANNELS, text_dim=TEXT_DIM,
    freq_dim=64, text_len=TEXT_LEN, patch_size=(1, 4, 4),
)
FRAMES_PER_BLOCK = 3
# The steered world's model reads, beside its noisy frame, the previous clean frame moved by the key (3 channels)
# and where that moved frame is defined (1 channel): see ``actions.moved_reference``. One frame per chunk, so
# every frame is one key away from a clean frame.
WORLD_MODEL_CONFIG = replace(MODEL_CONFIG, in_dim=2 * CHANNELS + 1)
WORLD_FRAMES_PER_BLOCK = 1
# Few steps as in the distilled AR models, but unshifted: 24x24 frames need no shift towards high noise.
DEMO_SIGMAS = (1.0, 0.75, 0.5, 0.25)
# The steered world's model is not distilled: each re-noised step of DEMO_SIGMAS asks it for the mean of what the
# new strip could hold, and four such means average the landmarks away. An ODE solver (UniPC, unshifted) follows
# the model's flow to a sample instead. Six steps were chosen on held-out maps (seeds 7 and 8, not the bar's):
# fewer leave the strips too bland, more leave them noisier than the true views (WORLD_MODEL_CARD.md).
WORLD_SAMPLER = {"solver": "unipc", "steps": 6, "shift": 1.0}
TRAIN_CLIP_FRAMES = 21  # 7 chunks: covers a sink-3 + window-12 cache plus the chunk being denoised
# Temporal RoPE distances past the trained span are clamped to the longest distance seen in training.
ROPE_MAX_DISTANCE = TRAIN_CLIP_FRAMES - 1
FRAME_HW = (FRAME_SIZE, FRAME_SIZE)
