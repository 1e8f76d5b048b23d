"""What a family's rollout reads from a sampler's inputs, kept per video.

A sampler hands the MODEL's family its 'positive' (a CONDITIONING or an AR Prompt Schedule) and its 'actions'. The
family's reader (``request.READERS``) checks them against the MODEL and the video's size, once, and returns a
``FamilyInputs``: what video r of a batch is conditioned on, in the engine's terms. The Wan readers are in
``prompting.py`` (text, a start image), Matrix-Game 2.0's in ``world.py`` (World Model Start and an Action Script).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.conditioning import Conditioning
from ..fastar_core.rollout.sampler import FRAMES_PER_BLOCK


@dataclass(frozen=True)
class SamplerInputs:
    """A sampler's inputs that a family reads, as the node received them."""

    positive: object  # CONDITIONING, or an ARPromptSchedule
    actions: object = None  # an ActionScript, or None
    latent_frames: int = 1  # of the whole video, start frames included
    latent_h: int = 1
    latent_w: int = 1
    sigmas: object = None  # custom SIGMAS replacing the schedule preset, if any
    schedule: str = ""  # the sampler's schedule widget (a SCHEDULE_PRESETS label)
    frames_per_block: int = FRAMES_PER_BLOCK  # the sampler's chunk
    from_guider: bool = False  # the AR Video Sampler: 'positive' is the guider's text, as a prompt schedule
    core_start: object = None  # a start latent core's ARVideoI2V left in the MODEL's options, if any


class FamilyInputs:
    """A rollout's conditioning, per video: checked when read, so a rollout never starts on inputs it refuses."""

    notes: list

    @property
    def start_frames(self) -> int:
        """Latent frames of a start image the video begins with (0: none)."""
        return 0

    def check_batch(self, batch: int) -> None:
        """Refuse inputs whose batch is neither 1 nor ``batch``."""

    def initial_latents(self, model, r: int) -> torch.Tensor | None:
        """Video ``r``'s clean start frames in the model's latent space (a start image), or None."""
        return None

    def conditioning(self, model, r: int) -> Conditioning:
        raise NotImplementedError

    def describe(self) -> str:
        """What the video is conditioned on, for the report."""
        raise NotImplementedError


def batch_rows(name: str, tensor: torch.Tensor, batch: int) -> None:
    if tensor.shape[0] not in (1, batch):
        raise FastARError(f"{name} has a batch of {tensor.shape[0]} but the sampler makes {batch} video(s): make "
                          f"{tensor.shape[0]} (the Long Video Sampler's batch_size, or the LATENT's batch), or give it "
                          "a batch of 1, shared by every video")


def item_of(tensor: torch.Tensor | None, r: int) -> torch.Tensor | None:
    """Row ``r`` of a per-video tensor, or its only row when it is shared by the whole batch."""
    if tensor is None:
        return None
    return tensor[r:r + 1] if tensor.shape[0] > 1 else tensor[:1]
