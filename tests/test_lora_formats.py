"""LoRA files in the key formats ComfyUI reads for Wan all merge to the same weights: W + alpha/rank * up @ down."""

import pytest
import torch
from safetensors.torch import save_file

from comfyui_fastar.fastar_core.errors import CheckpointError
from comfyui_fastar.fastar_core.files.wan_checkpoint import merge_lora, save_checkpoint
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES

TINY = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
TARGETS = ("blocks.0.self_attn.q", "blocks.1.ffn.0", "blocks.0.cross_attn.k", "head.head")
RANK, ALPHA = 4, 2.0


def base_sd():
    return {k: v.clone() for k, v in random_wan(TINY, seed=0).state_dict().items()}


def pairs(sd):
    g = torch.Generator().manual_seed(5)
    out = {}
    for t in TARGETS:
        rows, cols = sd[f"{t}.weight"].shape
        out[t] = (torch.randn(rows, RANK, generator=g), torch.randn(RANK, cols, generator=g))  # up, down
    return out


def expected(sd, lora, scale):
    merged = dict(sd)
    for t, (up, down) in lora.items():
        merged[f"{t}.weight"] = sd[f"{t}.weight"] + scale * up @ down
    return merged


def kohya(t):
    return "lora_unet_" + t.replace(".", "_")


# name -> (key of the up matrix, key of the down matrix, key of alpha or None) for a module
FORMATS = {
    "kohya": (lambda t: f"{kohya(t)}.lora_up.weight", lambda t: f"{kohya(t)}.lora_down.weight",
              lambda t: f"{kohya(t)}.alpha"),
    "wan fun kohya": (lambda t: f"lora_unet__{t.replace('.', '_')}.lora_up.weight",
                      lambda t: f"lora_unet__{t.replace('.', '_')}.lora_down.weight",
                      lambda t: f"lora_unet__{t.replace('.', '_')}.alpha"),
    "comfyui lora_up/down": (lambda t: f"diffusion_model.{t}.lora_up.weight",
                             lambda t: f"diffusion_model.{t}.lora_down.weight", lambda t: f"diffusion_model.{t}.alpha"),
    "diffusers lora_A/B": (lambda t: f"diffusion_model.{t}.lora_B.weight",
                           lambda t: f"diffusion_model.{t}.lora_A.weight", lambda t: f"diffusion_model.{t}.alpha"),
    "peft default adapter": (lambda t: f"base_model.model.{t}.lora_B.default.weight",
                             lambda t: f"base_model.model.{t}.lora_A.default.weight", lambda t: f"{t}.alpha"),
    "lora.up/down": (lambda t: f"{t}.lora.up.weight", lambda t: f"{t}.lora.down.weight", lambda t: f"{t}.alpha"),
    "bare lora_A/B": (lambda t: f"model.diffusion_model.{t}.lora_B", lambda t: f"model.diffusion_model.{t}.lora_A",
                      lambda t: f"model.diffusion_model.{t}.alpha"),
}


def lora_file(tmp_path, name, lora, alpha=ALPHA, suffix=".safetensors"):
    up_key, down_key, alpha_key = FORMATS[name]
    tensors = {}
    for t, (up, down) in lora.items():
        tensors[up_key(t)] = up
        tensors[down_key(t)] = down
        if alpha is not None:
            tensors[alpha_key(t)] = torch.tensor(alpha)
    path = tmp_path / f"{name.replace(' ', '_').replace('/', '_')}{suffix}"
    if suffix == ".safetensors":
        save_file(tensors, str(path))
    else:
        torch.save(tensors, path)
    return path


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_merges_to_the_same_weights(tmp_path, name):
    sd = base_sd()
    lora = pairs(sd)
    want = expected(sd, lora, ALPHA / RANK)
    for suffix in (".safetensors", ".pt"):
        merged = dict(sd)
        assert merge_lora(merged, lora_file(tmp_path, name, lora, suffix=suffix)) == len(TARGETS)
        for key in sd:
            assert torch.allclose(merged[key], want[key], atol=1e-5), f"{name}{suffix}: {key}"


