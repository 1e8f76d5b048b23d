"""Checkpoint layouts of the Wan2.1 AR family, and every kind of bad file, each with one clear message."""

import json

import pytest
import torch
from safetensors.torch import save_file

from comfyui_fastar.fastar_core.errors import CheckpointError, FastARError
from comfyui_fastar.fastar_core.files.wan_checkpoint import (
    KNOWN_PREFIXES,
    build_model,
    expected_shapes,
    load_checkpoint,
    save_checkpoint,
)
from comfyui_fastar.fastar_core.model.wan_config import KNOWN_SIZES, WanConfig, infer_config
from comfyui_fastar.fastar_core.model.wan_model import WanModel

from helpers import TINY, tiny_model


def tiny_sd(seed=0):
    return {k: v.clone() for k, v in tiny_model(seed).state_dict().items()}


# A tiny config's head count cannot be read from shapes; published models use head_dim 128.
CFG = TINY


def assert_same(sd, ckpt):
    assert set(sd) == set(ckpt.state_dict)
    for k in sd:
        assert torch.equal(sd[k].to(ckpt.dtype), ckpt.state_dict[k]), k


@pytest.mark.parametrize("prefix", ["", *KNOWN_PREFIXES])
def test_safetensors_with_each_prefix(tmp_path, prefix):
    sd = tiny_sd()
    path = tmp_path / "m.safetensors"
    save_file({prefix + k: v for k, v in sd.items()}, str(path))
    ckpt = load_checkpoint(path, config=CFG)
    assert ckpt.prefix == prefix
    assert ckpt.container == "flat"
    assert_same(sd, ckpt)


def test_pt_prefers_generator_ema_and_strips_fsdp(tmp_path):
    ema, plain = tiny_sd(1), tiny_sd(2)
    path = tmp_path / "self_forcing_dmd.pt"
    torch.save({"generator": {"model." + k: v for k, v in plain.items()},
                "generator_ema": {"model._fsdp_wrapped_module." + k: v for k, v in ema.items()},
                "step": torch.tensor(3)}, path)
    ckpt = load_checkpoint(path, config=CFG)
    assert ckpt.container == "generator_ema"
    assert_same(ema, ckpt)


def both_entries(path, ema, plain):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"generator": {"model." + k: v for k, v in plain.items()},
                "generator_ema": {"model." + k: v for k, v in ema.items()}}, path)
    return path


@pytest.mark.parametrize("name,entry", [
    ("longlive_base.pt", "generator"),  # LongLive's inference configs: use_ema: false
    ("autoregressive_checkpoint/model.pt", "generator"),  # CausVid's released folder; its scripts load generator
    ("causvid_ar.pt", "generator"),
    ("rolling_forcing_dmd.pt", "generator_ema"),
    ("Self-Forcing DMD.pt", "generator_ema"),
    ("framewise/causal_forcing.pt", "generator_ema"),
    ("chunkwise/causal_forcing.pt", "generator"),  # Causal Forcing's README runs chunk-wise without --use_ema
    ("my_model.pt", "generator_ema"),  # no family named: the EMA, as before
])
def test_auto_takes_the_entry_the_family_inference_loads(tmp_path, name, entry):
    ema, plain = tiny_sd(1), tiny_sd(2)
    ckpt = load_checkpoint(both_entries(tmp_path / name, ema, plain), config=CFG)
    assert ckpt.container == entry
    assert_same(plain if entry == "generator" else ema, ckpt)
    assert ckpt.summary()["weights_choice"].startswith("auto")


def test_weights_entry_overrides_the_family_and_names_what_a_file_lacks(tmp_path):
    ema, plain = tiny_sd(1), tiny_sd(2)
    path = both_entries(tmp_path / "longlive_base.pt", ema, plain)
    ckpt = load_checkpoint(path, config=CFG, weights_entry="generator_ema")
    assert ckpt.container == "generator_ema" and ckpt.weights_choice == "chosen by weights_entry"
    assert_same(ema, ckpt)
    only = tmp_path / "longlive_ema_only.pt"
    torch.save({"generator_ema": {"model." + k: v for k, v in ema.items()}}, only)
    assert load_checkpoint(only, config=CFG).container == "generator_ema"  # auto: the only weights there are
    with pytest.raises(CheckpointError, match="weights_entry 'generator'.*holds generator_ema"):
        load_checkpoint(only, config=CFG, weights_entry="generator")
    with pytest.raises(FastARError, match="weights_entry 'ema' is not one of auto, generator_ema, generator"):
        load_checkpoint(only, config=CFG, weights_entry="ema")


@pytest.mark.parametrize("container", ["generator", "state_dict", "model"])
def test_pt_containers(tmp_path, container):
    sd = tiny_sd()
    path = tmp_path / "m.pt"
    torch.save({container: {"model." + k: v for k, v in sd.items()}}, path)
    ckpt = load_checkpoint(path, config=CFG)
    assert ckpt.container == container
    assert_same(sd, ckpt)


def test_nested_fsdp_segments_are_removed(tmp_path):
    sd = tiny_sd()
    path = tmp_path / "m.pt"
    wrapped = {"model._fsdp_wrapped_module." + k.replace("blocks.0.", "blocks.0._fsdp_wrapped_module."): v
               for k, v in sd.items()}
    torch.save({"generator_ema": wrapped}, path)
    assert_same(sd, load_checkpoint(path, config=CFG))


