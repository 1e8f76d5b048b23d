"""FAST-AR Attention: a MODEL patch that tells our samplers which FAST-AR pieces to use.

The config travels as a plain dict in ``model_options["transformer_options"]``: ComfyUI deep-copies
model_options on every clone, so nothing large (and no tensor) may live there. Stock samplers ignore it.
"""

from __future__ import annotations

from ..fastar_core.errors import FastARError
from ..fastar_core.fastar.config import parse_layers
from ..fastar_core.forward.family import family_for
from .constants import ANNCA_CHOICES, CATEGORY, FASTAR_BACKENDS, FASTAR_OPTIONS_KEY, FASTAR_PRESETS, SWITCH
from .inputs import combo, float_input, int_input, link, string_input
from .model_access import FastARChoice, diffusion_model_of


def _switch(value: str):
    return None if value == "preset" else value == "on"


def _annca(value: str) -> dict:
    """The AnnCA combo as config overrides (None keeps the preset's value)."""
    if value == "preset":
        return {}
    if value == "off":
        return {"annca": False}
    return {"annca": True, "annca_prune": value == "pad merge + prune"}


class FastARAttentionPatch:
    DESCRIPTION = ("Turns on FAST-AR for the AR samplers of this pack: TempCache (a bounded KV cache that merges "
                   "temporally matching keys), AnnCA (merged, optionally pruned prompt tokens in cross-attention) "
                   "and AnnSA (bucketed sparse self-attention). Pick a preset, then override single knobs; "
                   "0 / -1 / 'preset' keep the preset's value. ComfyUI's KSampler ignores this patch.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": link("MODEL", "A Wan2.1 T2V or Wan2.2 TI2V-5B MODEL (from Load AR Video Model or Load "
                                   "Diffusion Model), or a world model from Load AR Video Model (Matrix-Game 2.0, "
                                   "the demo world)."),
            "preset": combo(FASTAR_PRESETS, "off: dense reference. quality: TempCache at threshold 0.95 + AnnCA. "
                                            "balanced: the paper's defaults (TempCache 0.9, AnnCA, AnnSA). fast: more "
                                            "merging, 7-bit buckets, 15-frame capacity.", default="balanced"),
            "tempcache": combo(SWITCH, "TempCache (bounded, merged KV cache): as the preset says, or forced on/off. "
                                       "The sampler's cache_policy 'auto' follows it."),
            "threshold": float_input(0.0, 0.0, 1.0, "TempCache merge threshold: cosine similarity a new key needs to "
                                                    "join a cached group (higher = fewer merges, closer to dense). "
                                                    "0 = preset."),
            "capacity_frames": int_input(0, 0, 4096, "TempCache capacity in latent frames' worth of tokens, sink "
                                                     "included; memory stays flat at this size. 0 = preset."),
            "annca": combo(ANNCA_CHOICES, "AnnCA: 'pad merge' merges the identical padded prompt tokens into one "
                                          "key (exact; what the presets use); '+ prune' also drops, per frame, "
                                          "prompt tokens no query hashes near (approximate, rarely faster)."),
            "annsa": combo(SWITCH, "AnnSA: bucketed sparse self-attention over the cache (sink and current chunk stay "
                                   "dense)."),
            "bits": int_input(0, 0, 16, "LSH bits per table for AnnSA/AnnCA (2^bits buckets; more = sparser). "
                                        "0 = preset."),
            "tables": int_input(0, 0, 8, "LSH tables (more = better recall, more hashing). 0 = preset."),
            "dense_warmup": float_input(-1.0, -1.0, 1.0, "Share of denoising steps that stay dense before AnnSA "
                                                         "starts. -1 = preset."),
            "layers": string_input("all", "Blocks where AnnSA runs: 'all' or a comma-separated list such as 2,3,5."),
            "backend": combo(FASTAR_BACKENDS, "Attention kernels: on GPUs auto uses ComfyUI's attention for plain "
                                              "calls, the bias folded into SDPA and Triton for sparse ones, each "
                                              "checked against torch at first use; plain torch elsewhere (always "
                                              "works). 'comfy' = ComfyUI's attention (your --use-*-attention flag)."),
        }}

    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The same MODEL (a clone) carrying the FAST-AR settings.",)
    FUNCTION = "patch"
    CATEGORY = CATEGORY

    def patch(self, model, preset="balanced", tempcache="preset", threshold=0.0, capacity_frames=0, annca="preset",
              annsa="preset", bits=0, tables=0, dense_warmup=-1.0, layers="all", backend="auto"):
        dm = diffusion_model_of(model)
        family = family_for(dm)
        refusal = family.fastar_attention_refusal()
        if refusal:
            raise FastARError(f"FAST-AR Attention cannot patch {family.describe()}: {refusal}")
        family.check_model(dm)  # a module tree the runner drives: Wan's, or a world family's
        layers = (layers or "all").strip()
        if layers == "auto":
            raise FastARError("layers 'auto' needs a calibration file, which this node does not take; use 'all' or "
                              "the list that `fastar calibrate` printed")
        choice = FastARChoice(
            preset=preset, tempcache=_switch(tempcache),
            tempcache_overrides={"threshold": threshold or None, "capacity_frames": capacity_frames or None},
            attention_overrides={**_annca(annca), "annsa": _switch(annsa), "bits": bits or None,
                                 "tables": tables or None, "dense_warmup": None if dense_warmup < 0 else dense_warmup,
                                 "layers": parse_layers(layers), "backend": backend},
        )
        choice.resolve(cache_policy="auto", num_layers=len(dm.blocks))  # refuse bad settings here, not at sampling
        patched = model.clone()
        patched.model_options.setdefault("transformer_options", {})[FASTAR_OPTIONS_KEY] = choice.to_dict()
        return (patched,)
