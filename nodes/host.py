"""The one module that talks to ComfyUI; every node reaches ComfyUI through ``get_host()``.

Inside ComfyUI (its ``comfy.model_management`` and ``folder_paths`` are already imported when nodes run) this
returns ``ComfyHost``; anywhere else the standalone fallback in ``standalone.py``. ComfyUI is imported lazily,
inside methods, so importing the pack never imports ComfyUI. ``FASTAR_HOST=standalone|comfyui`` forces one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch

from ..fastar_core.errors import FastARError, GenerationCancelled
from ..fastar_core.model.wan_config import WAN22_LATENT_CHANNELS
from .constants import CORE_AR_CONFIG_KEY, CORE_START_LATENT_KEY
from .standalone import StandaloneHost
from .upstream import LOADER_SHIFT_ATTR

_standalone: StandaloneHost | None = None
_comfy: ComfyHost | None = None


def comfy_loaded() -> bool:
    forced = os.environ.get("FASTAR_HOST", "").lower()
    if forced in ("standalone", "comfyui"):
        return forced == "comfyui"
    return "comfy.model_management" in sys.modules and "folder_paths" in sys.modules


def get_host():
    global _standalone, _comfy
    if comfy_loaded():
        if _comfy is None:
            _comfy = ComfyHost()
            register_comfy_attention()
        return _comfy
    if _standalone is None:
        _standalone = StandaloneHost()
    return _standalone


def register_inside_comfyui() -> None:
    """At import: inside ComfyUI, backend "comfy" exists before any node validates a config naming it, and the
    templates list leaves out the workflows this ComfyUI cannot run."""
    if comfy_loaded():
        register_comfy_attention()
        hide_templates_this_comfyui_cannot_run()


WORKFLOWS = Path(__file__).resolve().parents[1] / "example_workflows"
EDITOR_ONLY_NODES = {"MarkdownNote", "Note", "Reroute", "PrimitiveNode"}  # the editor's own, never sent to the server


def workflows_needing_missing_nodes(known) -> set[str]:
    """The shipped workflows (file stems) that use a node type ``known`` lacks."""
    out = set()
    for path in WORKFLOWS.glob("*.json"):
        try:
            types = {node.get("type") for node in json.loads(path.read_text(encoding="utf-8")).get("nodes", [])}
        except (OSError, ValueError, AttributeError):
            continue
        if types - EDITOR_ONLY_NODES - set(known):
            out.add(path.stem)
    return out


def hide_templates_this_comfyui_cannot_run() -> None:
    """ComfyUI lists every workflow in a pack's example_workflows/ as a template. The one built on core's own AR nodes
    (ComfyUI 0.21+) cannot run on an older ComfyUI, so the list it answers is filtered: a workflow naming a node type
    this ComfyUI does not have (asked when the list is requested, every pack loaded by then) is left out. The files
    stay served."""
    try:
        import server
        from aiohttp import web

        import nodes
    except ImportError:
        return
    app = getattr(getattr(server.PromptServer, "instance", None), "app", None)
    if app is None or getattr(app, "frozen", False):
        return
    ours = {p.stem for p in WORKFLOWS.glob("*.json")}

    @web.middleware
    async def templates_this_comfyui_runs(request, handler):
        response = await handler(request)
        if (request.method != "GET" or not request.path.rstrip("/").endswith("/workflow_templates")
                or response.status != 200 or not isinstance(getattr(response, "body", None), bytes)):
            return response
        listed = json.loads(response.body)
        hidden = workflows_needing_missing_nodes(nodes.NODE_CLASS_MAPPINGS)
        for pack, names in listed.items():
            if isinstance(names, list) and ours & set(names):  # this pack's entry, whatever its folder is called
                listed[pack] = [n for n in names if n not in hidden]
        return web.json_response(listed)

    app.middlewares.append(templates_this_comfyui_runs)


# ComfyUI's attention may be int8 SageAttention: its first-use check against torch allows this absolute error.
COMFY_ATTENTION_TOLERANCE = 0.1


def register_comfy_attention() -> None:
    """Dense attention without bias through ComfyUI's `optimized_attention`, as kernels backend "comfy", so the
    attention flags users start ComfyUI with (--use-sage-attention, --use-flash-attention, ...) apply to it."""
    from ..fastar_core.forward.attention import register_host_attention

    register_host_attention("comfy", comfy_attention, tolerance=COMFY_ATTENTION_TOLERANCE)


def comfy_attention(q, k, v, scale: float):
    """q, k, v [B, H, N, D] -> [B, H, Nq, D] with ComfyUI's chosen attention function (looked up per call)."""
    from comfy.ldm.modules import attention as comfy_attn

    B, H, N, D = q.shape
    if not math.isclose(scale, D**-0.5, rel_tol=1e-6):
        q = q * (scale * D**0.5)  # not every ComfyUI attention takes a `scale`; all default to 1/sqrt(D)
    # skip_reshape: the inputs are already [B, H, N, D]; the output comes back as [B, N, H * D].
    out = comfy_attn.optimized_attention(q, k, v, H, skip_reshape=True)
    return out.view(B, N, H, D).transpose(1, 2)


