"""TempCache's top-1 search: each new key's most similar cached representative, by cosine.

Both searches have shapes fixed by their inputs and never read a value on the host, so a commit runs as one
queue of kernels (and compiles, and can be captured in a CUDA graph).

- ``exact_top1``: chunked fp32 matmul, then the best entry of each row: the reference.
- ``quantized_top1``: the search the paper does with 8-bit codes, in the form a GPU's tensor cores multiply: the
  representatives are kept unit-normalised in bfloat16 (8 significant bits), written once when a group is made or
  changes (``TempCache`` keeps them beside the keys), so nothing is normalised or converted per chunk. The
  bfloat16 scores pick each new key's ``candidates`` best entries; those are rescored exactly in fp32, which is
  what the threshold and the choice are decided on.

Bound: for unit vectors rounded to bfloat16 (relative error 2**-9 per component), the rounded dot product is within
2 * 2**-9 of the exact cosine by Cauchy-Schwarz, and rounding the score itself to bfloat16 adds at most 2**-9; so a
key whose best bfloat16 score is below ``threshold - SEARCH_MARGIN`` cannot have an exact cosine at the threshold,
and an entry outside the candidates beats the best rescored one by at most ``2 * SEARCH_MARGIN``. The quantized
search therefore makes the exact one's decision except among near-ties that more than ``candidates`` entries share
(then it takes the best of its candidates, within that band of the best cosine): ``fastar bench matcher`` counts
how often.

Why bfloat16 and not int8 codes: on this project's CPUs (AMX / AVX-512 BF16) a bfloat16 matmul costs 0.54 of the
fp32 one at Wan's shapes and an int8 ``torch._int_mm`` 0.74; on CUDA both are tensor-core formats. A sign hash
with exact rescoring would cost the same matmul over 64 bits and prune less.
"""

from __future__ import annotations

import torch

from ...kernels import row_max, topk_scores
from ..model.rope import RopeTables