def test_metadata_config_dtype_cast_and_build(tmp_path):
    model = tiny_model()
    path = tmp_path / "demo.safetensors"
    save_checkpoint(model, path, dtype=torch.bfloat16, extra_metadata={"config": {"transformer": {"causal_ar": True}}})
    ckpt = load_checkpoint(path)  # config read from the metadata, no hint needed
    assert ckpt.config == CFG
    assert ckpt.file_dtype == torch.bfloat16 and ckpt.dtype == torch.bfloat16
    assert ckpt.causal_ar is True
    as_fp32 = load_checkpoint(path, dtype="fp32")
    assert as_fp32.dtype == torch.float32
    built = build_model(as_fp32)
    assert built.blocks[0].self_attn.q.weight.dtype == torch.float32
    assert ckpt.summary()["parameters"] == sum(p.numel() for p in model.parameters())


def test_published_sizes_are_recognised():
    for name, cfg in KNOWN_SIZES.items():
        shapes = expected_shapes(cfg)
        inferred = infer_config(shapes)
        assert inferred == cfg
        assert inferred.family == name
        assert inferred.head_dim == 128
    assert WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128).family == "custom"


def test_longlive_lora_merge(tmp_path):
    sd = tiny_sd()
    base = tmp_path / "longlive_base.safetensors"
    save_file(sd, str(base))
    rank, alpha = 4, 8.0
    g = torch.Generator().manual_seed(0)
    lora = {}
    targets = ["blocks.0.self_attn.q", "blocks.1.ffn.0"]
    for t in targets:
        out_f, in_f = sd[f"{t}.weight"].shape
        lora[f"base_model.model.{t}.lora_A.weight"] = torch.randn(rank, in_f, generator=g)
        lora[f"base_model.model.{t}.lora_B.weight"] = torch.randn(out_f, rank, generator=g)
    lora_path = tmp_path / "lora.pt"
    torch.save({"generator_lora": lora}, lora_path)
    ckpt = load_checkpoint(base, config=CFG, lora=lora_path, lora_alpha=alpha)
    for t in targets:
        a = lora[f"base_model.model.{t}.lora_A.weight"]
        b = lora[f"base_model.model.{t}.lora_B.weight"]
        torch.testing.assert_close(ckpt.state_dict[f"{t}.weight"], sd[f"{t}.weight"] + (b @ a) * alpha / rank)
    assert torch.equal(ckpt.state_dict["blocks.0.self_attn.k.weight"], sd["blocks.0.self_attn.k.weight"])


class Arbitrary:
    pass


def bad_files(tmp_path):
    sd = tiny_sd()
    files = {}

    def st(name, tensors):
        p = tmp_path / name
        save_file(tensors, str(p))
        return p

    files["not Wan"] = (st("vae.safetensors", {"encoder.conv.weight": torch.zeros(2, 2)}), "not a Wan2.1")
    good = st("good.safetensors", sd)
    trunc = tmp_path / "truncated.safetensors"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["truncated"] = (trunc, "truncated")
    missing = dict(sd)
    del missing["blocks.1.ffn.2.weight"]
    files["missing"] = (st("missing.safetensors", missing), "missing keys")
    extra = dict(sd, **{"blocks.0.extra.weight": torch.zeros(1)})
    files["extra"] = (st("extra.safetensors", extra), "unexpected keys")
    wrong = dict(sd, **{"blocks.0.self_attn.q.weight": torch.zeros(64, 32)})
    files["shape"] = (st("shape.safetensors", wrong), "wrong shape")
    i2v = dict(sd, **{"blocks.0.cross_attn.k_img.weight": torch.zeros(64, 64), "img_emb.proj.0.weight": torch.zeros(1)})
    files["i2v"] = (st("i2v.safetensors", i2v), "image-to-video")
    pickled = tmp_path / "evil.pt"
    torch.save({"generator": sd, "extra": Arbitrary()}, pickled)
    files["pickle"] = (pickled, "arbitrary code")
    other = tmp_path / "model.gguf"
    other.write_bytes(b"GGUF")
    files["suffix"] = (other, "unsupported file type")
    files["absent"] = (tmp_path / "absent.safetensors", "no such file")
    return files


def test_bad_checkpoints_are_refused_with_one_message(tmp_path):
    for case, (path, phrase) in bad_files(tmp_path).items():
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(path, config=CFG)
        message = str(err.value)
        assert str(path) in message, case
        assert phrase in message, (case, message)
        assert "\n" not in message


def test_metadata_is_json_decoded(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(tiny_sd(), str(path), metadata={"fastar_config": json.dumps(CFG.to_dict()), "note": "plain"})
    ckpt = load_checkpoint(path)
    assert ckpt.metadata["note"] == "plain"
    assert ckpt.metadata["fastar_config"]["dim"] == CFG.dim


@pytest.mark.parametrize("cfg", [TINY, KNOWN_SIZES["Wan2.1-1.3B"],
                                 WanConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=48, in_dim=4, out_dim=8,
                                           text_dim=16, freq_dim=16, patch_size=(1, 1, 2))])
def test_expected_shapes_match_the_module_tree(cfg):
    """The loader's written-out layout is the engine's WanModel, key for key and shape for shape."""
    with torch.device("meta"):
        model = WanModel(cfg)
    assert expected_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
