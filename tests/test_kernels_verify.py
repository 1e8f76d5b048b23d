"""Verified at first use: a broken accelerated backend costs one warning and the torch result, never the run."""

import importlib
import logging

import pytest
import torch

from comfyui_fastar.fastar_core.fastar.attention import FastARAttention
from comfyui_fastar.fastar_core.fastar.config import FastARConfig
from comfyui_fastar.fastar_core.forward.attention import DenseAttention
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.kernels import attention, dispatch, lsh_codes, verify

from helpers import tiny_context

# Head dim 64: a size the Triton kernels run (smaller ones hand the call to torch before any kernel).
HEAD64 = WanConfig(dim=128, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
attention_triton = importlib.import_module("comfyui_fastar.kernels.attention_triton")
sparse_triton = importlib.import_module("comfyui_fastar.kernels.sparse_triton")


@pytest.fixture(autouse=True)
def fresh_verdicts(fresh_kernel_checks):
    yield


@pytest.fixture(scope="module")
def model():
    return random_wan(HEAD64, seed=0)


def rollout(model, attention_seam):
    cfg = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=3)
    return ARSampler(CausalRunner(model, attention=attention_seam)).generate(tiny_context(), cfg).latent


def kernel_warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == verify.__name__]


def raising(*args, **kwargs):
    raise RuntimeError("PTX compile failed: out of resource: shared memory")


def off_by_half(q, k, v, bias, scale, return_lse):
    from comfyui_fastar.kernels.attention_torch import attention_torch

    out, lse = attention_torch(q, k, v, bias, scale, return_lse)
    return out + 0.5, lse


@pytest.mark.parametrize("broken, says", [(raising, "raised RuntimeError: PTX compile failed"),
                                           (off_by_half, "differs from torch by up to 0.5")])
def test_broken_triton_attention_falls_back_in_a_rollout_with_one_warning(model, monkeypatch, caplog, broken, says):
    expected = rollout(model, DenseAttention(backend="torch"))
    monkeypatch.setattr(attention_triton, "attention_triton", broken)
    with caplog.at_level(logging.WARNING):
        got = rollout(model, DenseAttention(backend="triton"))
    assert torch.equal(got, expected)  # every call ran torch: bit for bit
    [warning] = kernel_warnings(caplog)  # dense cache: one family (fp32, head dim 64, no bias) for all calls
    message = warning.getMessage()
    assert "'triton'" in message and "attention" in message and says in message and "'torch'" in message


def test_a_backend_failing_only_on_real_calls_is_dropped_after_one_warning(model, monkeypatch, caplog):
    real, calls = attention_triton.attention_triton, []

    def fails_past_the_probe(q, *args):
        calls.append(q.shape[2])
        if len(calls) > 1:  # the probe passes, the first real call raises
            raise RuntimeError("illegal memory access")
        return real(q, *args)

    expected = rollout(model, DenseAttention(backend="torch"))
    monkeypatch.setattr(attention_triton, "attention_triton", fails_past_the_probe)
    with caplog.at_level(logging.WARNING):
        got = rollout(model, DenseAttention(backend="triton"))
    assert torch.equal(got, expected)
    assert len(calls) == 2  # probe, first real call; never again
    [warning] = kernel_warnings(caplog)
    assert "illegal memory access" in warning.getMessage()


def test_broken_sparse_kernel_falls_back_in_an_annsa_rollout(model, monkeypatch, caplog):
    config = FastARConfig(annsa=True, annsa_min_keys=0, dense_warmup=0.0, block_size=16, bits=2, backend="torch")
    expected = rollout(model, FastARAttention(config, HEAD64.num_heads, 64))
    monkeypatch.setattr(sparse_triton, "sparse_attention_triton", raising)
    with caplog.at_level(logging.WARNING):
        # Only the sparse calls are forced onto Triton; dense ones and the hashing stay on torch.
        monkeypatch.setattr(dispatch, "_auto_chain", _sparse_on_triton(dispatch._auto_chain))
        got = rollout(model, FastARAttention(config.with_overrides(backend="auto"), HEAD64.num_heads, 64))
    assert torch.equal(got, expected)
    [warning] = kernel_warnings(caplog)
    assert "sparse_attention" in warning.getMessage() and "blocks 16x16" in warning.getMessage()


def _sparse_on_triton(auto_chain):
    def chain(op, *args):
        return ("triton", "torch") if op == "sparse_attention" else auto_chain(op, *args)

    return chain


