"""FlashInfer cannot run here: its pure-torch planning (bias split into requests, LSE merge) is executed with a
torch stand-in for the FlashInfer kernel and checked against the biased reference."""

import math

import pytest
import torch

from comfyui_fastar.kernels import BackendUnavailableError, build_sparse_layout, sparse_attention
from comfyui_fastar.kernels.flashinfer_plan import (
    merge_request_rows,
    plan_dense_requests,
    plan_sparse_requests,
)


def run_requests_in_torch(q, k, v, requests, scale):
    """What FlashInfer's paged prefill computes per request (plain attention + base-2 LSE), then our merge."""
    D = q.shape[-1]
    qf, kf, vf = (t.reshape(-1, D).double() for t in (q, k, v))
    outs, lses = [], []
    for r in range(requests.num_requests):
        rows = requests.q_rows[requests.qo_indptr[r] : requests.qo_indptr[r + 1]]
        keys = requests.kv_tokens[requests.kv_indptr[r] : requests.kv_indptr[r + 1]].long()
        logits = qf[rows] @ kf[keys].T * scale
        outs.append(torch.softmax(logits, -1) @ vf[keys])
        lse2 = torch.logsumexp(logits, -1) / math.log(2)
        lses.append(lse2 * math.log(2) + requests.row_bias()[requests.qo_indptr[r] : requests.qo_indptr[r + 1]])
    out, lse = merge_request_rows(torch.cat(outs), torch.cat(lses), requests.q_rows, requests.num_query_rows)
    return out.view(q.shape), lse.view(q.shape[:-1])


def reference(q, k, v, bias, visible=None, scale=0.25):
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale + bias.double().unsqueeze(2)
    if visible is not None:
        logits = logits.masked_fill(~visible, -math.inf)
    return torch.softmax(logits, -1).nan_to_num(0.0) @ v.double(), torch.logsumexp(logits, -1)


def make(B=2, H=2, Nq=30, Nk=50, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (Nq, Nk, Nk))
    bias = torch.log(torch.randint(1, 4, (B, 1, Nk), generator=gen).float())  # broadcast over heads
    bias[..., ::4] = -math.inf
    bias[1] = -math.inf  # batch 1 sees nothing
    return q, k, v, bias


def assert_matches(got, expected):
    out, lse = got
    ref_out, ref_lse = expected
    assert (out.double() - ref_out).abs().max().item() < 1e-5
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-5


def test_dense_plan_splits_by_bias_value_and_merges_exactly():
    q, k, v, bias = make()
    requests = plan_dense_requests(bias, 2, 2, 30, 50, "cpu")
    # one request per (batch 0, head, distinct finite value): values log 1, log 2, log 3
    assert requests.num_requests == 2 * 3
    assert set(requests.request_bias.tolist()) == set(torch.log(torch.tensor([1.0, 2.0, 3.0])).tolist())
    assert_matches(run_requests_in_torch(q, k, v, requests, 0.25), reference(q, k, v, bias))


@pytest.mark.parametrize("radius, n_dense, buckets", [(0, 10, 4), (1, 0, 16), (0, 50, 3), (2, 5, 2000)])
def test_sparse_plan_covers_exactly_the_visible_keys(radius, n_dense, buckets):
    q, k, v, bias = make(seed=radius + n_dense)
    gen = torch.Generator().manual_seed(1)
    q_codes = torch.randint(0, buckets, (2, 2, 30), generator=gen)
    k_codes = torch.randint(0, buckets, (2, 2, 50), generator=gen)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense, block_q=16, block_k=16, radius=radius)
    hamming = (((q_codes[..., :, None] ^ k_codes[..., None, :])[..., None] >> torch.arange(16)) & 1).sum(-1)
    visible = (torch.arange(50) < n_dense) | (hamming <= radius)
    requests = plan_sparse_requests(layout, bias)
    assert_matches(run_requests_in_torch(q, k, v, requests, 0.25), reference(q, k, v, bias, visible))


def test_merge_rows_with_no_request_give_zero_and_minus_inf():
    out, lse = merge_request_rows(torch.ones(2, 3), torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), 3)
    assert torch.allclose(out[0], torch.ones(3)) and torch.equal(out[1:], torch.zeros(2, 3))
    assert lse[0].item() == pytest.approx(math.log(1 + math.e)) and torch.isneginf(lse[1:]).all()


def test_selecting_flashinfer_on_cpu_fails_clearly():
    q, k, v, bias = make(D=64)
    layout = build_sparse_layout(torch.zeros(2, 2, 30, dtype=torch.long), torch.zeros(2, 2, 50, dtype=torch.long),
                                 n_dense=0)
    with pytest.raises(BackendUnavailableError, match="backend 'flashinfer' cannot run sparse_attention here"):
        sparse_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), layout, bias, backend="flashinfer")
