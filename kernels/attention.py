"""Public dense attention with a per-key logit bias: check the inputs, pick a backend, run it."""

import torch

from .checks import check_bias, check_qkv, resolve_scale
from .dispatch import choose_backend


def attention(q, k, v, bias=None, *, scale=None, return_lse=False, backend="auto"):
    """softmax(scale * q k^T + bias[key]) v over all keys, per (batch, head).

    q [B, H, Nq, D]; k, v [B, H, Nk, D] (one dtype: float32, float16 or bfloat16); bias float32 broadcastable
    to [B, H, Nk] with entries finite or -inf (e.g. log(count) of merged keys, -inf for empty slots). `scale`
    defaults to 1/sqrt(D). Output in q's dtype with fp32 accumulation; with `return_lse` also the natural-log
    LSE [B, H, Nq] in float32. A query that sees no key outputs zeros with lse = -inf.
    `backend`: "auto", "torch", "triton", "flex" or "flashinfer" (see `available_backends`).
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    bias = check_bias(bias, B, H, Nk, q.device)
    scale = resolve_scale(scale, D)
    name = choose_backend("attention", backend, q.device, dtype=q.dtype, head_dim=D)
    if Nk == 0 or Nq == 0:
        out = torch.zeros(B, H, Nq, D, dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, Nq), float("-inf"), dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    out, lse = _run(name, q, k, v, bias, scale, return_lse)
    return (out, lse) if return_lse else out


def _run(name, q, k, v, bias, scale, return_lse):
    if name == "triton":
        from .attention_triton import attention_triton

        return attention_triton(q, k, v, bias, scale, return_lse)
    if name == "flex":
        from .attention_flex import attention_flex

        return attention_flex(q, k, v, bias, scale, return_lse)
    if name == "flashinfer":
        from .attention_flashinfer import attention_flashinfer

        return attention_flashinfer(q, k, v, bias, scale, return_lse)
    from .attention_torch import attention_torch

    return attention_torch(q, k, v, bias, scale, return_lse)
