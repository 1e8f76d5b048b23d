"""Checks that need tensors from inside a real ComfyUI: run by tests/test_comfyui_host.py with the host's python,
in the ComfyUI folder, as ``python comfyui_in_process.py PACK_DIR``. Prints one line ``RESULT {json}``: per check
either its figures, {"skipped": why} when this ComfyUI lacks the feature, or {"error": traceback}.

Nothing here asserts; the test file does, with the same assertions on every host.
"""

import importlib.util
import inspect
import json
import os

from comfyui_boot import Skip, boot, recorder, report

boot()
import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.samplers  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import torch  # noqa: E402
from comfy.cli_args import args  # noqa: E402

from comfyui_fastar.fastar_core.errors import FastARError  # noqa: E402
from comfyui_fastar.fastar_core.forward.attention import PassInfo  # noqa: E402
from comfyui_fastar.nodes.host import get_host  # noqa: E402
from comfyui_fastar.nodes.model_access import resolve_model  # noqa: E402
from comfyui_fastar.nodes.node_image_to_video import ARImageToVideo  # noqa: E402
from comfyui_fastar.nodes.node_loader import LoadARVideoModel  # noqa: E402
from comfyui_fastar.nodes.node_long_sampler import LongVideoSampler  # noqa: E402
from comfyui_fastar.nodes.node_sampler_ar import SamplerARVideoFastAR  # noqa: E402
from comfyui_fastar.nodes.streaming_decode import WanCausalStream, stream_pixels  # noqa: E402

TINY = "tiny_wan_t2v.safetensors"
CAUSAL = "tiny_wan_causal_ar_t2v.safetensors"
RESULTS = {"host": get_host().name}
check = recorder(RESULTS)


def model_path(name):
    path = folder_paths.get_full_path("diffusion_models", name)
    if path is None:
        raise Skip(f"no {name} in models/diffusion_models")
    return path


def vae_name():
    # the tiny VAE loads where ComfyUI reads the width from the file (0.2x) and decodes ~30x faster
    names = folder_paths.get_filename_list("vae")
    return "tiny_wan21_vae.safetensors" if "tiny_wan21_vae.safetensors" in names else "random_wan21_vae.safetensors"


_vae = []


def vae():
    if not _vae:
        _vae.append(comfy.sd.VAE(sd=comfy.utils.load_torch_file(folder_paths.get_full_path("vae", vae_name()))))
    return _vae[0]


def core_ar_nodes():
    try:
        import comfy_extras.nodes_ar_video as nodes_ar_video
    except ImportError as e:
        raise Skip(f"this ComfyUI has no AR video nodes ({e})") from None
    return nodes_ar_video


def pack_model(name=TINY):
    model_path(name)
    return LoadARVideoModel().load(name)[0]


def max_diff(a, b):
    return float((a.float() - b.float()).abs().max())


UMT5_TOKENS = 512  # ComfyUI's Wan text encoder pads every prompt to at least this many tokens, zeroing the tail


def prompt_embedding(seed, scale=1.0, tokens=16, padded=True):
    """A random stand-in for a ``tokens``-token prompt; ``padded``: shaped as ComfyUI's UMT5 encoder gives it."""
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(1, tokens, 4096, generator=g) * scale
    if padded:
        context = torch.cat([context, context.new_zeros(1, UMT5_TOKENS - tokens, 4096)], 1)
    return context


def conditioning(seed, scale=1.0):
    return [[prompt_embedding(seed, scale), {}]]


def sample(model, latent, sampler, positive, seed=0, steps=4):
    """What SamplerCustomAdvanced does with RandomNoise, CFGGuider (cfg 1) and BasicScheduler 'simple'."""
    guider = comfy.samplers.CFGGuider(model)
    guider.set_conds(positive, conditioning(99, 0.0))
    guider.set_cfg(1.0)
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps).cpu()
    noise = comfy.sample.prepare_noise(latent, seed)
    return guider.sample(noise, latent, sampler, sigmas, seed=seed).cpu()


def core_sampler():
    return comfy.samplers.ksampler("ar_video", {"num_frame_per_block": 3})


def pack_sampler(cache_policy="global"):
    return SamplerARVideoFastAR().get_sampler(frames_per_block=3, mode="chunk", cache_policy=cache_policy)[0]


def empty_latent(frames=7):
    return torch.zeros(1, 16, frames, 4, 4)


def start_image():
    g = torch.Generator().manual_seed(3)
    return torch.rand(1, 32, 32, 3, generator=g)


