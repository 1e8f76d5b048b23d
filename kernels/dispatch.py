"""Pick the backends for each call from the device, the installed packages, the dtype, the head dim and the
call's kind (bias or not, LSE or not).

Every call gets a chain of backends ending with `torch`; `verify.run_with_fallback` runs the first one that has
passed its first-use check. `auto`:

| call (CUDA) | chain |
|---|---|
| dense attention, no bias, no LSE | a registered host attention (e.g. ComfyUI's), flashinfer (below), torch (flash) |
| dense attention, bias, fp16/bf16 | triton (64/128: reads the bias), `sdpa_fold` (folds: copies q, k, v), torch |
| dense attention with a bias in fp32 | torch (memory-efficient SDPA, the bias as a broadcast mask) |
| dense attention with the LSE requested | triton (head dims 64/128; one pass), then torch |
| sparse attention | triton (head dims 64/128), then torch |
| LSH codes | triton, then torch |
| sparse layout block lists (codes of at most 8 bits) | triton, then torch |
| top-k scores (TempCache's search) | triton (head dims 16..256, powers of two; fused: no score matrix), then torch |

FlashInfer's single prefill joins the plain dense chain where it fits: fp16/bf16, head dims 64/128/256, Linux,
installed (no plan, so nothing synchronises; FA3 on Hopper).

Off CUDA `auto` is torch. An explicit backend that cannot run here is refused with one
`BackendUnavailableError`; one that can run is tried first and falls back like `auto` when its check fails.
For calls it does not cover (a head dim without a kernel, a host backend asked for a biased call) it steps
aside for torch. A name valid for some op but not this one (e.g. `flex` for LSH codes) gets this op's `auto`.
"""

import sys

import torch

from .environment import (
    flashinfer_installed,
    flex_attention_installed,
    import_problem,
    triton_install_hint,
    triton_installed,
    triton_interpreter_on,
)
from .errors import BackendUnavailableError
from .host_backends import preferred_host, registered_host_backends

BACKENDS = ("triton", "flashinfer", "flex", "sdpa_fold", "torch")
OP_BACKENDS = {
    "attention": ("triton", "flashinfer", "flex", "sdpa_fold", "torch"),
    "sparse_attention": ("triton", "flashinfer", "flex", "torch"),
    "lsh_codes": ("triton", "torch"),
    "block_lists": ("triton", "torch"),
    "topk_scores": ("triton", "torch"),
}
# Head dims the fused top-k kernel takes (tl.dot over the whole head).
TOPK_HEAD_DIMS = (16, 32, 64, 128, 256)
# Head dims our Triton attention kernels are built and tuned for; others take the torch path.
TRITON_HEAD_DIMS = (64, 128)
# Head dims FlashInfer's prefill kernels ship built for (FA2 and FA3); others would compile with nvcc at first use.
FLASHINFER_HEAD_DIMS = (64, 128, 256)
# The fold adds 8 to the head dim; PyTorch's flash kernel takes head dims up to 256.
FOLD_MAX_HEAD_DIM = 248
HALF_TYPES = (torch.float16, torch.bfloat16)


def op_backends(op: str) -> tuple:
    """Every backend name `op` knows: the built-in ones, then (dense attention) the registered host ones."""
    _check_op(op)
    if op == "attention":
        return OP_BACKENDS[op][:-1] + tuple(registered_host_backends()) + ("torch",)
    return OP_BACKENDS[op]


