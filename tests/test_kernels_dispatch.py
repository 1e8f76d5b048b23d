"""The backend dispatcher: automatic choice, honoured overrides, and clear refusals."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from comfyui_fastar import kernels
from comfyui_fastar.kernels import BackendUnavailableError, available_backends, choose_backend, dispatch


def small_qkv():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(1, 2, 20, 64, generator=gen) for _ in range(3))


def test_auto_picks_torch_on_cpu():
    for op in ("attention", "sparse_attention", "lsh_codes"):
        assert choose_backend(op, "auto", "cpu", dtype=torch.float32, head_dim=64) == "torch"


def test_cpu_backends_under_the_interpreter():
    assert available_backends("cpu") == ["triton", "flex", "sdpa_fold", "torch"]
    assert available_backends("cpu", "lsh_codes") == ["triton", "torch"]


@pytest.mark.parametrize("backend, module, function", [
    ("torch", "attention_torch", "attention_torch"),
    ("triton", "attention_triton", "attention_triton"),
    ("flex", "attention_flex", "attention_flex"),
    ("auto", "attention_torch", "attention_torch"),
])
def test_attention_runs_the_backend_asked_for(monkeypatch, backend, module, function):
    import importlib

    from comfyui_fastar.kernels import verify

    monkeypatch.setattr(verify, "_enabled", False)  # the first-use check would call the backend once more

    target = importlib.import_module(f"comfyui_fastar.kernels.{module}")
    real, calls = getattr(target, function), []

    def spy(*args, **kwargs):
        calls.append(function)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, function, spy)
    q, k, v = small_qkv()
    kernels.attention(q, k, v, backend=backend)
    assert calls == [function]


def test_flashinfer_on_cpu_is_refused_clearly():
    q, k, v = small_qkv()
    with pytest.raises(BackendUnavailableError) as err:
        kernels.attention(q.half(), k.half(), v.half(), backend="flashinfer")
    message = str(err.value)
    assert "'flashinfer'" in message and "CUDA tensors only" in message and "torch" in message
    assert isinstance(err.value, ValueError)


def test_unknown_backend_is_refused_with_the_valid_names():
    with pytest.raises(BackendUnavailableError, match="unknown backend 'cuda_magic'") as err:
        choose_backend("attention", "cuda_magic", "cpu")
    assert "auto, triton, flashinfer, flex, sdpa_fold, torch" in str(err.value)


def test_a_backend_of_another_op_gets_this_ops_automatic_choice():
    """One setting reaches every op: `flex` for the attention calls must not break the LSH hashing."""
    assert dispatch.backend_chain("lsh_codes", "flex", "cpu") == ("torch",)
    assert dispatch.backend_chain("sparse_attention", "sdpa_fold", "cpu", head_dim=64) == ("torch",)


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_interpreter_on", lambda: False)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1") as err:
        choose_backend("attention", "triton", "cpu")
    assert "Backends that can: flex, sdpa_fold, torch" in str(err.value)


def test_missing_triton_on_windows_points_to_triton_windows(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_installed", lambda: False)
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(BackendUnavailableError, match="pip install triton-windows"):
        choose_backend("attention", "triton", torch.device("cpu"))


def test_flashinfer_refuses_fp32_even_on_cuda(monkeypatch):
    monkeypatch.setattr(dispatch, "flashinfer_installed", lambda: True)
    monkeypatch.setattr(dispatch, "import_problem", lambda name: None)
    monkeypatch.setattr(dispatch.sys, "platform", "linux")
    problem = dispatch.backend_problem("attention", "flashinfer", torch.device("cuda"), torch.float32)
    assert "float16 or bfloat16" in problem


def test_kernels_import_and_run_without_triton_or_flashinfer():
    """A fresh interpreter where importing triton or flashinfer fails: the package still imports and runs."""
    root = pathlib.Path(__file__).resolve().parents[1]
    script = textwrap.dedent(f"""
        import sys, types
        sys.modules["triton"] = sys.modules["flashinfer"] = None  # what an absent package looks like to import
        package = types.ModuleType("comfyui_fastar")
        package.__path__ = [{str(root)!r}]
        sys.modules["comfyui_fastar"] = package
        import torch
        from comfyui_fastar.kernels import attention, available_backends
        q = torch.randn(1, 1, 4, 64)
        assert attention(q, q, q).shape == q.shape
        assert not any(name.startswith("comfyui_fastar.kernels.") and "triton" in name for name in sys.modules)
        print(available_backends("cpu"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "['flex', 'sdpa_fold', 'torch']" in result.stdout
