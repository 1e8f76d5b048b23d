"""A minimal Wan2.1 DiT module tree whose parameter names are the checkpoint keys.

It holds weights only; the forward lives in ``runner.py``, which drives this tree and ComfyUI's ``WanModel``
alike by calling their submodules, so a state dict loads with a plain ``load_state_dict``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .wan_config import WanConfig


class WanRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Computed in fp32 as in the original Wan code; bf16 rsqrt drifts.
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class WanLayerNorm(nn.LayerNorm):
    def forward(self, x):
        # fp32 statistics as in the original Wan code. The affine weights go up to fp32 with the input: CPU
        # layer_norm refuses a bf16/fp16 weight beside an fp32 input ("mixed dtype (CPU)"), CUDA would not.
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class WanAttention(nn.Module):
    """Projections of one attention (self or cross); the attention itself is the runner's."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = WanRMSNorm(dim, eps)
        self.norm_k = WanRMSNorm(dim, eps)


class WanBlock(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.norm1 = WanLayerNorm(cfg.dim, cfg.eps, elementwise_affine=False)
        self.self_attn = WanAttention(cfg.dim, cfg.eps)
        self.norm3 = WanLayerNorm(cfg.dim, cfg.eps, elementwise_affine=True)
        self.cross_attn = WanAttention(cfg.dim, cfg.eps)
        self.norm2 = WanLayerNorm(cfg.dim, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, cfg.dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, cfg.dim) / cfg.dim**0.5)


class WanHead(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        patch_volume = cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
        self.norm = WanLayerNorm(cfg.dim, cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.out_dim * patch_volume)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)


class WanModel(nn.Module):
    """Wan2.1 T2V DiT: the engine's own weight container (standalone use, tests, the demo model)."""

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.config = cfg
        self.patch_embedding = nn.Conv3d(cfg.in_dim, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, cfg.dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.dim, cfg.dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, cfg.dim * 6))
        self.blocks = nn.ModuleList([WanBlock(cfg) for _ in range(cfg.num_layers)])
        self.head = WanHead(cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.head.head.weight.dtype


def randomize_(model: nn.Module, seed: int, std: float, is_unit) -> None:
    """Seeded random weights in place (global RNG untouched): ones where ``is_unit(name, p)`` (norm scales), small
    biases, the rest at ``min(std, fan_in**-0.5)`` (modulations at ``std``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_unit(name, p):
                p.fill_(1.0)
            elif name.endswith("bias") and p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
            else:
                fan_in = p[0].numel() if p.ndim > 1 else p.numel()
                scale = std if name.endswith("modulation") else min(std, fan_in**-0.5)
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def random_wan(cfg: WanConfig, seed: int = 0, std: float = 0.05, dtype=torch.float32) -> WanModel:
    """A randomly initialised model for tests and shape benchmarks (seeded, global RNG untouched)."""
    model = WanModel(cfg)
    randomize_(model, seed, std, lambda name, p: name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")))
    return model.to(dtype)
