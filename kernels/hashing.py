"""Sign-LSH bucket codes and a stable bucket sort.

Table t of token x gets a `bits`-bit code whose bit i is set iff x . planes[h, :, t*bits + i] > 0, packed
little-endian (bit i has weight 2**i). Codes stay below 2**16, the range the sparse layout accepts.
"""

from typing import NamedTuple

import torch

from .checks import check_codes
from .dispatch import backend_chain
from .errors import KernelInputError
from .verify import Family, probe_generator, run_with_fallback

MAX_BITS = 16


class BucketSort(NamedTuple):
    perm: torch.Tensor  # [..., N] int64: sorted position -> original index (stable)
    sorted_codes: torch.Tensor  # [..., N] int64
    offsets: torch.Tensor  # [..., num_buckets + 1] int64: bucket c is sorted_codes[offsets[c]:offsets[c+1]]


def lsh_codes(x, planes, *, bits: int, backend="auto") -> torch.Tensor:
    """x [B, H, N, D] (float), planes [H, D, T*bits] float32 -> int32 codes [B, H, N, T]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.dtype.is_floating_point:
        raise KernelInputError(f"x must be a float [B, H, N, D] tensor, got {_describe(x)}")
    B, H, N, D = x.shape
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise KernelInputError(f"bits must be an int in [1, {MAX_BITS}], got {bits!r}")
    if not isinstance(planes, torch.Tensor) or planes.dim() != 3 or planes.shape[:2] != (H, D):
        raise KernelInputError(f"planes must be [H={H}, D={D}, T*bits] float32, got {_describe(planes)}")
    if planes.dtype != torch.float32:
        raise KernelInputError(f"planes must be float32, got {planes.dtype}")
    if planes.shape[2] == 0 or planes.shape[2] % bits:
        raise KernelInputError(f"planes' last dim must be a positive multiple of bits={bits}, got {planes.shape[2]}")
    if planes.device != x.device:
        raise KernelInputError(f"planes must be on x's device {x.device}, got {planes.device}")
    chain = backend_chain("lsh_codes", backend, x.device, dtype=x.dtype, head_dim=D)
    family = Family(str(x.device), x.dtype, D, False, bits=bits)
    return run_with_fallback("lsh_codes", chain, family, lambda name: _run(name, x, planes, bits),
                             lambda name: probe(name, family))


def probe(name: str, family: Family) -> str | None:
    """Backend `name` against torch on random tokens: codes must agree wherever no projection is within
    rounding of 0 (there the sign, and so the bit, may legitimately differ)."""
    D, bits = family.head_dim, family.bits
    gen = probe_generator(D + bits)
    x = torch.randn(1, 2, 70, D, generator=gen)
    planes = torch.randn(2, D, 2 * bits, generator=gen)
    projections = torch.einsum("bhnd,hdk->bhnk", x.to(family.dtype).double(), planes.double())
    clear = (projections.abs() > 1e-3 * D**0.5).view(1, 2, 70, 2, bits).all(-1)
    x, planes = x.to(family.device, family.dtype), planes.to(family.device)
    got, expected = _run(name, x, planes, bits), _run("torch", x, planes, bits)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"codes have shape {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} {expected.dtype}"
    wrong = int((got != expected)[clear.to(got.device)].sum())
    if wrong:
        return f"{wrong} of {int(clear.sum())} codes differ from torch"
    return None


@torch.library.custom_op("fastar::lsh_codes", mutates_args=())
def lsh_codes_op(x: torch.Tensor, planes: torch.Tensor, bits: int, backend: str) -> torch.Tensor:
    """One operator whatever the backend: the fused Triton kernel on CUDA, torch's projection and sign packing
    elsewhere (what an operator count sees as the one kernel a GPU launches)."""
    if backend == "triton":
        from .hashing_triton import lsh_codes_triton

        return lsh_codes_triton(x, planes, bits)
    return lsh_codes_torch(x, planes, bits)


@lsh_codes_op.register_fake
def _(x, planes, bits, backend):
    return x.new_empty((*x.shape[:3], planes.shape[2] // bits), dtype=torch.int32)


def _run(name, x, planes, bits):
    return lsh_codes_op(x, planes, bits, name)


def lsh_codes_torch(x, planes, bits: int) -> torch.Tensor:
    B, H, N, _ = x.shape
    tables = planes.shape[2] // bits
    projections = torch.einsum("bhnd,hdk->bhnk", x.float(), planes)
    signs = (projections > 0).view(B, H, N, tables, bits).to(torch.int32)
    weights = 1 << torch.arange(bits, dtype=torch.int32, device=x.device)
    return (signs * weights).sum(-1, dtype=torch.int32)


def bucket_sort(codes, num_buckets: int | None = None) -> BucketSort:
    """Stable sort of integer codes [..., N] along the last dim, with per-bucket segment offsets.

    `num_buckets` defaults to max code + 1; offsets has num_buckets + 1 entries per row.
    """
    if not isinstance(codes, torch.Tensor) or codes.dim() < 1:
        raise KernelInputError(f"codes must be an integer tensor [..., N], got {_describe(codes)}")
    codes = check_codes(codes, "codes")
    top = int(codes.max()) + 1 if codes.numel() else 0
    if num_buckets is None:
        num_buckets = top
    elif isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < top:
        raise KernelInputError(f"num_buckets must be an int >= max code + 1 = {top}, got {num_buckets!r}")
    sorted_codes, perm = torch.sort(codes, dim=-1, stable=True)
    bounds = torch.arange(num_buckets + 1, device=codes.device).expand(*codes.shape[:-1], num_buckets + 1)
    offsets = torch.searchsorted(sorted_codes.contiguous(), bounds.contiguous())
    return BucketSort(perm, sorted_codes, offsets)


def _describe(x) -> str:
    return f"shape {tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