@check
def forward():
    with torch.no_grad():
        patcher = comfy.sd.load_diffusion_model(model_path(TINY))
        mm.load_models_gpu([patcher])
        model = resolve_model(patcher)
        runner = model.runner()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 16, 3, 8, 8, generator=g)
        t = torch.tensor([[900.0, 500.0, 100.0]])
        context = prompt_embedding(7)  # what ComfyUI's text encoder gives: 512 tokens, zero past the prompt
        short = prompt_embedding(7, padded=False)  # the same prompt's 16 tokens alone
        info = PassInfo(chunk=0, step=0, num_steps=1, frame_start=0, num_frames=3, tokens_per_frame=16)
        ours = runner.forward(x, t, runner.encode_text(context), None, info)
        ours_short = runner.forward(x, t, runner.encode_text(short), None, info)
        native = model.diffusion_model(x, t, context).float()
        native_short = model.diffusion_model(x, t, short).float()  # ComfyUI's forward does not pad
    return {"max_abs_diff": max_diff(ours, native), "max_abs": float(native.abs().max()),
            # the runner pads a short prompt to the model's 512 tokens as Wan's own forward does
            "short_prompt_max_abs_diff": max_diff(ours_short, native),
            # control: the zero rows change the output (text_embedding's bias), so a missing pad would show
            "unpadded_native_max_abs_diff": max_diff(native_short, native)}


@check
def streaming_decode():
    v = vae()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 16, 5, 4, 6, generator=g)
    with torch.no_grad():
        full = v.decode(z)
        out = {"vae": vae_name(), "full_shape": list(full.shape), "pieces": {}}
        for piece in (1, 2, 3):
            streamed = torch.cat(list(stream_pixels(v, z, piece)), 2).movedim(1, -1)
            out["pieces"][str(piece)] = {"shape": list(streamed.shape), "max_abs_diff": max_diff(full, streamed)}
        stream = WanCausalStream(v)
        stream.decode(z[:, :, :1])
        out["decoder_calls"] = "pairs" if stream.step == 2 else "one frame"
        if stream.step == 2:  # the cut matters: one frame per call (the old order) differs from VAE Decode
            stream = WanCausalStream(v)
            x = stream.fsm.conv2(z)
            chunks = []
            for i in range(z.shape[2]):
                chunks += stream._call(x[:, :, i:i + 1])
            naive = v.process_output(torch.cat(chunks, 2).float()).movedim(1, -1)
            out["one_frame_per_call_max_abs_diff"] = max_diff(full, naive)
    return out


@check
def preview():
    from comfy.cli_args import LatentPreviewMethod

    patcher = comfy.sd.load_diffusion_model(model_path(TINY))
    old = args.preview_method
    args.preview_method = LatentPreviewMethod.Latent2RGB  # what --preview-method auto selects
    try:
        kind, image, _ = get_host().previewer(patcher)(torch.randn(1, 16, 1, 4, 6))
    finally:
        args.preview_method = old
    return [kind, list(image.size)]


def marked_causal_model() -> str:
    """A causal-marked checkpoint: the host's own (0.2x builds write one), else a marked copy of the tiny model."""
    if folder_paths.get_full_path("diffusion_models", CAUSAL) is not None:
        return CAUSAL
    import tempfile

    from safetensors.torch import save_file

    folder = tempfile.mkdtemp(prefix="fastar_marked_")
    name = "tiny_wan_marked_causal_ar.safetensors"
    save_file(comfy.utils.load_torch_file(model_path(TINY)), os.path.join(folder, name),
              metadata={"config": json.dumps({"transformer": {"causal_ar": True}})})
    folder_paths.add_model_folder_path("diffusion_models", folder)
    return name


@check
def loader_classes():
    out = {"host_has_causal_class": importlib.util.find_spec("comfy.ldm.wan.ar_model") is not None}
    for key, name in (("unmarked", TINY), ("causal_marked", marked_causal_model())):
        path = model_path(name)
        out[key] = {"pack": type(pack_model(name).model.diffusion_model).__name__,
                    "core": type(comfy.sd.load_diffusion_model(path).model.diffusion_model).__name__}
    return out


