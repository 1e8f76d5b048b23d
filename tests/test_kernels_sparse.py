"""Block-sparse attention over a bucket layout: every CPU-runnable backend against a dense masked reference."""

import math

import pytest
import torch

from comfyui_fastar.kernels import KernelInputError, attention, build_sparse_layout, sparse_attention

BACKENDS = ["torch", "triton", "flex"]


def hamming(a, b):
    """Bit-by-bit Hamming distance of 16-bit codes (independent of the kernels' popcount)."""
    bits = torch.arange(16)
    return (((a.unsqueeze(-1) ^ b.unsqueeze(-1)) >> bits) & 1).sum(-1)


def token_rule(q_codes, k_codes, n_dense, radius):
    """[B, H, Nq, Nk] bool in original order: key j visible iff j < n_dense or Hamming <= radius."""
    dense = torch.arange(k_codes.shape[-1]) < n_dense
    return dense | (hamming(q_codes.unsqueeze(-1), k_codes.unsqueeze(-2)) <= radius)


def masked_reference(q, k, v, bias, visible, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias.double().unsqueeze(2)
    logits = logits.masked_fill(~visible, -math.inf)
    return torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v.double()


def make_case(Nq, Nk, D, buckets, seed, dtype=torch.float32, B=1, H=2):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen).to(dtype) for n in (Nq, Nk, Nk))
    bias = torch.log(torch.randint(1, 5, (B, H, Nk), generator=gen).float())
    bias[..., 3::11] = -math.inf
    q_codes = torch.randint(0, buckets, (B, H, Nq), generator=gen)
    k_codes = torch.randint(0, buckets, (B, H, Nk), generator=gen)
    return q, k, v, bias, q_codes, k_codes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("radius, n_dense", [(0, 0), (0, 40), (1, 0), (1, 70)])
def test_backend_matches_dense_masked_reference(backend, radius, n_dense):
    # 8 buckets over 3 bits; queries with code 7 find no sparse key (keys use 0..6), so with n_dense = 0 and
    # radius 0 they see nothing and must give zeros.
    q, k, v, bias, q_codes, k_codes = make_case(200, 250, 64, 8, seed=radius * 100 + n_dense)
    k_codes = k_codes % 7
    layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense, radius=radius)
    visible = token_rule(q_codes, k_codes, n_dense, radius)
    out = sparse_attention(q, k, v, layout, bias, backend=backend)
    ref = masked_reference(q, k, v, bias, visible)
    assert (out.double() - ref).abs().max().item() < 2e-5
    blind = ~(visible & (bias.unsqueeze(2) > -math.inf)).any(-1)
    if radius == 0 and n_dense == 0:
        assert blind.any()  # the case really has queries that see nothing
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_triton_half_precision(dtype, tol):
    q, k, v, bias, q_codes, k_codes = make_case(130, 190, 128, 4, seed=7, dtype=dtype)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=30)
    out = sparse_attention(q, k, v, layout, bias, backend="triton")
    assert out.dtype == dtype
    ref = masked_reference(q, k, v, bias, token_rule(q_codes, k_codes, 30, 0))
    assert (out.double() - ref).abs().max().item() < tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_bucket_equals_dense_attention(backend):
    q, k, v, bias, _, _ = make_case(150, 230, 64, 1, seed=8)
    codes_q = torch.zeros(1, 2, 150, dtype=torch.int64)
    codes_k = torch.full((1, 2, 230), 5)
    for n_dense in (0, 100):
        codes_q.fill_(5)
        layout = build_sparse_layout(codes_q, codes_k, n_dense=n_dense)
        dense = attention(q, k, v, bias, backend="torch")
        assert (sparse_attention(q, k, v, layout, bias, backend=backend) - dense).abs().max().item() < 2e-5


def test_odd_head_dim_goes_through_the_torch_path():
    q, k, v, bias, q_codes, k_codes = make_case(90, 120, 48, 3, seed=9)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=20, block_q=32, block_k=32)
    out = sparse_attention(q, k, v, layout, bias, backend="triton")
    ref = masked_reference(q, k, v, bias, token_rule(q_codes, k_codes, 20, 0))
    assert (out.double() - ref).abs().max().item() < 2e-5


