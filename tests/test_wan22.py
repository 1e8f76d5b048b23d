"""The Wan2.2 TI2V-5B family: its config, LongLive 2.0's checkpoint layout, ``fastar info``, and the UniPC rollout
on a tiny 5B-shaped model (no reference needed; the parity with LongLive 2.0's own code is in
``test_longlive2_parity``)."""

import pytest
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.files.wan_checkpoint import load_checkpoint, load_wan_model
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import KNOWN_SIZES, WanConfig, infer_config
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.rollout.schedule import get_schedule
from comfyui_fastar.fastar_core.rollout.unipc import UniPCSolver
from comfyui_fastar.tools.cli import main

TINY_5B = WanConfig(dim=256, num_heads=2, num_layers=2, ffn_dim=256, in_dim=48, out_dim=48, text_dim=16, freq_dim=32)


def test_5b_config_is_named_and_its_shapes_infer_back():
    cfg = KNOWN_SIZES["Wan2.2-TI2V-5B"]
    assert (cfg.dim, cfg.num_heads, cfg.head_dim, cfg.num_layers, cfg.ffn_dim) == (3072, 24, 128, 30, 14336)
    assert (cfg.in_dim, cfg.out_dim, cfg.patch_size) == (48, 48, (1, 2, 2))
    assert cfg.family == "Wan2.2-TI2V-5B" and cfg.architecture == "Wan2.2 TI2V" and cfg.vae_spatial_stride == 16
    wan21 = KNOWN_SIZES["Wan2.1-1.3B"]
    assert wan21.family == "Wan2.1-1.3B" and wan21.architecture == "Wan2.1 T2V" and wan21.vae_spatial_stride == 8
    shapes = {k: tuple(v.shape) for k, v in random_wan(TINY_5B).state_dict().items()}
    assert infer_config(shapes) == TINY_5B


def save_longlive2(path, seed_generator=0, seed_ema=1):
    gen, ema = random_wan(TINY_5B, seed=seed_generator), random_wan(TINY_5B, seed=seed_ema)
    torch.save({"generator": {"model." + k: v for k, v in gen.state_dict().items()},
                "generator_ema": {"model." + k: v for k, v in ema.state_dict().items()}}, path)
    return gen, ema


def test_longlive2_checkpoint_loads_generator_not_ema(tmp_path):
    """LongLive 2.0 runs with use_ema false: a 5B file's ``generator`` entry, even beside ``generator_ema``
    (which a Wan2.1 file's loader prefers)."""
    path = tmp_path / "longlive2.pt"
    gen, _ = save_longlive2(path)
    ckpt = load_checkpoint(path)
    assert ckpt.container == "generator" and ckpt.prefix == "model."
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in gen.state_dict().items())
    alone = tmp_path / "model_only.pt"
    torch.save({"model": gen.state_dict()}, alone)
    assert load_checkpoint(alone).container == "model"


def test_info_names_the_wan22_architecture(tmp_path, capsys):
    path = tmp_path / "longlive2.pt"
    save_longlive2(path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Wan2.2 TI2V architecture" in out and "in/out 48/48 ch" in out and "from 'generator'" in out


def test_unipc_rollout_runs_on_a_5b_shaped_model(tmp_path):
    """A 5B-shaped rollout with the longlive2 schedule: 48 channels, no noise drawn after each chunk's start,
    deterministic; a rolling-mode request for it is refused."""
    path = tmp_path / "longlive2.pt"
    save_longlive2(path)
    model, _ = load_wan_model(path)
    sampler = ARSampler(CausalRunner(model))
    cfg = RolloutConfig(num_frames=12, latent_height=2, latent_width=2, frames_per_block=4, schedule="longlive2",
                        channels=48, cache=CacheSpec("window", sink_frames=2, window_frames=8))
    g = torch.Generator().manual_seed(0)
    a = sampler.generate(torch.randn(1, 8, 16, generator=g), cfg).latent
    b = sampler.generate(torch.randn(1, 8, 16, generator=g), cfg).latent
    assert a.shape == (1, 48, 12, 2, 2) and torch.isfinite(a).all()
    assert not torch.equal(a, b)  # the prompt matters
    assert torch.equal(sampler.generate(torch.zeros(1, 8, 16), cfg).latent,
                       sampler.generate(torch.zeros(1, 8, 16), cfg).latent)
    with pytest.raises(FastARError, match="needs sampler mode 'chunk'"):
        RolloutConfig(num_frames=12, latent_height=2, latent_width=2, schedule="longlive2", mode="rolling",
                      channels=48).validate()


def test_longlive2_schedule_is_unipc_with_integer_timesteps():
    s = get_schedule("longlive2")
    assert s.solver == "unipc" and s.timesteps == [999.0, 937.0, 833.0, 624.0]
    assert [round(v, 4) for v in s.sigmas] == [0.9998, 0.9373, 0.8331, 0.6247]
    # The last step lands on sigma 0: the model's x0 estimate itself, whatever came before.
    solver, x = UniPCSolver(s.sigmas), torch.randn(1, 2, 3, 2, 2)
    for _ in range(3):
        x = solver.step(torch.randn_like(x), x)
    flow = torch.randn_like(x)
    estimate = x - torch.tensor(s.sigmas[-1], dtype=torch.float32) * flow
    assert torch.equal(solver.step(flow, x), estimate)
    with pytest.raises(FastARError, match="taken all its 4 steps"):
        solver.step(flow, x)


def test_comfyui_format_5b_file_loads_as_wan22(tmp_path):
    """A flat ``.safetensors`` with ComfyUI's ``model.diffusion_model.`` prefix, as core saves the 5B."""
    from safetensors.torch import save_file

    model = random_wan(TINY_5B, seed=2)
    path = tmp_path / "wan2.2_ti2v_5B.safetensors"
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    ckpt = load_checkpoint(path)
    assert ckpt.config == TINY_5B and ckpt.config.architecture == "Wan2.2 TI2V" and ckpt.container == "flat"


def test_generate_sizes_a_5b_latent_by_the_wan22_vae_stride(tmp_path, capsys):
    """Pixels become latents at the Wan2.2 VAE's 16x16 compression, not Wan2.1's 8x8, and a height that is no
    multiple of stride x patch (32 here) is refused before any work."""
    from safetensors.torch import load_file

    from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint

    ckpt = tmp_path / "tiny5b.safetensors"
    save_checkpoint(random_wan(TINY_5B, seed=3), ckpt, dtype=torch.float32)
    args = ["generate", "--checkpoint", str(ckpt), "--frames", "32", "--width", "64", "--frames-per-block", "8",
            "--schedule", "longlive2", "--cache", "window", "--window", "24", "--sink", "8", "--device", "cpu"]
    assert main([*args, "--height", "96", "--out", str(tmp_path / "run")]) == 0
    assert tuple(load_file(str(tmp_path / "run" / "latent.safetensors"))["latent"].shape) == (1, 48, 32, 6, 4)
    assert main([*args, "--height", "80", "--out", str(tmp_path / "bad")]) == 2
    assert "--height 80" in capsys.readouterr().err
