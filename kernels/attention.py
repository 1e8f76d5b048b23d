"""Public dense attention with a per-key logit bias: check the inputs, pick the backends, run the first that works."""

import torch

from .checks import check_bias, check_qkv, resolve_scale
from .dispatch import backend_chain
from .verify import Family, compare, log_count_bias, probe_generator, run_with_fallback

PROBE_SHAPE = (1, 3, 70, 100)  # B, H, Nq, Nk: ragged against every tile size, and a head that sees no key


def attention(q, k, v, bias=None, *, scale=None, return_lse=False, backend="auto", check_values=True,
              may_be_blind=True):
    """softmax(scale * q k^T + bias[key]) v over all keys, per (batch, head).

    q [B, H, Nq, D]; k, v [B, H, Nk, D] (one dtype: float32, float16 or bfloat16); bias float32 broadcastable
    to [B, H, Nk] with entries finite or -inf (e.g. log(count) of merged keys, -inf for empty slots). `scale`
    defaults to 1/sqrt(D). Output in q's dtype with fp32 accumulation; with `return_lse` also the natural-log
    LSE [B, H, Nq] in float32. A query that sees no key outputs zeros with lse = -inf.
    `backend`: "auto", "torch", "triton", "flex", "flashinfer", "sdpa_fold" or a registered host backend (see
    `available_backends`); accelerated ones are checked against torch at first use (see `verify`).
    `check_values=False` skips reading the bias on the host to check its entries (a caller whose biases are
    finite or -inf by construction, on its hot path). `may_be_blind=False`: the caller knows every (batch, head)
    has a finite key (its queries' own keys are among them), so no backend looks for one that sees nothing.
    """
    B, H, Nq, Nk, D = check_qkv(q, k, v)
    bias = check_bias(bias, B, H, Nk, q.device, check_values)
    scale = resolve_scale(scale, D)
    chain = backend_chain("attention", backend, q.device, dtype=q.dtype, head_dim=D, has_bias=bias is not None,
                          return_lse=return_lse)
    if Nk == 0 or Nq == 0:
        out = torch.zeros(B, H, Nq, D, dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, Nq), float("-inf"), dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    family = Family(str(q.device), q.dtype, D, bias is not None, return_lse)
    out, lse = run_with_fallback("attention", chain, family,
                                 lambda name: _run(name, q, k, v, bias, scale, return_lse, may_be_blind),
                                 lambda name: probe(name, family))
    return (out, lse) if return_lse else out


def probe(name: str, family: Family) -> str | None:
    """Backend `name` against torch on a small problem of `family`: None, or the difference found."""
    B, H, Nq, Nk = PROBE_SHAPE
    D = family.head_dim
    gen = probe_generator(D)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (Nq, Nk, Nk))
    q = 2 * q  # peaked softmax: outputs of order 1, so errors show
    bias = log_count_bias(B, H, Nk, gen, family.device, blind_head=True) if family.has_bias else None
    q, k, v = (t.to(family.device, family.dtype) for t in (q, k, v))
    scale = resolve_scale(None, D)
    out, lse = _run(name, q, k, v, bias, scale, family.return_lse)
    ref_out, ref_lse = _run("torch", q.float(), k.float(), v.float(), bias, scale, family.return_lse)
    problem = compare(out, ref_out, name, family.dtype)
    if problem is None and family.return_lse:
        problem = compare(lse, ref_lse, name, family.dtype, what="lse")
    return problem


def _run(name, q, k, v, bias, scale, return_lse, may_be_blind=True):
    if name == "triton":
        from .attention_triton import attention_triton

        return attention_triton(q, k, v, bias, scale, return_lse)
    if name == "flex":
        from .attention_flex import attention_flex

        return attention_flex(q, k, v, bias, scale, return_lse)
    if name == "flashinfer":
        from .attention_flashinfer import attention_flashinfer

        return attention_flashinfer(q, k, v, bias, scale, return_lse)
    if name == "sdpa_fold":
        from .attention_fold import attention_fold

        return attention_fold(q, k, v, bias, scale, return_lse, may_be_blind)
    if name != "torch":
        from .host_backends import attention_host

        return attention_host(name, q, k, v, scale), None
    from .attention_torch import attention_torch

    return attention_torch(q, k, v, bias, scale, return_lse, may_be_blind)
