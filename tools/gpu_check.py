"""``fastar gpu-check --out DIR --deadline 480``: everything a GPU machine should tell us, in order of value,
within a deadline.

1. ``verify``: the first-use check (``kernels/verify.py``) of every accelerated backend on the Wan families
   (fp16/bf16, head dim 128, with and without bias, block-sparse, LSH): verdicts and seconds per family.
2. ``correctness``: every backend against an fp32 reference at Wan-1.3B self-attention shapes (12 heads of 128,
   4,680 queries, 9,360 biased keys with empty slots and a blind head), fp16 and bf16, dense and block-sparse at
   several densities; first-call and second-call seconds.
3. ``bench_kernels``: ``fastar bench kernels``.
4. ``bench_rollout``: ``fastar bench gpu-rollout`` (random Wan-1.3B weights at 480x832, fewer layers, dense-global
   until memory or time runs out, against FAST-AR; per-chunk latency and peak memory).

Each step runs in its own process with the time left (a kernel that hangs or takes the process down costs its
step, not the report), writes its JSON as it goes, and ``gpu_check.json`` records every step's outcome after
each step. ``--dry-run`` runs the same plan on the CPU with tiny shapes (and bf16 only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

STEPS = ("verify", "correctness", "bench_kernels", "bench_rollout")
# Share of the whole deadline a step may use at most (what a step leaves goes to the next ones).
SHARE = {"verify": 0.15, "correctness": 0.25, "bench_kernels": 0.35, "bench_rollout": 1.0}
MIN_STEP_S = 20  # a step starts only with this much time left (dry runs: 5)
GRACE_S = 15  # a step's process is killed this long after its budget (steps stop themselves at the budget)
ROOT = Path(__file__).resolve().parents[1]


def run_gpu_check(out_dir, deadline_s: float = 480, dry_run: bool = False, isolate: bool = True,
                  steps=STEPS) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    report = {"deadline_s": deadline_s, "dry_run": dry_run, "steps": {}}
    path = out / "gpu_check.json"
    _save(path, report)
    min_step = 5 if dry_run else MIN_STEP_S
    for step in steps:
        left = deadline_s - (time.monotonic() - start)
        budget = min(left, SHARE[step] * deadline_s) if step != steps[-1] else left
        if budget < min_step:
            report["steps"][step] = {"status": "skipped", "why": f"{left:.0f} s left of the deadline"}
            _save(path, report)
            continue
        began = time.monotonic()
        print(f"gpu-check: {step} (up to {budget:.0f} s)", flush=True)
        if isolate:
            result = _run_child(step, out, budget, dry_run)
        else:
            result = _run_step(step, out, budget, dry_run)
        result["seconds"] = round(time.monotonic() - began, 1)
        report["steps"][step] = result
        _save(path, report)
    report["seconds"] = round(time.monotonic() - start, 1)
    _save(path, report)
    print(f"gpu-check: wrote {path}", flush=True)
    return report


def _save(path: Path, report: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(path)


def _run_child(step: str, out: Path, budget: float, dry_run: bool) -> dict:
    bootstrap = (f"import sys, types; p = types.ModuleType('comfyui_fastar'); p.__path__ = [{str(ROOT)!r}]; "
                 "sys.modules['comfyui_fastar'] = p; from comfyui_fastar.tools.gpu_check import child_main; "
                 "sys.exit(child_main(sys.argv[1:]))")
    argv = [sys.executable, "-c", bootstrap, step, str(out), str(budget)] + (["--dry-run"] if dry_run else [])
    env = dict(os.environ)
    if dry_run:
        env.setdefault("TRITON_INTERPRET", "1")  # CPU: the Triton kernels run in the interpreter
    try:
        done = subprocess.run(argv, env=env, timeout=budget + GRACE_S, capture_output=True, text=True)
    except subprocess.TimeoutExpired as e:
        return {"status": "timeout", "why": f"past its {budget:.0f} s", "log_tail": _tail(e.stdout, e.stderr)}
    result_file = out / f"{step}.result.json"
    if done.returncode == 0 and result_file.exists():
        return json.loads(result_file.read_text())
    return {"status": "crashed", "returncode": done.returncode, "log_tail": _tail(done.stdout, done.stderr)}


def _tail(*texts) -> str:
    joined = "\n".join(t if isinstance(t, str) else (t or b"").decode(errors="replace") for t in texts if t)
    return joined[-3000:]


def child_main(argv) -> int:
    step, out, budget = argv[0], Path(argv[1]), float(argv[2])
    result = _run_step(step, out, budget, "--dry-run" in argv)
    (out / f"{step}.result.json").write_text(json.dumps(result, indent=2, default=str))
    return 0


def _run_step(step: str, out: Path, budget: float, dry_run: bool) -> dict:
    import torch

    from ..kernels import set_verification, verification_enabled

    device = torch.device("cpu" if dry_run else "cuda")
    if not dry_run and not torch.cuda.is_available():
        return {"status": "skipped", "why": "no CUDA device visible (use --dry-run on a CPU)"}
    deadline = time.monotonic() + budget
    was_on = verification_enabled()
    try:
        if step == "verify":
            return {"status": "done", **_step_verify(out, device, dry_run)}
        set_verification(False)  # measure each backend itself: no silent fallback to torch
        if step == "correctness":
            return {"status": "done", **_step_correctness(out, device, dry_run, deadline)}
        if step == "bench_kernels":
            return {"status": "done", **_step_bench_kernels(out, device, dry_run, budget)}
        if step == "bench_rollout":
            return {"status": "done", **_step_bench_rollout(out, device, dry_run, budget)}
    except Exception as e:  # noqa: BLE001 - the report says what broke; the next step still runs
        return {"status": "error", "error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        set_verification(was_on)
    raise ValueError(f"unknown step {step!r}: expected one of {', '.join(STEPS)}")


# -- 1. first-use verification ------------------------------------------------------------------------------------
def _step_verify(out: Path, device, dry_run: bool) -> dict:
    import importlib

    import torch

    from ..kernels import dispatch
    from ..kernels.verify import Family

    head_dim = 64 if dry_run else 128
    dtypes = (torch.bfloat16,) if dry_run else (torch.float16, torch.bfloat16)
    kernels_package = __package__.rsplit(".", 1)[0] + ".kernels"
    probes = {op: importlib.import_module(f"{kernels_package}.{module}").probe
              for op, module in (("attention", "attention"), ("sparse_attention", "sparse_attention"),
                                 ("lsh_codes", "hashing"))}
    rows = []
    for dtype in dtypes:
        families = [("attention", Family(str(device), dtype, head_dim, has_bias)) for has_bias in (False, True)]
        families.append(("attention", Family(str(device), dtype, head_dim, True, return_lse=True)))
        families.append(("sparse_attention", Family(str(device), dtype, head_dim, True, block_q=64, block_k=64,
                                                    radius=1, bits=6)))
        families.append(("lsh_codes", Family(str(device), dtype, head_dim, False, bits=6)))
        for op, family in families:
            for name in dispatch.available_backends(device, op, dtype):
                if name == "torch":
                    continue
                start = time.perf_counter()
                try:
                    problem = probes[op](name, family)
                except Exception as e:  # noqa: BLE001 - what the first-use check would have caught
                    problem = f"raised {type(e).__name__}: {e}"[:500]
                _sync(device)
                rows.append({"op": op, "backend": name, "family": family.describe(), "ok": problem is None,
                             "problem": problem, "seconds": round(time.perf_counter() - start, 3)})
                print(f"verify {rows[-1]}", flush=True)
                _save(out / "verify.json", {"families": rows})
    return {"families": len(rows), "failed": [r for r in rows if not r["ok"]],
            "slowest_s": max((r["seconds"] for r in rows), default=None)}


# -- 2. correctness at Wan shapes ---------------------------------------------------------------------------------
def _step_correctness(out: Path, device, dry_run: bool, deadline: float) -> dict:
    import torch

    from ..kernels import attention, available_backends, build_sparse_layout, sparse_attention
    from ..kernels.verify import TOLERANCE
    from .bench.kernels import _bucket_plan, _masked_reference, _reference

    heads, nq, nk, head_dim = (2, 100, 160, 64) if dry_run else (12, 4680, 9360, 128)
    densities = (0.2,) if dry_run else (0.1, 0.2, 0.5, 1.0)
    dtypes = (torch.bfloat16,) if dry_run else (torch.bfloat16, torch.float16)
    rows = []
    path = out / "correctness.json"
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        q, k, v = (torch.randn(1, heads, n, head_dim, generator=g).to(device, dtype) for n in (nq, nk, nk))
        bias = torch.randint(1, 6, (1, heads, nk), generator=g).float().log()
        bias[..., -64:] = -math.inf
        bias[:, -1] = -math.inf  # a head that sees no key
        bias = bias.to(device)
        reference = _reference(q, k, v, bias)
        for name in available_backends(device, "attention", dtype):
            if time.monotonic() > deadline:
                rows.append({"skipped": f"dense {name} {dtype}: deadline"})
                break
            rows.append(_timed_case("dense", name, dtype, partial(attention, q, k, v, bias, backend=name),
                                    reference, TOLERANCE[dtype], device))
            _save(path, {"cases": rows})
        for density in densities:
            n_dense, buckets = _bucket_plan(density, nq, nk)
            q_codes = torch.randint(0, buckets, (1, heads, nq), generator=g).to(device)
            k_codes = torch.randint(0, buckets, (1, heads, nk), generator=g).to(device)
            layout = build_sparse_layout(q_codes, k_codes, n_dense=n_dense)
            sparse_ref = _masked_reference(q, k, v, bias, q_codes, k_codes, n_dense)
            for name in available_backends(device, "sparse_attention", dtype):
                if time.monotonic() > deadline:
                    rows.append({"skipped": f"sparse {name} {dtype} {density}: deadline"})
                    break
                row = _timed_case("sparse", name, dtype,
                                  partial(sparse_attention, q, k, v, layout, bias, backend=name),
                                  sparse_ref, TOLERANCE[dtype], device)
                row.update(target_density=density, density=layout.density())
                rows.append(row)
                _save(path, {"cases": rows})
    cases = [r for r in rows if "backend" in r]
    return {"cases": len(cases), "failed": [r for r in cases if not r["ok"]],
            "skipped": [r["skipped"] for r in rows if "skipped" in r]}


def _timed_case(kind, name, dtype, fn, reference, tolerance, device) -> dict:
    row = {"kind": kind, "backend": name, "dtype": str(dtype).replace("torch.", "")}
    try:
        start = time.perf_counter()
        out = fn()
        _sync(device)
        row["first_call_s"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        fn()
        _sync(device)
        row["second_call_s"] = round(time.perf_counter() - start, 4)
        row["max_abs_err"] = float((out.float() - reference).abs().max())
        row["blind_head_is_zero"] = bool((out[:, -1] == 0).all())
        row["ok"] = row["max_abs_err"] <= tolerance and row["blind_head_is_zero"]
    except Exception as e:  # noqa: BLE001 - a failing backend is a finding, not the end of the check
        row.update(ok=False, error=f"{type(e).__name__}: {e}"[:1000])
    print(f"correctness {row}", flush=True)
    return row


# -- 3. and 4. the benches ------------------------------------------------------------------------------------------
def _step_bench_kernels(out: Path, device, dry_run: bool, budget: float) -> dict:
    from .bench import kernels as bench

    tiny = {"HEADS": 2, "N_QUERIES": 100, "KEY_COUNTS": (160,), "DENSITIES": (0.2, 1.0), "HEAD_DIM": 64,
            "WARMUP": 1, "REPS": 1} if dry_run else {}
    with _patched(bench, tiny):
        report = bench.measure_all(out / "kernels", bench.Budget(budget - 5), device)
    return {"targets": report.get("targets"), "skipped": report.get("skipped")}


def _step_bench_rollout(out: Path, device, dry_run: bool, budget: float) -> dict:
    from .bench.gpu_rollout import run_gpu_rollout

    options = {"layers": 1, "max_frames": 3, "device": "cpu", "latent_hw": (8, 8)} if dry_run else {"layers": 10}
    report = run_gpu_rollout(out / "rollout", budget_s=budget - 10, **options)
    return {mode: {"status": m["status"], **m["summary"]} for mode, m in report["modes"].items()}


@contextlib.contextmanager
def _patched(module, values: dict):
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def add_parser(sub) -> None:
    p = sub.add_parser("gpu-check", help="on a GPU machine: backend correctness, kernel and rollout benches in a "
                                         "deadline, JSON as it goes")
    p.add_argument("--out", required=True, help="output folder (gpu_check.json and one file per step)")
    p.add_argument("--deadline", type=float, default=480, help="seconds for the whole check")
    p.add_argument("--dry-run", action="store_true", help="the same plan on the CPU with tiny shapes")


def run_from_args(args) -> int:
    report = run_gpu_check(args.out, deadline_s=args.deadline, dry_run=args.dry_run)
    failed = [s for s, r in report["steps"].items() if r.get("status") not in ("done", "skipped")]
    for step, result in report["steps"].items():
        print(f"{step:14s} {result.get('status')}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastar")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run_from_args(parser.parse_args(["gpu-check", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