def sorted_visible_blocks(layout, q_codes, k_codes):
    """[B, H, nQB, nKB] bool: block pairs holding at least one visible (query, key) pair."""
    B, H, Nq, Nk = layout.shape
    visible = token_rule(q_codes, k_codes, layout.n_dense, layout.radius)
    visible = visible.gather(2, layout.q_perm.unsqueeze(-1).expand(-1, -1, -1, Nk))
    visible = visible.gather(3, layout.k_perm.unsqueeze(2).expand(-1, -1, Nq, -1))
    n_qb, n_kb = layout.num_q_blocks, layout.num_k_blocks
    padded = torch.zeros(B, H, n_qb * layout.block_q, n_kb * layout.block_k, dtype=torch.bool)
    padded[:, :, :Nq, :Nk] = visible
    return padded.view(B, H, n_qb, layout.block_q, n_kb, layout.block_k).any(5).any(3)


@pytest.mark.parametrize(
    "buckets, radius, n_dense, blocks",
    [(8, 0, 0, 32), (8, 1, 50, 32), (256, 2, 10, 16), (3000, 0, 0, 16), (3000, 1, 33, 32), (2, 3, 0, 16)],
)
def test_block_lists_cover_every_visible_pair(buckets, radius, n_dense, blocks):
    # 3000 buckets need 12 bits: the probe/range planner; <= 8 bits use bitmaps; radius >= bits lists all.
    _, _, _, _, q_codes, k_codes = make_case(230, 310, 8, buckets, seed=buckets + radius, B=2)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense, block_q=blocks, block_k=blocks, radius=radius)
    n_qb, n_kb = layout.num_q_blocks, layout.num_k_blocks
    listed = torch.zeros(2, 2, n_qb, n_kb + 1, dtype=torch.bool)
    slots = torch.arange(layout.kv_idx.shape[-1]) < layout.kv_num.unsqueeze(-1)
    listed.scatter_(3, torch.where(slots, layout.kv_idx.long(), n_kb), True)
    needed = sorted_visible_blocks(layout, q_codes, k_codes)
    assert not (needed & ~listed[..., :n_kb]).any(), "a visible pair lies in an unlisted block"
    listed_idx = torch.where(slots, layout.kv_idx, -1)
    assert (listed_idx[..., 1:] > listed_idx[..., :-1])[slots[..., 1:]].all(), "block lists must ascend"
    assert layout.density() == pytest.approx(token_rule(q_codes, k_codes, n_dense, radius).float().mean().item())
    assert 0 < layout.block_density() <= 1
    if buckets == 8 and radius == 0:
        assert layout.block_density() < 1  # the bitmap planner really prunes


def test_layout_sorts_buckets_contiguously_with_dense_keys_first():
    _, _, _, _, q_codes, k_codes = make_case(100, 120, 8, 5, seed=11)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=17)
    assert torch.equal(layout.q_codes_sorted.long(), q_codes.gather(2, layout.q_perm))
    assert (layout.q_codes_sorted[..., 1:] >= layout.q_codes_sorted[..., :-1]).all()
    assert torch.equal(layout.k_perm[..., :17], torch.arange(17).expand(1, 2, 17))
    assert (layout.k_codes_sorted[..., :17] == -1).all()
    assert torch.equal(layout.k_codes_sorted[..., 17:].long(), k_codes.gather(2, layout.k_perm[..., 17:]))


