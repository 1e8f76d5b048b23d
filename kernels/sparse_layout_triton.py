"""The block lists of a sparse layout in two Triton kernels (codes of at most 8 bits), instead of some thirty
torch operators.

1. One program per (head, key block) marks which of the 2**bits codes its sparse keys hold (a byte per code).
2. One program per (head, query block) marks the codes within the Hamming radius of its queries (its probe set),
   then walks the key blocks in tiles: a block is visited if it is dense or holds a probed code. The visited
   blocks are written in ascending order with a running count (a prefix sum per tile), the rest of the row with 0.

The same lists as the torch planner, entry for entry (exact at code level, as its bitmaps are).
"""

import torch
import triton
import triton.language as tl

from .hamming import code_lanes
from .triton_common import device_guard

KB_TILE = 16  # key blocks handled per step of the walk


@triton.jit
def _key_code_sets_kernel(
    KCodes, KSets, n_keys, n_kblocks,
    N_CODES: tl.constexpr, BLOCK_K: tl.constexpr,
):
    kb = tl.program_id(0)
    bh = tl.program_id(1)
    offs = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    codes = tl.load(KCodes + bh * n_keys + offs, mask=offs < n_keys, other=-2)
    held = tl.max((codes[:, None] == tl.arange(0, N_CODES)[None, :]).to(tl.int32), axis=0)
    tl.store(KSets + (bh * n_kblocks + kb) * N_CODES + tl.arange(0, N_CODES), held.to(tl.int8))


@triton.jit
def _visit_lists_kernel(
    QCodes, KSets, KvNum, KvIdx,
    n_queries, n_kblocks, n_qblocks, n_dense_blocks, radius,
    N_CODES: tl.constexpr, BITS: tl.constexpr, BLOCK_Q: tl.constexpr, KB_TILE: tl.constexpr,
):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    offs = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q = tl.load(QCodes + bh * n_queries + offs, mask=offs < n_queries, other=-1)
    diff = q[:, None] ^ tl.arange(0, N_CODES)[None, :]
    distance = tl.zeros([BLOCK_Q, N_CODES], dtype=tl.int32)
    for bit in tl.static_range(BITS):
        distance += (diff >> bit) & 1
    probed = tl.max(((distance <= radius) & (q[:, None] >= 0)).to(tl.int32), axis=0)  # [N_CODES]

    row = KvIdx + (bh * n_qblocks + qb) * n_kblocks
    count = 0
    for kb0 in range(0, n_kblocks, KB_TILE):
        kb = kb0 + tl.arange(0, KB_TILE)
        inside = kb < n_kblocks
        sets = tl.load(KSets + (bh * n_kblocks + kb)[:, None] * N_CODES + tl.arange(0, N_CODES)[None, :],
                       mask=inside[:, None], other=0).to(tl.int32)
        hits = tl.sum(sets * probed[None, :], axis=1)
        visited = inside & ((hits > 0) | (kb < n_dense_blocks))
        flags = visited.to(tl.int32)
        slot = count + tl.cumsum(flags, axis=0) - 1
        tl.store(row + slot, kb, mask=visited)
        count += tl.sum(flags, axis=0)
    for p0 in range(0, n_kblocks, KB_TILE):
        p = p0 + tl.arange(0, KB_TILE)
        tl.store(row + p, tl.zeros([KB_TILE], dtype=tl.int32), mask=(p >= count) & (p < n_kblocks))
    tl.store(KvNum + bh * n_qblocks + qb, count)


def block_lists_triton(q_sorted, k_sorted, n_dense: int, block_q: int, block_k: int, radius: int, bits: int):
    """(kv_num [B, H, nQB] int32, kv_idx [B, H, nQB, nKB] int32) from sorted int32 codes (dense keys
    -1); `bits` <= 8 and `radius` < `bits` (the torch planner's bitmap case)."""
    B, H, Nq = q_sorted.shape
    Nk = k_sorted.shape[-1]
    n_qb, n_kb = -(-Nq // block_q), -(-Nk // block_k)
    n_codes = code_lanes(bits)
    device = q_sorted.device
    q_sorted, k_sorted = q_sorted.contiguous(), k_sorted.contiguous()
    kv_num = torch.empty(B, H, n_qb, dtype=torch.int32, device=device)
    kv_idx = torch.empty(B, H, n_qb, n_kb, dtype=torch.int32, device=device)
    if n_qb == 0:
        return kv_num, kv_idx
    key_sets = torch.empty(B * H, max(1, n_kb), n_codes, dtype=torch.int8, device=device)
    with device_guard(q_sorted):
        if n_kb:
            _key_code_sets_kernel[(n_kb, B * H)](k_sorted, key_sets, Nk, n_kb, N_CODES=n_codes, BLOCK_K=block_k)
        _visit_lists_kernel[(n_qb, B * H)](
            q_sorted, key_sets, kv_num, kv_idx,
            Nq, n_kb, n_qb, -(-n_dense // block_k), radius,
            N_CODES=n_codes, BITS=bits, BLOCK_Q=block_q, KB_TILE=KB_TILE,
        )
    return kv_num, kv_idx
