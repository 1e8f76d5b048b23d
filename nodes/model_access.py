"""From a MODEL (ComfyUI's ModelPatcher or the standalone stand-in) to what the engine needs.

The engine's ``CausalRunner`` calls the Wan submodules directly, so it works on ComfyUI's own ``WanModel``:
LoRA and other weight patches (applied when ComfyUI loads the model), fp8 manual casting and offloading stay
ComfyUI's business. Patches that wrap the whole forward (attention overrides, block replacements, caches of
other packs) do not apply to our forward; ``upstream.py`` names them in the run's report. ComfyUI's
TorchCompileModel setting does apply: the runner compiles its own block pieces with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.forward.family import ModelFamily, family_for
from ..fastar_core.forward.runner import CausalRunner, runner_for
from ..fastar_core.rollout.engine import EngineSettings, resolve_settings
from ..fastar_core.rollout.video_geometry import VAE_STRIDES, VideoGeometry, vae_stride
from .constants import FASTAR_OPTIONS_KEY, TORCH_COMPILE_KWARGS_KEY


@dataclass(frozen=True)
class FastARChoice:
    """The FAST-AR Attention node's inputs as it received them (``None`` = the preset's value). They travel on
    the MODEL as a plain dict and are resolved, together with the sampler's cache inputs, by the engine's
    ``resolve_settings``: the same function the command line and the benches call."""

    preset: str = "off"
    tempcache: bool | None = None
    tempcache_overrides: dict = field(default_factory=dict)
    attention_overrides: dict = field(default_factory=dict)

    def resolve(self, cache_policy: str = "auto", num_layers: int | None = None, **cache) -> EngineSettings:
        """``cache``: the sampler's sizes, and the family's own cache (``resolve_settings``'s keywords)."""
        return resolve_settings(preset=self.preset, cache_policy=cache_policy, tempcache=self.tempcache,
                                tempcache_overrides=self.tempcache_overrides,
                                attention_overrides=self.attention_overrides, num_layers=num_layers, **cache)

    def to_dict(self) -> dict:
        layers = self.attention_overrides.get("layers")
        attention = dict(self.attention_overrides)
        if isinstance(layers, tuple):
            attention["layers"] = list(layers)
        return {"preset": self.preset, "tempcache": self.tempcache,
                "tempcache_overrides": dict(self.tempcache_overrides), "attention_overrides": attention}

    @classmethod
    def from_dict(cls, stored: dict) -> FastARChoice:
        attention = dict(stored.get("attention_overrides") or {})
        if isinstance(attention.get("layers"), list):
            attention["layers"] = tuple(attention["layers"])
        return cls(preset=stored.get("preset", "off"), tempcache=stored.get("tempcache"),
                   tempcache_overrides=dict(stored.get("tempcache_overrides") or {}), attention_overrides=attention)


@dataclass
class ARModel:
    patcher: object
    diffusion_model: torch.nn.Module
    family: ModelFamily  # what the runner and the sampler inputs are, for this module tree
    latent_format: object
    dtype: torch.dtype  # the dtype activations run in
    device: torch.device
    fastar: FastARChoice
    compile_kwargs: dict | None = None  # TorchCompileModel's settings on the MODEL, if any

    @property
    def num_layers(self) -> int:
        return len(self.diffusion_model.blocks)

    @property
    def latent_channels(self) -> int:
        """16 for Wan2.1 T2V and Matrix-Game 2.0, 48 for Wan2.2 TI2V-5B (checked by the family)."""
        return self.family.latent_channels(self.diffusion_model)

    @property
    def geometry(self) -> VideoGeometry:
        return geometry_of(self.family, self.diffusion_model)

    @property
    def vae_stride(self) -> int:
        """Pixels per latent row/column of the VAE this model's latents come from (8: Wan2.1, 16: Wan2.2)."""
        return VAE_STRIDES[self.latent_channels]

    def runner(self) -> CausalRunner:
        # With partial loading some weights stay offloaded (ComfyUI casts them per call), so the device of the
        # first weight is not where activations belong: use the patcher's load device.
        return runner_for(self.diffusion_model, self.family, dtype=self.dtype, device=self.device,
                          compile_kwargs=self.compile_kwargs)


def geometry_of(family: ModelFamily, diffusion_model) -> VideoGeometry:
    """How a MODEL's latents map to the video: its family's say, else the Wan VAE its latent channels name."""
    own = family.geometry(diffusion_model)
    return own if own is not None else VideoGeometry(spatial=vae_stride(family.latent_channels(diffusion_model)))


def own_schedule(family: ModelFamily):
    """The schedule "model's own" means for this family (its own inference's), refused for one without."""
    own = family.own_rollout()
    if own is None:
        raise FastARError(f"schedule \"model's own\": the MODEL is {family.describe()}, whose step list depends on "
                          "the checkpoint; choose its preset (Self-Forcing 4-step, CausVid 3-step, ...)")
    return own[1]


def diffusion_model_of(patcher):
    """The Wan module tree, honouring object patches (e.g. a compile node's) but unwrapping torch.compile, since
    the runner calls submodules rather than the compiled forward."""
    getter = getattr(patcher, "get_model_object", None)
    dm = getter("diffusion_model") if getter is not None else patcher.model.diffusion_model
    return getattr(dm, "_orig_mod", dm)


def compute_dtype(patcher) -> torch.dtype:
    base = patcher.model
    cast = getattr(base, "manual_cast_dtype", None)
    if cast is not None:
        return cast
    dtype = base.get_dtype()
    # fp8 weights without manual casting ("fp8 fast") still take bf16 activations.
    return torch.bfloat16 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype


def fastar_choice_of(patcher) -> FastARChoice:
    """What the FAST-AR Attention node stored (a plain dict), or 'off' when the model was not patched."""
    options = getattr(patcher, "model_options", {}) or {}
    stored = options.get("transformer_options", {}).get(FASTAR_OPTIONS_KEY)
    if not stored:
        return FastARChoice()
    return FastARChoice.from_dict(stored)


def compile_kwargs_of(patcher) -> dict | None:
    """The torch.compile settings ComfyUI's TorchCompileModel stored on the MODEL (0.3.x and 0.2x alike), or None."""
    options = getattr(patcher, "model_options", {}) or {}
    stored = options.get(TORCH_COMPILE_KWARGS_KEY)
    if stored is None:
        return None
    if not isinstance(stored, dict):
        raise FastARError(f"the MODEL's model_options['{TORCH_COMPILE_KWARGS_KEY}'] is {type(stored).__name__}, not "
                          "the dict of torch.compile settings TorchCompileModel stores")
    return dict(stored)


def check_model_input(patcher) -> ModelFamily:
    """The MODEL input is one the runner drives (its family says: Wan2.1 T2V, Wan2.2 TI2V-5B, Matrix-Game 2.0):
    checked before it is loaded to the device, so a wrong model costs no transfer (and no out-of-memory) before its
    message. Returns its family."""
    if patcher is None or not hasattr(patcher, "model"):
        raise FastARError("the 'model' input is not a MODEL")
    dm = diffusion_model_of(patcher)
    family = family_for(dm)
    family.check_model(dm)
    return family


def resolve_model(patcher, device=None) -> ARModel:
    """The MODEL as the engine needs it, read once: a sampler's request keeps it."""
    family = check_model_input(patcher)
    dm = diffusion_model_of(patcher)
    load_device = getattr(patcher, "load_device", None)
    return ARModel(
        patcher=patcher,
        diffusion_model=dm,
        family=family,
        latent_format=patcher.model.latent_format,
        dtype=compute_dtype(patcher),
        device=torch.device(device or load_device or dm.patch_embedding.weight.device),
        fastar=fastar_choice_of(patcher),
        compile_kwargs=compile_kwargs_of(patcher),
    )
