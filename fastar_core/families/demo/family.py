"""The bundled demo world as a model family: a MODEL built over its file, steered by ``demo_world`` actions.

The loader attaches the world's parts to the Wan module tree it loads: ``action_encoder`` (a submodule, so it moves
with the weights) and ``demo_world`` (the ``DemoModel`` of its file: settings, prompt, the runner it needs). A
rollout gives the camera's start on the map (``Conditioning.place``), the start view as its initial frames
(``start_view``) and one action per frame (``Actions`` with ``time_stride`` 1, keyboard columns none, up, down, left,
right: the ``demo_world`` variant); the family turns the actions into the camera ``Track`` the runner reads,
chunk by chunk, so a live source steers it as the rollout goes. The start frames hold still (their actions are
ignored): the view was rendered at one place.
"""

from __future__ import annotations

import torch

from ...errors import FastARError
from ...forward.family import ModelFamily, register_family
from ...rollout.actions import ActionLayout
from ...rollout.schedule import get_schedule
from ...rollout.video_geometry import VideoGeometry
from .model import DemoModel
from .steer_world import ACTIONS, STEP, make_map, render_track, track_from_actions

VARIANT = "demo_world"  # the action script variant (rollout/action_script.py) whose columns are ACTIONS
WORLD = "demo_world"  # the module tree's attribute holding its DemoModel


def attach_world(demo: DemoModel):
    """The module tree of a steered-world file, carrying what the family needs (see the module's text)."""
    if not demo.is_world:
        raise FastARError("this demo model is not a steered-world model (its file has no action encoder): load "
                          "world_model.safetensors")
    model = demo.model
    model.add_module("action_encoder", demo.action_encoder)  # moves with the weights
    setattr(model, WORLD, demo)
    return model


def map_patches(demo: DemoModel) -> int:
    return int(demo.metadata["world"]["map_size"]) // STEP


def start_view(demo: DemoModel, map_seed: int, place: tuple) -> torch.Tensor:
    """The first chunk's frames ``[1, C, frames_per_block, H, W]`` in [-1, 1]: map ``map_seed``'s view at ``place``
    ((x, y) in patches), held still."""
    world = make_map(map_seed, int(demo.metadata["world"]["map_size"]))
    track = track_from_actions(["none"] * (demo.frames_per_block - 1), start=place, map_patches=map_patches(demo))
    return render_track(world, track).permute(1, 0, 2, 3)[None]


@register_family
class DemoWorldFamily(ModelFamily):
    name = "demo-world"

    def __init__(self, world: DemoModel):
        self.world = world
        self.tracks: list = []  # the runner's camera tracks, one per batch item, grown before each chunk
        self.context = None

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(getattr(model, WORLD, None), DemoModel)

    @classmethod
    def for_model(cls, model) -> DemoWorldFamily:
        return cls(getattr(model, WORLD))

    def describe(self) -> str:
        return "the demo world"

    def check_model(self, model) -> None:
        """Nothing to refuse: the loader built this module tree from a steered-world file."""

    def latent_channels(self, model) -> int:
        """3: the latent is the RGB video (the input's other channels are the moved reference frame)."""
        return self.world.channels

    def geometry(self, model) -> VideoGeometry:
        """The latent is the video: a pixel per latent pixel, a frame per latent frame, the model's own patches."""
        return VideoGeometry(spatial=1, temporal=1, patch=int(model.patch_embedding.weight.shape[-1]))

    def own_rollout(self) -> tuple:
        return self.world.frames_per_block, self.world.schedule

    def start_image_in_first_chunk(self, schedule) -> bool:
        return False  # the start view is committed context, whatever the solver

    def live_variant(self) -> str:
        return VARIANT

    @property
    def rope_max_distance(self) -> int:
        return self.world.rope_max_distance

    def make_runner(self, model, **kw):
        if model is not self.world.model:
            raise FastARError("the demo world's module tree was replaced after loading; load the file again")
        return self.world.world_runner(self.tracks, family=self, **kw)

    # -- rollout checks -------------------------------------------------------------------------------------
    def check_rollout(self, cfg, cond) -> None:
        w = self.world
        if cfg.sampler_mode != "chunk":
            raise FastARError("the demo world runs in sampler mode 'chunk'")
        schedule = get_schedule(cfg.schedule)
        if schedule != w.schedule:
            raise FastARError(f"schedule {schedule.name}: the demo world samples with its file's {w.schedule.name} "
                              "(choose the sampler's schedule \"model's own\")")
        if cfg.frames_per_block != w.frames_per_block:
            raise FastARError(f"frames_per_block {cfg.frames_per_block}: the demo world was trained with chunks of "
                              f"{w.frames_per_block} frame(s)")
        if (cfg.latent_height, cfg.latent_width) != tuple(w.frame_size) or cfg.channels != w.channels:
            raise FastARError(f"the demo world's frames are {w.frame_size[1]}x{w.frame_size[0]} with {w.channels} "
                              f"channels; the rollout asks {cfg.latent_width}x{cfg.latent_height} with {cfg.channels}")
        if cfg.context_noise != w.context_noise:
            raise FastARError(f"context_noise {cfg.context_noise:g}: the demo world's file says {w.context_noise:g}")
        if cond.prompts is not None:
            raise FastARError("the demo world takes no prompt: its file holds its own")
        if cond.place is None:
            raise FastARError("the demo world needs the camera's start on its map (Conditioning.place: x, y)")
        if cond.actions is None:
            raise FastARError("the demo world is steered by keys: give Conditioning.actions (the demo_world variant)")
        cond.actions.check_layout(ActionLayout(num_keys=len(ACTIONS), mouse=False))
        if cond.actions.time_stride != 1:
            raise FastARError("the demo world takes one action per frame (time_stride 1): its latent is the video")
        x, y = cond.place
        self.tracks[:] = [track_from_actions([], start=(x, y), map_patches=map_patches(w)) for _ in range(cfg.batch)]

    def before_chunk(self, cond, frame_start: int, frames: int) -> None:
        """The camera track up to the chunk's last frame, from the actions (asked of a live source here)."""
        end = frame_start + frames
        cond.actions.require(end)
        for track in self.tracks:
            for t in range(len(track), end):
                track.extend("none" if t < self.world.frames_per_block else self.action_at(cond.actions, t))

    def camera(self, frame: int) -> tuple:
        """The camera's place on the map at ``frame`` ((x, y) in patches; the first track's)."""
        return tuple(int(v) for v in self.tracks[0].positions[frame])

    @staticmethod
    def action_at(actions, frame: int) -> str:
        row = actions.keyboard[frame]
        if not bool(((row == 0) | (row == 1)).all()) or int(row.sum()) != 1:
            raise FastARError(f"the demo world's action of frame {frame} is {row.tolist()}; one of "
                              f"{', '.join(ACTIONS)} (one-hot) per frame")
        return ACTIONS[int(row.argmax())]

    # -- the forward's hooks --------------------------------------------------------------------------------
    def encode_context(self, runner, cond, segment):
        if self.context is None:
            self.context = self.world.world_prompt()
        return runner.encode_text(self.context)
