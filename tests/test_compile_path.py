"""ComfyUI's TorchCompileModel setting on a MODEL reaches the pack's runner: its block pieces go through
torch.compile with the MODEL's settings and give the eager result."""

import os

import pytest
import torch
from test_nodes_e2e import cond, patch, sample, tiny_model

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.block_forward import BlockForward
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.constants import TORCH_COMPILE_KWARGS_KEY
from comfyui_fastar.nodes.model_access import resolve_model

from helpers import tiny_context
from helpers import tiny_model as engine_tiny_model


@pytest.fixture()
def model(standalone_host, tmp_path):
    save_checkpoint(tiny_model(), tmp_path / "tiny_ar.safetensors", dtype=torch.float32)
    return NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)[0]


class RecordingBackend:
    """A torch.compile backend that records each graph it is given and runs it as traced."""

    def __init__(self):
        self.graphs = []

    def __deepcopy__(self, memo):  # MODEL.clone() deep-copies model_options; keep one recorder
        return self

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def compiled_model(model, backend, **settings):
    """What TorchCompileModel does to a MODEL's options (comfy_api.torch_helpers.set_torch_compile_wrapper)."""
    m = model.clone()
    m.model_options[TORCH_COMPILE_KWARGS_KEY] = {"backend": backend, "options": None, "mode": None,
                                                  "fullgraph": False, "dynamic": None, **settings}
    return m


def test_the_model_s_compile_setting_compiles_the_block_pieces(model):
    torch._dynamo.reset()
    backend = RecordingBackend()
    eager, _ = sample(patch(model), cond())
    compiled, report = sample(patch(compiled_model(model, backend)), cond())
    assert backend.graphs, "the block pieces went through the MODEL's compile backend"
    assert len(backend.graphs) <= 3 * 3, "one graph per piece and chunk size, shared by every layer"
    assert torch.allclose(compiled, eager, atol=1e-5)
    assert "torch.compile backend" in report and "TorchCompileModel" in report
    assert "torch.compile" not in sample(patch(model), cond())[1], "an uncompiled MODEL says nothing of it"


def test_comfyui_0_27_settings_with_a_guard_filter_are_accepted(model):
    torch._dynamo.reset()
    backend = RecordingBackend()
    filter_calls = []

    def skip_transformer_options(entries):
        filter_calls.append(len(entries))
        return [("transformer_options" not in e.name) for e in entries]

    options = {"guard_filter_fn": skip_transformer_options}
    m = compiled_model(model, backend, options=options)
    out, _ = sample(m, cond())
    assert backend.graphs and torch.isfinite(out).all()
    assert "guard_filter_fn" in m.model_options[TORCH_COMPILE_KWARGS_KEY]["options"], "the MODEL's options are kept"
    assert resolve_model(m).compile_kwargs["backend"] is backend


def test_bad_compile_settings_are_refused():
    with pytest.raises(FastARError, match="not known"):
        BlockForward({"backend": "inductor", "keys": ["diffusion_model"]})


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FASTAR_TEST_INDUCTOR") != "1",
                    reason="the inductor compiles C++ for about a minute on a CPU; FASTAR_TEST_INDUCTOR=1 runs it")
def test_inductor_on_cpu_matches_eager():
    torch._dynamo.reset()
    m = engine_tiny_model()
    cfg = RolloutConfig(num_frames=6, latent_height=4, latent_width=4, seed=3)
    eager = ARSampler(CausalRunner(m)).generate(tiny_context(), cfg).latent
    compiled = ARSampler(CausalRunner(m, compile_kwargs={"backend": "inductor"})).generate(tiny_context(), cfg).latent
    assert torch.allclose(compiled, eager, atol=1e-4)
