"""ComfyUI's attention as the pack's backend "comfy": the adapter's layout, its registration, its signature."""

import ast
import os
import pathlib
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.fastar.config import FastARConfig
from comfyui_fastar.kernels import dispatch, registered_host_backends, unregister_host_backend, verify
from comfyui_fastar.kernels import host_backends as host_module
from comfyui_fastar.nodes import host


def fake_optimized_attention(calls):
    """What ComfyUI's attention functions do with skip_reshape=True (q, k, v [B, H, N, D]) and no output skip:
    attention per head, returned as [B, N, H * D]."""

    def optimized_attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                            skip_output_reshape=False, **kwargs):
        calls.append({"heads": heads, "skip_reshape": skip_reshape, "kwargs": kwargs})
        assert skip_reshape and q.shape[1] == heads
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(q.shape[0], -1, heads * q.shape[-1])

    return optimized_attention


@pytest.fixture()
def fake_comfy(monkeypatch):
    calls = []
    names = ["comfy", "comfy.ldm", "comfy.ldm.modules", "comfy.ldm.modules.attention"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["comfy.ldm.modules.attention"].optimized_attention = fake_optimized_attention(calls)
    for parent, child in zip(names, names[1:]):
        setattr(modules[parent], child.rsplit(".", 1)[1], modules[child])
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(host_module, "_registry", {})
    verify.reset()
    yield calls
    verify.reset()


@pytest.mark.parametrize("scale", [None, 0.2])
def test_the_adapter_gives_per_head_attention_in_the_packs_layout(fake_comfy, scale):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16, generator=gen) for n in (10, 14, 14))
    scale_value = scale or 16**-0.5
    out = host.comfy_attention(q, k, v, scale_value)
    assert out.shape == q.shape
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=scale_value), atol=1e-6)
    assert fake_comfy[0]["heads"] == 3 and fake_comfy[0]["kwargs"] == {}


def test_inside_comfyui_the_host_registers_comfy_for_dense_cuda_calls(fake_comfy, monkeypatch):
    monkeypatch.setenv("FASTAR_HOST", "comfyui")
    monkeypatch.setattr(host, "_comfy", None)
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    monkeypatch.setattr(dispatch, "import_problem", lambda name: None)
    host.get_host()
    assert list(registered_host_backends()) == ["comfy"]
    cuda = torch.device("cuda")
    assert dispatch.backend_chain("attention", "auto", cuda, dtype=torch.bfloat16, head_dim=128) == ("comfy", "torch")
    assert dispatch.backend_chain("attention", "auto", cuda, dtype=torch.bfloat16, head_dim=128,
                                  has_bias=True) == ("triton", "sdpa_fold", "torch")
    assert verify.tolerance("comfy", torch.bfloat16) == host.COMFY_ATTENTION_TOLERANCE
    assert FastARConfig(backend="comfy").validate().backend == "comfy"  # the node's choice is valid here
    unregister_host_backend("comfy")
    with pytest.raises(FastARError, match="backend = 'comfy' is invalid"):
        FastARConfig(backend="comfy").validate()


def test_outside_comfyui_nothing_is_registered(monkeypatch):
    monkeypatch.setenv("FASTAR_HOST", "standalone")
    monkeypatch.setattr(host_module, "_registry", {})
    host.get_host()
    assert registered_host_backends() == {}


COMFYUI_CHECKOUTS = list(dict.fromkeys(d for d in [os.environ.get("COMFYUI_DIR", ""),
                                                    *os.environ.get("COMFYUI_DIRS", "").split(":")] if d))


@pytest.mark.skipif(not COMFYUI_CHECKOUTS, reason="needs a ComfyUI checkout in COMFYUI_DIR (or COMFYUI_DIRS=a:b)")
@pytest.mark.parametrize("comfyui_dir", COMFYUI_CHECKOUTS or ["none"])
def test_the_call_binds_to_every_attention_function_of_the_real_comfyui(comfyui_dir):
    """Read (not import) comfy/ldm/modules/attention.py: every function `optimized_attention` may be set to takes
    (q, k, v, heads) positionally and `skip_reshape` by name, which is all the adapter passes."""
    source = pathlib.Path(comfyui_dir, "comfy", "ldm", "modules", "attention.py").read_text()
    tree = ast.parse(source)
    chosen = {node.value.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(getattr(t, "id", None) == "optimized_attention" for t in node.targets)
              and isinstance(node.value, ast.Name)}
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert len(chosen) >= 3, f"expected optimized_attention = attention_* for several flags, found {chosen}"
    for name in sorted(chosen):
        args = functions[name].args
        positional = [a.arg for a in args.posonlyargs + args.args]
        named = positional + [a.arg for a in args.kwonlyargs]
        assert len(positional) >= 4, f"{name} takes {positional}, the adapter passes q, k, v, heads"
        assert "skip_reshape" in named, f"{name} has no skip_reshape parameter: {named}"
        assert "mask" in named or args.kwarg is not None
