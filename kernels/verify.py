"""Verified at first use: an accelerated backend earns each shape family once per process.

The first time a backend other than torch runs an op for a family (op, device, dtype, head dim, bias or not,
and the op's compile-time switches), it runs that op once on a small problem of the family and compares the
result with the torch backend. If it raises, or differs beyond the dtype's tolerance, one warning names the
backend, the op and the difference, the family is marked unusable for that backend for the rest of the process,
and the call moves on to the next backend of its chain (the chain always ends with torch). A backend that passes
but raises on a real call is marked and skipped the same way. So a kernel broken on a user's GPU costs one
warning and the torch speed, never a failed run or a wrong picture.

Turned off (no probe and no fallback: the chosen backend runs and its errors propagate, which is what a benchmark
wants) with ``FASTAR_VERIFY_KERNELS=0`` or ``set_verification(False)`` for the process, or within a block (one
rollout) with ``verification_turned_off()``.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .errors import KernelInputError

log = logging.getLogger(__name__)

ENV_VAR = "FASTAR_VERIFY_KERNELS"
_FALSE = {"0", "false", "no", "off"}

# Largest |backend - torch| allowed on the probe, whose outputs are O(1). fp32 leaves room for TF32 matmuls;
# the half types allow a few units of their rounding on values near 1 (bf16 keeps 8 bits of mantissa).
TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}

_enabled: bool | None = None  # process setting; None defers to the environment
_results: dict = {}  # (op, backend, Family) -> None (verified) or the problem found
_tolerances: dict = {}  # backend -> absolute tolerance that replaces the dtype's (approximate host kernels)


@dataclass(frozen=True)
class Family:
    """What makes two calls of an op compile and behave alike on one backend."""

    device: str
    dtype: torch.dtype
    head_dim: int
    has_bias: bool
    return_lse: bool = False
    # sparse attention: the layout's tiles, Hamming radius and code width
    block_q: int = 0
    block_k: int = 0
    radius: int = 0
    bits: int = 0
    top: int = 0  # top-k scores: k

    def describe(self) -> str:
        parts = [str(self.dtype).replace("torch.", ""), f"head dim {self.head_dim}",
                 "with bias" if self.has_bias else "no bias", f"on {self.device}"]
        if self.return_lse:
            parts.append("with lse")
        if self.block_q:
            parts.append(f"blocks {self.block_q}x{self.block_k}, radius {self.radius}, {self.bits}-bit codes")
        elif self.bits:
            parts.append(f"{self.bits}-bit codes")
        if self.top:
            parts.append(f"top {self.top}")
        return ", ".join(parts)


def set_verification(enabled: bool | None) -> None:
    """Turn first-use verification on or off for this process; None goes back to the environment variable."""
    global _enabled
    _enabled = None if enabled is None else bool(enabled)


@contextmanager
def verification_turned_off(off: bool = True):
    """Within the block (a rollout), first-use verification is off when ``off``; the process setting it had
    before comes back after."""
    global _enabled
    before = _enabled
    if off:
        _enabled = False
    try:
        yield
    finally:
        _enabled = before


def verification_enabled() -> bool:
    if _enabled is not None:
        return _enabled
    return os.environ.get(ENV_VAR, "1").strip().lower() not in _FALSE


def set_tolerance(backend: str, tolerance: float | None) -> None:
    """An absolute probe tolerance for `backend` in place of the dtype's (for knowingly approximate kernels)."""
    if tolerance is None:
        _tolerances.pop(backend, None)
    else:
        _tolerances[backend] = float(tolerance)


def tolerance(backend: str, dtype: torch.dtype) -> float:
    return _tolerances.get(backend, TOLERANCE.get(dtype, TOLERANCE[torch.float32]))


def reset() -> None:
    """Forget every verdict (tests; a process that swapped its GPU stack)."""
    _results.clear()


