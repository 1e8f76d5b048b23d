"""Load AR Video Model: a Self-Forcing-family checkpoint in, a native ComfyUI MODEL out."""

from __future__ import annotations

import json
from pathlib import Path

from ..fastar_core.errors import FastARError
from ..fastar_core.families.demo.family import attach_world
from ..fastar_core.families.demo.model import load_demo_file
from ..fastar_core.families.lingbot.checkpoint import build_lingbot, load_lingbot_checkpoint
from ..fastar_core.families.lingbot.rollout import FRAMES_PER_BLOCK as LINGBOT_CHUNK
from ..fastar_core.families.lingbot.rollout import SCHEDULE as LINGBOT_SCHEDULE
from ..fastar_core.families.matrix_game.checkpoint import build_matrix_game, load_matrix_game_checkpoint
from ..fastar_core.files.model_files import is_demo_world_file, is_lingbot, is_matrix_game_file
from ..fastar_core.files.wan_checkpoint import WEIGHTS_ENTRY_CHOICES, load_checkpoint
from ..fastar_core.rollout.action_script import VARIANTS
from .constants import CATEGORY
from .host import WEIGHT_DTYPES, get_host
from .inputs import combo, float_input

NO_LORA = "none"
# The demo world shipped with the pack (a CPU is enough), offered beside the files in models/diffusion_models.
BUNDLED_DEMO_WORLD = "demo world (bundled with ComfyUI-FastAR)"
BUNDLED_DEMO_WORLD_FILE = Path(__file__).resolve().parents[1] / "tools" / "demo" / "weights" / "world_model.safetensors"
ENGINE_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}  # others: ComfyUI casts (fp8) or picks (default)


def load_native_model(path: str, weight_dtype: str, lora: str | None, shift: float, disable_dynamic: bool = False,
                      weights_entry: str = "auto"):
    """Checkpoint file -> (MODEL, checkpoint). Also registered as the MODEL's ``cached_patcher_init``, the factory
    ComfyUI 0.2x calls (with ``disable_dynamic=True``) to rebuild a model when a Dynamic VRAM patcher must be
    cloned into a plain one (TorchCompileModel, MultiGPU, hooked conditioning) and refuses without it."""
    ckpt = load_checkpoint(path, dtype=ENGINE_DTYPES.get(weight_dtype), lora=lora, weights_entry=weights_entry)
    model = get_host().model_from_checkpoint(ckpt, weight_dtype, shift, disable_dynamic=disable_dynamic)
    if hasattr(model, "cached_patcher_init"):
        model.cached_patcher_init = (rebuild_model, (path, weight_dtype, lora, shift, weights_entry))
    return model, ckpt


def rebuild_model(path, weight_dtype, lora, shift, weights_entry="auto", disable_dynamic=False):
    return load_native_model(path, weight_dtype, lora, shift, disable_dynamic, weights_entry)[0]


def load_engine_model(host, path: str, weight_dtype: str, lora_name: str, family: str, read, build, extra: dict):
    """A world model's checkpoint as a MODEL over the engine's own module tree, which only the pack's samplers run:
    ``read(path)`` checks and reads it, ``build(ckpt)`` makes the module tree; ``extra`` goes into 'info'."""
    if lora_name and lora_name != NO_LORA:
        raise FastARError(f"lora_name {lora_name}: LoRAs are for the Wan2.1 text models; a {family} checkpoint takes "
                          "none (set it to none)")
    if weight_dtype.startswith("fp8"):
        raise FastARError(f"weight_dtype {weight_dtype}: a {family} model runs in bf16, fp16 or fp32 (default: the "
                          "file's on a GPU, fp32 on a CPU)")
    ckpt = read(path)
    dtype = host.world_weight_dtype(weight_dtype, ckpt.dtype)
    model = host.world_model(build(ckpt).to(dtype), {"weight_dtype": weight_dtype})
    summary = ckpt.summary()
    summary.update(weight_dtype=weight_dtype, dtype=str(dtype).replace("torch.", ""), **extra)
    return (model, json.dumps(summary, indent=1))


def load_world_model(host, path: str, weight_dtype: str, lora_name: str):
    """A Matrix-Game 2.0 checkpoint (its sizes from its metadata, a config.json beside it, or the released variant its
    keys are)."""
    def extra(ckpt):
        variant = ckpt.config.variant
        return {"schedule": ckpt.config.schedule_name,
                "keys": VARIANTS[variant].valid_keys() if variant in VARIANTS else None}

    ckpt = load_matrix_game_checkpoint(path)
    return load_engine_model(host, path, weight_dtype, lora_name, "Matrix-Game 2.0", lambda _: ckpt,
                             build_matrix_game, extra(ckpt))


def load_lingbot_model(host, path: str, weight_dtype: str, lora_name: str):
    """A LingBot-World 2.0 ``from_pretrained`` folder, named by any of its safetensors."""
    return load_engine_model(host, path, weight_dtype, lora_name, "LingBot-World 2.0", load_lingbot_checkpoint,
                             build_lingbot, {"schedule": LINGBOT_SCHEDULE, "frames_per_block": LINGBOT_CHUNK,
                                             "steering": "a Camera Path, or an Action Script of variant lingbot: "
                                                         + VARIANTS["lingbot"].valid_keys()})


