"""The bundled demo models' files, loaded: a toy text-to-video model and the steered world.

``load_demo_file(path)`` returns a ``DemoModel``: the Wan module tree, the text encoder, the frame format, the
recommended rollout settings stored in the weights file, ``encode_prompt``, and for a steered-world file its
action encoder and ``world_runner``. The files themselves ship with the command line (``tools/demo/weights``,
``tools/demo/bundled.py`` knows where); the world's node family (``family.py``) loads them from ComfyUI's folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...caches import CacheSpec
from ...errors import FastARError
from ...files.raw import read_raw
from ...files.wan_checkpoint import checkpoint_errors, load_wan_model
from ...forward.attention import DenseAttention
from ...forward.runner import CausalRunner
from ...model.wan_model import WanModel
from ...rollout.sampler import ARSampler, RolloutConfig, RolloutResult
from ...rollout.schedule import DenoisingSchedule, custom_schedule, unipc_schedule
from .actions import ActionEncoder
from .text import STATE_PREFIX as TEXT_PREFIX
from .text import PromptEncoder, TextEncoder, Tokenizer


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
    action_encoder: ActionEncoder | None = None  # for a steered-world model, else None

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

    def world_runner(self, tracks: list, attention=None, **kw) -> CausalRunner:
        """The runner of a steered-world model, conditioned on ``tracks`` (one ``Track`` per batch item); ``kw``
        goes to ``CausalRunner`` (dtype, device, family, ...)."""
        from .actions import REFERENCE_INPUT, ActionRunner

        if self.action_encoder is None:
            raise FastARError("this demo model is not a steered-world model (its file has no action encoder)")
        moved = self.metadata["world"].get("inputs") == REFERENCE_INPUT
        return ActionRunner(self.model, self.action_encoder, tracks, attention=attention or self.attention(),
                            moved_reference=moved, **kw)

    def world_prompt(self) -> torch.Tensor:
        return self.encode_prompt(self.metadata["world"]["prompt"])

    def generate(self, start, num_frames: int, cache: CacheSpec | None = None, seed: int = 0,
                 attention=None, **kw) -> RolloutResult:
        """Continue ``start`` (rendered frames ``.latents`` and their ``.prompt``) by ``num_frames`` latent frames with
        the engine's sampler (dense by default)."""
        sampler = ARSampler(self.runner(attention))
        return sampler.generate(self.encode_prompt(start.prompt), self.rollout_config(num_frames, cache, seed),
                                initial_latents=start.latents, **kw)


def load_demo_file(path, device="cpu") -> DemoModel:
    """Load a demo model file (the bundled ones, or another written by ``train_demo``) in fp32."""
    path = Path(path)
    if not path.is_file():
        raise FastARError(f"{path}: no demo weights here; train them with `fastar train-demo --out <folder>`")
    model, info = load_wan_model(path, dtype="fp32", device=device)
    meta = info.metadata.get("demo")
    if not isinstance(meta, dict):
        raise FastARError(f"{path}: not a demo model file (no 'demo' metadata)")
    tokenizer = Tokenizer(meta["vocabulary"], meta["text_len"])
    encoder = TextEncoder(len(tokenizer.vocabulary), model.config.text_dim, meta["text_len"])
    encoder.load_state_dict({k: v.float() for k, v in read_text_encoder_state(path).items()})
    encoder = encoder.to(device).eval().requires_grad_(False)
    action_encoder = (_load_action_encoder(path, meta, model.config.dim, model.config.in_dim, device)
                      if "world" in meta else None)
    return DemoModel(
        model=model, text_encoder=encoder, tokenizer=tokenizer, frame_size=tuple(meta["frame_size"]),
        channels=meta["channels"], frames_per_block=meta["frames_per_block"],
        schedule=schedule_from_metadata(meta), rope_max_distance=meta["rope_max_distance"],
        context_noise=meta.get("context_noise", 0.0), trained_span_frames=meta["trained_span_frames"], metadata=meta,
        action_encoder=action_encoder,
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


def _load_action_encoder(path, meta: dict, dim: int, in_dim: int, device):
    from .actions import REFERENCE_INPUT, STATE_PREFIX, ActionEncoder
    from .steer_world import STEP

    world = meta["world"]
    inputs = world.get("inputs")
    if inputs not in (None, REFERENCE_INPUT):
        raise FastARError(f"{path}: its world inputs {inputs!r} are unknown; this version reads world files without "
                          f"inputs (keys only) or with {REFERENCE_INPUT!r}")
    # Files before the moved reference frame read the noisy frame alone; the newer ones that and 2 * C + 1 more.
    want = meta["channels"] * (2 if inputs else 1) + (1 if inputs else 0)
    if in_dim != want:
        raise FastARError(f"{path}: its patch embedding takes {in_dim} channels, but a world model with inputs "
                          f"{inputs or 'keys only'!r} reads {want}")
    encoder = ActionEncoder(dim, world["map_size"] // STEP, meta["frames_per_block"])
    state = {k: v.float() for k, v in read_text_encoder_state(path, STATE_PREFIX).items()}
    try:
        encoder.load_state_dict(state)
    except RuntimeError as e:
        raise FastARError(f"{path}: its action encoder does not fit ({str(e).splitlines()[0][:200]})") from None
    return encoder.to(device).eval().requires_grad_(False)


def read_text_encoder_state(path, prefix: str = TEXT_PREFIX) -> dict:
    """The text encoder's tensors (or those under another ``prefix``), read through the engine's checked loader
    (only those tensors are read)."""
    path = Path(path)
    with checkpoint_errors(path):
        tensors, _ = read_raw(path, before_load=lambda infos, _: [k for k in infos if k.startswith(prefix)])
    return {k[len(prefix):]: v for k, v in tensors.items()}