@check
def dynamic_clone():
    params = inspect.signature(comfy.model_patcher.ModelPatcher.clone).parameters
    if "disable_dynamic" not in params:
        raise Skip("this ComfyUI has no Dynamic VRAM patcher (ModelPatcher.clone takes no disable_dynamic)")
    with torch.no_grad():
        model = pack_model(TINY)
        model.is_dynamic = lambda: True  # what a CUDA host with comfy-aimdo gives; CPU hosts never are
        clone = model.clone(disable_dynamic=True)
        x = torch.randn(1, 16, 3, 4, 4)
        t = torch.tensor([[900.0, 500.0, 100.0]])
        context = torch.randn(1, 16, 4096)
        mm.load_models_gpu([model])
        a = model.model.diffusion_model(x, t, context)
        mm.load_models_gpu([clone])
        b = clone.model.diffusion_model(x, t, context)
        out = {"clone_class": type(clone).__name__, "rebuilt": clone.model is not model.model,
               "clone_model_class": type(clone.model.diffusion_model).__name__, "forward_max_abs_diff": max_diff(a, b),
               "shift_kept": float(clone.get_model_object("model_sampling").shift)}
        # Control: a patcher built from a state dict without a factory fails the same clone (what the loader did).
        raw = comfy.sd.load_diffusion_model_state_dict(comfy.utils.load_torch_file(model_path(TINY)))
        raw.is_dynamic = lambda: True
        try:
            raw.clone(disable_dynamic=True)
            out["control_error"] = None
        except RuntimeError as e:
            out["control_error"] = str(e)
    return out


@check
def core_sampler_on_pack_loader():
    core_ar_nodes()
    with torch.no_grad():
        out = sample(pack_model(TINY), empty_latent(), core_sampler(), conditioning(1))
        result = {"shape": list(out.shape), "finite": bool(torch.isfinite(out).all()), "std": float(out.std())}
        # Control: the same file through core's own loader has no causal marker, and core's sampler refuses it.
        try:
            sample(comfy.sd.load_diffusion_model(model_path(TINY)), empty_latent(), core_sampler(), conditioning(1))
            result["control_error"] = None
        except TypeError as e:
            result["control_error"] = str(e)
    return result


@check
def long_sampler_progress():
    """The Long Video Sampler's progress, as ComfyUI's own ProgressBar hook (the one that feeds the editor's bar
    over the websocket) receives it."""
    calls = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: calls.append([value, total]))
    try:
        with torch.no_grad():
            LongVideoSampler().sample(pack_model(), conditioning(1), 32, 32, 25, cache_policy="global")
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
    return {"calls": calls}


@check
def pack_on_core_loader_and_latent():
    nodes = core_ar_nodes()
    with torch.no_grad():
        model = comfy.sd.load_diffusion_model(model_path(CAUSAL))
        latent = nodes.EmptyARVideoLatent.execute(32, 32, 25, 1).args[0]
        custom = sample(model, latent["samples"], pack_sampler(), conditioning(1))
        long = LongVideoSampler().sample(model, conditioning(1), 32, 32, 25, cache_policy="global")[0]["samples"]
    return {"model_class": type(model.model.diffusion_model).__name__, "latent_shape": list(latent["samples"].shape),
            "custom_shape": list(custom.shape), "long_shape": list(long.shape),
            "finite": bool(torch.isfinite(custom).all() and torch.isfinite(long).all())}


@check
def core_start_image_to_pack():
    nodes = core_ar_nodes()
    with torch.no_grad():
        model = comfy.sd.load_diffusion_model(model_path(CAUSAL))
        with_image, latent = nodes.ARVideoI2V.execute(model, vae(), start_image(), 32, 32, 25, 1).args
        start = with_image.model_options["transformer_options"]["ar_config"]["initial_latent"].float().cpu()
        long = LongVideoSampler().sample(with_image, conditioning(1), 32, 32, 25, cache_policy="global")[0]
        plain = LongVideoSampler().sample(model, conditioning(1), 32, 32, 25, cache_policy="global")[0]
        custom = sample(with_image, latent["samples"], pack_sampler(), conditioning(1))
        custom_plain = sample(model, latent["samples"], pack_sampler(), conditioning(1))
        core = sample(with_image, latent["samples"], core_sampler(), conditioning(1))
        core_plain = sample(model, latent["samples"], core_sampler(), conditioning(1))
    long, plain = long["samples"].cpu(), plain["samples"].cpu()
    return {"start_abs_max": float(start.abs().max()),
            "long_frame0_vs_start": max_diff(long[:, :, :1], start),
            "long_changed_by_image": max_diff(long, plain),
            "custom_frame0_vs_start": max_diff(custom[:, :, :1], start),
            "custom_changed_by_image": max_diff(custom, custom_plain),
            "core_frame0_vs_start": max_diff(core[:, :, :1], start),
            "core_changed_by_image": max_diff(core, core_plain)}


