"""Flash-attention forward with a per-key logit bias, in Triton.

One program owns BLOCK_M queries of one (batch, head) and streams every key block through an online softmax in
the exp2 domain (the bias is multiplied by log2 e). Accumulation is fp32. A query whose keys are all -inf keeps
its finite running max of -1e30, sums to 0 and outputs 0 with lse = -inf.
"""

import torch
import triton
import triton.language as tl

from .triton_common import autotune_configs, device_guard, ieee_fp32_dot, upcast_dot_inputs

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
SUPPORTED_HEAD_DIMS = (64, 128)

_CONFIGS = [
    # The first config is the only one the interpreter runs (it cannot benchmark).
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
]


@triton.jit
def _dot(a, b, FP32_IEEE: tl.constexpr):
    if FP32_IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v, FP32_IEEE: tl.constexpr):
    """Fold one block of base-2 logits `qk` [M, N] and values `v` [N, D] into the running state."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_IEEE)
    return acc, l_i, m_new


@triton.jit
def _attend_key_block(
    acc, l_i, m_i, q, K, V, bias_row, start_n, n_keys, stride_kn, stride_vn, stride_bn, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, MASK_TAIL: tl.constexpr,
    UPCAST: tl.constexpr, FP32_IEEE: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_range = offs_n < n_keys
    if MASK_TAIL:
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=in_range[:, None], other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :], mask=in_range[:, None], other=0.0)
    else:
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :])
        v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :])
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk = _dot(q, tl.trans(k), FP32_IEEE) * qk_scale
    if HAS_BIAS:
        b = tl.load(bias_row + offs_n * stride_bn, mask=in_range, other=float("-inf"))
        qk += b[None, :] * 1.4426950408889634
    if MASK_TAIL:
        qk = tl.where(in_range[None, :], qk, float("-inf"))
    return online_softmax_step(acc, l_i, m_i, qk, v, FP32_IEEE)


# Tuned per head dim, bias, precision, dtypes and power-of-two class of the key count: a rollout whose cache grows
# key by key retunes a handful of times, not at every length.
@triton.autotune(configs=autotune_configs(_CONFIGS), key=["keys_class", "HEAD_DIM", "HAS_BIAS", "FP32_IEEE"])
@triton.jit
def _attention_fwd(
    Q, K, V, Bias, Out, Lse,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_bb, stride_bh, stride_bn, stride_ob, stride_oh, stride_on,
    n_heads, n_queries, n_keys, keys_class, qk_scale,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_LSE: tl.constexpr, UPCAST: tl.constexpr,
    FP32_IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_queries

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    bias_row = Bias + b * stride_bb + h * stride_bh

    # Finite start: rows that see only -inf keep m = -1e30, so exp2(-inf - m) = 0 and nothing turns NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    n_full = (n_keys // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_full, BLOCK_N):
        acc, l_i, m_i = _attend_key_block(
            acc, l_i, m_i, q, K, V, bias_row, start_n, n_keys, stride_kn, stride_vn, stride_bn, qk_scale,
            HEAD_DIM, BLOCK_N, HAS_BIAS, False, UPCAST, FP32_IEEE,
        )
    if n_full < n_keys:
        acc, l_i, m_i = _attend_key_block(
            acc, l_i, m_i, q, K, V, bias_row, n_full, n_keys, stride_kn, stride_vn, stride_bn, qk_scale,
            HEAD_DIM, BLOCK_N, HAS_BIAS, True, UPCAST, FP32_IEEE,
        )

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = tl.where(seen, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        tl.store(Lse + pid_bh * n_queries + offs_m, lse, mask=row_ok)


def attention_triton(q, k, v, bias, scale: float, return_lse: bool):
    """Run the kernel for head dims 64 and 128; other head dims take the torch path."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if D not in SUPPORTED_HEAD_DIMS:
        from .attention_torch import attention_torch

        return attention_torch(q, k, v, bias, scale, return_lse)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(B, H, Nq, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else out
    bias_view = bias.expand(B, H, Nk) if bias is not None else q
    bias_strides = bias_view.stride() if bias is not None else (0, 0, 0)

    def grid(meta):
        return (triton.cdiv(Nq, meta["BLOCK_M"]), B * H)

    with device_guard(q):
        _attention_fwd[grid](
            q, k, v, bias_view, out, lse,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *bias_strides, *out.stride()[:3],
            H, Nq, Nk, Nk.bit_length(), scale * LOG2E,
            HEAD_DIM=D, HAS_BIAS=bias is not None, WRITE_LSE=return_lse,
            UPCAST=upcast_dot_inputs(q.dtype), FP32_IEEE=ieee_fp32_dot(q.dtype),
        )
    return out, (lse if return_lse else None)
