"""What this install can run, answered without importing Triton or FlashInfer.

Importing triton costs seconds, so the dispatcher asks these questions cheaply and the kernel modules import
triton only when a Triton backend actually runs.
"""

import importlib.util
import os
import sys

_TRUE = {"1", "true", "yes", "on"}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def triton_installed() -> bool:
    return _installed("triton")


_import_errors: dict = {}


def import_problem(name: str) -> str | None:
    """Why `import name` fails (e.g. a triton wheel without its GPU runtime), or None; tried once per process."""
    if name not in _import_errors:
        try:
            importlib.import_module(name)
            _import_errors[name] = None
        except Exception as e:  # noqa: BLE001 - any failure means the backend cannot run
            _import_errors[name] = f"`import {name}` fails: {type(e).__name__}: {e}"
    return _import_errors[name]


def triton_interpreter_on() -> bool:
    """True when our @triton.jit kernels run on CPU tensors through Triton's interpreter.

    Triton reads TRITON_INTERPRET when a kernel is decorated. Once our kernel modules are imported, what they
    saw then is what counts; before that, the environment decides what they will see.
    """
    loaded = sys.modules.get(f"{__package__}.triton_common")
    if loaded is not None:
        return bool(loaded.INTERPRET)
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def flashinfer_installed() -> bool:
    return _installed("flashinfer")


def flex_attention_installed() -> bool:
    try:
        return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    except ModuleNotFoundError:
        return False


def triton_install_hint() -> str:
    if sys.platform == "win32":
        return "on Windows install it with `pip install triton-windows`"
    return "install it with `pip install triton` (CUDA builds of torch on Linux bring it)"
