"""Stored K/V in int8 (``CacheSpec.kv_quant``): symmetric, one float32 scale per token (or TempCache group) and
head, absmax / 127. Per token, because keys differ in norm from token to token far more than from channel to
channel within one head's row, and a scale per row keeps every row's relative error at half a step of 1/127."""

from __future__ import annotations

import torch

KV_QUANTS = ("none", "int8")


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] -> int8 values and a float32 scale per row ([..., 1]), rounded to nearest (a zero row keeps
    scale 0). Quantizing a dequantized row gives back the same values and scale."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    q = torch.where(scale > 0, x / scale.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return q.round().clamp_(-127, 127).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)
