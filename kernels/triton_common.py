"""Shared Triton setup: import triton once and record whether its interpreter is on.

Only imported by the Triton backends, never by the package itself, so `import kernels` works without triton.
"""

import contextlib
import os

import torch
import triton

try:
    INTERPRET = bool(triton.knobs.runtime.interpret)
except AttributeError:  # older triton without knobs
    INTERPRET = os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}


def autotune_configs(configs):
    """The interpreter cannot benchmark (no driver), so it gets exactly one config."""
    return configs[:1] if INTERPRET else configs


def upcast_dot_inputs(dtype) -> bool:
    """bf16 `tl.dot` is wrong under the interpreter (it multiplies the raw bit patterns), so upcast there."""
    return INTERPRET and dtype == torch.bfloat16


def ieee_fp32_dot(dtype) -> bool:
    """fp32 inputs ask for fp32 results: keep `tl.dot` in IEEE fp32 instead of TF32 on the GPU."""
    return dtype == torch.float32


def device_guard(t: torch.Tensor):
    """Launch on the tensor's own GPU, not whichever is current."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
