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

from ..fastar_core.engine import EngineSettings, resolve_settings
from ..fastar_core.errors import FastARError
from ..fastar_core.matrix_game.config import MatrixGameConfig
from ..fastar_core.runner import CausalRunner
from ..fastar_core.video_geometry import VAE_STRIDES
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

    def resolve(self, cache_policy: str = "auto", num_layers: int | None = None, **cache_sizes) -> EngineSettings:
        return resolve_settings(preset=self.preset, cache_policy=cache_policy, tempcache=self.tempcache,
                                tempcache_overrides=self.tempcache_overrides,
                                attention_overrides=self.attention_overrides, num_layers=num_layers, **cache_sizes)

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
    latent_format: object
    dtype: torch.dtype  # the dtype activations run in
    device: torch.device
    fastar: FastARChoice
    compile_kwargs: dict | None = None  # TorchCompileModel's settings on the MODEL, if any

    @property
    def num_layers(self) -> int:
        return len(self.diffusion_model.blocks)

    @property
    def world(self) -> MatrixGameConfig | None:
        return world_config_of(self.diffusion_model)

    @property
    def latent_channels(self) -> int:
        """16 for Wan2.1 T2V, 48 for Wan2.2 TI2V-5B (checked by ``check_wan_t2v``)."""
        return latent_channels_of(self.diffusion_model)

    @property
    def vae_stride(self) -> int:
        """Pixels per latent row/column of the VAE this model's latents come from (8: Wan2.1, 16: Wan2.2)."""
        return VAE_STRIDES[self.latent_channels]

    def runner(self) -> CausalRunner:
        # With partial loading some weights stay offloaded (ComfyUI casts them per call), so the device of the
        # first weight is not where activations belong: use the patcher's load device.
        return CausalRunner(self.diffusion_model, dtype=self.dtype, device=self.device,
                            compile_kwargs=self.compile_kwargs)


def diffusion_model_of(patcher):
    """The Wan module tree, honouring object patches (e.g. a compile node's) but unwrapping torch.compile, since
    the runner calls submodules rather than the compiled forward."""
    getter = getattr(patcher, "get_model_object", None)
    dm = getter("diffusion_model") if getter is not None else patcher.model.diffusion_model
    return getattr(dm, "_orig_mod", dm)


def latent_channels_of(dm) -> int:
    """Channels of the latents the model denoises: its input's, except for a Matrix-Game 2.0 model, whose input also
    carries a mask and the start image's latent (36 = 16 + 4 + 16)."""
    world = world_config_of(dm)
    return world.out_dim if world is not None else int(dm.patch_embedding.weight.shape[1])


def check_wan_t2v(dm) -> None:
    missing = [name for name in ("patch_embedding", "text_embedding", "time_embedding", "time_projection", "blocks",
                                 "head") if not hasattr(dm, name)]
    if missing:
        raise FastARError(f"the MODEL is not a Wan2.1 diffusion model ({type(dm).__name__} has no "
                          f"{', '.join(missing)}); load a Wan2.1 T2V model of the Self-Forcing family")
    weight = getattr(dm.patch_embedding, "weight", None)
    if len(dm.blocks) == 0 or weight is None or weight.ndim != 5:
        raise FastARError(f"the MODEL is not a Wan2.1 diffusion model ({type(dm).__name__} has no layers or no 3-D "
                          "patch embedding); load a Wan2.1 T2V model of the Self-Forcing family")
    if getattr(dm, "img_emb", None) is not None or hasattr(dm.blocks[0].cross_attn, "k_img"):
        raise FastARError("the MODEL is a Wan2.1 image-to-video (I2V) model; the AR models are text-to-video. "
                          "For a start image use the 'AR Image to Video' node with the T2V model")
    in_dim = latent_channels_of(dm)
    if in_dim not in VAE_STRIDES:
        raise FastARError(f"the MODEL takes {in_dim} latent channels; the AR models take 16 (Wan2.1 T2V) or 48 "
                          "(Wan2.2 TI2V-5B, LongLive 2.0)")


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


def world_config_of(dm) -> MatrixGameConfig | None:
    """A Matrix-Game 2.0 module tree's config (the pack's loader builds it), or None for a Wan2.1 model."""
    config = getattr(dm, "config", None)
    return config if isinstance(config, MatrixGameConfig) else None


def check_model_input(patcher) -> None:
    """The MODEL input is a Wan2.1 T2V, a Wan2.2 TI2V-5B or a Matrix-Game 2.0 model: checked before it is loaded to
    the device, so a wrong model costs no transfer (and no out-of-memory) before its message."""
    if patcher is None or not hasattr(patcher, "model"):
        raise FastARError("the 'model' input is not a MODEL")
    dm = diffusion_model_of(patcher)
    if world_config_of(dm) is None:
        check_wan_t2v(dm)


def model_vae_stride(patcher) -> int:
    """Pixels per latent row/column for a checked MODEL (``check_model_input``): 8 for Wan2.1, 16 for Wan2.2."""
    return VAE_STRIDES[latent_channels_of(diffusion_model_of(patcher))]


def resolve_model(patcher, device=None) -> ARModel:
    check_model_input(patcher)
    dm = diffusion_model_of(patcher)
    load_device = getattr(patcher, "load_device", None)
    return ARModel(
        patcher=patcher,
        diffusion_model=dm,
        latent_format=patcher.model.latent_format,
        dtype=compute_dtype(patcher),
        device=torch.device(device or load_device or dm.patch_embedding.weight.device),
        fastar=fastar_choice_of(patcher),
        compile_kwargs=compile_kwargs_of(patcher),
    )
