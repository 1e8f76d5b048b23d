"""TempCache's top-1 search: each new key's most similar cached representative, by cosine.

- ``exact_top1``: chunked fp32 matmul + max, never a full N x M matrix: the reference.
- ``quantized_top1``: the search the paper does with 8-bit codes, in the form this hardware multiplies fastest:
  the representatives are kept unit-normalised in bfloat16 (8 significant bits), written once when a group is
  made or changes (``TempCache`` keeps them beside the keys), so nothing is normalised or converted per chunk.
  The bfloat16 scores pick, for each new key whose best score could reach the merge threshold, its few best
  candidates; those are rescored exactly in fp32, which is what the threshold and the choice are decided on.

Why bfloat16 and not int8 codes: on this project's CPUs (AMX / AVX-512 BF16) a bfloat16 matmul costs 0.54 of the
fp32 one at Wan's shapes and an int8 ``torch._int_mm`` 0.74; on CUDA both are tensor-core formats. A sign hash
with exact rescoring would cost the same matmul over 64 bits and prune less.

Bound: for unit vectors rounded to bfloat16 (relative error 2**-9 per component), the rounded dot product is within
2 * 2**-9 of the exact cosine by Cauchy-Schwarz, and rounding the score itself to bfloat16 adds at most 2**-9; so a
key whose best bfloat16 score is below ``threshold - SEARCH_MARGIN`` cannot have an exact cosine at the threshold.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 1024  # rows of the similarity matrix computed at once
SEARCH_DTYPE = torch.bfloat16
SEARCH_MARGIN = 3 * 2.0**-9 + 1e-3  # the bound above, with room for fp32 accumulation


def normalize(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def search_form(x: torch.Tensor) -> torch.Tensor:
    """Keys as the quantized search holds them: unit-normalised, bfloat16."""
    return normalize(x).to(SEARCH_DTYPE)


def exact_top1(a: torch.Tensor, b: torch.Tensor, b_valid: torch.Tensor | None = None, chunk: int = CHUNK_ROWS,
               min_score: float | None = None):
    """Cosine top-1 of each row of ``a [B,H,N,D]`` among rows of ``b [B,H,M,D]``.

    ``b_valid [B,H,M]`` bool excludes entries (empty slots, sink). Returns (index [B,H,N] int64, cosine [B,H,N]
    float32; -inf where nothing is allowed). With ``min_score``, rows whose best cosine is below it get index 0:
    callers that only use matches above a bar save the index search there (on a CPU a max with indices costs
    many times a max of values).
    """
    B, H, N, D = a.shape
    M = b.shape[2]
    idx = torch.zeros(B, H, N, dtype=torch.long, device=a.device)
    best = torch.full((B, H, N), float("-inf"), device=a.device)
    if M == 0:
        return idx, best
    an = normalize(a).reshape(B * H, N, D)
    bn_t = normalize(b).reshape(B * H, M, D).transpose(1, 2)
    # Excluded entries as a -inf column bias that the matmul adds in place (no second pass over the scores).
    col_bias = None
    if b_valid is not None:
        col_bias = torch.zeros(B * H, 1, M, device=a.device).masked_fill_(~b_valid.reshape(B * H, 1, M),
                                                                           float("-inf"))
    for start in range(0, N, chunk):
        rows = an[:, start:start + chunk]
        sim = (torch.bmm(rows, bn_t) if col_bias is None else torch.baddbmm(col_bias, rows, bn_t)).view(B, H, -1, M)
        if min_score is None:
            val, arg = sim.max(dim=-1)
        else:
            val = sim.amax(dim=-1)
            arg = torch.zeros(val.shape, dtype=torch.long, device=a.device)
            rows = val >= min_score
            if bool(rows.any()):
                arg[rows] = sim[rows].argmax(dim=-1)
        best[:, :, start:start + chunk] = val
        idx[:, :, start:start + chunk] = arg
    return idx, best


def quantized_top1(a: torch.Tensor, b_search: torch.Tensor, b_exact: torch.Tensor, min_score: float,
                   candidates: int = 4, chunk: int = CHUNK_ROWS):
    """Top-1 of each row of ``a [B,H,N,D]`` among ``b``, for rows whose best cosine may reach ``min_score``.

    ``b_search [B,H,M,D]``: ``b`` in ``search_form`` (excluded entries all zero: score 0, below any positive
    ``min_score``, which must exceed ``SEARCH_MARGIN``); ``b_exact``: the same entries as they are, for the
    rescoring. Each row whose best bfloat16
    score is within ``SEARCH_MARGIN`` of ``min_score`` has its ``candidates`` best rescored exactly and takes
    the best of them: (index, exact cosine). Other rows get index 0 and their bfloat16 best, which is below
    ``min_score`` (they cannot merge)."""
    B, H, N, D = a.shape
    M = b_search.shape[2]
    idx = torch.zeros(B, H, N, dtype=torch.long, device=a.device)
    best = torch.full((B, H, N), float("-inf"), device=a.device)
    if M == 0:
        return idx, best
    an = normalize(a).reshape(B * H, N, D)
    a_search = an.to(SEARCH_DTYPE)
    b_t = b_search.reshape(B * H, M, D).transpose(1, 2)
    b_exact = b_exact.reshape(B * H, M, D)
    k = min(candidates, M)
    for start in range(0, N, chunk):
        end = min(N, start + chunk)
        scores = torch.bmm(a_search[:, start:end], b_t)  # [BH, n, M] bfloat16
        approx = scores.amax(dim=-1).float()
        rows = approx >= min_score - SEARCH_MARGIN
        val, arg = approx, torch.zeros(approx.shape, dtype=torch.long, device=a.device)
        if bool(rows.any()):
            heads, where = rows.nonzero(as_tuple=True)
            cand_score, cand = scores[heads, where].topk(k, dim=-1)  # [R, k]
            reps = normalize(b_exact[heads[:, None], cand])  # [R, k, D]
            cos = (reps * an[heads, start + where][:, None, :]).sum(-1)
            # A candidate whose bfloat16 score is below the bar cannot reach it: an excluded entry (zero in the
            # search form) among too few real candidates, whose exact key would otherwise be rescored.
            cos = cos.masked_fill(cand_score.float() < min_score - SEARCH_MARGIN, float("-inf"))
            top, which = cos.max(dim=-1)
            val[heads, where] = top
            arg[heads, where] = cand.gather(1, which[:, None])[:, 0]
        best.view(B * H, N)[:, start:end] = val
        idx.view(B * H, N)[:, start:end] = arg
    return idx, best
