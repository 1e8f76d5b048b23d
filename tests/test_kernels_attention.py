"""Dense biased attention: every CPU-runnable backend against a float64 reference, and Lemma 5.1."""

import math

import pytest
import torch

from comfyui_fastar.kernels import KernelInputError, attention, merge_attention_states

BACKENDS = ["torch", "triton", "flex"]
OUT_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def reference(q, k, v, bias=None, scale=None):
    """float64 softmax attention on the same (rounded) inputs; unseen queries give 0 and -inf."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias.double().unsqueeze(2)
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v.double()
    return out, lse


def make_inputs(B, H, Nq, Nk, D, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen).to(dtype) for n in (Nq, Nk, Nk))
    bias = torch.log(torch.randint(1, 6, (B, H, Nk), generator=gen).float())
    bias[..., ::7] = -math.inf  # empty slots
    return q, k, v, bias


def assert_close(out, lse, ref_out, ref_lse, dtype):
    assert out.dtype == dtype
    assert (out.double() - ref_out).abs().max().item() < OUT_TOL[dtype]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backend_matches_reference_with_ragged_tails_and_empty_slots(backend, dtype, head_dim):
    # Nq and Nk are not multiples of any tile; head 1 has every key -inf, so its queries see nothing.
    q, k, v, bias = make_inputs(1, 2, 100, 150, head_dim, dtype)
    bias[0, 1] = -math.inf
    out, lse = attention(q, k, v, bias, return_lse=True, backend=backend)
    ref_out, ref_lse = reference(q, k, v, bias)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.isneginf(lse[0, 1]).all()


@pytest.mark.parametrize("backend", ["triton", "flex"])
def test_no_bias_and_custom_scale(backend):
    q, k, v, _ = make_inputs(1, 1, 70, 90, 64, torch.float32, seed=1)
    out, lse = attention(q, k, v, scale=0.3, return_lse=True, backend=backend)
    ref_out, ref_lse = reference(q, k, v, scale=0.3)
    assert_close(out, lse, ref_out, ref_lse, torch.float32)


def test_odd_head_dim_takes_the_torch_path_under_triton():
    q, k, v, bias = make_inputs(1, 2, 50, 70, 80, torch.float32, seed=2)
    out, lse = attention(q, k, v, bias, return_lse=True, backend="triton")
    ref_out, ref_lse = reference(q, k, v, bias)
    assert_close(out, lse, ref_out, ref_lse, torch.float32)
    torch_out = attention(q, k, v, bias, backend="torch")
    assert torch.equal(out, torch_out)


@pytest.mark.parametrize("shape", [(1, 2, 150), (2, 1, 150), (1, 1, 150)])
def test_broadcast_bias_shapes(shape):
    q, k, v, full = make_inputs(2, 2, 40, 150, 64, torch.float32, seed=3)
    bias = full[: shape[0], : shape[1]]
    out = attention(q, k, v, bias, backend="triton")
    expected = attention(q, k, v, bias.expand(2, 2, 150).contiguous(), backend="torch")
    assert (out - expected).abs().max().item() < 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_lemma_5_1_duplicated_keys_equal_merged_keys_with_log_count_bias(backend):
    """Keys repeated m times (each copy with its own value) attended plainly == each key once, with the mean of
    its values and bias log(m)."""
    gen = torch.Generator().manual_seed(4)
    B, H, Nq, groups, D = 1, 2, 90, 60, 64
    q = torch.randn(B, H, Nq, D, generator=gen)
    unique_k = torch.randn(B, H, groups, D, generator=gen)
    counts = torch.randint(1, 6, (groups,), generator=gen)
    group_of_copy = torch.repeat_interleave(torch.arange(groups), counts)
    dup_k = unique_k[:, :, group_of_copy]
    dup_v = torch.randn(B, H, group_of_copy.numel(), D, generator=gen)
    mean_v = torch.zeros(B, H, groups, D).index_add_(2, group_of_copy, dup_v) / counts[:, None].float()
    log_m = torch.log(counts.float()).expand(B, H, groups).contiguous()

    plain = attention(q, dup_k, dup_v, backend=backend)
    merged = attention(q, unique_k, mean_v, log_m, backend=backend)
    assert (plain - merged).abs().max().item() < 1e-5
    assert (plain.double() - reference(q, dup_k, dup_v)[0]).abs().max().item() < 1e-5


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_merge_of_disjoint_key_sets_equals_full_attention(backend):
    q, k, v, bias = make_inputs(1, 2, 64, 150, 64, torch.float32, seed=5)
    bias[0, 1, :100] = -math.inf  # head 1 sees nothing in the first part
    parts = [slice(0, 100), slice(100, 150)]
    outs, lses = zip(*(attention(q, k[:, :, s], v[:, :, s], bias[..., s], return_lse=True, backend=backend)
                       for s in parts))
    out, lse = merge_attention_states(outs, lses)
    ref_out, ref_lse = reference(q, k, v, bias)
    assert_close(out, lse, ref_out, ref_lse, torch.float32)


def test_merge_keeps_queries_that_saw_nothing_at_zero():
    out = torch.randn(2, 1, 1, 4, 8)
    lse = torch.full((2, 1, 1, 4), -math.inf)
    merged, merged_lse = merge_attention_states(out, lse)
    assert torch.equal(merged, torch.zeros(1, 1, 4, 8))
    assert torch.isneginf(merged_lse).all()


def test_no_keys_gives_zeros_and_minus_inf():
    q = torch.randn(1, 2, 5, 64)
    k = v = torch.randn(1, 2, 0, 64)
    out, lse = attention(q, k, v, return_lse=True, backend="torch")
    assert torch.equal(out, torch.zeros_like(q)) and torch.isneginf(lse).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "bias": a["bias"].double()}, "bias must be float32"),
        (lambda a: {**a, "bias": a["bias"][..., :10]}, "bias must have shape"),
        (lambda a: {**a, "bias": torch.full_like(a["bias"], math.nan)}, "NaN or +inf"),
        (lambda a: {**a, "k": a["k"].half()}, "share one dtype"),
        (lambda a: {**a, "v": a["v"][..., :32]}, "v must have k's shape"),
        (lambda a: {**a, "q": a["q"][0]}, "q must be 4-D"),
        (lambda a: {**a, "scale": -1.0}, "scale must be a positive"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(change, message):
    q, k, v, bias = make_inputs(1, 2, 8, 12, 64, torch.float32)
    args = change({"q": q, "k": k, "v": v, "bias": bias, "scale": None})
    with pytest.raises(KernelInputError, match=message.replace("+", r"\+")):
        attention(args["q"], args["k"], args["v"], args["bias"], scale=args["scale"])
