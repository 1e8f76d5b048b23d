"""A Matrix-Game 2.0 rollout's inputs as the nodes pass them: World Model Start's conditioning and an Action
Script, checked against the MODEL's variant and the sampler's size, turned into the engine's ``Conditioning``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fastar_core.action_script import ActionScript
from ..fastar_core.actions import Actions
from ..fastar_core.conditioning import Conditioning
from ..fastar_core.errors import FastARError
from ..fastar_core.matrix_game.config import MatrixGameConfig
from ..fastar_core.matrix_game.rollout import matrix_game_conditioning
from ..fastar_core.video_geometry import pixel_size, video_frames
from .constants import WORLD_START_KEY
from .prompting import ARPromptSchedule, conditioning_entry


@dataclass
class WorldInputs:
    clip: torch.Tensor  # [B or 1, 257, clip_dim] CLIP-vision tokens
    start: torch.Tensor  # [B or 1, 16, T, h, w] raw VAE latent of the start image and the blank frames after it
    actions: ActionScript

    def conditioning(self, model, r: int, latent_frames: int) -> Conditioning:
        """Video ``r``'s conditioning: its start (row r, or the only row) and the script's actions for the video."""
        from .rollout import item_of

        keyboard, mouse = self.actions.to_tensors(video_frames(latent_frames))
        start = model.latent_format.process_in(item_of(self.start, r).float())
        return matrix_game_conditioning(start, item_of(self.clip, r).float(), Actions(keyboard, mouse))

    def describe(self, latent_frames: int) -> str:
        return "actions " + self.actions.describe(video_frames(latent_frames))


def world_inputs(config: MatrixGameConfig, positive, actions, latent_frames: int, latent_h: int,
                 latent_w: int) -> WorldInputs:
    """Refuse what does not fit a Matrix-Game 2.0 MODEL, naming the input to change."""
    variant = config.variant
    if isinstance(positive, ARPromptSchedule):
        raise FastARError("a Matrix-Game 2.0 MODEL takes no prompt schedule: connect World Model Start to 'positive'")
    tokens, extras = conditioning_entry(positive, "positive")
    start = extras.get(WORLD_START_KEY)
    if start is None:
        raise FastARError(f"this MODEL is Matrix-Game 2.0 {variant}, which takes no text: connect World Model Start "
                          "(the start image's CLIP vision tokens and latent) to 'positive'")
    if tokens.shape[-1] != config.clip_dim:
        raise FastARError(f"World Model Start's CLIP tokens are {tokens.shape[-1]} wide; this model reads "
                          f"{config.clip_dim} (a ViT-H CLIP vision model: clip_vision_h.safetensors)")
    if tuple(start.shape[3:]) != (latent_h, latent_w) or start.shape[2] < latent_frames:
        raise FastARError(f"World Model Start encoded {pixel_size(start.shape[4])}x{pixel_size(start.shape[3])} "
                          f"for {video_frames(start.shape[2])} frames, but the sampler makes "
                          f"{pixel_size(latent_w)}x{pixel_size(latent_h)} for {video_frames(latent_frames)}: give "
                          "both the same width, height and length")
    if actions is None:
        keys = "keyboard and mouse" if config.action.enable_mouse else "keyboard"
        raise FastARError(f"this MODEL is Matrix-Game 2.0 {variant}, steered by {keys}: connect an Action Script "
                          "to 'actions'")
    if not isinstance(actions, ActionScript):
        raise FastARError(f"'actions' is a {type(actions).__name__}; connect an Action Script node")
    if actions.variant != variant:
        raise FastARError(f"the Action Script is for {actions.variant}, but this MODEL is Matrix-Game 2.0 {variant}: "
                          f"set its variant to {variant} (the keys differ)")
    return WorldInputs(tokens, start, actions)
