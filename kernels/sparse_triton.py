"""Block-sparse flash attention over a bucket layout, in Triton.

Tokens arrive bucket-sorted. One program owns one query block of one (batch, head) and visits only the key
blocks its layout lists (`kv_idx[:kv_num]`). Inside a block the token rule decides: key j is visible iff
j < n_dense or popcount(q_code xor k_code) <= RADIUS. The bias is added in the exp2 domain; rows that see
nothing output 0 (finite running max, clamped denominator).
"""

import torch
import triton
import triton.language as tl

from .attention_triton import LOG2E, _dot, online_softmax_step
from .triton_common import autotune_configs, device_guard, ieee_fp32_dot, upcast_dot_inputs

_CONFIGS = [
    # Tile sizes come from the layout; only warps and pipelining depth are tuned.
    triton.Config({}, num_warps=4, num_stages=3),
    triton.Config({}, num_warps=8, num_stages=3),
    triton.Config({}, num_warps=4, num_stages=2),
    triton.Config({}, num_warps=4, num_stages=4),
]


@triton.jit
def _popcount16(x):
    x = x & 0xFFFF
    x = x - ((x >> 1) & 0x5555)
    x = (x & 0x3333) + ((x >> 2) & 0x3333)
    x = (x + (x >> 4)) & 0x0F0F
    return (x + (x >> 8)) & 0x1F


@triton.autotune(configs=autotune_configs(_CONFIGS), key=["HEAD_DIM", "BLOCK_M", "BLOCK_N", "HAS_BIAS", "FP32_IEEE"])
@triton.jit
def _sparse_attention_fwd(
    Q, K, V, Bias, QCodes, KCodes, KvNum, KvIdx, Out,
    stride_qbh, stride_qn, stride_kbh, stride_kn, stride_vbh, stride_vn, stride_obh, stride_on,
    n_queries, n_keys, n_dense, n_qblocks, max_kv_blocks, qk_scale,
    RADIUS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, FP32_IEEE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_queries

    q_ptrs = Q + pid_bh * stride_qbh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_code = tl.load(QCodes + pid_bh * n_queries + offs_m, mask=row_ok, other=0)
    K += pid_bh * stride_kbh
    V += pid_bh * stride_vbh
    k_codes = KCodes + pid_bh * n_keys
    bias_row = Bias + pid_bh * n_keys
    block_row = pid_bh * n_qblocks + pid_m
    n_visits = tl.load(KvNum + block_row)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for i in range(0, n_visits):
        kb = tl.load(KvIdx + block_row * max_kv_blocks + i)
        offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        in_range = offs_n < n_keys
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=in_range[:, None], other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :], mask=in_range[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        k_code = tl.load(k_codes + offs_n, mask=in_range, other=0)
        if RADIUS == 0:
            near = q_code[:, None] == k_code[None, :]
        else:
            near = _popcount16(q_code[:, None] ^ k_code[None, :]) <= RADIUS
        visible = ((offs_n < n_dense)[None, :] | near) & in_range[None, :]
        qk = _dot(q, tl.trans(k), FP32_IEEE) * qk_scale
        if HAS_BIAS:
            b = tl.load(bias_row + offs_n, mask=in_range, other=float("-inf"))
            qk += b[None, :] * 1.4426950408889634
        qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, FP32_IEEE)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(Out + pid_bh * stride_obh + offs_m[:, None] * stride_on + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def sparse_attention_triton(q, k, v, layout, bias, scale: float):
    """Head dims 64 and 128 run the kernel; other head dims take the torch path."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if D not in (64, 128):
        from .sparse_torch import sparse_attention_torch

        return sparse_attention_torch(q, k, v, layout, bias, scale)
    qs = layout.sort_queries(q).reshape(B * H, Nq, D)
    ks = layout.sort_keys(k).reshape(B * H, Nk, D)
    vs = layout.sort_keys(v).reshape(B * H, Nk, D)
    key_bias = layout.sort_key_bias(bias)
    key_bias = key_bias.contiguous() if key_bias is not None else qs
    out = torch.empty_like(qs)
    n_qb = layout.num_q_blocks
    with device_guard(q):
        _sparse_attention_fwd[(n_qb, B * H)](
            qs, ks, vs, key_bias, layout.q_codes_sorted, layout.k_codes_sorted, layout.kv_num, layout.kv_idx, out,
            qs.stride(0), qs.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
            out.stride(0), out.stride(1),
            Nq, Nk, layout.n_dense, n_qb, layout.kv_idx.shape[-1], scale * LOG2E,
            RADIUS=layout.radius, HEAD_DIM=D, BLOCK_M=layout.block_q, BLOCK_N=layout.block_k,
            HAS_BIAS=bias is not None, UPCAST=upcast_dot_inputs(q.dtype), FP32_IEEE=ieee_fp32_dot(q.dtype),
        )
    return layout.unsort_queries(out.view(B, H, Nq, D))
