"""Loading the bundled demo model, and the small helpers a demo rollout needs.

``load_demo_model()`` returns a ``DemoModel``: the Wan module tree, the text encoder, the world's frame format,
the recommended rollout settings stored in the weights file, ``encode_prompt`` and ``render_start`` (a rendered
start chunk to continue from, image-to-video, which is how the demo model is meant to run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...fastar_core.caches import CacheSpec
from ...fastar_core.errors import FastARError
from ...fastar_core.files.wan_checkpoint import load_wan_model
from ...fastar_core.forward.attention import DenseAttention
from ...fastar_core.forward.runner import CausalRunner
from ...fastar_core.model.wan_model import WanModel
from ...fastar_core.rollout.sampler import ARSampler, RolloutConfig, RolloutResult
from ...fastar_core.rollout.schedule import DenoisingSchedule, custom_schedule, unipc_schedule
from .settings import WEIGHTS_DIR, WEIGHTS_FILE
from .steer_world import STEP
from .text import STATE_PREFIX as TEXT_PREFIX
from .text import PromptEncoder, TextEncoder, Tokenizer
from .world import Scene, make_scene


def default_weights_path() -> Path:
    return WEIGHTS_DIR / WEIGHTS_FILE


@dataclass
class StartChunk:
    latents: torch.Tensor  # [1, C, T, H, W] rendered frames in [-1, 1]
    prompt: str
    scene: Scene


@dataclass
class DemoModel:
    model: WanModel
    text_encoder: TextEncoder
    tokenizer: Tokenizer
    frame_size: tuple  # (height, width) of a latent frame (the latent is the RGB video itself)
    channels: int
    frames_per_block: int
    schedule: DenoisingSchedule
    rope_max_distance: int
    context_noise: float
    trained_span_frames: int
    metadata: dict = field(default_factory=dict)
    action_encoder: object = None  # actions.ActionEncoder for a steered-world model, else None

    @property
    def is_world(self) -> bool:
        return self.action_encoder is not None

    @property
    def device(self) -> torch.device:
        return self.model.head.head.weight.device

    @property
    def rollout_settings(self) -> dict:
        """What the model was trained for; pass these to the sampler."""
        return {"frames_per_block": self.frames_per_block, "schedule": self.schedule,
                "rope_max_distance": self.rope_max_distance, "context_noise": self.context_noise,
                "channels": self.channels, "latent_height": self.frame_size[0], "latent_width": self.frame_size[1]}

    @torch.no_grad()
    def encode_prompt(self, text: str) -> torch.Tensor:
        """``[1, text_len, text_dim]`` conditioning, rows past the prompt exactly zero."""
        return PromptEncoder(self.tokenizer, self.text_encoder)(text).to(self.device)

    def render_start(self, seed: int, frames: int = 3, long_prompt: bool = False) -> StartChunk:
        """The first ``frames`` frames of the world's scene ``seed`` as latents, with the scene's prompt."""
        scene = make_scene(seed, self.frame_size[0])
        latents = scene.render(frames).permute(1, 0, 2, 3)[None].to(self.device)
        return StartChunk(latents, scene.prompt(long=long_prompt), scene)

    def attention(self) -> DenseAttention:
        """The dense reference seam with temporal RoPE distances clamped to the trained span."""
        return DenseAttention(rope_max_distance=self.rope_max_distance)

    def runner(self, attention=None) -> CausalRunner:
        return CausalRunner(self.model, attention=attention or self.attention())

    def rollout_config(self, num_frames: int, cache: CacheSpec | None = None, seed: int = 0) -> RolloutConfig:
        return RolloutConfig(
            num_frames=num_frames, latent_height=self.frame_size[0], latent_width=self.frame_size[1],
            frames_per_block=self.frames_per_block, schedule=self.schedule, seed=seed, cache=cache or CacheSpec(),
            context_noise=self.context_noise, channels=self.channels,
        )

    def world_runner(self, tracks: list, attention=None) -> CausalRunner:
        """The runner of a steered-world model, conditioned on ``tracks`` (one ``Track`` per batch item)."""
        from .actions import REFERENCE_INPUT, ActionRunner

        if not self.is_world:
            raise FastARError("this demo model is not a steered-world model (its file has no action encoder)")
        moved = self.metadata["world"].get("inputs") == REFERENCE_INPUT
        return ActionRunner(self.model, self.action_encoder, tracks, attention=attention or self.attention(),
                            moved_reference=moved, map_positions=self.places_on_map)

    @property
    def places_on_map(self) -> bool:
        """A steered-world model whose rotary positions are places on its map (``map_rope.py``): TempCache's groups
        are then places (``same_place``)."""
        from .map_rope import POSITIONS

        return self.is_world and self.metadata["world"].get("positions") == POSITIONS

    def world_prompt(self) -> torch.Tensor:
        return self.encode_prompt(self.metadata["world"]["prompt"])

    def generate(self, start: StartChunk, num_frames: int, cache: CacheSpec | None = None, seed: int = 0,
                 attention=None, **kw) -> RolloutResult:
        """Continue ``start`` by ``num_frames`` latent frames with the engine's sampler (dense by default)."""
        sampler = ARSampler(self.runner(attention))
        return sampler.generate(self.encode_prompt(start.prompt), self.rollout_config(num_frames, cache, seed),
                                initial_latents=start.latents, **kw)


