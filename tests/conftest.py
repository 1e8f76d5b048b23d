"""Test setup: the Triton interpreter on CPU, and the checkout imported as ``comfyui_fastar``."""

import importlib.util
import os
import pathlib
import sys

import pytest
import torch

# Must be set before any module that defines @triton.jit kernels is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _import_checkout_as_package() -> None:
    """Import this checkout under the fixed name ``comfyui_fastar``, whatever its folder is called."""
    existing = sys.modules.get("comfyui_fastar")
    if existing is not None and pathlib.Path(existing.__file__).resolve().parent == ROOT:
        return
    spec = importlib.util.spec_from_file_location(
        "comfyui_fastar", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_fastar"] = module
    spec.loader.exec_module(module)


_import_checkout_as_package()
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture()
def fresh_kernel_checks(monkeypatch):
    """Kernel checks on (whatever the environment or an earlier test set) and no verdicts from earlier tests."""
    from comfyui_fastar.kernels import verify

    monkeypatch.delenv(verify.ENV_VAR, raising=False)
    monkeypatch.setattr(verify, "_enabled", None)
    verify.reset()
    yield
    verify.reset()


@pytest.fixture()
def standalone_host(monkeypatch, tmp_path):
    """The nodes' standalone host, fresh for each test, with ``tmp_path`` as its diffusion_models folder."""
    from comfyui_fastar.nodes import host as host_module
    from comfyui_fastar.nodes.standalone import StandaloneHost

    monkeypatch.setenv("FASTAR_HOST", "standalone")
    fresh = StandaloneHost()
    fresh.output_dir = tmp_path / "output"
    monkeypatch.setattr(host_module, "_standalone", fresh)
    fresh.register_folder("diffusion_models", tmp_path)
    return fresh


@pytest.fixture()
def one_thread():
    """Small tensors: one thread avoids the OpenMP barrier stalls that dominate on a shared, busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def tiny_checkpoint_host(standalone_host, tmp_path):
    """The standalone host with the tests' tiny Wan model saved as ``tiny_ar.safetensors`` in its models folder."""
    from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
    from comfyui_fastar.fastar_core.model.wan_model import random_wan

    from helpers import TINY

    save_checkpoint(random_wan(TINY, seed=0), tmp_path / "tiny_ar.safetensors", dtype=torch.float32)
    return standalone_host