def host_has_causal_wan() -> bool:
    """Whether this ComfyUI has its own causal AR Wan class (0.21 and later), chosen by the metadata marker."""
    import importlib.util

    try:
        return importlib.util.find_spec("comfy.ldm.wan.ar_model") is not None
    except (ImportError, ValueError):
        return False


def detection_metadata(file_metadata: dict, causal_ar: bool) -> dict:
    """The safetensors metadata ComfyUI's model detection reads (``config``, a JSON string), with the causal-AR
    marker set unless the file already says either way."""
    config = file_metadata.get("config") if file_metadata else None
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except (ValueError, RecursionError):  # malformed, a huge number, or nested past the parser's depth
            config = None
    config = dict(config) if isinstance(config, dict) else {}
    transformer = config.get("transformer")
    transformer = dict(transformer) if isinstance(transformer, dict) else {}
    if causal_ar and "causal_ar" not in transformer:
        transformer["causal_ar"] = True
    if transformer:
        config["transformer"] = transformer
    return {"config": json.dumps(config)} if config else {}


WEIGHT_DTYPES = ("default", "bf16", "fp16", "fp32", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")
ENGINE_WEIGHT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class RawLatentFormat:
    """The demo world's latent format: its latent is the RGB video itself, in [-1, 1]."""

    latent_channels = 3
    latent_dimensions = 3

    def process_in(self, latent):
        return latent

    def process_out(self, latent):
        return latent


class WorldModelContainer(torch.nn.Module):
    """What a MODEL's ``.model`` offers the pack's samplers (``diffusion_model``, ``latent_format``, the dtype)
    for a module tree of the engine's own."""

    def __init__(self, diffusion_model, latent_format):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.latent_format = latent_format
        self.manual_cast_dtype = None

    def get_dtype(self) -> torch.dtype:
        return next(self.diffusion_model.parameters()).dtype


class ComfyHost:
    name = "comfyui"

    # -- folders ----------------------------------------------------------------------------------------------
    def list_files(self, folder: str) -> list[str]:
        import folder_paths

        return folder_paths.get_filename_list(folder)

    def full_path(self, folder: str, name: str) -> str:
        import folder_paths

        return folder_paths.get_full_path_or_raise(folder, name)

    def input_directory(self) -> Path:
        import folder_paths

        return Path(folder_paths.get_input_directory())

    def output_path(self, prefix: str, width: int, height: int) -> tuple[Path, str]:
        import folder_paths

        folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(
            prefix, folder_paths.get_output_directory(), width, height)
        return Path(folder) / f"{filename}_{counter:05}_.mp4", subfolder

    # -- devices and memory -------------------------------------------------------------------------------------
    def torch_device(self) -> torch.device:
        import comfy.model_management as mm

        return mm.get_torch_device()

    def intermediate_device(self) -> torch.device:
        import comfy.model_management as mm

        return mm.intermediate_device()

    def load_model(self, patcher) -> None:
        import comfy.model_management as mm

        # Applies LoRA / weight patches and moves the weights to ComfyUI's device (offloading what does not fit).
        mm.load_models_gpu([patcher])

    def soft_empty_cache(self) -> None:
        import comfy.model_management as mm

        mm.soft_empty_cache()

    def load_vae(self, vae, piece_shape, encode: bool = False) -> None:
        """ComfyUI's VAE onto its device with room for one piece: latents to decode, or pixels [B, 3, T, H, W] to
        encode."""
        import comfy.model_management as mm

        if hasattr(vae, "throw_exception_if_invalid"):
            vae.throw_exception_if_invalid()
        estimate = vae.memory_used_encode if encode else vae.memory_used_decode
        memory = estimate(piece_shape, vae.vae_dtype)
        full = getattr(vae, "disable_offload", False)
        mm.load_models_gpu([vae.patcher], memory_required=memory, force_full_load=full)

    # -- progress, previews, interruption -----------------------------------------------------------------------
    def progress(self, total: int):
        import comfy.utils

        return comfy.utils.ProgressBar(total)

    def previewer(self, patcher):
        """A function latent-chunk -> preview tuple, or None when previews are off (--preview-method none)."""
        import latent_preview

        previewer = latent_preview.get_previewer(patcher.load_device, patcher.model.latent_format)
        if previewer is None:
            return None
        return lambda latent: previewer.decode_latent_to_preview_image("JPEG", latent)

    def interrupted(self) -> bool:
        import comfy.model_management as mm

        return mm.processing_interrupted()

    def raise_interrupted(self) -> None:
        import comfy.model_management as mm

        mm.throw_exception_if_processing_interrupted()  # raises ComfyUI's own interrupt (clean "interrupted" run)
        raise GenerationCancelled("interrupted")

    # -- live plays: messages to the page, routes on ComfyUI's own server -----------------------------------------
    def send_live(self, event: str, data: dict) -> None:
        """A websocket message to the page that queued the running prompt (ComfyUI's own channel)."""
        from server import PromptServer

        server = PromptServer.instance
        server.send_sync(event, data, server.client_id)

    def add_routes(self, routes) -> bool:
        """Add ``(method, path, handler)`` routes to ComfyUI's server (its middlewares and trust model apply); False
        where no server runs in this process (ComfyUI imported as a library)."""
        server_module = sys.modules.get("server")
        server = getattr(getattr(server_module, "PromptServer", None), "instance", None)
        if server is None:
            return False
        for method, path, handler in routes:
            server.routes.route(method, path)(handler)
        return True

    # -- model building -------------------------------------------------------------------------------------------
    def model_from_checkpoint(self, ckpt, weight_dtype: str, shift: float, disable_dynamic: bool = False):
        """A native MODEL built by ComfyUI's loader from the engine's normalised state dict.

        Where ComfyUI's loader reads file metadata (0.2x), it gets the causal-AR marker, so a host with its own
        causal Wan class (``CausalWanModel``, which core's SamplerARVideo needs) builds that one: every model this
        pack loads is an autoregressive one. A marker in the file (true or false) wins. Older hosts take no
        metadata and build ``WanModel``; both classes have the submodules the pack's runner calls."""
        import inspect

        import comfy.sd

        options = {}
        if weight_dtype.startswith("fp8"):
            options["dtype"] = getattr(torch, "float8_" + weight_dtype.replace("_fast", "")[len("fp8_"):])
            options["fp8_optimizations"] = weight_dtype.endswith("_fast")
        elif weight_dtype != "default":
            options["dtype"] = ckpt.dtype
        accepted = inspect.signature(comfy.sd.load_diffusion_model_state_dict).parameters
        extra = {}
        wan22 = ckpt.config.in_dim == WAN22_LATENT_CHANNELS
        if "metadata" in accepted:
            # core's causal class is Wan2.1's (16 channels); a 5B stays ComfyUI's Wan2.2 TI2V model (WAN22)
            extra["metadata"] = detection_metadata(ckpt.metadata, causal_ar=host_has_causal_wan() and not wan22)
        if disable_dynamic and "disable_dynamic" in accepted:
            extra["disable_dynamic"] = True
        patcher = comfy.sd.load_diffusion_model_state_dict(dict(ckpt.state_dict), model_options=options, **extra)
        if patcher is None:
            what = "Wan2.2 TI2V-5B" if wan22 else "Wan2.1"
            raise FastARError(f"{ckpt.path}: ComfyUI did not recognise the converted weights as a {what} model")
        if wan22 and getattr(patcher.model.latent_format, "latent_channels", None) != WAN22_LATENT_CHANNELS:
            raise FastARError(f"{ckpt.path}: this ComfyUI builds the Wan2.2 TI2V-5B weights with a "
                              f"{patcher.model.latent_format.latent_channels}-channel latent format, not the Wan2.2 "
                              "VAE's 48: it cannot run a 5B model (ComfyUI 0.3.64 and 0.27.0 can)")
        self._set_shift(patcher, shift)
        return patcher

    def world_model(self, diffusion_model, info: dict, raw_latent: bool = False):
        """A MODEL over the engine's own world module tree (Matrix-Game 2.0's, the demo world's), which ComfyUI's
        loaders do not build (action modules, CLIP-only context): ComfyUI's ModelPatcher moves it to the device and
        back like any model; only the pack's samplers run it. ``raw_latent``: its latent is the video (the demo)."""
        import comfy.latent_formats
        import comfy.model_management as mm
        import comfy.model_patcher

        latent_format = RawLatentFormat() if raw_latent else comfy.latent_formats.Wan21()
        container = WorldModelContainer(diffusion_model, latent_format)
        return comfy.model_patcher.ModelPatcher(container, load_device=mm.get_torch_device(),
                                                offload_device=mm.unet_offload_device())

    def world_weight_dtype(self, weight_dtype: str, file_dtype: torch.dtype) -> torch.dtype:
        import comfy.model_management as mm

        if weight_dtype in ENGINE_WEIGHT_DTYPES:
            return ENGINE_WEIGHT_DTYPES[weight_dtype]
        device = mm.get_torch_device()
        return torch.float32 if device.type == "cpu" else file_dtype

    @staticmethod
    def _set_shift(patcher, shift: float) -> None:
        # The same object patch as the ModelSamplingSD3 node, so BasicScheduler gives the AR family's sigmas.
        import comfy.model_sampling

        class ModelSamplingAR(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
            pass

        sampling = ModelSamplingAR(patcher.model.model_config)
        sampling.set_parameters(shift=shift, multiplier=1000)
        setattr(sampling, LOADER_SHIFT_ATTR, shift)  # so a later ModelSamplingSD3 is told apart in the report
        patcher.add_object_patch("model_sampling", sampling)

    def ksampler(self, sampler_function, extra_options: dict):
        import comfy.samplers

        return comfy.samplers.KSAMPLER(sampler_function, extra_options=extra_options)

    def resize_image(self, image: torch.Tensor, width: int, height: int) -> torch.Tensor:
        import comfy.utils

        return comfy.utils.common_upscale(image.movedim(-1, 1), width, height, "bilinear", "center").movedim(1, -1)

    def start_image_hook(self, latent: torch.Tensor):
        """A conditioning hook that puts a start latent where core's ar_video sampler reads it
        (``transformer_options["ar_config"]["initial_latent"]``) while that conditioning is sampled, and a function
        joining two hook groups; (None, None) where ComfyUI has no conditioning hooks."""
        try:
            import comfy.hooks as hooks
        except ImportError:
            return None, None
        if not hasattr(hooks, "TransformerOptionsHook"):
            return None, None
        group = hooks.HookGroup()
        group.add(hooks.TransformerOptionsHook({CORE_AR_CONFIG_KEY: {CORE_START_LATENT_KEY: latent}}))
        return group, hooks.HookGroup.combine_all_hooks

    def metadata(self, prompt, extra_pnginfo) -> dict | None:
        from comfy.cli_args import args

        if args.disable_metadata:
            return None
        meta = dict(extra_pnginfo or {})
        if prompt is not None:
            meta["prompt"] = prompt
        return {k: json.dumps(v) for k, v in meta.items()} or None


register_inside_comfyui()
