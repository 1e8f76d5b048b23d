"""CONDITIONING and prompt schedules as the nodes pass them, turned into the engine's ``PromptSchedule``.

A CONDITIONING is ComfyUI's ``[[tensor [B, L, 4096], {extras}], ...]``. Our schedule type
(``AR_PROMPT_SCHEDULE``) is an ``ARPromptSchedule``: conditioning tensors with the latent frame where each
starts. Either one goes into the samplers' ``positive`` input. A start image (image to video) rides along as
the raw VAE latent in a conditioning entry's extras, where ComfyUI's own image-to-video nodes put theirs. ComfyUI's
own AR nodes keep theirs in the MODEL's ``transformer_options["ar_config"]`` instead; both are read here, and the
pack's AR Image to Video also hands its latent to core's AR sampler through a hook on the conditioning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.lingbot.camera import CameraPath
from ..fastar_core.rollout.action_script import ActionScript
from ..fastar_core.rollout.conditioning import Conditioning
from ..fastar_core.rollout.prompts import PromptSchedule, PromptSegment
from ..fastar_core.rollout.video_geometry import pixel_size
from .constants import CORE_AR_CONFIG_KEY, CORE_START_LATENT_KEY, INITIAL_LATENT_KEY, WORLD_START_KEY
from .family_inputs import FamilyInputs, SamplerInputs, batch_rows, item_of
from .upstream import ignored_conditioning
from .video_size import VideoSize


@dataclass
class ScheduledPrompt:
    start_frame: int  # latent frame
    context: torch.Tensor
    recache_frames: int = 0
    label: str = ""


@dataclass
class ARPromptSchedule:
    prompts: list = field(default_factory=list)  # ScheduledPrompt, sorted by start_frame
    initial_latent: torch.Tensor | None = None  # raw VAE latent [B, 16, F, h, w] of a start image
    notes: list = field(default_factory=list)  # things the report should mention
    video_size: VideoSize | None = None  # the start node's size and length, when prompt 1 came from one

    def to_engine(self) -> PromptSchedule:
        return PromptSchedule([PromptSegment(p.start_frame, p.context, p.recache_frames, p.label)
                               for p in self.prompts])

    def describe(self) -> str:
        parts = [f"{p.label or 'prompt'} from latent frame {p.start_frame}"
                 + (f" (recache {p.recache_frames})" if p.recache_frames and p.start_frame else "")
                 for p in self.prompts]
        return "; ".join(parts)


def conditioning_entry(conditioning, input_name: str):
    """The first ``(tensor, extras)`` of a CONDITIONING, with one clear message for anything else."""
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise FastARError(f"'{input_name}' is not a CONDITIONING (expected [[tensor, dict], ...])")
    entry = conditioning[0]
    if not isinstance(entry, (list, tuple)) or len(entry) < 1 or not torch.is_tensor(entry[0]):
        raise FastARError(f"'{input_name}' is not a CONDITIONING (expected [[tensor, dict], ...])")
    tensor = entry[0]
    if tensor.ndim != 3:
        raise FastARError(f"'{input_name}' has a conditioning tensor of shape {list(tensor.shape)}; expected "
                          "[batch, tokens, 4096] from a Wan text encoder (CLIPLoader type 'wan')")
    extras = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
    return tensor, extras


def schedule_from_conditioning(conditioning, input_name: str = "positive") -> ARPromptSchedule:
    tensor, extras = conditioning_entry(conditioning, input_name)
    notes = []
    if len(conditioning) > 1:
        notes.append(f"'{input_name}' has {len(conditioning)} conditioning entries; the AR sampler uses the first "
                     "(use the AR Prompt Schedule node to change prompts over time)")
    return ARPromptSchedule([ScheduledPrompt(0, tensor, 0, "prompt")], extras.get(INITIAL_LATENT_KEY), notes)


def as_schedule(positive, input_name: str = "positive") -> ARPromptSchedule:
    """Accept our schedule or a CONDITIONING (the samplers' ``positive`` takes either)."""
    if isinstance(positive, ARPromptSchedule):
        return positive
    return schedule_from_conditioning(positive, input_name)


def video_frame_to_latent(frame: int) -> int:
    """Video frame -> the latent frame that decodes to it (latent 0 -> frame 0, latent k -> frames 4k-3..4k)."""
    return (max(0, frame) + 3) // 4


def with_initial_latent(conditioning, latent: torch.Tensor, hooks=None, combine_hooks=None, size=None):
    """A copy of a CONDITIONING whose every entry carries the start image's latent (tensors are shared) and the
    video's ``size`` (a ``VideoSize``).

    ``hooks`` (a ComfyUI HookGroup, or None) is attached too, joined with an entry's own hooks by
    ``combine_hooks([theirs, ours])``."""
    out = []
    for entry in conditioning:
        extras = dict(entry[1]) if len(entry) > 1 else {}
        extras[INITIAL_LATENT_KEY] = latent
        if size is not None:
            extras.update(size.as_extras())
        if hooks is not None:
            theirs = extras.get("hooks")
            extras["hooks"] = hooks if theirs is None else combine_hooks([theirs, hooks])
        out.append([entry[0], extras])
    return out


def core_start_latent(*model_options_list):
    """The start latent ComfyUI's ARVideoI2V stored in a MODEL's options (the first options that have one)."""
    for options in model_options_list:
        ar_config = ((options or {}).get("transformer_options") or {}).get(CORE_AR_CONFIG_KEY) or {}
        latent = ar_config.get(CORE_START_LATENT_KEY) if isinstance(ar_config, dict) else None
        if latent is not None:
            return latent
    return None


def with_core_start_image(schedule: ARPromptSchedule, core_latent) -> ARPromptSchedule:
    """Honour a start image from core's ARVideoI2V; one start image only (the same one twice is fine: the pack's
    AR Image to Video hands its latent to both places)."""
    if core_latent is None:
        return schedule
    if not torch.is_tensor(core_latent):
        raise FastARError("the MODEL's transformer_options['ar_config']['initial_latent'] (set by ARVideoI2V) is not a "
                          "latent tensor")
    ours = schedule.initial_latent
    if ours is None:
        return ARPromptSchedule(schedule.prompts, core_latent, list(schedule.notes))
    same = ours.shape == core_latent.shape and torch.equal(ours.cpu(), core_latent.cpu())
    if not same:
        raise FastARError("two start images: the MODEL carries one from ARVideoI2V and 'positive' another from AR "
                          "Image to Video; keep one of the two nodes")
    return schedule


def item_schedule(schedule: ARPromptSchedule, r: int) -> ARPromptSchedule:
    prompts = [ScheduledPrompt(p.start_frame, item_of(p.context, r), p.recache_frames, p.label)
               for p in schedule.prompts]
    return ARPromptSchedule(prompts, item_of(schedule.initial_latent, r), list(schedule.notes))


@dataclass
class TextInputs(FamilyInputs):
    """A Wan text-to-video rollout's inputs: prompts over time, and an optional start image (model space)."""

    schedule: ARPromptSchedule
    start: torch.Tensor | None  # [B or 1, C, F, h, w] in the model's latent space
    notes: list = field(default_factory=list)

    @property
    def start_frames(self) -> int:
        return 0 if self.start is None else self.start.shape[2]

    def check_batch(self, batch: int) -> None:
        for p in self.schedule.prompts:
            batch_rows(f"the conditioning of {p.label}" if p.label else "the conditioning", p.context, batch)
        if self.start is not None:
            batch_rows("the start image latent", self.start, batch)

    def initial_latents(self, model, r: int) -> torch.Tensor | None:
        return item_of(self.start, r)

    def conditioning(self, model, r: int) -> Conditioning:
        return Conditioning(prompts=item_schedule(self.schedule, r).to_engine())

    def describe(self) -> str:
        return self.schedule.describe()


def start_latent(model, raw, latent_h: int, latent_w: int) -> torch.Tensor | None:
    """A start image's raw VAE latent, checked against the MODEL and the video's size, in the model's space."""
    if raw is None:
        return None
    if raw.ndim == 4:  # [B, C, h, w]: one frame
        raw = raw[:, :, None]
    channels, stride = model.latent_channels, model.vae_stride
    if raw.ndim != 5 or raw.shape[1] != channels:
        vae = "a Wan2.2 VAE" if channels == 48 else "a Wan2.1 VAE"
        raise FastARError(f"the start image latent has shape {list(raw.shape)}; this MODEL needs [batch, {channels}, "
                          f"frames, h, w] from {vae}")
    if tuple(raw.shape[3:]) != (latent_h, latent_w):
        raise FastARError(f"the start image was encoded at {pixel_size(raw.shape[4], stride)}x"
                          f"{pixel_size(raw.shape[3], stride)} but the sampler makes {pixel_size(latent_w, stride)}x"
                          f"{pixel_size(latent_h, stride)}: give 'AR Image to Video' the same width and height")
    return model.latent_format.process_in(raw.float())


def check_no_world_inputs(actions, positive) -> None:
    """Actions and a world start belong to a world model, not to a text-to-video one."""
    if actions is not None:
        if isinstance(actions, ActionScript):
            family = "LingBot-World 2.0" if actions.variant == "lingbot" else "Matrix-Game 2.0"
            what = f"'actions' ({actions.variant}) steer a {family} model"
        elif isinstance(actions, CameraPath):
            what = "'actions' (a camera path) steer LingBot-World 2.0"
        else:
            raise FastARError(f"'actions' is a {type(actions).__name__}; connect an Action Script or Camera Path node")
        raise FastARError(f"{what}, but this MODEL is a text-to-video Wan model, which takes no actions; disconnect "
                          "'actions'")
    if not isinstance(positive, ARPromptSchedule) and WORLD_START_KEY in conditioning_entry(positive, "positive")[1]:
        raise FastARError("'positive' comes from World Model Start, which starts a Matrix-Game 2.0 model, but this "
                          "MODEL is a text-to-video Wan model: give it a text prompt (CLIP Text Encode)")


def read_text_inputs(model, given: SamplerInputs) -> TextInputs:
    """The Wan family's reader: a CONDITIONING or a prompt schedule, and a start image from AR Image to Video or
    from core's ARVideoI2V (``given.core_start``, read off the MODEL's options by the sampler)."""
    check_no_world_inputs(given.actions, given.positive)
    schedule = with_core_start_image(as_schedule(given.positive), given.core_start)
    notes = list(schedule.notes)
    if not given.from_guider and not isinstance(given.positive, ARPromptSchedule):
        # a schedule node has read its entries already; a guider's were read by the AR Video Sampler
        notes += ignored_conditioning(conditioning_entry(given.positive, "positive")[1])
    start = start_latent(model, schedule.initial_latent, given.latent_h, given.latent_w)
    return TextInputs(schedule, start, notes)
