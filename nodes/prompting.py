"""CONDITIONING and prompt schedules as the nodes pass them, turned into the engine's ``PromptSchedule``.

A CONDITIONING is ComfyUI's ``[[tensor [B, L, 4096], {extras}], ...]``. Our schedule type
(``AR_PROMPT_SCHEDULE``) is an ``ARPromptSchedule``: conditioning tensors with the latent frame where each
starts. Either one goes into the samplers' ``positive`` input. A start image (image to video) rides along as
the raw VAE latent in a conditioning entry's extras, where ComfyUI's own image-to-video nodes put theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.prompts import PromptSchedule, PromptSegment
from .constants import INITIAL_LATENT_KEY


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


def with_initial_latent(conditioning, latent: torch.Tensor):
    """A copy of a CONDITIONING whose every entry carries the start image's latent (tensors are shared)."""
    out = []
    for entry in conditioning:
        extras = dict(entry[1]) if len(entry) > 1 else {}
        extras[INITIAL_LATENT_KEY] = latent
        out.append([entry[0], extras])
    return out
