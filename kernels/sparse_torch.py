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
    k_blocks = _pad_to(layout.sort_keys(k), 2, n_kb * bk, 0.0).view(B * H * n_kb, bk, D)
    v_blocks = _pad_to(layout.sort_keys(v), 2, n_kb * bk, 0.0).view(B * H * n_kb, bk, D)
    key_bias = layout.sort_key_bias(bias)
    if key_bias is None:
        key_bias = torch.zeros(B, H, Nk, device=q.device)
    key_bias = _pad_to(key_bias, 2, n_kb * bk, float("-inf")).view(B * H * n_kb, bk)
    q_codes = _pad_to(layout.q_codes_sorted, 2, n_qb * bq, 0).view(rows, bq)
    k_codes = _pad_to(layout.k_codes_sorted, 2, n_kb * bk, 0).view(B * H * n_kb, bk)
    # Queries with no visible finite-bias key output 0 by convention (CUDA SDPA may give NaN there). When every
    # (batch, head) has a finite dense key, every query sees something and the count can be skipped.
    finite_keys = None if bias is None else layout.sort_key_bias(bias) > float("-inf")
    dense_seen = layout.n_dense > 0 and (finite_keys is None or bool(finite_keys[..., : layout.n_dense].any(-1).all()))
    if dense_seen:
        seen = torch.ones(rows, bq, 1, dtype=torch.bool, device=q.device)
    else:
        seen = _pad_to(layout.visible_keys_per_query(finite_keys) > 0, 2, n_qb * bq, False).view(rows, bq, 1)

    kv_num = layout.kv_num.reshape(rows).long()
    kv_idx = layout.kv_idx.reshape(rows, -1).long()
    # Rows in order of block count, so each chunk pads its block lists to about the same length.
    order = torch.sort(kv_num, stable=True).indices
    kv_num_sorted = kv_num[order].tolist()

    out = torch.zeros(rows, bq, D, dtype=q.dtype, device=q.device)
    # Bytes per row and listed block: gathered k and v, the fp32 mask, the int32 codes and the bool rule.
    block_bytes = bk * (2 * D * q.element_size() + bq * (4 + 4 + 1 + q.element_size()))
    start = 0
    while start < rows:
        n_blocks = kv_num_sorted[start]
        step = max(1, CHUNK_BYTES // (block_bytes * max(1, n_blocks)))
        stop = min(rows, start + step)
        n_blocks = kv_num_sorted[stop - 1]  # the largest in this chunk
        chunk = order[start:stop]
        start = stop
        if n_blocks == 0:
            continue  # nothing listed: these rows stay zero
        idx = kv_idx[chunk, :n_blocks]
        listed = torch.arange(n_blocks, device=q.device) < kv_num[chunk, None]
        # Row-wise index_select on flat block tables: much faster than 2-D advanced indexing.
        flat = ((chunk // n_qb)[:, None] * n_kb + idx).flatten()
        count = len(chunk)
        keys = k_blocks.index_select(0, flat).view(count, n_blocks * bk, D)
        values = v_blocks.index_select(0, flat).view(count, n_blocks * bk, D)
        kb = key_bias.index_select(0, flat).view(count, n_blocks, bk)
        kb = torch.where(listed[..., None], kb, float("-inf")).flatten(1)
        codes = k_codes.index_select(0, flat).view(count, 1, n_blocks * bk)
        visible = within_radius(q_codes.index_select(0, chunk).unsqueeze(-1), codes, layout.radius)
        if layout.n_dense:
            key_pos = (idx[..., None] * bk + torch.arange(bk, device=q.device)).view(count, 1, -1)
            visible |= key_pos < layout.n_dense
        mask = torch.where(visible, kb[:, None, :], float("-inf")).to(q.dtype)
        o = F.scaled_dot_product_attention(
            q_rows.index_select(0, chunk)[:, None], keys[:, None], values[:, None], attn_mask=mask[:, None], scale=scale
        )[:, 0]
        o = torch.where(seen.index_select(0, chunk), o, torch.zeros((), dtype=o.dtype, device=o.device))
        out.index_copy_(0, chunk, o)
    out = out.view(B, H, n_qb * bq, D)[:, :, :Nq]
    return layout.unsort_queries(out)


def _pad_to(t, dim, length, value):
    extra = length - t.shape[dim]
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad, value=value)