def forget(backend: str) -> None:
    """Forget the verdicts on one backend (its implementation was replaced)."""
    for key in [key for key in _results if key[1] == backend]:
        del _results[key]


def verdicts() -> dict:
    """{(op, backend, family description): None when verified, else the problem} for reports."""
    return {(op, name, fam.describe()): problem for (op, name, fam), problem in _results.items()}


def run_with_fallback(op: str, chain, family: Family, run, probe):
    """`run(name)` with the first backend of `chain` that is (or gets) verified for `family`.

    `probe(name)` checks one backend on a small problem of the family and returns None or the problem found.
    """
    chain = tuple(chain)
    if torch.compiler.is_compiling():
        # Checks happen at first use, before a step is compiled or captured: a traced call takes the first backend
        # its family has earned (torch when none has).
        return run(next((name for name in chain if name == "torch" or _results.get((op, name, family), "") is None),
                        "torch"))
    if not verification_enabled():
        return run(chain[0])
    for position, name in enumerate(chain):
        last = position == len(chain) - 1
        if name == "torch" or last:  # the reference, and the end of the line
            return run(name)
        key = (op, name, family)
        if key not in _results:
            _results[key] = _checked_probe(probe, name)
            if _results[key] is not None:
                _warn(op, name, family, _results[key], chain[position + 1])
        if _results[key] is not None:
            continue
        try:
            return run(name)
        except (KernelInputError, torch.cuda.OutOfMemoryError):
            raise  # the caller's input, or memory the fallback would need too
        except Exception as e:  # noqa: BLE001 - any kernel failure: fall back rather than end the user's run
            _results[key] = f"raised {type(e).__name__}: {_short(e)}"
            _warn(op, name, family, _results[key], chain[position + 1])
    raise AssertionError("unreachable: the last backend of a chain always runs")


def _checked_probe(probe, name: str) -> str | None:
    start = time.perf_counter()
    try:
        with torch.no_grad():
            problem = probe(name)
    except (KernelInputError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a probe that raises is the verdict
        problem = f"raised {type(e).__name__}: {_short(e)}"
    log.debug("verified backend %s in %.3f s: %s", name, time.perf_counter() - start, problem or "ok")
    return problem


def _warn(op: str, name: str, family: Family, problem: str, fallback: str) -> None:
    log.warning("kernel backend %r failed its check for %s (%s): %s. Using %r for this case from now on "
                "(set %s=0 to skip these checks).", name, op, family.describe(), problem, fallback, ENV_VAR)


def _short(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def compare(got: torch.Tensor, expected: torch.Tensor, backend: str, dtype: torch.dtype, what: str = "output"):
    """None when `got` matches `expected` within the tolerance, else the difference in words."""
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    got, expected = got.float(), expected.float()
    same_inf = torch.equal(torch.isneginf(got), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    if not same_inf or not bool(torch.isfinite(got[finite]).all()):
        return f"{what} has NaN or infinite entries where torch has finite ones (or the reverse)"
    err = float((got[finite] - expected[finite]).abs().max()) if bool(finite.any()) else 0.0
    limit = tolerance(backend, dtype)
    if not err <= limit:
        return f"{what} differs from torch by up to {err:.3g} (tolerance {limit:.3g})"
    return None


def probe_generator(seed: int = 0) -> torch.Generator:
    """Probe inputs come from their own generator: a check must never move the caller's random streams."""
    return torch.Generator().manual_seed(seed)


def log_count_bias(B: int, H: int, Nk: int, gen: torch.Generator, device, blind_head: bool) -> torch.Tensor:
    """log(count) biases with some empty (-inf) slots; with `blind_head`, the last head sees no key at all."""
    counts = torch.randint(1, 8, (B, H, Nk), generator=gen).float()
    bias = counts.log()
    bias[..., 3::7] = -math.inf
    if blind_head:
        bias[:, -1] = -math.inf
    return bias.to(device)
