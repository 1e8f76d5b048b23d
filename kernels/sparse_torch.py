"""Block-sparse attention in torch: each query block against a padded batch of its listed key blocks.

Exact for the layout: the token rule and the bias become a float mask over the gathered keys (-inf for
padding and invisible pairs), and SDPA runs on [rows, 1, block_q, D] batches. Rows are processed in chunks so
the gathered keys and the mask stay within a fixed memory budget.
"""

import torch
import torch.nn.functional as F

from .hamming import within_radius

CHUNK_BYTES = 256 * 2**20


def sparse_attention_torch(q, k, v, layout, bias, scale: float):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    bq, bk = layout.block_q, layout.block_k
    n_qb, n_kb = layout.num_q_blocks, layout.num_k_blocks
    rows = B * H * n_qb

    q_rows = _pad_to(layout.sort_queries(q), 2, n_qb * bq, 0.0).view(rows, bq, D)
    k_blocks = _pad_to(layout.sort_keys(k), 2, n_kb * bk, 0.0).view(B * H, n_kb, bk, D)
    v_blocks = _pad_to(layout.sort_keys(v), 2, n_kb * bk, 0.0).view(B * H, n_kb, bk, D)
    key_bias = layout.sort_key_bias(bias)
    if key_bias is None:
        key_bias = torch.zeros(B, H, Nk, device=q.device)
    key_bias = _pad_to(key_bias, 2, n_kb * bk, float("-inf")).view(B * H, n_kb, bk)
    q_codes = _pad_to(layout.q_codes_sorted, 2, n_qb * bq, 0).view(rows, bq)
    k_codes = _pad_to(layout.k_codes_sorted, 2, n_kb * bk, 0).view(B * H, n_kb, bk)
    kv_num = layout.kv_num.reshape(rows).long()
    kv_idx = layout.kv_idx.reshape(rows, -1).long()
    kv_num_host = kv_num.tolist()

    out = torch.zeros(rows, bq, D, dtype=q.dtype, device=q.device)
    max_kb = kv_idx.shape[1]
    # Per row: gathered k and v, the fp32 mask and the int32 codes.
    row_bytes = max_kb * bk * (2 * D * q.element_size() + bq * (4 + 4 + q.element_size()))
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        n_blocks = max(kv_num_host[start:stop])
        if n_blocks == 0:
            continue  # nothing visible: rows stay zero
        idx = kv_idx[start:stop, :n_blocks]
        listed = torch.arange(n_blocks, device=q.device) < kv_num[start:stop, None]
        bh = (torch.arange(start, stop, device=q.device) // n_qb)[:, None]
        keys = k_blocks[bh, idx].flatten(1, 2)
        values = v_blocks[bh, idx].flatten(1, 2)
        key_pos = (idx[..., None] * bk + torch.arange(bk, device=q.device)).flatten(1)
        codes = k_codes[bh, idx].flatten(1)
        kb = torch.where(listed[..., None], key_bias[bh, idx], float("-inf")).flatten(1)
        visible = (key_pos < layout.n_dense)[:, None, :] | within_radius(
            q_codes[start:stop, :, None], codes[:, None, :], layout.radius
        )
        mask = torch.where(visible, kb[:, None, :], float("-inf"))
        o = F.scaled_dot_product_attention(
            q_rows[start:stop, None], keys[:, None], values[:, None], attn_mask=mask[:, None].to(q.dtype), scale=scale
        )[:, 0]
        # Queries with no visible key: 0 by convention (CUDA SDPA may give NaN there).
        seen = (mask > float("-inf")).any(-1, keepdim=True)
        out[start:stop] = torch.where(seen, o, torch.zeros((), dtype=o.dtype, device=o.device))
    out = out.view(B, H, n_qb * bq, D)[:, :, :Nq]
    return layout.unsort_queries(out)


def _pad_to(t, dim, length, value):
    extra = length - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad, value=value)
