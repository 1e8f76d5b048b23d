"""Sparse attention in torch, exact for the layout, two ways.

- By code (codes of at most ``BY_CODE_MAX_BITS`` bits): queries are sorted by code, so each code is a
  contiguous run; its visible keys are the dense keys plus the sorted sparse keys of every code within the
  Hamming radius (contiguous runs too). One SDPA per (batch, head, code) over exactly those keys: no mask, no
  wasted pairs. This is the fast CPU path.
- By block (wider codes): each query block against a padded batch of its listed key blocks; the token rule
  and the bias become a float mask (-inf for padding and invisible pairs), and SDPA runs on
  [rows, 1, block_q, D] batches, in chunks that keep the gathered keys within a memory budget.
"""

import torch
import torch.nn.functional as F

from .attention_torch import attention_torch
from .hamming import flip_masks, within_radius
from .merge import merge_attention_states

CHUNK_BYTES = 256 * 2**20
BY_CODE_MAX_BITS = 8


def sparse_attention_torch(q, k, v, layout, bias, scale: float):
    if layout.bits <= BY_CODE_MAX_BITS:
        return sparse_attention_by_code(q, k, v, layout, bias, scale)
    return sparse_attention_by_block(q, k, v, layout, bias, scale)


def sparse_attention_by_code(q, k, v, layout, bias, scale: float):
    """Dense keys once for every query, then per (batch, head, code) only the sparse keys within the radius;
    the two parts are merged exactly by their log-sum-exps."""
    B, H, Nq, D = q.shape
    n_codes = 2**layout.bits
    nd = layout.n_dense
    q_sorted, k_sorted, v_sorted = layout.sort_queries(q), layout.sort_keys(k), layout.sort_keys(v)
    key_bias = layout.sort_key_bias(bias)
    parts_out, parts_lse = [], []
    if nd:
        dense_bias = None if key_bias is None else key_bias[..., :nd]
        o, lse = attention_torch(q_sorted, k_sorted[:, :, :nd], v_sorted[:, :, :nd], dense_bias, scale, True)
        parts_out.append(o)
        parts_lse.append(lse)
    out = torch.zeros_like(q_sorted)
    out_lse = torch.full((B, H, Nq), float("-inf"), device=q.device)
    bounds = torch.arange(n_codes + 1, device=q.device).expand(B, H, -1).contiguous()
    q_runs = torch.searchsorted(layout.q_codes_sorted.long().contiguous(), bounds)
    k_runs = nd + torch.searchsorted(layout.k_codes_sorted[..., nd:].long().contiguous(), bounds)
    probes = flip_masks(layout.bits, layout.radius).tolist()
    for b in range(B):
        for h in range(H):
            qr, kr = q_runs[b, h].tolist(), k_runs[b, h].tolist()
            for code in range(n_codes):
                q0, q1 = qr[code], qr[code + 1]
                runs = [(kr[p], kr[p + 1]) for p in (code ^ m for m in probes) if kr[p] < kr[p + 1]]
                if q0 == q1 or not runs:
                    continue
                keys: slice | torch.Tensor
                if len(runs) == 1:  # one bucket: a slice, no copy
                    keys = slice(*runs[0])
                else:
                    keys = torch.cat([torch.arange(a, z, device=q.device) for a, z in runs])
                code_bias = None if key_bias is None else key_bias[b, h, keys][None, None]
                o, lse = attention_torch(q_sorted[b, h, q0:q1][None, None], k_sorted[b, h, keys][None, None],
                                         v_sorted[b, h, keys][None, None], code_bias, scale, True)
                out[b, h, q0:q1] = o[0, 0]
                out_lse[b, h, q0:q1] = lse[0, 0]
    parts_out.append(out)
    parts_lse.append(out_lse)
    merged, _ = merge_attention_states(parts_out, parts_lse)
    return layout.unsort_queries(merged)


def sparse_attention_by_block(q, k, v, layout, bias, scale: float):
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
