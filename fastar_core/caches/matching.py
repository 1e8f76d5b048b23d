"""TempCache's top-1 search: each new key's most similar cached representative, by cosine.

- ``exact_top1``: chunked fp32 matmul + max, never a full N x M matrix: the reference.
- ``quantized_top1``: the search the paper does with 8-bit codes, in the form this hardware multiplies fastest:
  the representatives are kept unit-normalised in bfloat16 (8 significant bits), written once when a group is
  made or changes (``TempCache`` keeps them beside the keys), so nothing is normalised or converted per chunk.
  The bfloat16 scores pick, for each new key whose best score could reach the merge threshold, its few best
  candidates; those are rescored exactly in fp32, which is what the threshold and the choice are decided on.
  Where the bfloat16 scores cannot rule out the entries beyond those few (near-ties), the key is rescored
  against every entry, so the answer is the exact matcher's, up to rounding.

Why bfloat16 and not int8 codes: on this project's CPUs (AMX / AVX-512 BF16) a bfloat16 matmul costs 0.54 of the
fp32 one at Wan's shapes and an int8 ``torch._int_mm`` 0.74; on CUDA both are tensor-core formats. A sign hash
with exact rescoring would cost the same matmul over 64 bits and prune less.

Bound: for unit vectors rounded to bfloat16 (relative error 2**-9 per component), the rounded dot product is within
2 * 2**-9 of the exact cosine by Cauchy-Schwarz, and rounding the score itself to bfloat16 adds at most 2**-9; so a
key whose best bfloat16 score is below ``threshold - SEARCH_MARGIN`` cannot have an exact cosine at the threshold.
"""

from __future__ import annotations

import torch

from ..model.rope import rotate

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

    ``b_valid [B,H,M]`` bool excludes entries (empty slots, sink), or ``[B,H,N,M]`` per row (TempCache's
    ``same_place``: only the groups at the row's own place). Returns (index [B,H,N] int64, cosine [B,H,N]
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
        per_row = b_valid.dim() == 4
        col_bias = torch.zeros(B * H, N if per_row else 1, M, device=a.device).masked_fill_(
            ~b_valid.reshape(B * H, N if per_row else 1, M), float("-inf"))
    for start in range(0, N, chunk):
        rows = an[:, start:start + chunk]
        bias = None if col_bias is None else col_bias[:, start:start + chunk] if col_bias.shape[1] > 1 else col_bias
        sim = (torch.bmm(rows, bn_t) if bias is None else torch.baddbmm(bias, rows, bn_t)).view(B, H, -1, M)
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
                   candidates: int = 4, chunk: int = CHUNK_ROWS, b_valid: torch.Tensor | None = None,
                   b_positions: torch.Tensor | None = None):
    """``exact_top1(a, b_exact, b_valid, min_score=min_score)``'s answer for every row whose best cosine reaches
    ``min_score`` (up to fp32 rounding in the rescoring), mostly from a bfloat16 search.

    ``b_search [B,H,M,D]``: the entries in ``search_form``, excluded ones all zero (score 0, below any
    ``min_score`` above ``SEARCH_MARGIN``); ``b_exact``: the entries as they are; ``b_valid``: which are
    candidates (default: those nonzero in ``b_search``). A row whose best bfloat16 score is below
    ``min_score - SEARCH_MARGIN`` cannot merge: it gets index 0 and that score. Otherwise its ``candidates`` best
    bfloat16 scores are rescored exactly; the exact best is among them unless the next bfloat16 score is within
    ``2 * SEARCH_MARGIN`` of the first (then an entry outside could beat them all), and such rows are rescored
    exactly against every entry. Returns (index, cosine), as ``exact_top1``.

    ``b_positions [B,H,M,3]``: ``b_exact`` holds the entries rotated by RoPE at these positions (a cache that
    keeps its keys ready for attention); the few rescored entries are rotated back, which RoPE's rotations undo
    up to fp32 rounding, so nothing is rotated for all M entries."""
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
    b_pos = None if b_positions is None else b_positions.reshape(B * H, M, 3)

    def content(heads, entries):
        """Entries' exact keys before RoPE, normalised: ``b_exact[heads, entries]`` rotated back if needed."""
        rows = b_exact[heads, entries]
        return normalize(rows if b_pos is None else rotate(rows, -b_pos[heads, entries]))

    k = min(candidates, M)
    full = None  # per head: every entry normalised, excluded ones -inf; built only if a row needs it
    for start in range(0, N, chunk):
        end = min(N, start + chunk)
        scores = torch.bmm(a_search[:, start:end], b_t)  # [BH, n, M] bfloat16
        approx = scores.amax(dim=-1).float()
        rows = approx >= min_score - SEARCH_MARGIN
        val, arg = approx, torch.zeros(approx.shape, dtype=torch.long, device=a.device)
        if bool(rows.any()):
            heads, where = rows.nonzero(as_tuple=True)
            # One more than the candidates: its score says whether an entry beyond them could still win.
            cand_score, cand = scores[heads, where].topk(min(k + 1, M), dim=-1)  # [R, k (+ 1)]
            cand_score, boundary, cand = cand_score[:, :k].float(), cand_score[:, k:].float(), cand[:, :k]
            queries = an[heads, start + where]  # [R, D]
            cos = (content(heads[:, None], cand) * queries[:, None, :]).sum(-1)
            # A candidate whose bfloat16 score is below the bar cannot reach it: an excluded entry (zero in the
            # search form) among too few real candidates, whose exact key would otherwise be rescored.
            cos = cos.masked_fill(cand_score < min_score - SEARCH_MARGIN, float("-inf"))
            top, which = cos.max(dim=-1)
            pick = cand.gather(1, which[:, None])[:, 0]
            open_rows = (boundary[:, 0] >= cand_score[:, 0] - 2 * SEARCH_MARGIN) if k < M else None
            if open_rows is not None and bool(open_rows.any()):
                if full is None:
                    valid = (b_search != 0).any(-1) if b_valid is None else b_valid
                    every = torch.arange(M, device=a.device)
                    full = (content(torch.arange(B * H, device=a.device)[:, None], every[None]),
                            valid.reshape(B * H, M))
                for h in heads[open_rows].unique().tolist():
                    sel = open_rows & (heads == h)
                    sims = (queries[sel] @ full[0][h].T).masked_fill(~full[1][h], float("-inf"))
                    top[sel], pick[sel] = sims.max(dim=-1)
            val[heads, where] = top
            arg[heads, where] = pick
        best.view(B * H, N)[:, start:end] = val
        idx.view(B * H, N)[:, start:end] = arg
    return idx, best
