"""Pick a backend for each op from the device, the installed packages, the dtype and the head dim.

`auto` runs `torch` on CPU and prefers `triton` on CUDA (head dims 64 and 128), then `torch`. An explicit choice
is honoured when it can run and refused with one `BackendUnavailableError` otherwise.
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

BACKENDS = ("triton", "flashinfer", "flex", "torch")
OP_BACKENDS = {
    "attention": ("triton", "flashinfer", "flex", "torch"),
    "sparse_attention": ("triton", "flashinfer", "flex", "torch"),
    "lsh_codes": ("triton", "torch"),
}
# Head dims our Triton attention kernels are built and tuned for; others take the torch path.
TRITON_HEAD_DIMS = (64, 128)


def _as_device(device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def backend_problem(op: str, backend: str, device, dtype: torch.dtype | None = None) -> str | None:
    """Why `backend` cannot run `op` on `device` (and `dtype`), or None when it can."""
    device = _as_device(device)
    if backend == "torch":
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
    _check_op(op)
    return [name for name in OP_BACKENDS[op] if backend_problem(op, name, device, dtype) is None]


def choose_backend(
    op: str, backend: str = "auto", device="cpu", *, dtype: torch.dtype | None = None, head_dim: int | None = None
) -> str:
    """The backend that will run `op`: the user's choice if it can run here, else the best automatic one."""
    _check_op(op)
    device = _as_device(device)
    if not isinstance(backend, str):
        raise BackendUnavailableError(f"backend must be a string such as 'auto' or 'torch', got {backend!r}")
    name = backend.strip().lower()
    if name == "auto":
        return _auto_backend(op, device, dtype, head_dim)
    if name not in OP_BACKENDS[op]:
        raise BackendUnavailableError(
            f"unknown backend {backend!r} for {op}: valid names are auto, {', '.join(OP_BACKENDS[op])}; "
            f"on {device.type} these can run: {', '.join(available_backends(device, op, dtype))}"
        )
    problem = backend_problem(op, name, device, dtype)
    if problem is not None:
        raise BackendUnavailableError(
            f"backend {name!r} cannot run {op} here: {problem}. "
            f"Backends that can: {', '.join(available_backends(device, op, dtype))} (or 'auto')"
        )
    return name


def _auto_backend(op: str, device: torch.device, dtype, head_dim) -> str:
    if device.type != "cuda" or backend_problem(op, "triton", device, dtype) is not None:
        return "torch"
    if op == "lsh_codes" or head_dim in TRITON_HEAD_DIMS:
        return "triton"
    return "torch"


def _check_op(op: str) -> None:
    if op not in OP_BACKENDS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OP_BACKENDS)}")