@check
def pack_start_image_to_core():
    nodes = core_ar_nodes()
    with torch.no_grad():
        model = comfy.sd.load_diffusion_model(model_path(CAUSAL))
        positive, latent, *_ = ARImageToVideo().encode(conditioning(1), vae(), start_image(), 32, 32, 25, 1)
        start = positive[0][1]["fastar_initial_latent"].float().cpu()
        core = sample(model, latent["samples"], core_sampler(), positive)
        core_plain = sample(model, latent["samples"], core_sampler(), conditioning(1))
        custom = sample(model, latent["samples"], pack_sampler(), positive)  # the hook and the entry agree
        # one start image each way: refused with one message
        other, *_ = ARImageToVideo().encode(conditioning(1), vae(), 1 - start_image(), 32, 32, 25, 1)
        with_image = nodes.ARVideoI2V.execute(model, vae(), start_image(), 32, 32, 25, 1).args[0]
        try:
            LongVideoSampler().sample(with_image, other, 32, 32, 25)
            refused = None
        except FastARError as e:
            refused = str(e)
    return {"start_abs_max": float(start.abs().max()), "core_frame0_vs_start": max_diff(core[:, :, :1], start),
            "core_changed_by_image": max_diff(core, core_plain),
            "custom_frame0_vs_start": max_diff(custom[:, :, :1], start), "two_images_error": refused}


@check
def dense_agreement_one_step():
    core_ar_nodes()
    with torch.no_grad():
        model = comfy.sd.load_diffusion_model(model_path(CAUSAL))
        core = sample(model, empty_latent(), core_sampler(), conditioning(1), seed=5, steps=1)
        pack = sample(model, empty_latent(), pack_sampler(), conditioning(1), seed=5, steps=1)
        core4 = sample(model, empty_latent(), core_sampler(), conditioning(1), seed=5, steps=4)
        pack4 = sample(model, empty_latent(), pack_sampler(), conditioning(1), seed=5, steps=4)
    return {"one_step_max_abs_diff": max_diff(core, pack), "max_abs": float(core.abs().max()),
            "four_step_max_abs_diff": max_diff(core4, pack4),
            "four_step_std": [float(core4.std()), float(pack4.std())]}


@check
def lingbot_nodes():
    """LingBot-World 2.0 through the nodes on this ComfyUI (its shards loaded by Load AR Video Model, LingBot World
    Start with the host's Wan2.1 VAE, an Action Script of variant lingbot, the Long Video Sampler with ComfyUI's
    progress hook) against the engine's own rollout of the same prompt, start latent (in the model's latent space:
    ComfyUI's Wan21 format) and camera."""
    import tempfile
    from pathlib import Path

    from comfyui_fastar.fastar_core.families.lingbot.camera import check_path
    from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
    from comfyui_fastar.fastar_core.families.lingbot.config import LingBotConfig
    from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
    from comfyui_fastar.fastar_core.families.lingbot.rollout import lingbot_conditioning, rollout_config
    from comfyui_fastar.fastar_core.forward.runner import CausalRunner
    from comfyui_fastar.fastar_core.rollout.sampler import ARSampler
    from comfyui_fastar.nodes.node_action_script import ActionScriptNode
    from comfyui_fastar.nodes.node_lingbot_start import LingBotWorldStart
    from comfyui_fastar.nodes.node_loader import load_lingbot_model

    config = LingBotConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, freq_dim=32, text_len=16)
    folder = Path(tempfile.mkdtemp())
    save_lingbot(random_lingbot(config, seed=3), folder, shards=3, config_in_files=True)
    script = "variant lingbot\n0 W\n0.5 W L\n1 up\n"
    calls = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: calls.append([value, total]))
    try:
        with torch.no_grad():
            model, info = load_lingbot_model(get_host(), str(folder / "diffusion_pytorch_model-00002-of-00003"
                                                                     ".safetensors"), "default", "none")
            prompt = prompt_embedding(4, tokens=12, padded=False)  # the tiny model reads 16 tokens
            positive = LingBotWorldStart().encode([[prompt, {}]], vae(), start_image(), 48, 32, 29)[0]
            actions = ActionScriptNode().build("lingbot", 16.0, script)[0]
            latent, report = LongVideoSampler().sample(model, positive, 48, 32, 29, frames_per_block=4,
                                                       schedule="LingBot-World 4-step", seed=5, actions=actions)
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
    extras = positive[0][1]
    start = extras["fastar_world_start"].index_select(2, extras["fastar_world_start_index"])
    dm = model.model.diffusion_model
    fmt = model.model.latent_format
    path = check_path(actions.to_poses(29), actions.intrinsics())
    cond = lingbot_conditioning(prompt, fmt.process_in(start.float()), path.condition(8, 32, 48))
    with torch.no_grad():
        direct = ARSampler(CausalRunner(dm)).generate(cond, rollout_config(dm.config, 8, 4, 6, seed=5)).latent
    return {"info_family": json.loads(info)["family"], "latent_format": type(fmt).__name__,
            "shape": list(latent["samples"].shape), "calls": calls,
            "max_abs_diff": max_diff(latent["samples"], fmt.process_out(direct)),
            "report_has_camera": "keys lingbot at 16 fps" in report}


report(RESULTS)
