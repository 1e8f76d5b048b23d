"""Batches, TorchCompileModel, ModelSamplingSD3 and LoRA files with ComfyUI's own nodes and sampling code: run by
tests/test_comfyui_user_features.py with a host's python, in its ComfyUI folder, as
``python comfyui_user_features.py PACK_DIR``. Prints one line ``RESULT {json}`` with each check's figures (or
{"skipped": why} / {"error": traceback}); the test file asserts, the same on every host.
"""

import os
import tempfile

from comfyui_boot import boot, recorder, report

boot()
import comfy.sample  # noqa: E402
import comfy.samplers  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from comfyui_fastar.nodes.host import get_host  # noqa: E402
from comfyui_fastar.nodes.node_loader import LoadARVideoModel  # noqa: E402
from comfyui_fastar.nodes.node_long_sampler import LongVideoSampler  # noqa: E402
from comfyui_fastar.nodes.node_sampler_ar import SamplerARVideoFastAR  # noqa: E402

TINY = "tiny_wan_t2v.safetensors"
RESULTS = {"host": get_host().name}
check = recorder(RESULTS)


def conditioning(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, 16, 4096, generator=g) * scale, {}]]


def pack_model():
    return LoadARVideoModel().load(TINY)[0]


def custom_sample(model, latent, seed, batch_index=None):
    """SamplerCustomAdvanced with RandomNoise (batch_index as LatentFromBatch sets it), CFGGuider cfg 1,
    BasicScheduler simple 4 steps and the pack's SAMPLER."""
    guider = comfy.samplers.CFGGuider(model)
    guider.set_conds(conditioning(1), conditioning(99, 0.0))
    guider.set_cfg(1.0)
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 4).cpu()
    noise = comfy.sample.prepare_noise(latent, seed, batch_index)
    sampler = SamplerARVideoFastAR().get_sampler(frames_per_block=3, mode="chunk", cache_policy="global")[0]
    return guider.sample(noise, latent, sampler, sigmas, seed=seed).cpu()


@check
def batch_custom_sampling():
    model = pack_model()
    both = custom_sample(model, torch.zeros(2, 16, 7, 4, 4), seed=5)
    first = custom_sample(model, torch.zeros(1, 16, 7, 4, 4), seed=5)
    return {"shape": list(both.shape), "item0_equal": bool(torch.equal(both[:1], first)),
            "items_differ": bool((both[0] - both[1]).abs().max() > 1e-3)}


@check
def batch_long_sampler():
    model = pack_model()
    both, report = LongVideoSampler().sample(model, conditioning(1), 32, 32, 25, seed=3, batch_size=2)
    one, _ = LongVideoSampler().sample(model, conditioning(1), 32, 32, 25, seed=3)
    both, one = both["samples"], one["samples"]
    return {"shape": list(both.shape), "item0_equal": bool(torch.equal(both[:1], one)),
            "items_differ": bool((both[0] - both[1]).abs().max() > 1e-3), "report_says": "batch of 2" in report}


@check
def torch_compile_model():
    from comfy_extras.nodes_torch_compile import TorchCompileModel

    model = pack_model()
    execute = getattr(TorchCompileModel, "execute", None)
    out = execute(model, "inductor") if execute is not None else TorchCompileModel().patch(model, "inductor")
    compiled = out[0] if isinstance(out, tuple) else out.result[0]
    eager, _ = LongVideoSampler().sample(model, conditioning(1), 32, 32, 13, seed=3, cache_policy="global")
    got, report = LongVideoSampler().sample(compiled, conditioning(1), 32, 32, 13, seed=3, cache_policy="global")
    eager, got = eager["samples"], got["samples"]
    return {"compile_kwargs": sorted(compiled.model_options.get("torch_compile_kwargs", {})),
            "report_says": "torch.compile backend inductor" in report,
            "max_abs_diff": float((eager - got).abs().max()), "max_abs": float(eager.abs().max())}


@check
def model_sampling_sd3_shift():
    from comfy_extras.nodes_model_advanced import ModelSamplingSD3

    model = pack_model()
    out = ModelSamplingSD3().patch(model, 3.0)
    shifted = out[0] if isinstance(out, tuple) else out.result[0]
    _, report = LongVideoSampler().sample(shifted, conditioning(1), 32, 32, 13, seed=3)
    _, plain = LongVideoSampler().sample(model, conditioning(1), 32, 32, 13, seed=3)
    notes = [line for line in plain.splitlines() if line.startswith("note")]
    return {"warned": "shift 3 from ModelSamplingSD3" in report, "plain_quiet": not any("shift" in n for n in notes)}


@check
def lora_formats_match_comfyui_lora_loader():
    """The pack's loader merging a kohya-format LoRA gives the weights ComfyUI's LoraLoaderModelOnly patches in."""
    import nodes

    # fp32 weights on both sides: the pack merges before building the MODEL, ComfyUI patches the built one.
    base = LoadARVideoModel().load(TINY, "fp32")[0]
    sd = {k: v.clone() for k, v in base.model.diffusion_model.state_dict().items()}  # before any patching
    g = torch.Generator().manual_seed(7)
    tensors = {}
    for target in ("blocks.0.self_attn.q", "blocks.1.ffn.0"):
        rows, cols = sd[f"{target}.weight"].shape
        flat = "lora_unet_" + target.replace(".", "_")
        tensors[f"{flat}.lora_up.weight"] = torch.randn(rows, 4, generator=g) * 0.1
        tensors[f"{flat}.lora_down.weight"] = torch.randn(4, cols, generator=g) * 0.1
        tensors[f"{flat}.alpha"] = torch.tensor(2.0)
    folder = tempfile.mkdtemp()
    save_file(tensors, os.path.join(folder, "fastar_check_kohya.safetensors"))
    folder_paths.add_model_folder_path("loras", folder)
    ours = LoadARVideoModel().load(TINY, "fp32", "fastar_check_kohya.safetensors")[0]
    theirs = nodes.LoraLoaderModelOnly().load_lora_model_only(base, "fastar_check_kohya.safetensors", 1.0)[0]
    comfy.model_management.load_models_gpu([theirs])
    diffs = {}
    for target in ("blocks.0.self_attn.q", "blocks.1.ffn.0"):
        a = ours.get_model_object(f"diffusion_model.{target}").weight.detach().float()
        b = theirs.get_model_object(f"diffusion_model.{target}").weight.detach().float()
        diffs[target] = float((a - b).abs().max())
    changed = float((ours.get_model_object("diffusion_model.blocks.0.self_attn.q").weight.detach().float()
                     - sd["blocks.0.self_attn.q.weight"].float()).abs().max())
    return {"max_abs_diff": max(diffs.values()), "changed": changed,
            "dtype": str(ours.get_model_object("diffusion_model.blocks.0.self_attn.q").weight.dtype)}


report(RESULTS)