def _as_device(device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def backend_problem(op: str, backend: str, device, dtype: torch.dtype | None = None) -> str | None:
    """Why `backend` cannot run `op` on `device` (and `dtype`), or None when it can."""
    device = _as_device(device)
    if backend in ("torch", "sdpa_fold"):
        return None
    host = registered_host_backends().get(backend)
    if host is not None:
        if op != "attention":
            return f"host backend {backend!r} runs dense attention only"
        if device.type not in host.device_types:
            return f"host backend {backend!r} runs on {', '.join(host.device_types)} tensors (got {device.type})"
        return None
    if backend == "triton":
        if not triton_installed():
            return f"triton is not installed; {triton_install_hint()}"
        if device.type == "cuda":
            return import_problem("triton")
        if device.type == "cpu":
            if triton_interpreter_on():
                return None
            return "a CPU tensor needs the Triton interpreter (TRITON_INTERPRET=1 set before kernels is imported)"
        return f"Triton runs on CUDA tensors only (got a {device.type} tensor)"
    if backend == "flex":
        if not flex_attention_installed():
            return f"torch {torch.__version__} has no FlexAttention (it needs torch >= 2.5)"
        if device.type == "cuda":
            if not triton_installed():
                return f"compiled FlexAttention on CUDA needs triton; {triton_install_hint()}"
            return None
        if device.type == "cpu":
            return None
        return f"FlexAttention runs on CPU and CUDA tensors only (got a {device.type} tensor)"
    if backend == "flashinfer":
        if device.type != "cuda":
            return f"FlashInfer runs on CUDA tensors only (got a {device.type} tensor)"
        if not sys.platform.startswith("linux"):
            return f"FlashInfer supports Linux only (this is {sys.platform})"
        if not flashinfer_installed():
            return "flashinfer is not installed; install it with `pip install flashinfer-python`"
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
            return f"FlashInfer takes float16 or bfloat16 inputs (got {dtype})"
        return import_problem("flashinfer")
    raise ValueError(f"unknown backend {backend!r}")


def available_backends(device, op: str = "attention", dtype: torch.dtype | None = None) -> list[str]:
    """The backends that can run `op` for tensors on `device` (for reports and error messages)."""
    return [name for name in op_backends(op) if backend_problem(op, name, device, dtype) is None]


def all_backend_names() -> tuple:
    return BACKENDS + tuple(registered_host_backends())


def backend_chain(
    op: str, backend: str = "auto", device="cpu", *, dtype: torch.dtype | None = None, head_dim: int | None = None,
    has_bias: bool = False, return_lse: bool = False,
) -> tuple:
    """The backends to try for one call, best first, always ending with torch (see the module docstring)."""
    _check_op(op)
    device = _as_device(device)
    if not isinstance(backend, str):
        raise BackendUnavailableError(f"backend must be a string such as 'auto' or 'torch', got {backend!r}")
    name = backend.strip().lower()
    call = (op, device, dtype, head_dim, has_bias, return_lse)
    if name == "auto":
        return _auto_chain(*call)
    if name not in all_backend_names():
        raise BackendUnavailableError(
            f"unknown backend {backend!r} for {op}: valid names are auto, {', '.join(op_backends(op))}; "
            f"on {device.type} these can run: {', '.join(available_backends(device, op, dtype))}"
        )
    if name not in op_backends(op):
        return _auto_chain(*call)  # a name for another op (the same setting reaches every op)
    problem = backend_problem(op, name, device, dtype)
    if problem is not None:
        raise BackendUnavailableError(
            f"backend {name!r} cannot run {op} here: {problem}. "
            f"Backends that can: {', '.join(available_backends(device, op, dtype))} (or 'auto')"
        )
    if name == "torch" or not covers(name, *call):
        return ("torch",)
    return (name, "torch")


def choose_backend(
    op: str, backend: str = "auto", device="cpu", *, dtype: torch.dtype | None = None, head_dim: int | None = None,
    has_bias: bool = False, return_lse: bool = False,
) -> str:
    """The backend that will run `op` when every check passes: the first of `backend_chain`."""
    return backend_chain(op, backend, device, dtype=dtype, head_dim=head_dim, has_bias=has_bias,
                         return_lse=return_lse)[0]


def covers(name: str, op: str, device, dtype, head_dim, has_bias: bool, return_lse: bool) -> bool:
    """Whether backend `name` computes this kind of call itself (rather than handing it to torch)."""
    if name == "triton" and op == "topk_scores":
        return head_dim in TOPK_HEAD_DIMS
    if name == "triton" and op not in ("lsh_codes", "block_lists"):
        return head_dim in TRITON_HEAD_DIMS
    if name == "sdpa_fold":
        return has_bias and not return_lse
    if name in registered_host_backends():
        return not has_bias and not return_lse
    return True


def _auto_chain(op: str, device: torch.device, dtype, head_dim, has_bias: bool, return_lse: bool) -> tuple:
    if device.type != "cuda":
        return ("torch",)
    triton_ok = backend_problem(op, "triton", device, dtype) is None
    if op in ("lsh_codes", "block_lists"):
        return ("triton", "torch") if triton_ok else ("torch",)
    if op == "topk_scores":
        return ("triton", "torch") if triton_ok and head_dim in TOPK_HEAD_DIMS else ("torch",)
    triton_runs = triton_ok and head_dim in TRITON_HEAD_DIMS
    if op == "sparse_attention":
        return ("triton", "torch") if triton_runs else ("torch",)
    if not has_bias and not return_lse:
        host = preferred_host(device.type)
        flashinfer = (("flashinfer",) if head_dim in FLASHINFER_HEAD_DIMS
                      and backend_problem(op, "flashinfer", device, dtype) is None else ())
        # torch last: SDPA picks flash / memory-efficient
        return ((host,) if host else ()) + flashinfer + ("torch",)
    fold_fits = head_dim is not None and head_dim <= FOLD_MAX_HEAD_DIM
    if has_bias and not return_lse and dtype in HALF_TYPES and fold_fits:
        # One kernel reading the bias beats copying the whole joined cache into folded q/k/v on every call (at
        # Wan-1.3B shapes a tenth of a TempCache chunk by `fastar bench launches`' estimate).
        return ("triton", "sdpa_fold", "torch") if triton_runs else ("sdpa_fold", "torch")
    if return_lse and triton_runs:
        return ("triton", "torch")  # writes the LSE in the same pass; torch needs a second matmul for it
    return ("torch",)


def _check_op(op: str) -> None:
    if op not in OP_BACKENDS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OP_BACKENDS)}")
