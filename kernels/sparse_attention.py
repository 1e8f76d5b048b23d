"""Public sparse attention: check, pick the backends, run the first that works in sorted order, unsort.

The torch and Triton backends run as one operator, ``fastar::sparse_attention``: a compiler traces it as an
opaque call (the torch backend's loops over buckets have sizes that depend on the codes) and an operator count
sees one kernel, as a GPU runs it (the Triton kernel with its sort and unsort gathers).
"""

import torch

from .checks import check_bias, check_qkv, resolve_scale
from .dispatch import backend_chain
from .errors import KernelInputError
from .sparse_layout import SparseLayout, build_sparse_layout
from .verify import Family, compare, log_count_bias, probe_generator, run_with_fallback


def sparse_attention(q, k, v, layout, bias=None, *, scale=None, backend="auto", check_values=True):
    """Attention where query i sees key j iff j < layout.n_dense or popcount(q_code xor k_code) <= radius.

    q [B, H, Nq, D], k and v [B, H, Nk, D] in their ORIGINAL order (the layout sorts and unsorts them);
    `layout` from `build_sparse_layout` with the same B, H, Nq, Nk; `bias` float32 per key, broadcastable to
    [B, H, Nk]. Returns [B, H, Nq, D] in the original query order; a query that sees no key gets zeros.
    `backend`: "auto", "torch", "triton", "flex" or "flashinfer"; accelerated ones are checked against torch at
    first use (see `verify`).
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    if not isinstance(layout, SparseLayout):
        raise KernelInputError(f"layout must be a SparseLayout from build_sparse_layout, got {type(layout).__name__}")
    if layout.shape != (B, H, Nq, Nk):
        raise KernelInputError(
            f"layout was built for (B, H, Nq, Nk) = {layout.shape}, but q/k give {(B, H, Nq, Nk)}"
        )
    if layout.device != q.device:
        raise KernelInputError(f"layout is on {layout.device} but q is on {q.device}; build it from codes there")
    bias = check_bias(bias, B, H, Nk, q.device, check_values)
    scale = resolve_scale(scale, D)
    chain = backend_chain("sparse_attention", backend, q.device, dtype=q.dtype, head_dim=D,
                          has_bias=bias is not None)
    if Nq == 0 or Nk == 0:
        return q.new_zeros(B, H, Nq, D)
    family = Family(str(q.device), q.dtype, D, bias is not None, block_q=layout.block_q, block_k=layout.block_k,
                    radius=layout.radius, bits=layout.bits)
    return run_with_fallback("sparse_attention", chain, family,
                             lambda name: _run(name, q, k, v, layout, bias, scale),
                             lambda name: probe(name, family))


def probe(name: str, family: Family) -> str | None:
    """Backend `name` against torch on a small layout of `family`: dense keys, ragged tiles, a blind head."""
    bq, bk, D = family.block_q, family.block_k, family.head_dim
    B, H = 1, 3
    n_dense = bk + 8  # one all-dense key block and one mixed block
    Nq, Nk = bq + 7, n_dense + 2 * bk + 5
    gen = probe_generator(D + bq)
    q_codes, k_codes = (_probe_codes(gen, (B, H, n), family.bits).to(family.device) for n in (Nq, Nk))
    layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense, block_q=bq, block_k=bk, radius=family.radius)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (Nq, Nk, Nk))
    q = 2 * q
    bias = log_count_bias(B, H, Nk, gen, family.device, blind_head=True) if family.has_bias else None
    q, k, v = (t.to(family.device, family.dtype) for t in (q, k, v))
    scale = resolve_scale(None, D)
    out = _run(name, q, k, v, layout, bias, scale)
    reference = _run("torch", q.float(), k.float(), v.float(), layout, bias, scale)
    return compare(out, reference, name, family.dtype)


def _probe_codes(gen, shape, bits: int) -> torch.Tensor:
    """Codes in a few buckets (so most queries see sparse keys too) whose widest one has exactly `bits` bits,
    the width the layout derives and the planners branch on."""
    codes = torch.randint(0, min(2**bits, 4), shape, generator=gen)
    if bits > 2:
        codes |= torch.randint(0, 2, shape, generator=gen) << (bits - 1)
    codes[..., 0] |= 1 << (bits - 1)
    return codes


@torch.library.custom_op("fastar::sparse_attention", mutates_args=())
def sparse_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                        q_perm: torch.Tensor, k_perm: torch.Tensor, q_codes_sorted: torch.Tensor,
                        k_codes_sorted: torch.Tensor, kv_num: torch.Tensor, kv_idx: torch.Tensor, n_dense: int,
                        block_q: int, block_k: int, radius: int, bits: int, scale: float, backend: str) -> torch.Tensor:
    layout = SparseLayout(q_perm, k_perm, q_codes_sorted, k_codes_sorted, kv_num, kv_idx, n_dense, block_q, block_k,
                          radius, bits)
    return _run_backend(backend, q, k, v, layout, bias, scale)


@sparse_attention_op.register_fake
def _(q, k, v, bias, q_perm, k_perm, q_codes_sorted, k_codes_sorted, kv_num, kv_idx, n_dense, block_q, block_k,
      radius, bits, scale, backend):
    return torch.empty_like(q)


def _run(name, q, k, v, layout, bias, scale):
    if name in ("torch", "triton"):
        return sparse_attention_op(q, k, v, bias, layout.q_perm, layout.k_perm, layout.q_codes_sorted,
                                   layout.k_codes_sorted, layout.kv_num, layout.kv_idx, layout.n_dense, layout.block_q,
                                   layout.block_k, layout.radius, layout.bits, scale, name)
    return _run_backend(name, q, k, v, layout, bias, scale)


def _run_backend(name, q, k, v, layout, bias, scale):
    if name == "triton":
        from .sparse_triton import sparse_attention_triton as run
    elif name == "flex":
        from .sparse_flex import sparse_attention_flex as run
    elif name == "flashinfer":
        from .attention_flashinfer import sparse_attention_flashinfer as run
    else:
        from .sparse_torch import sparse_attention_torch as run
    return run(q, k, v, layout, bias, scale)
