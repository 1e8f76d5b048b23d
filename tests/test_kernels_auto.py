"""What `auto` runs where (CUDA mocked on CPU), the bias folded into plain SDPA, and host attention backends."""

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from comfyui_fastar.kernels import attention, dispatch, register_host_backend, unregister_host_backend, verify
from comfyui_fastar.kernels import host_backends as host_module
from comfyui_fastar.kernels.attention_fold import fold_bias

CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def clean_state(monkeypatch, fresh_kernel_checks):
    monkeypatch.setattr(host_module, "_registry", {})  # e.g. ComfyUI's, registered by a host test


@pytest.fixture()
def gpu_install(monkeypatch):
    """A Linux CUDA machine with triton importable, as far as the dispatcher can tell."""
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    monkeypatch.setattr(dispatch, "import_problem", lambda name: None)


def chain(op="attention", dtype=BF16, head_dim=128, **kind):
    return dispatch.backend_chain(op, "auto", CUDA, dtype=dtype, head_dim=head_dim, **kind)


def test_auto_on_cuda_for_each_kind_of_call(gpu_install):
    assert chain() == ("torch",)  # dense, no bias: PyTorch SDPA (flash / memory-efficient)
    # bias read by our kernel; without it, folded in: mask-free SDPA can run flash
    assert chain(has_bias=True) == ("triton", "sdpa_fold", "torch")
    assert chain(dtype=torch.float16, head_dim=64, has_bias=True) == ("triton", "sdpa_fold", "torch")
    assert chain(has_bias=True, head_dim=96) == ("sdpa_fold", "torch")  # no Triton kernel for 96
    assert chain(dtype=torch.float32, has_bias=True) == ("torch",)  # no fp32 flash kernel to win
    assert chain(has_bias=True, head_dim=256) == ("torch",)  # 256 + 8 is past the flash kernel's head dims
    assert chain(has_bias=True, return_lse=True) == ("triton", "torch")  # LSE in the same pass
    assert chain("sparse_attention", has_bias=True) == ("triton", "torch")
    assert chain("sparse_attention", head_dim=96) == ("torch",)
    assert chain("lsh_codes", head_dim=96) == ("triton", "torch")
    assert dispatch.choose_backend("attention", "auto", CUDA, dtype=BF16, head_dim=128, has_bias=True) == "triton"