def load_demo_world(host, path, weight_dtype: str, lora_name: str):
    """A steered demo world file as a MODEL that only the pack's samplers run (in fp32: it is tiny)."""
    if lora_name and lora_name != NO_LORA:
        raise FastARError(f"lora_name {lora_name}: the demo world takes no LoRA (set it to none)")
    if weight_dtype not in ("default", "fp32"):
        raise FastARError(f"weight_dtype {weight_dtype}: the demo world runs in fp32 (choose default or fp32)")
    demo = load_demo_file(path)
    model = host.world_model(attach_world(demo), {"weight_dtype": "fp32"}, raw_latent=True)
    summary = {"family": "demo world", "path": str(path), "frame_size": list(demo.frame_size),
               "frames_per_block": demo.frames_per_block, "schedule": demo.schedule.name,
               "map_size": demo.metadata["world"]["map_size"], "keys": "W A S D or the arrows (variant demo_world)"}
    return (model, json.dumps(summary, indent=1))


class LoadARVideoModel:
    DESCRIPTION = ("Loads a Wan2.1 autoregressive checkpoint (Self-Forcing, CausVid, Rolling Forcing, LongLive, Krea, "
                   "Causal Forcing; .safetensors or .pt), a Matrix-Game 2.0 world model (its released .safetensors "
                   "at the top of models/diffusion_models) or a LingBot-World 2.0 world model (its transformers/ "
                   "folder's files in a folder of their own: pick any of its .safetensors) from "
                   "models/diffusion_models: picks the weights the model's own inference loads (generator or "
                   "generator_ema), strips training prefixes, optionally merges a LoRA, and builds a native MODEL "
                   "with ComfyUI's own loader, so LoRA loaders, model-sampling and compile nodes keep working on it "
                   "(the pack's samplers compile their blocks when TorchCompileModel asks). Where ComfyUI has its own "
                   "causal Wan model (0.21+), that is the class built, so core's Sampler AR Video runs on it too. The "
                   "world models become MODELs over the pack's own module trees, which the Long Video Sampler runs.")

    @classmethod
    def INPUT_TYPES(cls):
        host = get_host()
        return {"required": {
            "model_name": combo([*host.list_files("diffusion_models"), BUNDLED_DEMO_WORLD],
                                "Checkpoint in models/diffusion_models (or models/unet): e.g. self_forcing_dmd.pt, "
                                "rolling_forcing_dmd.pt, longlive_base.pt, causal_forcing.pt. Training files "
                                "(generator_ema, FSDP prefixes) are handled. LingBot-World 2.0: any shard of its "
                                "folder (lingbot-world-v2-14b-causal-fast/transformers/...) loads the whole folder. "
                                "The last entry is the pack's own demo world, which runs on a CPU."),
            "weight_dtype": combo(WEIGHT_DTYPES,
                                  "Weight dtype. 'default' lets ComfyUI choose for your device (bf16/fp16 on GPUs, "
                                  "fp32 on CPU); fp8 halves memory at a small quality cost."),
            "lora_name": combo([NO_LORA, *host.list_files("loras")],
                               "Optional LoRA from models/loras, merged into the weights at alpha/rank (1 without "
                               "alpha), as ComfyUI's LoRA loader merges it: LongLive's lora.pt and ComfyUI's Wan "
                               "formats (lora_unet_..., diffusion_model....lora_up/lora_down, .lora_A/.lora_B, "
                               ".diff). LoHa, LoKr and DoRA files are refused."),
            "shift": float_input(5.0, 0.0, 100.0,
                                 "Flow shift that ComfyUI's own schedulers (BasicScheduler) use with this MODEL: 5 "
                                 "gives the Self-Forcing family's 4-step sigmas with 4 'simple' steps. The Long Video "
                                 "Sampler's presets do not depend on it."),
        }, "optional": {
            "weights_entry": combo(WEIGHTS_ENTRY_CHOICES,
                                   "Which weights of a training .pt that holds both a generator and its EMA. auto: "
                                   "the ones the model's own inference loads, by the family its file name says "
                                   "(generator for LongLive, use_ema: false, and CausVid; generator_ema for "
                                   "Self-Forcing, Rolling Forcing and Causal Forcing), generator_ema when the name "
                                   "says no family. 'info' says which was taken. A .safetensors holds one set: "
                                   "keep auto.", default="auto"),
        }}

    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "info")
    OUTPUT_TOOLTIPS = ("A native Wan2.1 T2V MODEL.", "What the checkpoint was: family, shape, dtype, prefixes.")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, model_name, weight_dtype="default", lora_name=NO_LORA, shift=5.0, weights_entry="auto"):
        host = get_host()
        if model_name == BUNDLED_DEMO_WORLD:
            return load_demo_world(host, BUNDLED_DEMO_WORLD_FILE, weight_dtype, lora_name)
        path = host.full_path("diffusion_models", model_name)
        if is_demo_world_file(path):
            return load_demo_world(host, path, weight_dtype, lora_name)
        if is_matrix_game_file(path):
            return load_world_model(host, path, weight_dtype, lora_name)
        if is_lingbot(path):
            return load_lingbot_model(host, path, weight_dtype, lora_name)
        lora = host.full_path("loras", lora_name) if lora_name and lora_name != NO_LORA else None
        model, ckpt = load_native_model(path, weight_dtype, lora, shift, weights_entry=weights_entry)
        dm = getattr(getattr(model, "model", None), "diffusion_model", None)
        info = json.dumps({**ckpt.summary(), "weight_dtype": weight_dtype, "shift": shift,
                           "model_class": type(dm).__name__}, indent=1)
        return (model, info)
