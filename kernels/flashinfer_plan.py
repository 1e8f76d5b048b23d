"""Pure-torch planning for FlashInfer, which has no per-key bias input.

The bias is folded in exactly by splitting: attention is cut into requests, each pairing a set of query rows
with a set of keys that all carry ONE bias value c. A request's plain attention gives (o_r, lse_r); adding
c to lse_r (in the right base) and merging every request of a query by LSE gives the biased result
(Lemma 5.1 / method.md 3.3 trick 3). Keys with -inf bias are never listed.

Requests map onto FlashInfer's paged prefill with one head and page size 1, so each request's keys can be
any gathered token list: the same machinery `VariableBlockSparseAttentionWrapper` plans internally, here
with the bias split added. Dense attention is the case of one query group and one dense key group.
"""

from dataclasses import dataclass, field

import torch

from .errors import BackendUnavailableError
from .hamming import flip_masks, num_flip_masks

MAX_PROBE_TARGETS = 2**26


@dataclass(eq=False)
class AttentionRequests:
    """Attention as independent requests; indices refer to the flattened [B*H*N] rows in original order."""

    q_rows: torch.Tensor  # [total_q] int64: query rows of request r are q_rows[qo_indptr[r]:qo_indptr[r+1]]
    qo_indptr: torch.Tensor  # [R + 1] int32
    kv_tokens: torch.Tensor  # [total_kv] int32: key rows of request r are kv_tokens[kv_indptr[r]:kv_indptr[r+1]]
    kv_indptr: torch.Tensor  # [R + 1] int32
    request_bias: torch.Tensor  # [R] float32: the one bias value of request r's keys
    num_query_rows: int  # B * H * Nq
    cache: dict = field(default_factory=dict, repr=False)  # FlashInfer wrappers planned for these requests

    @property
    def num_requests(self) -> int:
        return self.request_bias.numel()

    def row_bias(self) -> torch.Tensor:
        """[total_q] float32: the bias value of the request each query row belongs to."""
        lengths = (self.qo_indptr[1:] - self.qo_indptr[:-1]).long()
        return self.request_bias.repeat_interleave(lengths)


def plan_dense_requests(bias, B: int, H: int, Nq: int, Nk: int, device) -> AttentionRequests:
    """Requests for dense attention: per (b, h), one request per distinct finite bias value."""
    q_codes = torch.zeros(B * H, Nq, dtype=torch.int64, device=device)
    q_order = torch.arange(Nq, device=device).expand(B * H, Nq)
    k_groups = torch.full((B * H, Nk), -1, dtype=torch.int64, device=device)
    k_order = torch.arange(Nk, device=device).expand(B * H, Nk)
    k_bias = _flat_bias(bias, B, H, Nk, device)
    return _plan(q_codes, q_order, k_groups, k_order, k_bias, radius=0, bits=1)


def plan_sparse_requests(layout, bias) -> AttentionRequests:
    """Requests for a sparse layout: per (b, h, query bucket), one request per visible (key bucket, bias value),
    the dense keys counting as one more bucket that every query sees."""
    B, H, Nq, Nk = layout.shape
    k_bias = layout.sort_key_bias(bias)
    k_bias = k_bias.reshape(B * H, Nk) if k_bias is not None else torch.zeros(B * H, Nk, device=layout.device)
    return _plan(
        layout.q_codes_sorted.reshape(B * H, Nq).long(),
        layout.q_perm.reshape(B * H, Nq),
        layout.k_codes_sorted.reshape(B * H, Nk).long(),
        layout.k_perm.reshape(B * H, Nk),
        k_bias,
        radius=layout.radius,
        bits=layout.bits,
    )


