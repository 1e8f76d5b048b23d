"""The nodes refuse bad inputs with the engine's own checks: the loader node through the same checkpoint
validation as the command line, and the Long Video Sampler checks its MODEL before loading it to the device."""

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from comfyui_fastar.fastar_core.errors import CheckpointError, FastARError
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES

from helpers import tiny_model


@pytest.fixture()
def host(standalone_host):
    return standalone_host


def test_loader_node_refuses_a_stray_layer_at_once(host, tmp_path):
    sd = {k: v.clone() for k, v in tiny_model().state_dict().items()}
    sd["blocks.10000.ffn.0.weight"] = sd["blocks.0.ffn.0.weight"].clone()
    save_file(sd, str(tmp_path / "stray.safetensors"))
    (tmp_path / "notes.pt").write_text("not a model\n")
    loader = NODES["FastAR_LoadARVideoModel"]()
    for name, phrase in (("stray.safetensors", "layer indices are not 0..2"), ("notes.pt", "is a text file")):
        with pytest.raises(CheckpointError) as err:
            loader.load(name, "default", "none", 5.0)
        assert name in str(err.value) and phrase in str(err.value), str(err.value)


def test_loader_node_refuses_hostile_files_without_crashing(host, tmp_path):
    """The loader node reads through the same checked path as the command line: a pickle nested 200,000 deep
    (which crashes torch's own unpickler), an archive that declares a petabyte, a tampered byte, a duplicate
    header key, and a LoRA of the same kind each end as one CheckpointError naming the file."""
    from fuzz_hostile import hostile_checkpoint_cases

    from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint

    model = tiny_model()
    save_checkpoint(model, tmp_path / "good.safetensors", dtype=torch.float32)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    good_pt = tmp_path / "good.pt"
    torch.save({"generator_ema": sd}, good_pt)
    cases = hostile_checkpoint_cases(tmp_path / "hostile", sd, {}, good_pt)
    host.register_folder("loras", tmp_path / "hostile")
    loader = NODES["FastAR_LoadARVideoModel"]()
    for name in ("hostile-deep-tuple-key", "hostile-zip-declares-1pib", "hostile-flipped-byte",
                 "hostile-st-duplicate-key", "hostile-entry-count"):
        path = cases[name]
        with pytest.raises(CheckpointError) as err:
            loader.load(f"hostile/{path.name}", "default", "none", 5.0)
        assert path.name in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(CheckpointError) as err:
        loader.load("good.safetensors", "default", cases["hostile-deep-tuple-key"].name, 5.0)
    assert "nests containers more than" in str(err.value)


@pytest.mark.parametrize("tree", [torch.nn.Linear(2, 2), SimpleNamespace(
    patch_embedding=torch.nn.Linear(2, 2), text_embedding=None, time_embedding=None, time_projection=None,
    blocks=[], head=None)])
def test_sampler_checks_the_model_before_loading_it(host, monkeypatch, tree):
    loads = []
    monkeypatch.setattr(host, "load_model", lambda patcher: loads.append(patcher))
    not_wan = SimpleNamespace(model=SimpleNamespace(diffusion_model=tree))
    positive = [[torch.zeros(1, 4, 32), {}]]
    with pytest.raises(FastARError) as err:
        NODES["FastAR_LongVideoSampler"]().sample(not_wan, positive, width=32, height=32, length=5)
    assert "not a Wan2.1 diffusion model" in str(err.value)
    assert loads == [], "the MODEL was loaded to the device before it was checked"
