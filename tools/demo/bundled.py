"""The demo models as the command line ships them: the bundled weights files, and the text demo's start chunks.

The models themselves are loaded by the engine (``fastar_core/families/demo/model.py``); this knows where the
bundled files are and renders the text demo's scenes (``world.py``) as the frames a rollout continues from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...fastar_core.families.demo.model import DemoModel, load_demo_file
from .settings import WEIGHTS_DIR, WEIGHTS_FILE
from .world import Scene, make_scene


def default_weights_path() -> Path:
    return WEIGHTS_DIR / WEIGHTS_FILE


def load_demo_model(path=None, device="cpu") -> DemoModel:
    """The bundled demo model (or another file written by ``train_demo``) in fp32."""
    return load_demo_file(Path(path) if path is not None else default_weights_path(), device=device)


@dataclass
class StartChunk:
    latents: torch.Tensor  # [1, C, T, H, W] rendered frames in [-1, 1]
    prompt: str
    scene: Scene


def render_start(demo: DemoModel, seed: int, frames: int = 3, long_prompt: bool = False) -> StartChunk:
    """The first ``frames`` frames of the text demo's scene ``seed`` as latents, with the scene's prompt."""
    scene = make_scene(seed, demo.frame_size[0])
    latents = scene.render(frames).permute(1, 0, 2, 3)[None].to(demo.device)
    return StartChunk(latents, scene.prompt(long=long_prompt), scene)


def latents_to_uint8(latent: torch.Tensor) -> np.ndarray:
    """``[1, C, T, H, W]`` or ``[C, T, H, W]`` latents in [-1, 1] -> ``[T, H, W, 3]`` uint8 RGB frames."""
    if latent.ndim == 5:
        latent = latent[0]
    frames = ((latent.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).numpy()


def latents_to_frames(latent: torch.Tensor) -> torch.Tensor:
    """``[1, 3, T, H, W]`` -> ``[T, 3, H, W]`` (the world's and the evaluator's layout)."""
    return latent[0].permute(1, 0, 2, 3)
