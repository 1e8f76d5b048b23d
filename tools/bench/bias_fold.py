"""``fastar bench bias-fold``: biased attention as a masked SDPA (backend torch) against the bias folded into a
mask-free SDPA (backend sdpa_fold), on this machine.

Shapes: one 3-frame chunk of Wan-1.3B queries (4,680 tokens, head dim 128) against a log-count-biased cache of
4,680 to 18,720 keys, 2 heads on a CPU (12 on CUDA). Every round times each path once per shape, in an order
that rotates from round to round; figures are per-path medians and the median of per-round ratios. The error of
both paths against a float64 reference is taken on the first 256 queries.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from ...kernels import attention, set_verification, verification_enabled
from .report import line_plots, machine, write_json

QUERIES, HEAD_DIM = 4680, 128
KEY_COUNTS = (4680, 9360, 18720)
PATHS = ("torch", "sdpa_fold")
CHECKED_QUERIES = 256


def _inputs(n_keys, heads, dtype, device, g):
    q = torch.randn(1, heads, QUERIES, HEAD_DIM, generator=g)
    k = torch.randn(1, heads, n_keys, HEAD_DIM, generator=g)
    v = torch.randn(1, heads, n_keys, HEAD_DIM, generator=g)
    bias = torch.randint(1, 22, (1, heads, n_keys), generator=g).float().log()
    bias[..., -64:] = -math.inf  # empty slots
    return [t.to(device, dtype) for t in (q, k, v)] + [bias.to(device)]


def _reference(q, k, v, bias):
    logits = q[:, :, :CHECKED_QUERIES].double() @ k.double().transpose(-1, -2) / math.sqrt(HEAD_DIM)
    return torch.softmax(logits + bias.double().unsqueeze(2), -1) @ v.double()


def _seconds(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def run_bias_fold_bench(out_dir, rounds: int = 5, key_counts=KEY_COUNTS, heads: int | None = None,
                        dtypes=None, seed: int = 0, device=None) -> dict:
    out_dir = Path(out_dir)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    heads = heads or (12 if device.type == "cuda" else 2)
    dtypes = dtypes or ((torch.bfloat16, torch.float16) if device.type == "cuda" else (torch.float32, torch.bfloat16))
    g = torch.Generator().manual_seed(seed)
    report = {"machine": machine(), "device": str(device), "rounds": rounds, "queries": QUERIES, "heads": heads,
              "head_dim": HEAD_DIM, "paths": list(PATHS), "cases": []}
    was_on = verification_enabled()
    set_verification(False)  # time the paths themselves, never a fallback
    try:
        for dtype in dtypes:
            for n_keys in key_counts:
                report["cases"].append(_case(n_keys, heads, dtype, device, g, rounds))
                write_json(out_dir / "bias_fold.json", report)
    finally:
        set_verification(was_on)
    _plot(out_dir, report)
    return report


def _case(n_keys, heads, dtype, device, g, rounds) -> dict:
    q, k, v, bias = _inputs(n_keys, heads, dtype, device, g)
    reference = _reference(q, k, v, bias)
    case = {"dtype": str(dtype).replace("torch.", ""), "keys": n_keys, "seconds": {p: [] for p in PATHS}}
    for path in PATHS:
        out = attention(q, k, v, bias, backend=path)  # warm-up, and the error
        case.setdefault("max_abs_err_vs_float64", {})[path] = float(
            (out[:, :, :CHECKED_QUERIES].double() - reference).abs().max())
    for r in range(rounds):
        order = PATHS[r % len(PATHS):] + PATHS[: r % len(PATHS)]
        for path in order:
            case["seconds"][path].append(_seconds(lambda p=path: attention(q, k, v, bias, backend=p), device))
    case["median_s"] = {p: statistics.median(s) for p, s in case["seconds"].items()}
    ratios = [f / t for f, t in zip(case["seconds"]["sdpa_fold"], case["seconds"]["torch"])]
    case["fold_over_masked_median_ratio"] = statistics.median(ratios)
    print(f"bias-fold {case['dtype']} keys={n_keys}: masked {case['median_s']['torch']:.3f} s, folded "
          f"{case['median_s']['sdpa_fold']:.3f} s, ratio {case['fold_over_masked_median_ratio']:.3f}", flush=True)
    return case


def _plot(out_dir, report):
    panels = []
    for dtype in dict.fromkeys(c["dtype"] for c in report["cases"]):
        cases = [c for c in report["cases"] if c["dtype"] == dtype]
        keys = [c["keys"] for c in cases]
        panels.append({"title": f"{dtype}, {report['heads']} heads x {report['queries']} queries",
                       "xlabel": "keys", "ylabel": "seconds (median)",
                       "series": {("masked SDPA (torch)" if p == "torch" else "folded bias (sdpa_fold)"):
                                  (keys, [c["median_s"][p] for c in cases]) for p in PATHS}})
    line_plots(out_dir / "bias_fold.png", panels, title=f"biased attention on {report['device']}")
