"""Tiny Matrix-Game 2.0 models of the three released variants, and the conditioning a rollout of them needs."""

from __future__ import annotations

import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec, TempCacheSettings
from comfyui_fastar.fastar_core.families.matrix_game.config import ActionConfig, MatrixGameConfig
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.actions import Actions, pixel_frames
from comfyui_fastar.fastar_core.rollout.conditioning import Conditioning
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig

CLIP_DIM = 24
# (keys, mouse, local_attn_size) of universal, gta_drive, templerun
VARIANTS = {"universal": (4, True, 6), "gta_drive": (2, True, 4), "templerun": (7, False, 6)}


def tiny_config(variant: str = "universal", layers: int = 3, action_blocks=(0, 1)) -> MatrixGameConfig:
    keys, mouse, window = VARIANTS[variant]
    action = ActionConfig(blocks=tuple(action_blocks), enable_mouse=mouse, keyboard_dim_in=keys, hidden_size=8,
                          img_hidden_size=32, keyboard_hidden_dim=32, mouse_hidden_dim=32, heads_num=2,
                          rope_dim_list=(4, 6, 6), mouse_qk_dim_list=(4, 6, 6))
    return MatrixGameConfig(dim=32, num_heads=2, num_layers=layers, ffn_dim=64, freq_dim=16, clip_dim=CLIP_DIM,
                            text_dim=CLIP_DIM, local_attn_size=window, action=action)


def tiny_runner(variant: str = "universal", seed: int = 0, **kw) -> CausalRunner:
    return CausalRunner(random_matrix_game(tiny_config(variant, **kw), seed=seed).eval())


def random_actions(variant: str, latent_frames: int, seed: int = 0) -> Actions:
    keys, mouse, _ = VARIANTS[variant]
    g = torch.Generator().manual_seed(seed)
    n = pixel_frames(latent_frames)
    keyboard = (torch.rand(n, keys, generator=g) > 0.6).float()
    moves = (torch.rand(n, 2, generator=g) - 0.5) * 0.2 if mouse else None
    return Actions(keyboard, moves)


def conditioning(frames: int, h: int = 4, w: int = 6, seed: int = 0, actions: Actions | None = None,
                 variant: str = "universal") -> Conditioning:
    g = torch.Generator().manual_seed(seed + 1000)
    image = torch.randn(1, 16, frames, h, w, generator=g)
    mask = torch.zeros(1, 4, frames, h, w)
    mask[:, :, 0] = 1.0  # the start image is frame 0
    return Conditioning(concat=torch.cat([mask, image], dim=1), clip=torch.randn(1, 5, CLIP_DIM, generator=g),
                        actions=actions if actions is not None else random_actions(variant, frames, seed))


def window_spec(variant: str) -> CacheSpec:
    return CacheSpec(policy="window", window_frames=VARIANTS[variant][2], sink_frames=0)


def tempcache_spec(capacity_frames: int = 6, threshold: float = 0.9) -> CacheSpec:
    return CacheSpec(policy="tempcache", sink_frames=0,
                     tempcache=TempCacheSettings(threshold=threshold, capacity_frames=capacity_frames))


def rollout(runner, cond, frames, variant="universal", cache=None, seed=0, h=4, w=6, callback=None, **cfg_kw):
    schedule = runner.model.config.schedule_name
    cfg = RolloutConfig(num_frames=frames, latent_height=h, latent_width=w, schedule=schedule, seed=seed,
                        cache=cache or window_spec(variant), **cfg_kw)
    return ARSampler(runner).generate(cond, cfg, callback=callback)