def test_auto_on_cuda_without_triton(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_installed", lambda: False)
    assert chain("sparse_attention") == ("torch",)
    assert chain("lsh_codes") == ("torch",)
    assert chain(has_bias=True) == ("sdpa_fold", "torch")  # pure torch, needs nothing else


def test_auto_off_cuda_is_torch(gpu_install):
    for op in ("attention", "sparse_attention", "lsh_codes"):
        for has_bias in (False, True):
            assert dispatch.backend_chain(op, "auto", "cpu", dtype=BF16, head_dim=128, has_bias=has_bias) == ("torch",)


def test_a_registered_host_attention_takes_the_dense_calls_on_its_devices(gpu_install):
    register_host_backend("hostattn", lambda q, k, v, scale: q)
    try:
        assert chain() == ("hostattn", "torch")
        assert chain(has_bias=True) == ("triton", "sdpa_fold", "torch")  # a host backend never sees a bias
        assert chain(return_lse=True) == ("triton", "torch")
        assert dispatch.backend_chain("attention", "auto", "cpu", dtype=BF16, head_dim=128) == ("torch",)
        assert dispatch.backend_chain("attention", "hostattn", CUDA, dtype=BF16, head_dim=128) == ("hostattn",
                                                                                                   "torch")
        assert dispatch.backend_chain("attention", "hostattn", CUDA, head_dim=128, has_bias=True) == ("torch",)
        with pytest.raises(dispatch.BackendUnavailableError, match="runs on cuda tensors"):
            dispatch.backend_chain("attention", "hostattn", "cpu")
        assert dispatch.backend_chain("sparse_attention", "hostattn", CUDA, head_dim=128) == ("triton", "torch")
    finally:
        unregister_host_backend("hostattn")
    assert chain() == ("torch",)


def test_host_backend_names_are_checked():
    for bad in ("torch", "auto", "Comfy", "two words", ""):
        with pytest.raises(ValueError):
            register_host_backend(bad, lambda q, k, v, scale: q)
    with pytest.raises(ValueError, match="callable"):
        register_host_backend("hostattn", "not a function")


def host_sdpa(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def test_a_host_backend_runs_and_a_wrong_one_falls_back(caplog):
    q, k, v = (torch.randn(1, 2, 30, 32) for _ in range(3))
    expected = attention(q, k, v, backend="torch")
    register_host_backend("hostattn", host_sdpa, device_types=("cpu",))
    register_host_backend("broken", lambda q, k, v, scale: torch.zeros_like(q), device_types=("cpu",))
    try:
        assert torch.allclose(attention(q, k, v, backend="hostattn"), expected, atol=1e-6)
        with caplog.at_level(logging.WARNING):
            assert torch.equal(attention(q, k, v, backend="broken"), expected)
        [warning] = [r for r in caplog.records if r.name == verify.__name__]
        assert "'broken'" in warning.getMessage() and "differs from torch" in warning.getMessage()
    finally:
        unregister_host_backend("hostattn")
        unregister_host_backend("broken")


def biased_reference(q, k, v, bias, scale):
    """float64 softmax(scale q k^T + bias) v; a (batch, head) whose keys are all -inf gives 0."""
    logits = scale * q.double() @ k.double().transpose(-1, -2) + bias.double().unsqueeze(2)
    return torch.softmax(logits, -1).nan_to_num(0.0) @ v.double()


def counts_bias(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bias = torch.randint(1, 22, shape, generator=gen).float().log()
    bias[..., ::5] = -math.inf
    return bias


@pytest.mark.parametrize("bias_shape", [(2, 3, 90), (1, 3, 90), (1, 1, 90)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_folded_bias_is_exact_in_fp32(bias_shape, scale):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 64, generator=gen) for n in (40, 90, 90))
    bias = counts_bias(bias_shape)
    if bias_shape[0] == 2:
        bias[1, 2] = -math.inf  # a head that sees no key: zeros
    out = attention(q, k, v, bias, scale=scale, backend="sdpa_fold")
    ref = biased_reference(q, k, v, bias, scale or 64**-0.5)
    masked = attention(q, k, v, bias, scale=scale, backend="torch")
    assert (out.double() - ref).abs().max() < max(1e-5, 2 * (masked.double() - ref).abs().max())
    assert torch.equal(out, attention(q, k, v, bias, scale=scale, backend="sdpa_fold"))
    if bias_shape[0] == 2:
        assert bool((out[1, 2] == 0).all())


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_folded_bias_in_half_types_is_as_close_as_the_masked_path(dtype, tol):
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, n, 128, generator=gen).to(dtype) for n in (64, 200, 200))
    bias = counts_bias((1, 4, 200))
    ref = biased_reference(q, k, v, bias, 128**-0.5)
    fold_err = (attention(q, k, v, bias, backend="sdpa_fold").double() - ref).abs().max()
    mask_err = (attention(q, k, v, bias, backend="torch").double() - ref).abs().max()
    assert fold_err < tol and fold_err < 3 * mask_err + 1e-3


def test_the_fold_reproduces_the_biased_logits():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen) for n in (5, 7, 7))
    bias = counts_bias((1, 2, 7))
    scale = 0.125
    qf, kf, vf = fold_bias(q, k, v, bias, scale)
    assert qf.shape[-1] == kf.shape[-1] == vf.shape[-1] == 72  # 64 + one coordinate padded to 8
    logits = scale * qf @ kf.transpose(-1, -2)
    expected = scale * q @ k.transpose(-1, -2) + bias.unsqueeze(2)
    finite = torch.isfinite(expected)
    assert (logits[finite] - expected[finite]).abs().max() < 1e-5
    assert bool((logits[~finite] < -5e3).all())  # empty slots: exp underflows to 0
    assert torch.equal(vf[..., :64], v) and not vf[..., 64:].any()
