"""GPU check of the kernels at Wan-1.3B self-attention shapes: accuracy against SDPA, and timings.

Shapes: B=1, 12 heads of 128, bf16, 4,680 queries (3 latent frames of 1,560 tokens) against 4,680 to 37,440
keys. Dense: each backend with a log-count key bias, against PyTorch's flash SDPA without bias on the same
shapes (target: within 1.2x). Sparse at 37,440 keys: random bucket codes give 10-100 % density with the first
Nq keys dense; block-sparse at 20 % against dense flash SDPA (target: >= 3x faster).

Order: small convention checks, then triton and torch at every shape, then the backends that compile on
first use (flex, flashinfer) at the largest shape only, so a slow compile cannot cost the core numbers.
`kernels.json` is rewritten after every measurement; what was skipped and why is printed and recorded. Run
it as `fastar bench kernels --out DIR`.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

BATCH, HEADS, HEAD_DIM, N_QUERIES = 1, 12, 128, 4680
KEY_COUNTS = (4680, 9360, 18720, 37440)
DENSITIES = (0.10, 0.20, 0.30, 0.50, 1.00)
DTYPE = torch.bfloat16
TARGET_BIAS_RATIO = 1.2
TARGET_SPARSE_SPEEDUP = 3.0
WARMUP, REPS = 3, 10
CORE_BACKENDS = ("triton", "torch")
COMPILING_BACKENDS = ("flex", "flashinfer")
# Seconds a step may need (first call autotunes or compiles); a step starts only if this much budget is left.
STEP_COST_S = {"torch": 5, "triton": 15, "flex": 90, "flashinfer": 90}


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Report(dict):
    """The JSON report, written to disk after every change so an interrupted run keeps its numbers."""

    def __init__(self, out_dir, **fields):
        super().__init__(**fields)
        self.path = os.path.join(out_dir, "kernels.json")
        os.makedirs(out_dir, exist_ok=True)

    def add(self, section, row):
        self.setdefault(section, []).append(row)
        self.save()

    def skip(self, what, why):
        print(f"skipped {what}: {why}", flush=True)
        self.add("skipped", {"what": what, "why": why})

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self, f, indent=2)


def run_kernel_bench(out_dir, *, time_budget_s: float = 270, device: str = "cuda") -> dict:
    """Measure every available backend; write `out_dir/kernels.json` and return the same dict."""
    if not torch.cuda.is_available() or not str(device).startswith("cuda"):
        raise RuntimeError(
            f"the kernel bench needs a CUDA GPU (device={device!r}, torch.cuda.is_available()="
            f"{torch.cuda.is_available()}); on CPU run the tests instead: python -m pytest tests/test_kernels_*.py"
        )
    return measure_all(out_dir, Budget(time_budget_s), torch.device(device))


def measure_all(out_dir, budget: Budget, device: torch.device) -> dict:
    """The whole bench on any device (tests dry-run it on CPU with tiny shapes). First-use verification is off
    while it runs: each row measures the backend it names, never a fallback."""
    from ...kernels import set_verification, verification_enabled

    was_on = verification_enabled()
    set_verification(False)
    try:
        return _measure_all(out_dir, budget, device)
    finally:
        set_verification(was_on)


def _measure_all(out_dir, budget: Budget, device: torch.device) -> dict:
    from ...kernels.dispatch import available_backends, backend_problem

    dense_names = available_backends(device, "attention", DTYPE)
    sparse_names = available_backends(device, "sparse_attention", DTYPE)
    report = Report(
        out_dir,
        env=_environment(device),
        shapes={"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "queries": N_QUERIES, "dtype": str(DTYPE)},
        backends={"attention": dense_names, "sparse_attention": sparse_names},
        conventions=[], dense=[], sparse=[], lsh=[], skipped=[],
    )
    for name in COMPILING_BACKENDS + ("triton",):
        if name not in dense_names:
            report.skip(f"{name}: not available", backend_problem("attention", name, device, DTYPE))
    torch.manual_seed(0)

    _check_conventions(report, budget, device, [n for n in CORE_BACKENDS if n in dense_names])
    last = None
    for n_keys in KEY_COUNTS:
        last = _DenseCase(device, n_keys)
        for name in CORE_BACKENDS:
            if name in dense_names:
                _measure_dense(report, budget, last, name)
    sparse20 = None
    for density in DENSITIES:
        case = _SparseCase(device, last, density)
        for name in CORE_BACKENDS:
            if name in sparse_names and (name == "triton" or density == 0.20):
                _measure_sparse(report, budget, case, name)
        if density == 0.20:
            sparse20 = case
    _measure_lsh(report, budget, device)
    # FlashInfer may JIT-compile on first use; flex conventions are left out (one more compile, same code path).
    _check_conventions(report, budget, device, [n for n in ("flashinfer",) if n in dense_names])
    for name in COMPILING_BACKENDS:
        if name in dense_names:
            _measure_dense(report, budget, last, name)
        if name in sparse_names:
            _measure_sparse(report, budget, sparse20, name)
    report["targets"] = _targets(report)
    report.save()
    print(f"wrote {report.path}\n{json.dumps(report['targets'], indent=2)}", flush=True)
    return dict(report)


class _DenseCase:
    """Inputs with a log-count bias, the fp32 reference and the flash SDPA (no bias) baseline at one key count."""

    def __init__(self, device, n_keys):
        self.n_keys = n_keys
        self.q, self.k, self.v, self.bias = _inputs(device, n_keys)
        self.reference = _reference(self.q, self.k, self.v, self.bias)
        try:
            self.flash_ms = _time_ms(lambda: _flash_sdpa(self.q, self.k, self.v))
            self.flash_error = None
        except Exception as e:  # no flash kernel: ratios are left out, the rest still runs
            self.flash_ms, self.flash_error = None, repr(e)[:300]


class _SparseCase:
    """Random bucket codes for one target density over the largest dense case, with the masked reference."""

    def __init__(self, device, dense: _DenseCase, density):
        from ...kernels import build_sparse_layout

        self.dense, self.target = dense, density
        self.n_dense, self.buckets = _bucket_plan(density, N_QUERIES, dense.n_keys)
        q_codes = torch.randint(0, self.buckets, (BATCH, HEADS, N_QUERIES), device=device)
        k_codes = torch.randint(0, self.buckets, (BATCH, HEADS, dense.n_keys), device=device)
        start = time.perf_counter()
        self.layout = build_sparse_layout(q_codes, k_codes, n_dense=self.n_dense)
        _synchronize(device)
        self.layout_ms = 1e3 * (time.perf_counter() - start)
        self.reference = _masked_reference(dense.q, dense.k, dense.v, dense.bias, q_codes, k_codes, self.n_dense)


def _check_conventions(report, budget, device, names):
    """Small shapes with ragged tails and a head whose keys are all -inf: error vs fp32, and zeros there."""
    from ...kernels import attention, build_sparse_layout, sparse_attention

    q, k, v = (torch.randn(1, 2, n, HEAD_DIM, device=device, dtype=DTYPE) for n in (100, 150, 150))
    bias = torch.log(torch.randint(1, 6, (1, 2, 150), device=device).float())
    bias[0, 1] = -math.inf
    reference = _reference(q, k, v, bias)
    codes = torch.randint(0, 3, (1, 2, 250), device=device)
    layout = build_sparse_layout(codes[..., :100], codes[..., 100:], n_dense=20)
    sparse_ref = _masked_reference(q, k, v, bias, codes[..., :100], codes[..., 100:], 20)
    for name in names:
        if budget.left() < STEP_COST_S[name]:
            report.skip(f"conventions {name}", "time budget exhausted")
            continue
        row = {"backend": name}
        try:
            out = attention(q, k, v, bias, backend=name)
            row["dense_max_abs_err"] = _max_err(out, reference)
            row["dense_blind_head_is_zero"] = bool((out[0, 1] == 0).all())
            out = sparse_attention(q, k, v, layout, bias, backend=name)
            row["sparse_max_abs_err"] = _max_err(out, sparse_ref)
            row["sparse_blind_head_is_zero"] = bool((out[0, 1] == 0).all())
        except Exception as e:
            row["error"] = repr(e)[:500]
        print(f"conventions {row}", flush=True)
        report.add("conventions", row)


def _measure_dense(report, budget, case: _DenseCase, name):
    from ...kernels import attention

    if budget.left() < STEP_COST_S[name]:
        report.skip(f"dense {name} at {case.n_keys} keys", "time budget exhausted")
        return
    row = {"keys": case.n_keys, "backend": name, "flash_sdpa_no_bias_ms": case.flash_ms}
    if case.flash_error:
        row["flash_sdpa_error"] = case.flash_error
    try:
        out = attention(case.q, case.k, case.v, case.bias, backend=name)
        row["max_abs_err"] = _max_err(out, case.reference)
        row["ms"] = _time_ms(lambda: attention(case.q, case.k, case.v, case.bias, backend=name))
        if case.flash_ms:
            row["ratio_vs_flash_no_bias"] = row["ms"] / case.flash_ms
    except Exception as e:
        row["error"] = repr(e)[:500]
    print(f"dense {row}", flush=True)
    report.add("dense", row)


def _measure_sparse(report, budget, case: _SparseCase, name):
    from ...kernels import sparse_attention

    if case is None:
        return
    if budget.left() < STEP_COST_S[name]:
        report.skip(f"sparse {name} at density {case.target:.0%}", "time budget exhausted")
        return
    d = case.dense
    row = {"target_density": case.target, "density": case.layout.density(),
           "block_density": case.layout.block_density(), "n_dense": case.n_dense, "buckets": case.buckets,
           "layout_ms": case.layout_ms, "backend": name}
    try:
        out = sparse_attention(d.q, d.k, d.v, case.layout, d.bias, backend=name)
        row["max_abs_err"] = _max_err(out, case.reference)
        row["ms"] = _time_ms(lambda: sparse_attention(d.q, d.k, d.v, case.layout, d.bias, backend=name))
        if d.flash_ms:
            row["speedup_vs_flash_dense"] = d.flash_ms / row["ms"]
    except Exception as e:
        row["error"] = repr(e)[:500]
    print(f"sparse {row}", flush=True)
    report.add("sparse", row)


def _measure_lsh(report, budget, device):
    """Triton vs torch sign-LSH: codes differ only where a projection is within rounding of 0."""
    from ...kernels import lsh_codes

    if budget.left() < STEP_COST_S["triton"] or "triton" not in report["backends"]["attention"]:
        report.skip("lsh", "time budget exhausted or triton unavailable")
        return
    tokens = KEY_COUNTS[-1]
    x = torch.randn(BATCH, HEADS, tokens, HEAD_DIM, device=device, dtype=DTYPE)
    planes = torch.randn(HEADS, HEAD_DIM, 4 * 8, device=device)
    row = {"tokens": tokens, "bits": 8, "tables": 4}
    try:
        codes = {name: lsh_codes(x, planes, bits=8, backend=name) for name in ("torch", "triton")}
        row["mismatch_fraction"] = float((codes["torch"] != codes["triton"]).float().mean())
        for name in ("torch", "triton"):
            row[f"{name}_ms"] = _time_ms(lambda n=name: lsh_codes(x, planes, bits=8, backend=n))
    except Exception as e:
        row["error"] = repr(e)[:500]
    print(f"lsh {row}", flush=True)
    report.add("lsh", row)


def _bucket_plan(density, n_queries, n_keys):
    """(n_dense, buckets) whose random codes give about `density` of visible pairs.

    With n_dense = Nq dense keys the floor is Nq/Nk (12.5 % at 37,440 keys); below it the dense part is
    dropped and the buckets alone set the density."""
    n_dense = n_queries if density * n_keys > n_queries else 0
    sparse_share = density * n_keys - n_dense
    buckets = max(1, round((n_keys - n_dense) / sparse_share))
    return n_dense, buckets


def _inputs(device, n_keys):
    q = torch.randn(BATCH, HEADS, N_QUERIES, HEAD_DIM, device=device, dtype=DTYPE)
    k = torch.randn(BATCH, HEADS, n_keys, HEAD_DIM, device=device, dtype=DTYPE)
    v = torch.randn(BATCH, HEADS, n_keys, HEAD_DIM, device=device, dtype=DTYPE)
    bias = torch.log(torch.randint(1, 6, (BATCH, HEADS, n_keys), device=device).float())
    bias[..., -64:] = -math.inf  # a few empty cache slots
    return q, k, v, bias


def _reference(q, k, v, bias):
    """fp32 biased attention, one head at a time; a head whose keys are all -inf gives 0."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for h in range(q.shape[1]):
        b = bias[:, h : h + 1]
        if torch.isneginf(b).all():
            continue
        out[:, h : h + 1] = F.scaled_dot_product_attention(
            q[:, h : h + 1].float(), k[:, h : h + 1].float(), v[:, h : h + 1].float(), attn_mask=b.unsqueeze(2)
        )
    return out


