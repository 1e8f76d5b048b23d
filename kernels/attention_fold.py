"""Biased attention as plain, mask-free SDPA: the per-key bias folded exactly into one extra q/k coordinate.

With q' = [q, a] and k' = [k, bias / (a * s)], scale * q'.k' = scale * q.k + bias, so SDPA with no mask gives the
biased result exactly (up to one rounding of the extra coordinate). Without a mask, PyTorch can run its flash
kernel on CUDA; with a float mask it must use the memory-efficient (or cuDNN) kernel, and FlashAttention takes
no mask at all. The extra coordinate is padded to a multiple of 8 (the fused kernels' alignment), so the head
dim grows by 8; v is padded alike because the flash kernel wants one head dim for q, k and v.

A -inf bias (an empty slot) becomes a logit of NEG_LOGIT, whose exp is 0 in fp32; a (batch, head) whose keys
are all -inf outputs 0, the package's convention.
"""

import functools
import math

import torch
import torch.nn.functional as F

from .attention_torch import exact_lse

PAD = 8
NEG_LOGIT = -1.0e4
# Typical |bias| (log counts stay below ~12): sets the extra coordinate's size so neither factor overflows fp16.
BIAS_SCALE = 8.0


@functools.lru_cache(maxsize=64)
def _rounded(x: float, dtype: torch.dtype) -> float:
    """``x`` rounded to ``dtype`` (worked out once per value and dtype, on the host: no tensor per call)."""
    return float(torch.tensor(x, dtype=dtype))


def fold_bias(q, k, v, bias, scale: float):
    """(q', k', v') whose mask-free attention at `scale` equals biased attention of (q, k, v)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    a = _rounded(math.sqrt(BIAS_SCALE / scale), q.dtype)  # the value q' will hold, so k' compensates exactly
    logits = bias.expand(B, H, Nk).float().clamp(min=NEG_LOGIT)
    extra_k = (logits / (a * scale)).to(q.dtype).unsqueeze(-1)
    q_fold = torch.cat([q, q.new_full((B, H, Nq, 1), a), q.new_zeros(B, H, Nq, PAD - 1)], dim=-1)
    k_fold = torch.cat([k, extra_k, k.new_zeros(B, H, Nk, PAD - 1)], dim=-1)
    v_fold = F.pad(v, (0, PAD))
    return q_fold, k_fold, v_fold


def attention_fold(q, k, v, bias, scale: float, return_lse: bool, may_be_blind: bool = True):
    if bias is None:
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return out, (exact_lse(q, k, None, scale) if return_lse else None)
    D = q.shape[-1]
    q_fold, k_fold, v_fold = fold_bias(q, k, v, bias, scale)
    out = F.scaled_dot_product_attention(q_fold, k_fold, v_fold, scale=scale)[..., :D]
    if may_be_blind:
        blind = torch.isneginf(bias).all(dim=-1)[..., None, None]
        out = torch.where(blind, torch.zeros((), dtype=out.dtype, device=out.device), out)
    return out, (exact_lse(q, k, bias, scale) if return_lse else None)
