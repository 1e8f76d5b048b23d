"""Settings of upstream nodes that the AR samplers do not use are named in the run's report (and the log)."""

import logging
from types import SimpleNamespace

import pytest
import torch
from test_nodes_e2e import cond, fake_custom_sampling, sample, tiny_model

from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.node_sampler_ar import sample_ar_video
from comfyui_fastar.nodes.upstream import LOADER_SHIFT_ATTR, ignored_conditioning, is_start_image_hook

SIGMAS = torch.tensor([1.0, 0.9375, 0.8333333, 0.625, 0.0])


@pytest.fixture()
def model(standalone_host, tmp_path):
    save_checkpoint(tiny_model(), tmp_path / "tiny_ar.safetensors", dtype=torch.float32)
    return NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)[0]


def with_sampling(model, shift, loader_shift=None):
    """A MODEL whose model_sampling has a shift, as ModelSamplingSD3 (or the pack's loader) leaves it."""
    m = model.clone()
    sampling = SimpleNamespace(shift=shift)
    if loader_shift is not None:
        setattr(sampling, LOADER_SHIFT_ATTR, loader_shift)
    m.model.model_sampling = sampling  # StandaloneModel.get_model_object reads the model's attributes
    return m


def notes(report):
    return [line for line in report.splitlines() if line.startswith("note")]


def test_model_sampling_shift_on_the_long_sampler_is_named(model, caplog):
    _, report = sample(with_sampling(model, 3.0), cond())
    assert any("shift 3 from ModelSamplingSD3" in n and "'Self-Forcing 4-step'" in n and "made for shift 5" in n
               for n in notes(report)), report
    assert "shift 3 from ModelSamplingSD3" in caplog.text, "the warning is logged too"
    assert not notes(sample(with_sampling(model, 5.0), cond())[1]), "the preset's own shift: nothing to say"
    assert not notes(sample(with_sampling(model, 5.0, loader_shift=5.0), cond(), schedule="CausVid 3-step")[1]), \
        "the loader's untouched default is no one's request"
    _, loader = sample(with_sampling(model, 3.0, loader_shift=3.0), cond())
    assert any("shift 3 from the loader's 'shift'" in n for n in notes(loader))
    _, custom = sample(with_sampling(model, 3.0), cond(), sigmas=SIGMAS)
    assert not any("shift" in n for n in notes(custom)), "connected SIGMAS carry the shift: not ignored"


def test_patches_the_runner_does_not_apply_are_named_in_both_samplers(model, caplog):
    patched = model.clone()
    transformer = patched.model_options["transformer_options"]
    transformer["patches_replace"] = {"dit": {("double_block", 0): lambda args, extra: args}}
    transformer["optimized_attention_override"] = lambda *a, **k: None
    patched.model_options["sampler_cfg_function"] = lambda args: args["cond"]
    patched.wrappers = {"diffusion_model": {"teacache": [lambda *a: None]}, "apply_model": {"torch.compile": [1]},
                        "outer_sample": {}}
    _, report = sample(patched, cond())
    (note,) = [n for n in notes(report) if "upstream nodes" in n]
    for part in ("block replacements", "attention override", "sampler_cfg_function", "wrappers of the model call "
                 "(diffusion_model)"):
        assert part in note, note
    assert "apply_model" not in note, "TorchCompileModel's wrapper is honoured, not ignored"
    assert not any("upstream" in n for n in notes(sample(model, cond())[1]))

    with caplog.at_level(logging.WARNING, logger="FAST-AR"):
        out = sample_ar_video(fake_custom_sampling(patched, cond()[0][0]), torch.randn(1, 16, 4, 4, 4), SIGMAS,
                              extra_args={"seed": 1, "denoise_mask": torch.ones(1, 1, 4, 4, 4)})
    assert torch.isfinite(out).all()
    assert "block replacements" in caplog.text and "noise_mask is ignored" in caplog.text


def test_conditioning_extras_the_samplers_do_not_use_are_named(model):
    extras = {"concat_latent_image": torch.zeros(1), "strength": 0.5, "mask": torch.ones(1)}
    _, report = sample(model, [[cond()[0][0], extras]])
    text = "\n".join(notes(report))
    assert "image-to-video Wan model (use AR Image to Video" in text and "strength 0.5" in text and "mask" in text
    ours = SimpleNamespace(hooks=[SimpleNamespace(transformers_dict={"ar_config": {"initial_latent": 0}})])
    theirs = SimpleNamespace(hooks=[SimpleNamespace(weights={"lora": 1})])
    assert is_start_image_hook(ours) and not is_start_image_hook(theirs)
    assert ignored_conditioning({"hooks": ours, "pooled_output": None, "strength": 1.0}) == []
    assert "Create Hook LoRA" in ignored_conditioning({"hooks": theirs})[0]


def test_a_batch_of_start_images_is_named(model, caplog):
    from test_nodes_e2e import SIZE, FakeVAE

    with caplog.at_level(logging.WARNING, logger="FAST-AR"):
        positive, *_ = NODES["FastAR_ImageToVideo"]().encode(cond(), FakeVAE(), torch.rand(2, 40, 48, 3), SIZE, SIZE,
                                                             13)
    assert "start_image holds 2 images; the first is the start of every video" in caplog.text
    assert positive[0][1]["fastar_initial_latent"].shape[0] == 1