def load_demo_model(path=None, device="cpu") -> DemoModel:
    """Load the bundled demo model (or another file written by ``train_demo``) in fp32, every part checked before
    it is used (``weights_file``): the metadata by type and range, the video model's layout, the encoders' shapes,
    every weight finite."""
    from ...fastar_core.files.wan_checkpoint import checkpoint_errors
    from .weights_file import check_against_model, read_demo_metadata, read_encoder_states

    path = Path(path) if path is not None else default_weights_path()
    if not path.is_file():
        raise FastARError(f"{path}: no demo weights here; train them with `fastar train-demo --out <folder>`")
    meta = read_demo_metadata(path)
    model, info = load_wan_model(path, dtype="fp32", device=device)
    with checkpoint_errors(path):
        check_against_model(path, meta, model.config)
        schedule = schedule_from_metadata(meta)
        states = read_encoder_states(path, meta, model.config)
        tokenizer = Tokenizer(meta["vocabulary"], meta["text_len"])
        encoder = TextEncoder(len(tokenizer.vocabulary), model.config.text_dim, meta["text_len"])
        encoder.load_state_dict(states[TEXT_PREFIX])
        encoder = encoder.to(device).eval().requires_grad_(False)
        action_encoder = None
        if "world" in meta:
            from .actions import STATE_PREFIX, ActionEncoder

            action_encoder = ActionEncoder(model.config.dim, meta["world"]["map_size"] // STEP,
                                           meta["frames_per_block"])
            action_encoder.load_state_dict(states[STATE_PREFIX])
            action_encoder = action_encoder.to(device).eval().requires_grad_(False)
    return DemoModel(
        model=model, text_encoder=encoder, tokenizer=tokenizer, frame_size=tuple(meta["frame_size"]),
        channels=meta["channels"], frames_per_block=meta["frames_per_block"], schedule=schedule,
        rope_max_distance=meta["rope_max_distance"], context_noise=meta.get("context_noise", 0.0),
        trained_span_frames=meta["trained_span_frames"], metadata=meta, action_encoder=action_encoder,
    )


def schedule_from_metadata(meta: dict) -> DenoisingSchedule:
    """The sampler a demo file asks for: its ``sampler`` entry (a UniPC run: solver, steps, shift), else the
    re-noising steps of its ``schedule`` sigmas."""
    sampler = meta.get("sampler")
    if sampler is None:
        return custom_schedule(meta["schedule"])
    if sampler.get("solver") != "unipc":
        raise FastARError(f"demo sampler {sampler!r}: only the 'unipc' solver is known (or no sampler entry)")
    return unipc_schedule(f"unipc-{sampler['steps']}", int(sampler["steps"]), float(sampler["shift"]))


def latents_to_uint8(latent: torch.Tensor) -> np.ndarray:
    """``[1, C, T, H, W]`` or ``[C, T, H, W]`` latents in [-1, 1] -> ``[T, H, W, 3]`` uint8 RGB frames."""
    if latent.ndim == 5:
        latent = latent[0]
    frames = ((latent.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).numpy()


def latents_to_frames(latent: torch.Tensor) -> torch.Tensor:
    """``[1, 3, T, H, W]`` -> ``[T, 3, H, W]`` (the world's and the evaluator's layout)."""
    return latent[0].permute(1, 0, 2, 3)