def test_auto_chains_are_verified_too(monkeypatch, caplog):
    """What `auto` picks on a GPU goes through the same check (the chain is forced here, on CPU)."""
    monkeypatch.setattr(dispatch, "_auto_chain", lambda *args: ("triton", "torch"))
    monkeypatch.setattr(attention_triton, "attention_triton", off_by_half)
    q, k, v = (torch.randn(1, 2, 20, 64) for _ in range(3))
    with caplog.at_level(logging.WARNING):
        out = attention(q, k, v)
        attention(q, k, v)
    assert torch.equal(out, attention(q, k, v, backend="torch"))
    assert len(kernel_warnings(caplog)) == 1


def test_each_family_is_checked_once_and_separately(monkeypatch, caplog):
    monkeypatch.setattr(attention_triton, "attention_triton", off_by_half)
    q, k, v = (torch.randn(1, 2, 20, 64) for _ in range(3))
    bias = torch.zeros(1, 2, 20)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            attention(q, k, v, backend="triton")
            attention(q, k, v, bias, backend="triton")
            attention(q.half(), k.half(), v.half(), backend="triton")
    families = sorted(r.getMessage().split("(")[1].split(")")[0] for r in kernel_warnings(caplog))
    assert families == ["float16, head dim 64, no bias, on cpu", "float32, head dim 64, no bias, on cpu",
                        "float32, head dim 64, with bias, on cpu"]
    assert all(problem is not None for problem in verify.verdicts().values())


def test_a_working_backend_is_checked_once_and_then_used(monkeypatch, caplog):
    real, calls = attention_triton.attention_triton, []
    monkeypatch.setattr(attention_triton, "attention_triton", lambda *a: calls.append(1) or real(*a))
    q, k, v = (torch.randn(1, 2, 20, 64) for _ in range(3))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            attention(q, k, v, backend="triton")
    assert len(calls) == 1 + 3 and not kernel_warnings(caplog)
    assert list(verify.verdicts().values()) == [None]


def test_the_check_never_moves_the_global_random_stream():
    state = torch.random.get_rng_state()
    q = torch.ones(1, 1, 8, 64)
    attention(q, q, q, backend="flex")
    lsh_codes(q, torch.ones(1, 64, 4), bits=4, backend="triton")
    assert len(verify.verdicts()) == 2
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("switch", ["env", "function"])
def test_turned_off_the_chosen_backend_runs_and_its_errors_propagate(monkeypatch, switch):
    if switch == "env":
        monkeypatch.setenv(verify.ENV_VAR, "0")
    else:
        verify.set_verification(False)
    monkeypatch.setattr(attention_triton, "attention_triton", raising)
    q = torch.randn(1, 2, 20, 64)
    with pytest.raises(RuntimeError, match="PTX compile failed"):
        attention(q, q, q, backend="triton")
    assert verify.verdicts() == {}


def test_input_errors_are_not_swallowed_by_the_fallback(monkeypatch):
    from comfyui_fastar.kernels import KernelInputError

    def refuses(*args):
        raise KernelInputError("q must be contiguous")

    from comfyui_fastar.kernels.attention_torch import attention_torch

    monkeypatch.setattr(attention_triton, "attention_triton", attention_torch)
    q = torch.randn(1, 2, 20, 64)
    attention(q, q, q, backend="triton")  # verified
    monkeypatch.setattr(attention_triton, "attention_triton", refuses)
    with pytest.raises(KernelInputError, match="contiguous"):
        attention(q, q, q, backend="triton")


def test_the_fastar_setting_turns_the_check_off_for_its_rollout(model, monkeypatch):
    from comfyui_fastar.tools.args import settings_from_arguments
    from comfyui_fastar.tools.cli import build_parser

    args = build_parser().parse_args(["generate", "--checkpoint", "x.safetensors", "--frames", "3", "--out", "o",
                                      "--no-verify-kernels"])
    config = settings_from_arguments(args).fastar
    assert config.verify_kernels is False and FastARConfig().verify_kernels is True
    monkeypatch.setattr(attention_triton, "attention_triton", raising)
    seam = FastARAttention(config.with_overrides(backend="triton"), HEAD64.num_heads, 64)
    with pytest.raises(RuntimeError, match="PTX compile failed"):
        rollout(model, seam)  # no check, no fallback: the kernel's own error
    assert verify.verification_enabled()  # on again after that rollout (it failed, too)
