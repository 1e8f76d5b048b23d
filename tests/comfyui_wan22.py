"""Wan2.2 TI2V-5B inside a real ComfyUI: run by tests/test_comfyui_user_features.py with a host's python, in its
ComfyUI folder, as ``python comfyui_wan22.py PACK_DIR``. Prints one line ``RESULT {json}`` with each check's
figures (or {"skipped": why} / {"error": traceback}); the test file asserts, the same on every host. With
``--write-models DIR`` it only writes the tiny model and the random VAE as files there (``NAME``, ``VAE_NAME``),
for a workflow run through the server.

The model is a tiny random 5B-shaped one ComfyUI's detection accepts (48 latent channels in and out, patch
1 x 2 x 2, two heads of 128, text width 4096), written to a temporary models folder; the VAE is a random Wan2.2 VAE
at its fixed size (ComfyUI reads no width from the file), built in memory with ComfyUI's own class.
"""

import json
import os
import sys
import tempfile

from comfyui_boot import boot, recorder, report

WRITE_MODELS = sys.argv[3] if sys.argv[2:3] == ["--write-models"] else None
boot()
import comfy.sample  # noqa: E402
import comfy.samplers  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from comfyui_fastar.fastar_core.errors import FastARError  # noqa: E402
from comfyui_fastar.fastar_core.model.wan_config import WanConfig  # noqa: E402
from comfyui_fastar.fastar_core.model.wan_model import random_wan  # noqa: E402
from comfyui_fastar.nodes.host import get_host  # noqa: E402
from comfyui_fastar.nodes.node_image_to_video import ARImageToVideo  # noqa: E402
from comfyui_fastar.nodes.node_loader import LoadARVideoModel  # noqa: E402
from comfyui_fastar.nodes.node_long_sampler import LongVideoSampler  # noqa: E402
from comfyui_fastar.nodes.node_sampler_ar import SamplerARVideoFastAR  # noqa: E402
from comfyui_fastar.nodes.node_streaming_save import SaveLongVideoStreaming  # noqa: E402
from comfyui_fastar.nodes.streaming_decode import WanCausalStream, stream_pixels, wan_vae_kind  # noqa: E402

TINY_5B = WanConfig(dim=256, num_heads=2, num_layers=2, ffn_dim=256, in_dim=48, out_dim=48, text_dim=4096,
                    freq_dim=256)
NAME = "tiny_wan22_ti2v_5b.safetensors"
VAE_NAME = "random_wan22_vae.safetensors"
LONGLIVE2 = "LongLive 2.0 4-step (UniPC)"
SIZE = 64  # pixels: a 4x4 latent at the Wan2.2 VAE's 16 pixels per latent, 2x2 tokens per frame
LENGTH = 93  # video frames: 24 latent frames, three chunks of 8; a 16-frame window with a 4-frame sink rolls
RESULTS = {"host": get_host().name}
check = recorder(RESULTS)


def write_model(folder: str) -> str:
    """The tiny 5B as ComfyUI saves Wan models (flat keys)."""
    path = os.path.join(folder, NAME)
    save_file({k: v.contiguous() for k, v in random_wan(TINY_5B, seed=0).state_dict().items()}, path)
    return path


def random_wan22_vae_state_dict() -> dict:
    """A random Wan2.2 VAE's weights, keyed as ComfyUI's own class (which VAELoader detects and builds at its
    fixed size). ComfyUI's layers leave their weights uninitialised, so they are drawn here: unit norms, zero
    biases, weights of variance 1 / fan-in (activations of order one through the stack)."""
    import comfy.ldm.wan.vae2_2 as vae2_2

    g = torch.Generator().manual_seed(0)
    fsm = vae2_2.WanVAE(dim=160, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                        temperal_downsample=[False, True, True], dropout=0.0)
    sd = fsm.state_dict()
    del fsm
    with torch.no_grad():
        for key, value in sd.items():
            if key.endswith("gamma") or key.endswith("norm.weight"):
                value.fill_(1.0)
            elif key.endswith("bias"):
                value.zero_()
            else:
                value.copy_(torch.randn(value.shape, generator=g) / max(1, value[0].numel()) ** 0.5)
    return sd


