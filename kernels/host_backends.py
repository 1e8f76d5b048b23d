"""Attention functions of the program hosting the pack, registered as extra backends for plain dense attention.

A host (an application that already ships a tuned attention, honouring its users' flags) registers a function
`fn(q, k, v, scale) -> out` over [B, H, N, D] tensors without bias, mask or LSE. `auto` then sends the dense
calls on the host's devices there; biased, sparse and LSE calls never go to a host backend. The registration
is the whole interface: this package imports nothing of any host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import verify


@dataclass(frozen=True)
class HostBackend:
    name: str
    fn: Callable
    device_types: tuple
    prefer_for_dense: bool


_registry: dict = {}
RESERVED = ("auto", "triton", "flashinfer", "flex", "sdpa_fold", "torch")


def register_host_backend(name: str, fn: Callable, *, device_types=("cuda",), prefer_for_dense: bool = True,
                          tolerance: float | None = None) -> None:
    """Add (or replace) backend `name` running `fn(q, k, v, scale)` for dense attention without bias.

    `prefer_for_dense`: `auto` picks it for those calls on `device_types`. `tolerance`: an absolute error its
    first-use check allows instead of the dtype's (for knowingly approximate kernels such as int8 attention).
    """
    if not isinstance(name, str) or not name.isidentifier() or name.lower() != name:
        raise ValueError(f"a host backend name must be a lower-case identifier, got {name!r}")
    if name in RESERVED:
        raise ValueError(f"{name!r} is a built-in backend; pick another name for the host's attention")
    if not callable(fn):
        raise ValueError(f"fn must be callable (q, k, v, scale) -> out, got {type(fn).__name__}")
    _registry[name] = HostBackend(name, fn, tuple(device_types), bool(prefer_for_dense))
    verify.set_tolerance(name, tolerance)
    verify.forget(name)  # a replaced function must earn its families again


def unregister_host_backend(name: str) -> None:
    _registry.pop(name, None)
    verify.set_tolerance(name, None)
    verify.forget(name)


def registered_host_backends() -> dict:
    """{name: HostBackend} in registration order."""
    return dict(_registry)


def preferred_host(device_type: str) -> str | None:
    """The first registered host backend `auto` prefers for dense attention on this device type."""
    for backend in _registry.values():
        if backend.prefer_for_dense and device_type in backend.device_types:
            return backend.name
    return None


def attention_host(name: str, q, k, v, scale: float):
    out = _registry[name].fn(q, k, v, scale)
    if tuple(out.shape) != tuple(q.shape):
        raise RuntimeError(f"host backend {name!r} returned shape {tuple(out.shape)} for queries {tuple(q.shape)}")
    return out.to(q.dtype)
