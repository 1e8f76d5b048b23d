"""A Matrix-Game 2.0 rollout's inputs as the nodes pass them: World Model Start's conditioning and an Action
Script, checked against the MODEL's variant and the sampler's size, turned into the engine's ``Conditioning``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.lingbot.camera import CameraPath
from ..fastar_core.families.matrix_game.config import MatrixGameConfig
from ..fastar_core.families.matrix_game.rollout import matrix_game_conditioning
from ..fastar_core.rollout.action_script import ActionScript
from ..fastar_core.rollout.actions import Actions
from ..fastar_core.rollout.conditioning import Conditioning
from ..fastar_core.rollout.live_actions import LivePlay
from ..fastar_core.rollout.video_geometry import pixel_size, video_frames
from .constants import MODEL_OWN, SCHEDULE_PRESETS, WORLD_START_INDEX_KEY, WORLD_START_KEY
from .family_inputs import FamilyInputs, SamplerInputs, batch_rows, item_of
from .prompting import ARPromptSchedule, conditioning_entry


@dataclass
class WorldInputs(FamilyInputs):
    clip: torch.Tensor  # [B or 1, 257, clip_dim] CLIP-vision tokens
    start: torch.Tensor  # [B or 1, 16, T or D, h, w] raw VAE latent of the start image and the blank frames after it
    index: torch.Tensor | None  # [T]: which of start's D distinct frames each latent frame is (None: frame t is t)
    actions: ActionScript | LivePlay
    latent_frames: int  # of the video: the actions are read for its frames
    notes: list = field(default_factory=list)

    def check_batch(self, batch: int) -> None:
        if batch != 1 and isinstance(self.actions, LivePlay):
            raise FastARError(f"a live play makes one video; batch_size is {batch}")
        batch_rows("World Model Start's latent", self.start, batch)
        batch_rows("World Model Start's CLIP tokens", self.clip, batch)

    def conditioning(self, model, r: int) -> Conditioning:
        """Video ``r``'s conditioning: its start (row r, or the only row) and the script's actions for the video."""
        if isinstance(self.actions, LivePlay):
            actions = self.actions.actions()
        else:
            actions = Actions(*self.actions.to_tensors(video_frames(self.latent_frames)))
        start = model.latent_format.process_in(item_of(self.start, r).float())
        index = None if self.index is None else self.index[:self.latent_frames]
        return matrix_game_conditioning(start, item_of(self.clip, r).float(), actions, index)

    def describe(self) -> str:
        if isinstance(self.actions, LivePlay):
            return f"actions played live ({self.actions.variant.name})"
        return "actions " + self.actions.describe(video_frames(self.latent_frames))


def schedule_notes(config: MatrixGameConfig, sigmas, schedule: str) -> list[str]:
    """A note when the step list is not the one the variant's inference config gives."""
    own = config.schedule_name
    label = next((k for k, v in SCHEDULE_PRESETS.items() if v == own), own)
    if sigmas is not None:
        return [f"custom sigmas replace Matrix-Game 2.0 {config.variant}'s own step list ('{label}')"]
    if schedule != MODEL_OWN and SCHEDULE_PRESETS.get(schedule) != own:
        return [f"schedule '{schedule}' is not Matrix-Game 2.0 {config.variant}'s own ('{label}')"]
    return []


def read_world_inputs(model, given: SamplerInputs) -> WorldInputs:
    """Matrix-Game 2.0's reader: refuse what does not fit the MODEL, naming the input to change."""
    config = model.family.config
    variant = config.variant
    if given.from_guider:
        raise FastARError(f"the MODEL is Matrix-Game 2.0 {variant}, which this SAMPLER does not run (it takes a text "
                          "guider): use the Long Video Sampler with World Model Start and an Action Script")
    if isinstance(given.positive, ARPromptSchedule):
        raise FastARError("a Matrix-Game 2.0 MODEL takes no prompt schedule: connect World Model Start to 'positive'")
    tokens, extras = conditioning_entry(given.positive, "positive")
    start = extras.get(WORLD_START_KEY)
    if start is None:
        raise FastARError(f"this MODEL is Matrix-Game 2.0 {variant}, which takes no text: connect World Model Start "
                          "(the start image's CLIP vision tokens and latent) to 'positive'")
    if tokens.shape[-1] != config.clip_dim:
        raise FastARError(f"World Model Start's CLIP tokens are {tokens.shape[-1]} wide; this model reads "
                          f"{config.clip_dim} (a ViT-H CLIP vision model: clip_vision_h.safetensors)")
    frames, latent_h, latent_w = given.latent_frames, given.latent_h, given.latent_w
    index = extras.get(WORLD_START_INDEX_KEY)
    if index is not None and (not torch.is_tensor(index) or index.ndim != 1 or index.dtype != torch.long):
        raise FastARError(f"World Model Start's frame index is not a 1-D long tensor ({WORLD_START_INDEX_KEY})")
    covers = start.shape[2] if index is None else index.shape[0]
    if tuple(start.shape[3:]) != (latent_h, latent_w) or covers < frames:
        raise FastARError(f"World Model Start encoded {pixel_size(start.shape[4])}x{pixel_size(start.shape[3])} "
                          f"for {video_frames(covers)} frames, but the sampler makes "
                          f"{pixel_size(latent_w)}x{pixel_size(latent_h)} for {video_frames(frames)}: link World "
                          "Model Start's width, height and length to the sampler's")
    actions = given.actions
    if actions is None:
        keys = "keyboard and mouse" if config.action.enable_mouse else "keyboard"
        raise FastARError(f"this MODEL is Matrix-Game 2.0 {variant}, steered by {keys}: connect an Action Script "
                          "to 'actions'")
    if isinstance(actions, LivePlay):
        if actions.variant.name != variant:
            raise FastARError(f"the play's keys are {actions.variant.name}'s, but this MODEL is Matrix-Game 2.0 "
                              f"{variant}")
    elif not isinstance(actions, ActionScript):
        what = ("a camera path, which steers LingBot-World 2.0" if isinstance(actions, CameraPath)
                else f"a {type(actions).__name__}")
        raise FastARError(f"'actions' is {what}; this MODEL is Matrix-Game 2.0 {variant}: connect an Action Script "
                          "node")
    elif actions.variant != variant:
        raise FastARError(f"the Action Script is for {actions.variant}, but this MODEL is Matrix-Game 2.0 {variant}: "
                          f"set its variant to {variant} (the keys differ)")
    return WorldInputs(tokens, start, index, actions, frames, schedule_notes(config, given.sigmas, given.schedule))