CHUNK_ROWS = 1024  # rows of the similarity matrix computed at once
SEARCH_DTYPE = torch.bfloat16
SEARCH_MARGIN = 3 * 2.0**-9 + 1e-3  # the bound above, with room for fp32 accumulation
def normalize(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def search_form(x: torch.Tensor) -> torch.Tensor:
    """Keys as the quantized search holds them: unit-normalised, bfloat16."""
    return normalize(x).to(SEARCH_DTYPE)


def exact_top1(a: torch.Tensor, b: torch.Tensor, b_valid: torch.Tensor | None = None, chunk: int = CHUNK_ROWS):
    """Cosine top-1 of each row of ``a [B,H,N,D]`` among rows of ``b [B,H,M,D]``.

    ``b_valid [B,H,M]`` bool excludes entries (empty slots, sink), or ``[B,H,N,M]`` per row (TempCache's
    ``same_place``: only the groups at the row's own place). Returns (index [B,H,N] int64, cosine [B,H,N]
    float32; -inf where nothing is allowed).
    """
    B, H, N, D = a.shape
    M = b.shape[2]
    if M == 0:
        return (torch.zeros(B, H, N, dtype=torch.long, device=a.device),
                torch.full((B, H, N), float("-inf"), device=a.device))
    an = normalize(a).reshape(B * H, N, D)
    bn_t = normalize(b).reshape(B * H, M, D).transpose(1, 2)
    # Excluded entries as a -inf column bias that the matmul adds in place (no second pass over the scores).
    col_bias = None
    if b_valid is not None:
        per_row = b_valid.dim() == 4
        col_bias = torch.zeros(B * H, N if per_row else 1, M, device=a.device).masked_fill_(
            ~b_valid.reshape(B * H, N if per_row else 1, M), float("-inf"))
    values, indices = [], []
    for start in range(0, N, chunk):
        rows = an[:, start:start + chunk]
        bias = None if col_bias is None else col_bias[:, start:start + chunk] if col_bias.shape[1] > 1 else col_bias
        sim = torch.bmm(rows, bn_t) if bias is None else torch.baddbmm(bias, rows, bn_t)
        val, arg = row_max(sim)
        values.append(val)
        indices.append(arg)
    best = values[0] if len(values) == 1 else torch.cat(values, dim=1)
    idx = indices[0] if len(indices) == 1 else torch.cat(indices, dim=1)
    return idx.view(B, H, N), best.view(B, H, N)


def quantized_top1(a: torch.Tensor, b_search: torch.Tensor, b_exact: torch.Tensor, min_score: float,
                   candidates: int = 8, b_valid: torch.Tensor | None = None, b_positions: torch.Tensor | None = None,
                   tables: RopeTables | None = None, backend: str = "auto"):
    """``exact_top1(a, b_exact, b_valid)``'s answer wherever a row's best cosine reaches ``min_score``, from a
    bfloat16 search and an exact rescoring of each row's ``candidates`` best entries (see the module docstring
    for where it may differ: near-ties shared by more entries than the candidates).

    ``b_search [B,H,M,D]``: the entries in ``search_form``, excluded ones all zero (score 0, below any
    ``min_score`` above ``SEARCH_MARGIN``); ``b_exact``: the entries as they are; ``b_valid``: which are
    candidates (None: those nonzero in ``b_search``, which the zero score keeps out already). A candidate whose
    bfloat16 score is below ``min_score - SEARCH_MARGIN`` cannot merge and scores -inf; a row with none gets index 0
    and its best bfloat16 score. Returns (index, cosine), as ``exact_top1``. The search is one operator
    (``kernels.topk_scores``: fused on CUDA, so the score matrix never reaches memory).

    ``b_positions [B,H,M,3]``: ``b_exact`` holds the entries rotated by RoPE at these positions (a cache that
    keeps its keys ready for attention), inside ``tables``; the candidates are rotated back, which RoPE's
    rotations undo up to rounding, so nothing is rotated for all M entries."""
    B, H, N, D = a.shape
    M = b_search.shape[2]
    if M == 0:
        return (torch.zeros(B, H, N, dtype=torch.long, device=a.device),
                torch.full((B, H, N), float("-inf"), device=a.device))
    BH, k = B * H, min(candidates, M)
    queries = normalize(a).reshape(BH, N, D)
    cand_score, cand = topk_scores(queries.to(SEARCH_DTYPE), b_search.reshape(BH, M, D), k, backend=backend)
    flat = cand.reshape(BH, N * k)
    rows = b_exact.reshape(BH, M, D).gather(1, flat[..., None].expand(-1, -1, D)).float().view(BH, N, k, D)
    cos = rescore(queries, rows, None if b_positions is None else
                  b_positions.reshape(BH, M, 3).gather(1, flat[..., None].expand(-1, -1, 3)).view(BH, N, k, 3), tables)
    # A candidate whose bfloat16 score is below the bar cannot reach it: an excluded entry (zero in the search form)
    # among too few real candidates, whose exact key would otherwise be rescored.
    bar = min_score - SEARCH_MARGIN
    out = cand_score < bar
    if b_valid is not None:
        out |= ~b_valid.reshape(BH, M).gather(1, flat).view(BH, N, k)
    top, which = cos.masked_fill(out, float("-inf")).max(dim=-1)
    pick = cand.gather(-1, which[..., None])[..., 0]
    # Rows that cannot merge report their best bfloat16 score (below the bar, so never accepted) and index 0.
    hopeless = cand_score[..., 0] < bar
    best = torch.where(hopeless, cand_score[..., 0], top)
    return pick.masked_fill(hopeless, 0).view(B, H, N), best.view(B, H, N)


def rescore(queries: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor | None,
            tables: RopeTables | None) -> torch.Tensor:
    """Exact cosines ``[BH, N, k]`` of unit ``queries [BH, N, D]`` with candidate keys ``rows [BH, N, k, D]``
    (fp32), which are rotated by RoPE at ``positions [BH, N, k, 3]`` where given: the key before RoPE is the row
    rotated back, and with each pair of dims as a complex number (RoPE's rotation a unit one, ``e^{i theta}``),
    the dot product of a query pair ``q`` with the rotated-back pair ``k e^{-i theta}`` is ``Re(q conj(k)
    e^{i theta})``, so the rotation is one product with the tables' ``cos + i sin``, never a rotated copy; a
    rotation keeps the norm."""
    norms = rows.norm(dim=-1).clamp_min(1e-12)
    if positions is None:
        return (rows * queries[:, :, None]).sum(-1) / norms
    assert tables is not None, "rotated candidates need the RoPE tables that cover their positions"
    shape = (*rows.shape[:-1], rows.shape[-1] // 2, 2)
    pair = torch.view_as_complex(queries.contiguous().view(*queries.shape[:-1], -1, 2))[:, :, None]
    turn = torch.view_as_complex(tables.cos_sin_pairs(positions))
    return (pair * torch.view_as_complex(rows.view(shape)).conj() * turn).real.sum(-1) / norms