def test_flex_block_mask_is_planned_once_per_layout():
    q, k, v, bias, q_codes, k_codes = make_case(64, 96, 64, 4, seed=12)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=8)
    sparse_attention(q, k, v, layout, bias, backend="flex")
    block_mask = layout.cache["flex_block_mask"]
    sparse_attention(q, k, v, layout, None, backend="flex")
    assert layout.cache["flex_block_mask"] is block_mask


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"q_codes": -1}, r"q_codes must lie in \[0, 65536\)"),
        ({"k_codes": 2**16}, r"k_codes must lie in \[0, 65536\)"),
        ({"n_dense": 500}, r"n_dense must be an int in \[0, Nk=60\]"),
        ({"block_q": 48}, "block_q must be a power of two"),
        ({"radius": -1}, "radius must be an int"),
    ],
)
def test_bad_layout_input_is_refused(kwargs, message):
    q_codes = torch.zeros(1, 2, 50, dtype=torch.int64)
    k_codes = torch.zeros(1, 2, 60, dtype=torch.int64)
    if "q_codes" in kwargs:
        q_codes[0, 0, 0] = kwargs.pop("q_codes")
    if "k_codes" in kwargs:
        k_codes[0, 0, 0] = kwargs.pop("k_codes")
    with pytest.raises(KernelInputError, match=message):
        build_sparse_layout(q_codes, k_codes, **{"n_dense": 0, **kwargs})


def test_layout_shape_mismatch_is_refused():
    q, k, v, _, q_codes, k_codes = make_case(40, 50, 64, 2, seed=13)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=0)
    with pytest.raises(KernelInputError, match="layout was built for"):
        sparse_attention(q[:, :, :30], k, v, layout)


def test_flex_block_mask_under_the_compiled_kernel():
    """Compiled FlexAttention (the CUDA path) skips mask_mod in "full" blocks, eager mode does not: check the
    BlockMask with the compiled kernel, with n_dense = 70 so one key block is purely dense and one is mixed.
    A second layout with other codes and n_dense must reuse the compiled graph."""
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    from comfyui_fastar.kernels.sparse_flex import flex_block_mask

    compiled = torch.compile(flex_attention)
    for n_dense, seed in ((70, 14), (100, 15)):
        q, k, v, _, q_codes, k_codes = make_case(200, 250, 64, 8, seed=seed)
        layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense)
        out_sorted = compiled(
            layout.sort_queries(q), layout.sort_keys(k), layout.sort_keys(v), block_mask=flex_block_mask(layout)
        )
        out = layout.unsort_queries(out_sorted)
        ref = masked_reference(q, k, v, None, token_rule(q_codes, k_codes, n_dense, 0))
        assert (out.double() - ref).abs().max().item() < 2e-5
        if n_dense == 70:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs, "a new layout recompiled the kernel"


@pytest.mark.parametrize("radius, n_dense", [(0, 30), (1, 0)])
def test_torch_block_path_for_wide_codes(radius, n_dense):
    # Codes above 8 bits take the block-gather path instead of the per-code one.
    q, k, v, bias, q_codes, k_codes = make_case(180, 220, 64, 600, seed=7 + radius)
    k_codes[..., :180:3] = q_codes[..., ::3]  # make sure some sparse keys share a bucket with a query
    layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense, radius=radius)
    assert layout.bits > 8
    out = sparse_attention(q, k, v, layout, bias, backend="torch")
    ref = masked_reference(q, k, v, bias, token_rule(q_codes, k_codes, n_dense, radius))
    assert (out.double() - ref).abs().max().item() < 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bucket_of_only_empty_slots_adds_nothing_to_the_dense_keys(backend):
    # Every key of bucket 5 is an empty slot (-inf bias): its queries must get exactly the dense keys' result,
    # so the empty part has to carry lse -inf into the merge, not a finite value.
    q, k, v, bias, q_codes, k_codes = make_case(120, 160, 64, 8, seed=7)
    bias[k_codes == 5] = -math.inf
    bias[..., :30] = 0.0  # the dense keys are all live
    layout = build_sparse_layout(q_codes, k_codes, n_dense=30, radius=0)
    out = sparse_attention(q, k, v, layout, bias, backend=backend)
    ref = masked_reference(q, k, v, bias, token_rule(q_codes, k_codes, 30, 0))
    assert (q_codes == 5).any() and (out.double() - ref).abs().max().item() < 2e-5