def test_scale_is_one_without_alpha_and_the_caller_s_alpha_wins(tmp_path):
    sd = base_sd()
    lora = pairs(sd)
    merged = dict(sd)
    merge_lora(merged, lora_file(tmp_path, "kohya", lora, alpha=None))
    assert torch.allclose(merged["blocks.0.self_attn.q.weight"], expected(sd, lora, 1.0)["blocks.0.self_attn.q.weight"],
                          atol=1e-5), "as ComfyUI: no alpha in the file, scale 1"
    merged = dict(sd)
    merge_lora(merged, lora_file(tmp_path, "kohya", lora), alpha=8.0)
    assert torch.allclose(merged["head.head.weight"], expected(sd, lora, 8.0 / RANK)["head.head.weight"], atol=1e-5)


def test_full_differences_and_refused_formats(tmp_path):
    sd = base_sd()
    diff = torch.randn_like(sd["blocks.0.norm3.weight"])
    diff_b = torch.randn_like(sd["blocks.0.self_attn.q.bias"])
    path = tmp_path / "diff.safetensors"
    save_file({"diffusion_model.blocks.0.norm3.diff": diff, "diffusion_model.blocks.0.self_attn.q.diff_b": diff_b},
              str(path))
    merged = dict(sd)
    assert merge_lora(merged, path) == 2
    assert torch.allclose(merged["blocks.0.norm3.weight"], sd["blocks.0.norm3.weight"] + diff)
    assert torch.allclose(merged["blocks.0.self_attn.q.bias"], sd["blocks.0.self_attn.q.bias"] + diff_b)

    dora = tmp_path / "dora.safetensors"
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(64, 4),
               "diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(4, 64),
               "diffusion_model.blocks.0.self_attn.q.dora_scale": torch.ones(64, 1)}, str(dora))
    with pytest.raises(CheckpointError, match="DoRA"):
        merge_lora(dict(sd), dora)
    half = tmp_path / "half.safetensors"
    save_file({"lora_unet_blocks_0_self_attn_q.lora_up.weight": torch.zeros(64, 4)}, str(half))
    with pytest.raises(CheckpointError, match="up matrix but not its down matrix"):
        merge_lora(dict(sd), half)
    diffusers_names = tmp_path / "diffusers.safetensors"
    save_file({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 64),
               "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(64, 4)}, str(diffusers_names))
    with pytest.raises(CheckpointError, match="LoRA targets transformer.blocks.0.attn1.to_q"):
        merge_lora(dict(sd), diffusers_names)


def test_the_loader_merges_a_comfyui_format_lora_from_the_loras_menu(standalone_host, tmp_path):
    model = random_wan(TINY, seed=0)
    save_checkpoint(model, tmp_path / "tiny_ar.safetensors", dtype=torch.float32)
    loras = tmp_path / "loras"
    loras.mkdir()
    standalone_host.register_folder("loras", loras)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    lora = pairs(sd)
    lora_file(loras, "kohya", lora)
    menu = NODES["FastAR_LoadARVideoModel"].INPUT_TYPES()["required"]["lora_name"][0]
    assert "kohya.safetensors" in menu
    loaded, info = NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "kohya.safetensors", 5.0)
    weight = loaded.model.diffusion_model.blocks[0].self_attn.q.weight
    assert torch.allclose(weight, expected(sd, lora, ALPHA / RANK)["blocks.0.self_attn.q.weight"], atol=1e-5)
    assert "kohya.safetensors" in info


def test_the_merge_is_rounded_once_to_the_dtype_the_model_runs_in(tmp_path):
    """A bf16 file loaded as fp32 gets fp32(W) + delta, as ComfyUI's LoRA patch of the loaded model gives, not the
    merge rounded to bf16 on the way."""
    from comfyui_fastar.fastar_core.files.wan_checkpoint import load_checkpoint

    model = random_wan(TINY, seed=0)
    save_checkpoint(model, tmp_path / "tiny_bf16.safetensors", dtype=torch.bfloat16)
    sd = {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}
    lora = {t: (up * 0.1, down * 0.1) for t, (up, down) in pairs(sd).items()}
    path = lora_file(tmp_path, "kohya", lora)
    ckpt = load_checkpoint(tmp_path / "tiny_bf16.safetensors", dtype="fp32", lora=path)
    want = expected(sd, lora, ALPHA / RANK)["blocks.0.self_attn.q.weight"]
    assert ckpt.state_dict["blocks.0.self_attn.q.weight"].dtype == torch.float32
    assert torch.allclose(ckpt.state_dict["blocks.0.self_attn.q.weight"], want, atol=1e-6, rtol=0)