if WRITE_MODELS is not None:
    os.makedirs(os.path.join(WRITE_MODELS, "diffusion_models"), exist_ok=True)
    os.makedirs(os.path.join(WRITE_MODELS, "vae"), exist_ok=True)
    write_model(os.path.join(WRITE_MODELS, "diffusion_models"))
    save_file({k: v.half().contiguous() for k, v in random_wan22_vae_state_dict().items()},
              os.path.join(WRITE_MODELS, "vae", VAE_NAME))
    print("RESULT " + json.dumps({"host": get_host().name, "written": [NAME, VAE_NAME]}))
    sys.exit(0)

MODELS = tempfile.mkdtemp(prefix="fastar_wan22_")
PATH = write_model(MODELS)
folder_paths.add_model_folder_path("diffusion_models", MODELS)


def conditioning(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(1, 16, 4096, generator=g) * scale
    return [[torch.cat([context, context.new_zeros(1, 512 - 16, 4096)], 1), {}]]


def max_diff(a, b):
    return float((a.float() - b.float()).abs().max())


def describe(patcher):
    base = patcher.model
    return {"model_base": type(base).__name__, "diffusion_model": type(base.diffusion_model).__name__,
            "latent_channels": base.latent_format.latent_channels,
            "in_dim": int(base.diffusion_model.patch_embedding.weight.shape[1])}


def pack_model():
    return LoadARVideoModel().load(NAME, "fp32")[0]


def core_model():
    """What core's UNETLoader (Load Diffusion Model) gives for the file."""
    return comfy.sd.load_diffusion_model(PATH, model_options={"dtype": torch.float32})


def long_video(model, positive, **kw):
    settings = dict(frames_per_block=8, schedule=LONGLIVE2, seed=3, cache_policy="window", sink_frames=4,
                    window_frames=16)
    settings.update(kw)
    latent, report = LongVideoSampler().sample(model, positive, SIZE, SIZE, LENGTH, **settings)
    return latent["samples"].cpu(), report


def basic_sigmas(model):
    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 4).cpu()


def custom_sample(model, latent, sigmas, seed=5):
    """SamplerCustomAdvanced: RandomNoise, CFGGuider cfg 1, the given SIGMAS, the pack's SAMPLER."""
    guider = comfy.samplers.CFGGuider(model)
    guider.set_conds(conditioning(1), conditioning(99, 0.0))
    guider.set_cfg(1.0)
    noise = comfy.sample.prepare_noise(latent, seed)
    sampler = SamplerARVideoFastAR().get_sampler(frames_per_block=8, cache_policy="window", sink_frames=4,
                                                 window_frames=16)[0]
    return guider.sample(noise, latent, sampler, sigmas, seed=seed).cpu()


@check
def loaders():
    return {"pack": describe(pack_model()), "core": describe(core_model())}


@check
def long_sampler_on_both_loaders():
    with torch.no_grad():
        pack, report = long_video(pack_model(), conditioning(1))
        core, _ = long_video(core_model(), conditioning(1))
        other, _ = long_video(pack_model(), conditioning(2))
    return {"shape": list(pack.shape), "finite": bool(torch.isfinite(pack).all()),
            "pack_vs_core_max_abs_diff": max_diff(pack, core), "max_abs": float(pack.abs().max()),
            "prompt_changes_video": max_diff(pack, other), "report_model": report.splitlines()[1],
            "report_says_unipc": "longlive2 (4 steps" in report}


