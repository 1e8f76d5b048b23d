"""Matrix-Game 2.0's module tree, named as its checkpoints' keys (after the ``model.`` prefix).

Wan2.1's blocks (``wan_model.py``) with an ``action_model`` in the blocks its config names, ``img_emb`` (CLIP-vision
features to the model width) in place of ``text_embedding``, and a 36-channel patch embedding. Weights only: the
forward is the runner's, with this family's hooks (``family.py``, ``action.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...model.wan_model import WanBlock, WanHead, randomize_
from .config import ActionConfig, MatrixGameConfig


class UnweightedRMSNorm(nn.Module):
    """The action module's RMSNorm: the reference's ignores its weight (its forward never multiplies by it) and
    runs in the input's dtype. The weight is kept only so the checkpoint's key loads."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


def _norm(dim: int, enabled: bool) -> nn.Module:
    return UnweightedRMSNorm(dim) if enabled else nn.Identity()


class ActionModel(nn.Module):
    """The action module's weights: a mouse path (a window of camera moves joined to each location's features,
    attention over time per location) and a keyboard path (one key/value token per latent frame from a window of
    key presses, attended by every token)."""

    def __init__(self, a: ActionConfig):
        super().__init__()
        window = a.window_frames
        if a.enable_keyboard:
            self.keyboard_embed = nn.Sequential(nn.Linear(a.keyboard_dim_in, a.hidden_size), nn.SiLU(),
                                                nn.Linear(a.hidden_size, a.hidden_size))
        if a.enable_mouse:
            c = a.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(nn.Linear(a.mouse_dim_in * window + a.img_hidden_size, c),
                                           nn.GELU(approximate="tanh"), nn.Linear(c, c), nn.LayerNorm(c))
            self.t_qkv = nn.Linear(c, 3 * c, bias=a.qkv_bias)
            self.img_attn_q_norm = _norm(c // a.heads_num, a.qk_norm)
            self.img_attn_k_norm = _norm(c // a.heads_num, a.qk_norm)
            self.proj_mouse = nn.Linear(c, a.img_hidden_size, bias=a.qkv_bias)
        if a.enable_keyboard:
            kh = a.keyboard_hidden_dim
            self.key_attn_q_norm = _norm(kh // a.heads_num, a.qk_norm)
            self.key_attn_k_norm = _norm(kh // a.heads_num, a.qk_norm)
            self.mouse_attn_q = nn.Linear(a.img_hidden_size, kh, bias=a.qkv_bias)
            self.keyboard_attn_kv = nn.Linear(a.hidden_size * window, 2 * kh, bias=a.qkv_bias)
            self.proj_keyboard = nn.Linear(kh, a.img_hidden_size, bias=a.qkv_bias)


class ImageEmbedding(nn.Module):
    """CLIP-vision tokens to the model width (the reference's ``MLPProj``)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))

    def forward(self, x):
        return self.proj(x)


class MatrixGameBlock(WanBlock):
    def __init__(self, cfg: MatrixGameConfig, index: int):
        super().__init__(cfg)
        if index in cfg.action.blocks:
            self.action_model = ActionModel(cfg.action)


class MatrixGameModel(nn.Module):
    def __init__(self, cfg: MatrixGameConfig):
        super().__init__()
        self.config = cfg
        self.patch_embedding = nn.Conv3d(cfg.in_dim, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, cfg.dim * 6))
        self.blocks = nn.ModuleList([MatrixGameBlock(cfg, i) for i in range(cfg.num_layers)])
        self.head = WanHead(cfg)
        self.img_emb = ImageEmbedding(cfg.clip_dim, cfg.dim)

    @property
    def dtype(self) -> torch.dtype:
        return self.head.head.weight.dtype


def random_matrix_game(cfg: MatrixGameConfig, seed: int = 0, std: float = 0.05,
                       dtype=torch.float32) -> MatrixGameModel:
    """A randomly initialised model for tests (seeded, global RNG untouched); the action projections get weights
    too (the reference initialises them to zero), so actions change the output."""
    model = MatrixGameModel(cfg)

    def is_unit(name, p):
        return name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight", "norm.weight")) or (
            ".proj." in name and p.ndim == 1 and name.endswith("weight")) or name.endswith("mlp.3.weight")

    randomize_(model, seed, std, is_unit)
    return model.to(dtype)
