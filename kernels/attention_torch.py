"""Biased attention with PyTorch SDPA: the CPU path and the reference for every other backend.

The per-key bias goes in as a float mask broadcast over queries, `[B, H, 1, Nk]`: on CPU that costs ~3 % over
no mask, where a dense `[B, H, Nq, Nk]` mask (bool especially) costs far more memory and time.
"""

import torch
import torch.nn.functional as F

# Bytes of fp32 logits materialised at once when the exact LSE is requested.
LSE_CHUNK_BYTES = 256 * 2**20

# ATen's CPU flash kernel (what SDPA runs on a CPU) also returns the LSE it computes anyway; used for fp32
# inputs only, since with fp16/bf16 its LSE is off by up to 1e-3.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attention_torch(q, k, v, bias, scale: float, return_lse: bool, may_be_blind: bool = True):
    mask = None if bias is None else bias.to(q.dtype).unsqueeze(2)
    if return_lse and q.device.type == "cpu" and q.dtype == torch.float32 and _FLASH_CPU is not None:
        try:
            out, lse = _FLASH_CPU(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        except (RuntimeError, TypeError):
            pass  # an ATen without this op or these arguments: SDPA, then the LSE explicitly
        else:
            lse = lse.float()
            if bias is not None:
                # ATen reports lse 0 for a query that sees no finite key; our convention is out 0, lse -inf.
                seen = (bias > float("-inf")).any(dim=-1, keepdim=True)
                out = torch.where(seen[..., None], out, torch.zeros((), dtype=out.dtype))
                lse = torch.where(seen, lse, float("-inf"))
            return out, lse
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if bias is not None and may_be_blind:
        # A (b, h) whose keys are all -inf sees nothing: our convention is 0 (CUDA SDPA may return NaN).
        blind = torch.isneginf(bias).all(dim=-1)[..., None, None]
        out = torch.where(blind, torch.zeros((), dtype=out.dtype, device=out.device), out)
    if not return_lse:
        return out, None
    return out, exact_lse(q, k, bias, scale)


def exact_lse(q, k, bias, scale: float) -> torch.Tensor:
    """Natural-log LSE of `scale * q.k + bias` per query, in fp32, chunked over queries."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device)
    k_t = k.float().transpose(-1, -2)
    rows = max(1, LSE_CHUNK_BYTES // max(1, B * H * Nk * 4))
    for start in range(0, Nq, rows):
        logits = torch.matmul(q[:, :, start : start + rows].float(), k_t) * scale
        if bias is not None:
            logits = logits + bias.unsqueeze(2)
        lse[:, :, start : start + rows] = torch.logsumexp(logits, dim=-1)
    return lse
