"""Combine attention results computed over disjoint key sets into the result over their union (exact)."""

import torch

from .errors import KernelInputError


def merge_attention_states(outs, lses):
    """Merge partial attentions `outs[s]` [..., N, D] with their natural-log LSEs `lses[s]` [..., N].

    out = sum_s exp(lse_s - L) * out_s with L = logsumexp_s lse_s. A query that saw no key in any part
    (every lse_s = -inf) gets out = 0 and lse = -inf. Returns (out in outs' dtype, lse float32).
    """
    outs = list(outs) if not isinstance(outs, torch.Tensor) else list(outs.unbind(0))
    lses = list(lses) if not isinstance(lses, torch.Tensor) else list(lses.unbind(0))
    if not outs or len(outs) != len(lses):
        raise KernelInputError(
            f"need one lse per partial output and at least one of each, got {len(outs)} and {len(lses)}"
        )
    shape = outs[0].shape
    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.shape != shape or tuple(l.shape) != tuple(shape[:-1]):
            raise KernelInputError(
                f"part {i}: outs must all be {tuple(shape)} and lses {tuple(shape[:-1])}, "
                f"got {tuple(o.shape)} and {tuple(l.shape)}"
            )
    lse_all = torch.stack([l.float() for l in lses])
    total = torch.logsumexp(lse_all, dim=0)
    # exp(-inf - 0) = 0 keeps queries that saw nothing at zero weight instead of NaN.
    weights = torch.exp(lse_all - torch.where(torch.isfinite(total), total, torch.zeros_like(total)))
    out = sum(w.unsqueeze(-1) * o.float() for w, o in zip(weights, outs))
    return out.to(outs[0].dtype), total
