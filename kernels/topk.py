"""The ``k`` best scores of each row of ``a @ b^T``: TempCache's quantized search, in one operator.

``topk_scores`` runs as ``fastar::topk_scores``: on CUDA the fused Triton kernel (the score matrix never reaches
memory), elsewhere torch (chunked matmuls and ``row_topk``). Either way a compiler sees one opaque call and an
operator count one kernel. Scores are compared as the backend computes them (bfloat16 matmuls round them to
bfloat16 in torch; the Triton kernel keeps fp32): callers decide on exact rescores, never on these.
"""

import torch

from .dispatch import backend_chain
from .errors import KernelInputError
from .verify import Family, probe_generator, run_with_fallback

CHUNK_BYTES = 256 * 2**20  # scores of the torch path materialised at once
BLOCK = 64  # entries per block of the row reductions


def _block_size(m: int) -> int:
    """The largest power of two up to ``BLOCK`` that divides ``m`` (1: no blocking)."""
    b = BLOCK
    while b > 1 and m % b:
        b //= 2
    return b


def row_max(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.max(dim=-1)`` (the first index of each row's largest value), in two passes that a CPU vectorises:
    the largest value of each block of entries, then the index inside the first block that holds it. A max with
    indices over the whole row costs about nine times a max of values on a CPU; a GPU does either at its bandwidth."""
    m = scores.shape[-1]
    b = _block_size(m)
    if b < 8:
        return scores.max(dim=-1)
    blocks = scores.unflatten(-1, (m // b, b))
    best, block = blocks.amax(dim=-1).max(dim=-1)
    inner = blocks.gather(-2, block[..., None, None].expand(*block.shape, 1, b))[..., 0, :].argmax(dim=-1)
    return best, block * b + inner


def row_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest values of each row and their indices, largest first: the best ``k`` blocks by their
    largest value hold every one of them, so only those blocks are searched entry by entry."""
    m = scores.shape[-1]
    b = _block_size(m)
    if b < 8 or m // b <= k:
        return scores.topk(k, dim=-1)
    blocks = scores.unflatten(-1, (m // b, b))
    _, which = blocks.amax(dim=-1).topk(k, dim=-1)  # [..., k] blocks
    picked = blocks.gather(-2, which[..., None].expand(*which.shape, b))  # [..., k, b]
    values, inner = picked.flatten(-2).topk(k, dim=-1)
    return values, which.gather(-1, inner // b) * b + inner % b


def topk_scores_torch(a: torch.Tensor, b: torch.Tensor, k: int):
    BH, N, _ = a.shape
    M = b.shape[1]
    b_t = b.transpose(1, 2)
    rows = max(1, CHUNK_BYTES // max(1, BH * M * a.element_size()))
    values, indices = [], []
    for start in range(0, N, rows):
        v, i = row_topk(torch.bmm(a[:, start:start + rows], b_t), k)
        values.append(v.float())
        indices.append(i)
    if len(values) == 1:
        return values[0], indices[0]
    return torch.cat(values, dim=1), torch.cat(indices, dim=1)


@torch.library.custom_op("fastar::topk_scores", mutates_args=())
def topk_scores_op(a: torch.Tensor, b: torch.Tensor, k: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        from .topk_triton import topk_scores_triton

        return topk_scores_triton(a, b, k)
    return topk_scores_torch(a, b, k)


@topk_scores_op.register_fake
def _(a, b, k, backend):
    shape = (*a.shape[:2], k)
    return a.new_empty(shape, dtype=torch.float32), a.new_empty(shape, dtype=torch.long)


def topk_scores(a: torch.Tensor, b: torch.Tensor, k: int, *, backend: str = "auto"):
    """Each row's ``k`` best scores of ``a [BH, N, D] @ b [BH, M, D]^T``, best first: (values float32, columns
    int64), both ``[BH, N, k]``. ``k <= M``."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise KernelInputError(f"{name} must be a [BH, N, D] tensor, got {type(t).__name__}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2] or a.dtype != b.dtype or a.device != b.device:
        raise KernelInputError(f"a {tuple(a.shape)} {a.dtype} and b {tuple(b.shape)} {b.dtype} must share batch, "
                               "head dim, dtype and device")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= b.shape[1]:
        raise KernelInputError(f"k must be an int in [1, {b.shape[1]}] (the columns), got {k!r}")
    D = a.shape[2]
    chain = backend_chain("topk_scores", backend, a.device, dtype=a.dtype, head_dim=D)
    family = Family(str(a.device), a.dtype, D, False, top=k)
    return run_with_fallback("topk_scores", chain, family, lambda name: topk_scores_op(a, b, k, name),
                             lambda name: probe(name, family))


def probe(name: str, family: Family):
    """Backend ``name`` against torch on unit rows: the same best scores (within the dtype's rounding), each
    column's score as claimed."""
    gen = probe_generator(family.head_dim + family.top)
    D, k = family.head_dim, family.top

    def unit(n):
        x = torch.randn(2, n, D, generator=gen)
        return (x / x.norm(dim=-1, keepdim=True)).to(family.device, family.dtype)

    a, b = unit(70), unit(300)
    got_v, got_i = topk_scores_op(a, b, k, name)
    want_v, _ = topk_scores_op(a, b, k, "torch")
    exact = torch.bmm(a.float(), b.float().transpose(1, 2)).gather(-1, got_i)
    tol = 2e-2 if family.dtype in (torch.bfloat16, torch.float16) else 1e-5
    if not torch.allclose(got_v, want_v, atol=tol) or not torch.allclose(got_v, exact, atol=tol):
        return f"best scores differ from torch by up to {float((got_v - want_v).abs().max()):.3g}"
    return None
