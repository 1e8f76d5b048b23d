"""FlashInfer backends (CUDA, Linux, fp16/bf16): dense attention, and dense and sparse attention with the bias
folded in exactly.

Dense attention without a bias (a window's, dense-global's) is `single_prefill_with_kv_cache` per batch item:
queries in its NHD layout as views of ours, keys and values as HND views of the cache (their strides are read
by the kernel), no plan, so nothing synchronises and a step can be captured; FA3 on Hopper. `auto` picks it there.

With a bias, both run the requests from `flashinfer_plan` through one `BatchPrefillWithPagedKVCacheWrapper` (one
head, page size 1): plain attention per request, then its base-2 LSE goes to natural log, gets the request's bias
added, and the requests of each query merge by LSE. Plans are cached: per bias tensor for dense attention,
on the layout for sparse attention, so `plan()` (which synchronises) runs once per layout and bias.
"""

import math
import weakref

import torch

from .flashinfer_plan import AttentionRequests, merge_request_rows, plan_dense_requests, plan_sparse_requests

WORKSPACE_BYTES = 256 * 2**20
MAX_DENSE_PLANS = 64
_workspaces: dict = {}
_dense_plans: dict = {}  # (shape, device) -> (weakref to bias or None, bias version, AttentionRequests)


def attention_flashinfer(q, k, v, bias, scale: float, return_lse: bool):
    if bias is None:
        return dense_prefill(q, k, v, scale, return_lse)
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    requests = _cached_plan(_dense_plans, (B, H, Nq, Nk, bias.shape if bias is not None else None, q.device), bias,
                            lambda: plan_dense_requests(bias, B, H, Nq, Nk, q.device))
    out, lse = run_requests(q, k, v, requests, scale)
    return out, (lse if return_lse else None)


def dense_prefill(q, k, v, scale: float, return_lse: bool):
    """Plain attention of q [B, H, Nq, D] over k, v [B, H, Nk, D] by FlashInfer's single prefill, batch item by
    batch item (views, no copies: q as [Nq, H, D], k and v as [H, Nk, D]); its base-2 LSE in natural log."""
    import flashinfer

    outs, lses = [], []
    for b in range(q.shape[0]):
        result = flashinfer.single_prefill_with_kv_cache(q[b].transpose(0, 1), k[b], v[b], kv_layout="HND",
                                                         sm_scale=scale, return_lse=return_lse)
        if return_lse:
            o, lse = result
            lses.append(lse.transpose(0, 1).float() * math.log(2.0))
        else:
            o = result
        outs.append(o.transpose(0, 1))  # [H, Nq, D], a view
    out = outs[0][None] if len(outs) == 1 else torch.stack(outs)
    lse = None if not return_lse else (lses[0][None] if len(lses) == 1 else torch.stack(lses))
    return out, lse


def sparse_attention_flashinfer(q, k, v, layout, bias, scale: float):
    plans = layout.cache.setdefault("flashinfer_plans", {})
    requests = _cached_plan(plans, "latest", bias, lambda: plan_sparse_requests(layout, bias))
    out, _ = run_requests(q, k, v, requests, scale)
    return out


def run_requests(q, k, v, requests: AttentionRequests, scale: float):
    """Execute the requests on FlashInfer and merge them: returns (out [B,H,Nq,D] in q's dtype, lse float32)."""
    B, H, Nq, D = q.shape
    if requests.num_requests == 0:
        return q.new_zeros(B, H, Nq, D), torch.full((B, H, Nq), -math.inf, device=q.device)
    wrapper = _planned_wrapper(requests, q, k, scale)
    q_req = q.reshape(-1, D)[requests.q_rows].unsqueeze(1)  # [total_q, 1 head, D]
    k_pages = k.contiguous().view(-1, 1, 1, D)  # [B*H*Nk pages, page size 1, 1 head, D]
    v_pages = v.contiguous().view(-1, 1, 1, D)
    o, lse2 = wrapper.run(q_req, (k_pages, v_pages), return_lse=True)
    if "row_bias" not in requests.cache:
        requests.cache["row_bias"] = requests.row_bias()
    lse = lse2.reshape(-1).float() * math.log(2.0) + requests.cache["row_bias"]
    out, lse = merge_request_rows(o.reshape(-1, D), lse, requests.q_rows, requests.num_query_rows)
    return out.to(q.dtype).view(B, H, Nq, D), lse.view(B, H, Nq)


def _planned_wrapper(requests: AttentionRequests, q, k, scale: float):
    import flashinfer

    key = ("wrapper", q.device, q.dtype, k.dtype, q.shape[-1], scale)
    wrapper = requests.cache.get(key)
    if wrapper is None:
        device = q.device
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), kv_layout="NHD")
        wrapper.plan(
            requests.qo_indptr.to(device),
            requests.kv_indptr.to(device),
            requests.kv_tokens.to(device),
            torch.ones(requests.num_requests, dtype=torch.int32, device=device),
            num_qo_heads=1,
            num_kv_heads=1,
            head_dim_qk=q.shape[-1],
            page_size=1,
            causal=False,
            sm_scale=scale,
            q_data_type=q.dtype,
            kv_data_type=k.dtype,
        )
        requests.cache[key] = wrapper
    return wrapper


def _workspace(device):
    if device not in _workspaces:
        _workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def _cached_plan(store: dict, key, bias, build):
    """Reuse the plan while the same bias tensor (same object, unmodified) comes back."""
    entry = store.get(key)
    version = bias._version if bias is not None else None
    if entry is not None:
        ref, cached_version, plan = entry
        same_bias = (ref is None and bias is None) or (ref is not None and ref() is bias)
        if same_bias and cached_version == version:
            return plan
    plan = build()
    if len(store) >= MAX_DENSE_PLANS:
        store.clear()
    store[key] = (weakref.ref(bias) if bias is not None else None, version, plan)
    return plan
