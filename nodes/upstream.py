"""What upstream nodes put on a MODEL or a prompt that the AR samplers do not use, named in the run's report.

The pack's runner calls the Wan submodules itself (``model_access.py``), so patches that ComfyUI applies around
its own model call never run: block replacements, attention overrides and patches, model-call wrappers, cfg
functions. LoRA and other weight patches, object patches of submodules and TorchCompileModel's setting do
apply. The Long Video Sampler's schedule presets are fixed step lists, so the MODEL's shift (ModelSamplingSD3,
or the loader's own widget) does not reach them. Each note names the setting and what to do instead.
"""

from __future__ import annotations

from ..fastar_core.rollout.schedule import get_schedule
from .constants import CORE_AR_CONFIG_KEY

LOADER_DEFAULT_SHIFT = 5.0
# Marks the model_sampling object the pack's loader puts on a MODEL, with the shift its widget gave.
LOADER_SHIFT_ATTR = "fastar_loader_shift"
# ComfyUI's wrapper levels that sit inside one model call, which the runner replaces (WrappersMP values).
MODEL_CALL_WRAPPERS = ("calc_cond_batch", "apply_model", "diffusion_model", "predict_noise")
COMPILE_WRAPPER_KEY = "torch.compile"  # TorchCompileModel's wrapper: its setting is honoured another way
CFG_FUNCTIONS = ("sampler_cfg_function", "sampler_pre_cfg_function", "sampler_post_cfg_function")
CONDITIONING_EXTRAS = {
    "concat_latent_image": "a start image for an image-to-video Wan model (use AR Image to Video instead)",
    "clip_vision_output": "CLIP vision features for an image-to-video Wan model (the AR models are text-to-video)",
    "area": "an area (ConditioningSetArea): the prompt applies to the whole frame",
    "mask": "a mask (ConditioningSetMask): the prompt applies to the whole frame",
}


def model_sampling_of(patcher):
    getter = getattr(patcher, "get_model_object", None)
    try:
        return getter("model_sampling") if getter is not None else None
    except AttributeError:
        return None


def ignored_shift(patcher, schedule_preset: str, preset_label: str) -> list[str]:
    """The MODEL's flow shift when the preset's fixed step list was made for another one."""
    sampling = model_sampling_of(patcher)
    shift = getattr(sampling, "shift", None)
    preset_shift = get_schedule(schedule_preset).shift
    if not isinstance(shift, (int, float)) or preset_shift is None or abs(float(shift) - preset_shift) < 1e-6:
        return []
    loader_shift = getattr(sampling, LOADER_SHIFT_ATTR, None)
    if loader_shift is not None and float(loader_shift) == LOADER_DEFAULT_SHIFT:
        return []  # the loader's untouched default: nobody asked for a shift
    source = "the loader's 'shift'" if loader_shift is not None else "ModelSamplingSD3 (or another model-sampling node)"
    return [f"the MODEL's shift {float(shift):g} from {source} is ignored: the '{preset_label}' schedule is a fixed "
            f"step list (made for shift {preset_shift:g}); to sample with shift {float(shift):g}, connect "
            "BasicScheduler's SIGMAS (on this MODEL) to 'sigmas'"]


def ignored_model_patches(patcher) -> list[str]:
    """Patches on the MODEL that act inside ComfyUI's own model call, which the AR runner does not make."""
    options = getattr(patcher, "model_options", None) or {}
    transformer = options.get("transformer_options") or {}
    found = []
    replaced = transformer.get("patches_replace") or {}
    if any(replaced.values()):
        found.append("block replacements (patches_replace)")
    patches = transformer.get("patches") or {}
    if any(patches.values()):
        found.append(f"attention/block patches ({', '.join(sorted(k for k, v in patches.items() if v))})")
    if transformer.get("optimized_attention_override") is not None:
        found.append("an attention override (optimized_attention_override; choose FAST-AR Attention's backend "
                     "instead)")
    if options.get("model_function_wrapper") is not None:
        found.append("a model function wrapper (model_function_wrapper)")
    cfg = [name for name in CFG_FUNCTIONS if options.get(name)]
    if cfg:
        found.append(f"cfg functions ({', '.join(cfg)}; the AR models run at cfg 1)")
    wrappers = getattr(patcher, "wrappers", None) or {}
    levels = sorted(level for level in MODEL_CALL_WRAPPERS
                    if any(fns for key, fns in (wrappers.get(level) or {}).items() if key != COMPILE_WRAPPER_KEY))
    if levels:
        found.append(f"wrappers of the model call ({', '.join(levels)})")
    if not found:
        return []
    return [f"the MODEL carries {'; '.join(found)} from upstream nodes; the AR samplers run their own block-causal "
            "forward, so these are not applied (LoRA, weight and object patches are)"]


def is_start_image_hook(hooks) -> bool:
    """Whether a conditioning's hook group holds only the start-image hook AR Image to Video attaches."""
    members = getattr(hooks, "hooks", None)
    if not members:
        return False
    for hook in members:
        payload = getattr(hook, "transformers_dict", None)
        if not isinstance(payload, dict) or set(payload) - {CORE_AR_CONFIG_KEY}:
            return False
    return True


def ignored_conditioning(extras: dict, input_name: str = "positive") -> list[str]:
    """Entries of a conditioning's extras that the AR samplers do not use."""
    notes = [f"'{input_name}' carries {what}; it is ignored" for key, what in CONDITIONING_EXTRAS.items()
             if extras.get(key) is not None]
    strength = extras.get("strength")
    if isinstance(strength, (int, float)) and strength != 1.0:
        notes.append(f"'{input_name}' has conditioning strength {strength:g}; it is ignored (the prompt is used as is)")
    hooks = extras.get("hooks")
    if hooks is not None and not is_start_image_hook(hooks):
        notes.append(f"'{input_name}' carries conditioning hooks (e.g. Create Hook LoRA); the AR samplers do not "
                     "apply them: load a LoRA into the MODEL instead")
    return notes
