"""The best few scores of each row of a matrix product, fused in Triton: ``a @ b^T`` never reaches memory.

One program owns BLOCK_M rows of one (batch, head) and streams the columns of ``b`` through a tensor-core dot,
keeping each row's ``KP`` best scores and their columns in registers. A block only costs more than its dot when
one of its scores beats some row's current ``KP``-th best: then its best scores are taken out one at a time and
each replaces the row's lowest kept one while it is larger. The kept scores come out unsorted.
"""

import torch
import triton
import triton.language as tl

from .triton_common import autotune_configs, device_guard, upcast_dot_inputs

_CONFIGS = [
    # The first config is the only one the interpreter runs (it cannot benchmark).
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
]


@triton.autotune(configs=autotune_configs(_CONFIGS), key=["HEAD_DIM", "KP"])
@triton.jit
def _topk_scores_fwd(
    A, B, Vals, Idx, stride_ab, stride_an, stride_bb, stride_bn, stride_vb, stride_vn, n_rows, n_cols,
    HEAD_DIM: tl.constexpr, KP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    cols = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, KP)
    row_ok = offs_m < n_rows
    a = tl.load(A + pid_bh * stride_ab + offs_m[:, None] * stride_an + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    if UPCAST:
        a = a.to(tl.float32)
    top_v = tl.full([BLOCK_M, KP], float("-inf"), tl.float32)
    top_i = tl.zeros([BLOCK_M, KP], dtype=tl.int32)
    B += pid_bh * stride_bb
    for start in range(0, n_cols, BLOCK_N):
        offs_n = start + cols
        col_ok = offs_n < n_cols
        b = tl.load(B + offs_n[:, None] * stride_bn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        if UPCAST:
            b = b.to(tl.float32)
        s = tl.dot(a, tl.trans(b))
        s = tl.where(col_ok[None, :], s, float("-inf"))
        if tl.max(tl.max(s, 1) - tl.min(top_v, 1)) > 0:  # some row's kept scores are beaten
            for _ in tl.static_range(KP):
                best = tl.max(s, 1)
                where = tl.argmax(s, 1)
                low = tl.min(top_v, 1)
                slot = tl.argmin(top_v, 1)
                put = (slots[None, :] == slot[:, None]) & (best > low)[:, None]
                top_v = tl.where(put, best[:, None], top_v)
                top_i = tl.where(put, (start + where)[:, None], top_i)
                s = tl.where(cols[None, :] == where[:, None], float("-inf"), s)
    out = pid_bh * stride_vb + offs_m[:, None] * stride_vn + slots[None, :]
    tl.store(Vals + out, top_v, mask=row_ok[:, None])
    tl.store(Idx + out, top_i, mask=row_ok[:, None])


def topk_scores_triton(a: torch.Tensor, b: torch.Tensor, k: int):
    """a [BH, N, D], b [BH, M, D] (bf16/fp16/fp32, head dim a power of two >= 16): each row's ``k`` best scores
    (float32) and columns (int64), best first."""
    BH, N, D = a.shape
    M = b.shape[1]
    kp = max(2, triton.next_power_of_2(k))
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    vals = torch.empty(BH, N, kp, dtype=torch.float32, device=a.device)
    idx = torch.empty(BH, N, kp, dtype=torch.int32, device=a.device)

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_M"]), BH)

    with device_guard(a):
        _topk_scores_fwd[grid](a, b, vals, idx, a.stride(0), a.stride(1), b.stride(0), b.stride(1), vals.stride(0),
                               vals.stride(1), N, M, HEAD_DIM=D, KP=kp, UPCAST=upcast_dot_inputs(a.dtype))
    vals, order = vals.sort(dim=-1, descending=True)
    return vals[..., :k], idx.gather(-1, order[..., :k]).long()
