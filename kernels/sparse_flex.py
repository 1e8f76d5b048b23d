"""Block-sparse attention through FlexAttention: a BlockMask built straight from the layout's block lists.

`BlockMask.from_kv_blocks` takes the lists as they are (no `create_block_mask` pass over every pair). Key
blocks made only of dense keys are passed as "full" blocks, which skip the mask_mod; the mask_mod applies the
token rule in the partial blocks. The BlockMask is cached on the layout.
"""

import torch
import torch.nn.functional as F

from .attention_flex import bias_score_mod, flex_attention_call, zero_unseen_queries
from .hamming import within_radius


def sparse_attention_flex(q, k, v, layout, bias, scale: float):
    qs, ks, vs = layout.sort_queries(q), layout.sort_keys(k), layout.sort_keys(v)
    key_bias = layout.sort_key_bias(bias)
    score_mod = bias_score_mod(key_bias.contiguous()) if key_bias is not None else None
    # The flex kernel's tiles must divide the BlockMask's blocks.
    tiles = {"BLOCK_M": min(layout.block_q, 128), "BLOCK_N": min(layout.block_k, 128)}
    out, lse = flex_attention_call(
        qs, ks, vs, score_mod=score_mod, block_mask=flex_block_mask(layout), scale=scale, kernel_options=tiles
    )
    out, _ = zero_unseen_queries(out, lse)
    return layout.unsort_queries(out)


def flex_block_mask(layout):
    """The layout as a FlexAttention BlockMask (built once, cached on the layout)."""
    if "flex_block_mask" not in layout.cache:
        layout.cache["flex_block_mask"] = _build_block_mask(layout)
    return layout.cache["flex_block_mask"]


def _build_block_mask(layout):
    from torch.nn.attention.flex_attention import BlockMask

    B, H, Nq, Nk = layout.shape
    n_qb, n_kb = layout.num_q_blocks, layout.num_k_blocks
    # Every query block lists all dense key blocks first (lowest indices); the purely dense ones are "full".
    n_full = layout.n_dense // layout.block_k
    partial_num = (layout.kv_num - n_full).contiguous()
    partial_idx = layout.kv_idx[..., n_full:]
    partial_idx = F.pad(partial_idx, (0, n_kb - partial_idx.shape[-1])).contiguous()
    full_num = torch.full_like(layout.kv_num, n_full)
    full_idx = torch.arange(n_kb, dtype=torch.int32, device=layout.device).expand(B, H, n_qb, n_kb).contiguous()

    q_codes, k_codes = layout.q_codes_sorted, layout.k_codes_sorted
    # A tensor, not an int: the compiled kernel takes captured tensors as inputs but specialises on ints, and
    # n_dense changes from chunk to chunk. The radius takes a handful of values, so it may specialise.
    n_dense = torch.tensor(layout.n_dense, dtype=torch.int32, device=layout.device)
    radius = layout.radius

    def bucket_rule(b, h, q_idx, kv_idx):
        return (kv_idx < n_dense) | within_radius(q_codes[b, h, q_idx], k_codes[b, h, kv_idx], radius)

    return BlockMask.from_kv_blocks(
        partial_num,
        partial_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(layout.block_q, layout.block_k),
        mask_mod=bucket_rule,
        seq_lengths=(Nq, Nk),
    )