def _plan(q_codes, q_order, k_groups, k_order, k_bias, *, radius: int, bits: int) -> AttentionRequests:
    """q_codes/q_order: [BH, Nq] query codes sorted ascending and the original index of each. k_groups/k_order/
    k_bias: [BH, Nk] key bucket (-1 = dense, seen by all), original index and bias, any order."""
    device = q_codes.device
    BH, Nq = q_codes.shape
    Nk = k_groups.shape[1]
    bh_q = torch.arange(BH, device=device).repeat_interleave(Nq)

    # Query groups: runs of one code within one (b, h).
    q_flat = q_codes.reshape(-1)
    q_rows_flat = bh_q * Nq + q_order.reshape(-1)
    q_start = _run_starts(bh_q, q_flat)
    group_start = q_start.nonzero().squeeze(1)
    group_len = torch.diff(group_start, append=torch.tensor([q_flat.numel()], device=device))
    group_bh, group_code = bh_q[group_start], q_flat[group_start]

    # Key segments: runs of one (bucket, bias value) within one (b, h), -inf keys dropped.
    by_bias = torch.sort(k_bias, dim=1, stable=True).indices
    order = by_bias.gather(1, torch.sort(k_groups.gather(1, by_bias), dim=1, stable=True).indices)
    seg_group_flat = k_groups.gather(1, order).reshape(-1)
    seg_bias_flat = k_bias.gather(1, order).reshape(-1)
    bh_k = torch.arange(BH, device=device).repeat_interleave(Nk)
    tokens_flat = bh_k * Nk + k_order.gather(1, order).reshape(-1)
    keep = seg_bias_flat > float("-inf")
    seg_group_flat, seg_bias_flat, tokens_flat, bh_k = (
        t[keep] for t in (seg_group_flat, seg_bias_flat, tokens_flat, bh_k)
    )
    seg_start = _run_starts(bh_k, seg_group_flat, seg_bias_flat).nonzero().squeeze(1)
    seg_len = torch.diff(seg_start, append=torch.tensor([tokens_flat.numel()], device=device))
    seg_key = _group_key(bh_k[seg_start], seg_group_flat[seg_start])

    # Each query group sees the dense segment(s) and the buckets within its Hamming ball.
    if group_start.numel() * (1 + num_flip_masks(bits, radius)) > MAX_PROBE_TARGETS:
        raise BackendUnavailableError(
            f"backend 'flashinfer' cannot plan radius {radius} over {bits}-bit codes (too many probe buckets); "
            "use backend 'triton' or 'torch' for this layout"
        )
    probes = group_code[:, None] ^ flip_masks(bits, radius, device)
    targets = torch.cat([torch.full_like(group_code[:, None], -1), probes], 1)
    target_key = _group_key(group_bh[:, None], targets).reshape(-1)
    lo = torch.searchsorted(seg_key, target_key)
    hi = torch.searchsorted(seg_key, target_key, right=True)
    counts = hi - lo
    req_group = torch.arange(group_start.numel(), device=device).repeat_interleave(targets.shape[1])
    req_group = req_group.repeat_interleave(counts)
    req_seg = _expand_ranges(lo, counts)

    qo_len = group_len[req_group]
    kv_len = seg_len[req_seg]
    return AttentionRequests(
        q_rows=q_rows_flat[_expand_ranges(group_start[req_group], qo_len)],
        qo_indptr=_indptr(qo_len),
        kv_tokens=tokens_flat[_expand_ranges(seg_start[req_seg], kv_len)].to(torch.int32),
        kv_indptr=_indptr(kv_len),
        request_bias=seg_bias_flat[seg_start[req_seg]].float(),
        num_query_rows=BH * Nq,
    )


def merge_request_rows(outs, lses, rows, num_rows: int):
    """Merge request outputs `outs` [T, D] with natural-log `lses` [T] into rows[t] of a [num_rows, D] result.

    Rows no request covers get out = 0 and lse = -inf. Returns (out float32, lse float32).
    """
    device = outs.device
    lses = lses.float()
    top = torch.full((num_rows,), float("-inf"), device=device).scatter_reduce(0, rows, lses, "amax")
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(lses - shift[rows])
    total = torch.zeros(num_rows, device=device).index_add_(0, rows, weights)
    out = torch.zeros(num_rows, outs.shape[-1], device=device).index_add_(0, rows, weights[:, None] * outs.float())
    seen = total > 0
    out = out / torch.where(seen, total, torch.ones_like(total))[:, None]
    lse = torch.where(seen, torch.log(torch.where(seen, total, torch.ones_like(total))) + shift, float("-inf"))
    return out, lse


def _flat_bias(bias, B, H, Nk, device):
    if bias is None:
        return torch.zeros(B * H, Nk, device=device)
    return bias.expand(B, H, Nk).reshape(B * H, Nk)


def _run_starts(*keys):
    """Bool flags marking where a run of equal consecutive (key, ...) tuples starts."""
    n = keys[0].numel()
    flags = torch.zeros(n, dtype=torch.bool, device=keys[0].device)
    if n:
        flags[0] = True
        for key in keys:
            flags[1:] |= key[1:] != key[:-1]
    return flags


def _group_key(bh, group):
    """Sortable key of (b*h index, bucket) with bucket -1 (dense) first; buckets are < 2**16."""
    return bh * (2**17) + (group + 1)


def _expand_ranges(starts, lengths):
    """Concatenation of arange(s, s + n) for each (s, n)."""
    total = int(lengths.sum())
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - offsets, lengths, output_size=total) + torch.arange(
        total, device=starts.device
    )


def _indptr(lengths):
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)]).to(torch.int32)
