"""What the nodes use of ComfyUI, re-made for plain Python, so the node functions run without ComfyUI.

The tests and the command line drive the nodes through this: a MODEL stand-in wrapping the engine's own
``WanModel``, folder lookups from registered directories, a progress log, and an interrupt flag.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from ..fastar_core.errors import FastARError, GenerationCancelled

MODEL_EXTENSIONS = (".safetensors", ".pt", ".pth", ".ckpt", ".bin", ".sft")


class NeedsComfyUI(FastARError):
    """A node (or part of one) that only works inside ComfyUI was run without it."""

    def __init__(self, what: str):
        super().__init__(f"{what} needs ComfyUI at run time (ComfyUI's modules are not loaded in this process)")


class IdentityLatentFormat:
    """Stand-in for ``comfy.latent_formats.Wan21``: the engine's own models work in raw latent space."""

    latent_channels = 16
    latent_dimensions = 3

    def process_in(self, latent):
        return latent

    def process_out(self, latent):
        return latent


class StandaloneModel:
    """Stand-in for a ComfyUI ``ModelPatcher`` over the engine's ``WanModel``.

    It mirrors the attributes the nodes read: ``.model.diffusion_model``, ``.model.latent_format``,
    ``.model.manual_cast_dtype``, ``.model_options`` (deep-copied by ``clone()`` like ComfyUI does),
    ``.load_device`` and ``get_model_object``.
    """

    def __init__(self, diffusion_model, latent_format=None, load_device=None, model_options=None, info=None):
        weight = next(diffusion_model.parameters())
        self.model = SimpleNamespace(
            diffusion_model=diffusion_model,
            latent_format=latent_format or IdentityLatentFormat(),
            manual_cast_dtype=None,
            get_dtype=lambda: weight.dtype,
        )
        self.load_device = torch.device(load_device) if load_device is not None else weight.device
        self.offload_device = self.load_device
        self.model_options = model_options if model_options is not None else {"transformer_options": {}}
        self.info = info or {}

    def clone(self) -> StandaloneModel:
        return StandaloneModel(self.model.diffusion_model, self.model.latent_format, self.load_device,
                               copy.deepcopy(self.model_options), dict(self.info))

    def get_model_object(self, name: str):
        obj = self.model
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj


class StandaloneProgress:
    """Records (value, total, has_preview) updates; prints nothing."""

    def __init__(self, host, total: int):
        self.host = host
        self.total = total
        self.current = 0

    def update_absolute(self, value, total=None, preview=None):
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        self.host.progress_log.append((self.current, self.total, preview is not None))
        for listener in list(self.host.progress_listeners):
            listener(self.current, self.total)


class StandaloneHost:
    name = "standalone"

    def __init__(self):
        self.folders: dict[str, list[Path]] = {}
        self.interrupt_requested = False
        self.progress_log: list = []
        self.progress_listeners: list = []
        self.live_listeners: list = []  # (event, data) -> None: what a page would be sent during a live play
        self.routes: list = []  # (method, path, handler): what would be added to ComfyUI's server
        self.output_dir = Path(os.environ.get("FASTAR_OUTPUT_DIR", "output"))
        self.input_dir = Path(os.environ.get("FASTAR_INPUT_DIR", "input"))
        for name in ("diffusion_models", "loras"):
            env = os.environ.get(f"FASTAR_{name.upper()}_DIR")
            if env:
                self.register_folder(name, env)

    # -- folders ----------------------------------------------------------------------------------------------
    def register_folder(self, name: str, path) -> None:
        self.folders.setdefault(name, []).append(Path(path))

    def input_directory(self) -> Path:
        return self.input_dir

    def list_files(self, folder: str) -> list[str]:
        names = set()
        for root in self.folders.get(folder, []):
            if root.is_dir():
                for p in root.rglob("*"):
                    if p.is_file() and p.suffix.lower() in MODEL_EXTENSIONS:
                        names.add(p.relative_to(root).as_posix())
        return sorted(names)

    def full_path(self, folder: str, name: str) -> str:
        for root in self.folders.get(folder, []):
            p = root / name
            if p.is_file():
                return str(p)
        raise FastARError(f"model file '{name}' was not found in the '{folder}' folder")

    def output_path(self, prefix: str, width: int, height: int) -> tuple[Path, str]:
        folder = (self.output_dir / prefix).parent
        folder.mkdir(parents=True, exist_ok=True)
        stem = Path(prefix).name
        counter = 1 + len(list(folder.glob(f"{stem}_*")))
        return folder / f"{stem}_{counter:05}_.mp4", folder.relative_to(self.output_dir).as_posix()

    # -- devices and memory -------------------------------------------------------------------------------------
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def intermediate_device(self) -> torch.device:
        return torch.device("cpu")

    def load_model(self, patcher) -> None:
        pass

    def load_vae(self, vae, piece_shape, encode: bool = False) -> None:
        pass

    def soft_empty_cache(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- progress, previews, interruption -----------------------------------------------------------------------
    def progress(self, total: int):
        return StandaloneProgress(self, total)

    def previewer(self, patcher):
        return None

    def interrupted(self) -> bool:
        return self.interrupt_requested

    def raise_interrupted(self) -> None:
        self.interrupt_requested = False
        raise GenerationCancelled("interrupted")

    def send_live(self, event: str, data: dict) -> None:
        for listener in list(self.live_listeners):
            listener(event, data)

    def add_routes(self, routes) -> bool:
        self.routes.extend(routes)
        return True

    # -- model building -------------------------------------------------------------------------------------------
    def model_from_checkpoint(self, ckpt, weight_dtype: str, shift: float, disable_dynamic: bool = False):
        from ..fastar_core.files.wan_checkpoint import build_model

        info = {"shift": shift, "weight_dtype": weight_dtype}
        return StandaloneModel(build_model(ckpt, device=self.torch_device()), info=info)

    def world_model(self, diffusion_model, info: dict, raw_latent: bool = False):
        # The engine's world models work in raw latent space here, the demo world's (its video) included.
        return StandaloneModel(diffusion_model.to(self.torch_device()), info=info)

    def world_weight_dtype(self, weight_dtype: str, file_dtype: torch.dtype) -> torch.dtype:
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        return dtypes.get(weight_dtype, torch.float32 if self.torch_device().type == "cpu" else file_dtype)

    def ksampler(self, sampler_function, extra_options: dict):
        raise NeedsComfyUI("The AR Video Sampler (FAST-AR) SAMPLER (used with SamplerCustomAdvanced)")

    def resize_image(self, image: torch.Tensor, width: int, height: int) -> torch.Tensor:
        """[N, H, W, C] -> [N, height, width, C]: scale to cover, then centre-crop (ComfyUI's 'center')."""
        n, h, w, c = image.shape
        scale = max(width / w, height / h)
        nh, nw = max(height, round(h * scale)), max(width, round(w * scale))
        x = torch.nn.functional.interpolate(image.movedim(-1, 1), size=(nh, nw), mode="bilinear", align_corners=False)
        top, left = (nh - height) // 2, (nw - width) // 2
        return x[:, :, top:top + height, left:left + width].movedim(1, -1)

    def start_image_hook(self, latent: torch.Tensor):
        return None, None  # no core AR sampler outside ComfyUI

    def metadata(self, prompt, extra_pnginfo) -> dict | None:
        return None