@check
def custom_sampling_on_both_loaders():
    import comfy_extras.nodes_wan as nodes_wan

    node = nodes_wan.Wan22ImageToVideoLatent
    out = node.execute(None, SIZE, SIZE, LENGTH, 1) if hasattr(node, "execute") else node().encode(
        None, SIZE, SIZE, LENGTH, 1)
    latent = (out.args[0] if hasattr(out, "args") else out[0])["samples"]
    pack_model_, core_model_ = pack_model(), core_model()
    sigmas = basic_sigmas(pack_model_)  # BasicScheduler on the pack's MODEL (its loader's shift 5)
    with torch.no_grad():
        pack = custom_sample(pack_model_, latent, sigmas)
        core = custom_sample(core_model_, latent, sigmas)
        try:  # a Wan2.1-shaped latent on the 5B: one message
            custom_sample(pack_model_, torch.zeros(1, 16, 24, 8, 8), sigmas)
            refused = None
        except FastARError as e:
            refused = str(e)
    return {"latent_shape": list(latent.shape), "shape": list(pack.shape), "finite": bool(torch.isfinite(pack).all()),
            "std": float(pack.std()), "pack_vs_core_max_abs_diff": max_diff(pack, core), "wan21_latent_error": refused,
            "sigmas": [round(float(v), 4) for v in sigmas],
            "core_shift": float(core_model_.get_model_object("model_sampling").shift)}


_vae = []


def wan22_vae():
    """The random Wan2.2 VAE as VAELoader builds it from a file."""
    if not _vae:
        _vae.append(comfy.sd.VAE(sd=random_wan22_vae_state_dict()))
    return _vae[0]


@check
def wan22_vae_streaming_decode():
    import nodes

    vae = wan22_vae()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 48, 4, 2, 3, generator=g)
    with torch.no_grad():
        full = nodes.VAEDecode().decode(vae, {"samples": z})[0]  # [frames, H, W, 3], what VAE Decode outputs
        out = {"kind": wan_vae_kind(vae), "full_shape": list(full.shape), "full_std": float(full.std()),
               "clamped_fraction": float(((full == 0) | (full == 1)).float().mean()), "pieces": {}}
        for piece in (1, 3):
            streamed = torch.cat(list(stream_pixels(vae, z, piece)), 2)[0].movedim(0, -1)
            out["pieces"][str(piece)] = {"shape": list(streamed.shape), "max_abs_diff": max_diff(full, streamed)}
        # control: frame 0 decoded without first_chunk (as every later frame is) does not fit the decoder
        stream = WanCausalStream(vae)
        stream.wan22 = False
        try:
            stream.decode(z[:, :, :1], final=True)
            out["no_first_chunk"] = "decoded"
        except RuntimeError:
            out["no_first_chunk"] = "refused"
    return out


@check
def save_long_video_with_the_wan22_vae():
    vae = wan22_vae()
    z = torch.randn(1, 48, 3, 2, 2, generator=torch.Generator().manual_seed(2))
    folder = tempfile.mkdtemp(prefix="fastar_wan22_out_")
    old = folder_paths.get_output_directory()
    folder_paths.set_output_directory(folder)
    try:
        with torch.no_grad():
            result = SaveLongVideoStreaming().save({"samples": z}, vae, 16.0, "fastar/wan22", 2)
    finally:
        folder_paths.set_output_directory(old)
    path = result["result"][0]
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        size = [stream.codec_context.width, stream.codec_context.height]
    return {"frames": frames, "size": size}


@check
def image_to_video_with_the_wan22_vae():
    vae = wan22_vae()
    image = torch.rand(1, SIZE, SIZE, 3, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        positive, latent, *_ = ARImageToVideo().encode(conditioning(1), vae, image, SIZE, SIZE, LENGTH, 1)
        start = positive[0][1]["fastar_initial_latent"].float().cpu()
        model = pack_model()
        with_image, _ = long_video(model, positive)
        plain, _ = long_video(model, conditioning(1))
    # the sampler's frame 0 is the image latent in ComfyUI's LATENT space (process_out of the model's space)
    return {"latent_shape": list(latent["samples"].shape), "start_shape": list(start.shape),
            "frame0_vs_start": max_diff(with_image[:, :, :1], start), "start_abs_max": float(start.abs().max()),
            "changed_by_image": max_diff(with_image, plain)}


report(RESULTS)
