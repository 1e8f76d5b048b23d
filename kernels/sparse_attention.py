"""Public block-sparse attention over a bucket layout: check, pick a backend, run in sorted order, unsort."""

from .checks import check_bias, check_qkv, resolve_scale
from .dispatch import choose_backend
from .errors import KernelInputError
from .sparse_layout import SparseLayout


def sparse_attention(q, k, v, layout, bias=None, *, scale=None, backend="auto"):
    """Attention where query i sees key j iff j < layout.n_dense or popcount(q_code xor k_code) <= radius.

    q [B, H, Nq, D], k and v [B, H, Nk, D] in their ORIGINAL order (the layout sorts and unsorts them);
    `layout` from `build_sparse_layout` with the same B, H, Nq, Nk; `bias` float32 per key, broadcastable to
    [B, H, Nk]. Returns [B, H, Nq, D] in the original query order; a query that sees no key gets zeros.
    `backend`: "auto", "torch", "triton", "flex" or "flashinfer".
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
    bias = check_bias(bias, B, H, Nk, q.device)
    scale = resolve_scale(scale, D)
    name = choose_backend("sparse_attention", backend, q.device, dtype=q.dtype, head_dim=D)
    if Nq == 0 or Nk == 0:
        return q.new_zeros(B, H, Nq, D)
    if name == "triton":
        from .sparse_triton import sparse_attention_triton as run
    elif name == "flex":
        from .sparse_flex import sparse_attention_flex as run
    elif name == "flashinfer":
        from .attention_flashinfer import sparse_attention_flashinfer as run
    else:
        from .sparse_torch import sparse_attention_torch as run
    return run(q, k, v, layout, bias, scale)
