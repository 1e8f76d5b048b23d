"""TempCache's search in one operator: the fused Triton kernel (under the interpreter here) and the torch path
give each row's best scores, best first, with the columns they came from."""

import pytest
import torch

from comfyui_fastar.kernels import topk_scores
from comfyui_fastar.kernels.topk import topk_scores_op


def unit(*shape, seed, dtype=torch.float32):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return (x / x.norm(dim=-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_best_scores_of_each_row_with_their_columns(backend, dtype):
    a, b = unit(2, 70, 16, seed=0, dtype=dtype), unit(2, 300, 16, seed=1, dtype=dtype)
    b[1, 17] = a[1, 5]  # one exact match: score 1, the row's best
    vals, cols = topk_scores_op(a, b, 5, backend)
    exact = a.float() @ b.float().transpose(1, 2)
    want = exact.topk(5, dim=-1).values
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert vals.shape == cols.shape == (2, 70, 5) and vals.dtype == torch.float32 and cols.dtype == torch.long
    torch.testing.assert_close(vals, want, atol=tol, rtol=0)
    torch.testing.assert_close(exact.gather(-1, cols), vals, atol=tol, rtol=0)  # each score is its column's
    assert (vals.diff(dim=-1) <= 0).all()  # best first
    assert cols[1, 5, 0] == 17


def test_the_public_call_checks_its_inputs_and_runs_on_a_cpu():
    a, b = unit(1, 8, 32, seed=2), unit(1, 40, 32, seed=3)
    vals, cols = topk_scores(a, b, 3)
    assert vals.shape == (1, 8, 3)
    with pytest.raises(Exception, match="k must be"):
        topk_scores(a, b, 41)
    with pytest.raises(Exception, match="share"):
        topk_scores(a, b[..., :16], 3)
