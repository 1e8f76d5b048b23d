"""Fused sign-LSH in Triton: project a token tile on one table's planes, take signs, pack the bits.

Bits are packed with int32 sums of distinct powers of two below 2**16, so the reduction never overflows
(the interpreter raises on int32 overflow where a GPU would wrap).
"""

import torch
import triton
import triton.language as tl

from .triton_common import device_guard

BLOCK_N = 64


@triton.jit
def _lsh_codes_kernel(
    X, Planes, Codes,
    stride_xb, stride_xh, stride_xn, stride_ph, stride_pd, stride_pk,
    n_heads, n_tokens, head_dim, n_tables,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_BITS: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    table = tl.program_id(2)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_BITS)
    row_ok = offs_n < n_tokens
    bit_ok = offs_k < BITS

    proj = tl.zeros([BLOCK_N, BLOCK_BITS], dtype=tl.float32)
    for d0 in range(0, head_dim, BLOCK_D):
        d = d0 + offs_d
        x = tl.load(X + b * stride_xb + h * stride_xh + offs_n[:, None] * stride_xn + d[None, :],
                    mask=row_ok[:, None] & (d[None, :] < head_dim), other=0.0).to(tl.float32)
        p = tl.load(Planes + h * stride_ph + d[:, None] * stride_pd + (table * BITS + offs_k)[None, :] * stride_pk,
                    mask=(d[:, None] < head_dim) & bit_ok[None, :], other=0.0)
        proj += tl.dot(x, p, input_precision="ieee")
    weights = tl.where(bit_ok, 1 << offs_k, 0)
    code = tl.sum(tl.where(proj > 0, weights[None, :], 0), axis=1)
    tl.store(Codes + pid_bh * n_tokens * n_tables + offs_n * n_tables + table, code, mask=row_ok)


def lsh_codes_triton(x, planes, bits: int) -> torch.Tensor:
    B, H, N, D = x.shape
    tables = planes.shape[2] // bits
    x = x if x.stride(-1) == 1 else x.contiguous()
    codes = torch.empty(B, H, N, tables, dtype=torch.int32, device=x.device)
    block_d = min(128, max(16, triton.next_power_of_2(D)))
    with device_guard(x):
        _lsh_codes_kernel[(triton.cdiv(N, BLOCK_N), B * H, tables)](
            x, planes, codes,
            *x.stride()[:3], *planes.stride(),
            H, N, D, tables,
            BITS=bits, BLOCK_N=BLOCK_N, BLOCK_D=block_d, BLOCK_BITS=max(16, triton.next_power_of_2(bits)),
        )
    return codes
