"""A LingBot-World 2.0 rollout's inputs as the nodes pass them: LingBot World Start's conditioning (the prompt's UMT5
features carrying the start video's latent) and a camera (a Camera Path node's folder, or an Action Script of the
``lingbot`` variant, or a play's keys: Live World), checked against the MODEL and the sampler's size, turned into the
engine's ``Conditioning``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.lingbot.camera import CameraConditioning, CameraPath, check_path
from ..fastar_core.families.lingbot.live import KeyCamera
from ..fastar_core.families.lingbot.rollout import FRAMES_PER_BLOCK, SCHEDULE
from ..fastar_core.rollout.action_script import ActionScript
from ..fastar_core.rollout.conditioning import Conditioning, first_frame_conditioning
from ..fastar_core.rollout.live_actions import LivePlay
from ..fastar_core.rollout.prompts import PromptSchedule
from ..fastar_core.rollout.video_geometry import pixel_size, video_frames
from .constants import MODEL_OWN, SCHEDULE_PRESETS, WORLD_START_INDEX_KEY, WORLD_START_KEY
from .family_inputs import FamilyInputs, SamplerInputs, batch_rows, item_of
from .prompting import ARPromptSchedule, conditioning_entry
from .upstream import ignored_conditioning

START_NODE = "LingBot World Start"
VARIANT = "lingbot"


def camera_of(actions, latent_frames: int, height: int, width: int) -> tuple[CameraConditioning, str]:
    """The camera an 'actions' input gives for a video of ``latent_frames`` latent frames of ``height`` x ``width``
    pixels, and what it is."""
    if isinstance(actions, CameraPath):
        return (actions.condition(latent_frames, height, width),
                f"camera path {actions.source} ({actions.num_frames} poses)")
    if isinstance(actions, ActionScript):
        if actions.variant != VARIANT:
            raise FastARError(f"the Action Script is for {actions.variant}, but this MODEL is LingBot-World 2.0, "
                              f"steered by a camera: set its variant to {VARIANT} (W S A D move, I K J L or the "
                              "arrows look)")
        frames = video_frames(latent_frames)
        path = check_path(actions.to_poses(frames), actions.intrinsics(), "the Action Script's key timeline")
        return (path.condition(latent_frames, height, width, scale=actions.camera_scale()),
                "keys " + actions.describe(frames))
    if isinstance(actions, LivePlay):
        if actions.variant.name != VARIANT:
            raise FastARError(f"the play's keys are {actions.variant.name}'s, but this MODEL is LingBot-World 2.0")
        # The keys held at each chunk walk the camera, its moves divided by the play's fixed scale (the script
        # that replays it names the same one).
        camera = KeyCamera(height, width, fps=actions.fps, scale=actions.translation_scale,
                           held=actions.held_motion)
        return camera.conditioning(), f"keys played live ({VARIANT})"
    if actions is None:
        raise FastARError("this MODEL is LingBot-World 2.0, steered by a camera: connect a Camera Path node (a folder "
                          "with poses.npy and intrinsics.npy) or an Action Script of variant lingbot to 'actions'")
    raise FastARError(f"'actions' is a {type(actions).__name__}; connect a Camera Path node or an Action Script of "
                      "variant lingbot")


@dataclass
class LingBotInputs(FamilyInputs):
    prompt: torch.Tensor  # [B or 1, L, 4096] UMT5 features
    start: torch.Tensor  # [B or 1, 16, T or D, h, w] raw VAE latent of the start image and the blank frames after it
    index: torch.Tensor | None  # [T]: which of start's D distinct frames each latent frame is (None: frame t is t)
    camera: CameraConditioning  # the same for every video (a live one makes each chunk's motion when pulled)
    steering: str
    latent_frames: int  # of the video
    notes: list = field(default_factory=list)

    def check_batch(self, batch: int) -> None:
        batch_rows("LingBot World Start's latent", self.start, batch)
        batch_rows("the prompt's conditioning", self.prompt, batch)

    def conditioning(self, model, r: int) -> Conditioning:
        start = model.latent_format.process_in(item_of(self.start, r).float())
        index = None if self.index is None else self.index[:self.latent_frames]
        return Conditioning(prompts=PromptSchedule.coerce(item_of(self.prompt, r).float()),
                            concat=first_frame_conditioning(start), concat_index=index, camera=self.camera)

    def describe(self) -> str:
        return "prompt; " + self.steering


def own_settings_notes(given: SamplerInputs) -> list[str]:
    """Notes when the sampler's step list or chunk is not the release's."""
    label = next(k for k, v in SCHEDULE_PRESETS.items() if v == SCHEDULE)
    notes = []
    if given.sigmas is not None:
        notes.append(f"custom sigmas replace LingBot-World 2.0's own step list ('{label}')")
    elif given.schedule != MODEL_OWN and SCHEDULE_PRESETS.get(given.schedule) != SCHEDULE:
        notes.append(f"schedule '{given.schedule}' is not LingBot-World 2.0's own ('{label}')")
    if given.frames_per_block != FRAMES_PER_BLOCK:
        notes.append(f"frames_per_block {given.frames_per_block} is not LingBot-World 2.0's own chunk "
                     f"({FRAMES_PER_BLOCK} latent frames)")
    return notes


def read_lingbot_inputs(model, given: SamplerInputs) -> LingBotInputs:
    """LingBot-World 2.0's reader: refuse what does not fit the MODEL, naming the input to change."""
    config = model.family.config
    if given.from_guider:
        raise FastARError("the MODEL is LingBot-World 2.0, which this SAMPLER does not run (it takes a text guider): "
                          f"use the Long Video Sampler with {START_NODE} and a camera")
    if isinstance(given.positive, ARPromptSchedule):
        raise FastARError(f"a LingBot-World 2.0 MODEL takes one prompt: connect {START_NODE} to 'positive'")
    tokens, extras = conditioning_entry(given.positive, "positive")
    start = extras.get(WORLD_START_KEY)
    if start is None:
        raise FastARError(f"this MODEL is LingBot-World 2.0, which starts from an image: connect {START_NODE} (the "
                          "prompt, the start image and the VAE) to 'positive'")
    if tokens.shape[-1] != config.text_dim:
        raise FastARError(f"'positive' carries a context {tokens.shape[-1]} wide (World Model Start's CLIP vision "
                          f"tokens?); LingBot-World 2.0 reads the UMT5 prompt ({config.text_dim} wide): give "
                          f"{START_NODE} a CLIP Text Encode of a 'wan' text encoder")
    frames, latent_h, latent_w = given.latent_frames, given.latent_h, given.latent_w
    index = extras.get(WORLD_START_INDEX_KEY)
    if index is not None and (not torch.is_tensor(index) or index.ndim != 1 or index.dtype != torch.long):
        raise FastARError(f"{START_NODE}'s frame index is not a 1-D long tensor ({WORLD_START_INDEX_KEY})")
    covers = start.shape[2] if index is None else index.shape[0]
    if start.ndim != 5 or tuple(start.shape[3:]) != (latent_h, latent_w) or covers < frames:
        raise FastARError(f"{START_NODE} encoded {pixel_size(start.shape[-1])}x{pixel_size(start.shape[-2])} for "
                          f"{video_frames(covers)} frames, but the sampler makes {pixel_size(latent_w)}x"
                          f"{pixel_size(latent_h)} for {video_frames(frames)}: link {START_NODE}'s width, height "
                          "and length to the sampler's")
    camera, steering = camera_of(given.actions, frames, pixel_size(latent_h), pixel_size(latent_w))
    notes = own_settings_notes(given) + ignored_conditioning(extras)
    return LingBotInputs(tokens, start, index, camera, steering, frames, notes)