def _masked_reference(q, k, v, bias, q_codes, k_codes, n_dense):
    """fp32 attention under the bucket rule (radius 0), one head at a time; queries that see nothing give 0."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    key_pos = torch.arange(k.shape[2], device=q.device)
    for h in range(q.shape[1]):
        visible = (key_pos < n_dense) | (q_codes[0, h, :, None] == k_codes[0, h, None, :])
        mask = torch.where(visible, bias[0, h][None, :], -math.inf)
        o = F.scaled_dot_product_attention(
            q[:, h : h + 1].float(), k[:, h : h + 1].float(), v[:, h : h + 1].float(), attn_mask=mask[None, None]
        )
        seen = (mask > -math.inf).any(-1)
        out[:, h : h + 1] = torch.where(seen[None, None, :, None], o.nan_to_num(0.0), 0.0)
    return out


def _flash_sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def _time_ms(fn) -> float:
    """Median of CUDA-event timings after warm-up (the first calls autotune or compile); wall clock off CUDA."""
    for _ in range(WARMUP):
        out = fn()
    device = out.device if isinstance(out, torch.Tensor) else torch.device("cpu")
    _synchronize(device)
    times = []
    for _ in range(REPS):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            begin = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times)


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _max_err(out, reference) -> float:
    return float((out.float() - reference).abs().max())


def _targets(report) -> dict:
    ratios = {str(r["keys"]): r.get("ratio_vs_flash_no_bias") for r in report["dense"] if r["backend"] == "triton"}
    worst = max((x for x in ratios.values() if x is not None), default=None)
    sparse20 = [r for r in report["sparse"] if r["backend"] == "triton" and r["target_density"] == 0.20]
    speedup = sparse20[0].get("speedup_vs_flash_dense") if sparse20 else None
    return {
        "biased_triton_over_flash_no_bias": ratios,
        "biased_ratio_target": TARGET_BIAS_RATIO,
        "biased_ratio_met": worst is not None and worst <= TARGET_BIAS_RATIO,
        f"sparse20_speedup_vs_flash_dense_{KEY_COUNTS[-1]}_keys": speedup,
        "sparse_speedup_target": TARGET_SPARSE_SPEEDUP,
        "sparse_speedup_met": speedup is not None and speedup >= TARGET_SPARSE_SPEEDUP,
    }


def _environment(device) -> dict:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    env = {"torch": torch.__version__, "gpu": gpu, "cuda": torch.version.cuda}
    for package in ("triton", "flashinfer"):
        try:
            env[package] = __import__(package).__version__
        except Exception as e:  # any import failure means "missing" for the report
            env[package] = f"missing ({type(e).__name__})"
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for kernels.json")
    parser.add_argument("--budget", type=float, default=270, help="seconds of GPU time to use at most")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    try:
        run_kernel_bench(args.out, time_budget_s=args.budget, device=args.device)
    except RuntimeError as e:
        if "needs a CUDA GPU" not in str(e):
            raise
        print(f"kernel bench: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
