"""The demo world's rollout inputs as the nodes pass them: Demo World Start's place on the map and the actions (an
Action Script of the ``demo_world`` variant, or a live play), checked against the MODEL and the sampler's size."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.demo.family import VARIANT, map_patches, start_view
from ..fastar_core.rollout.action_script import ActionScript
from ..fastar_core.rollout.actions import Actions
from ..fastar_core.rollout.conditioning import Conditioning
from ..fastar_core.rollout.live_actions import LivePlay
from .constants import DEMO_WORLD_START_KEY
from .family_inputs import FamilyInputs, SamplerInputs
from .prompting import ARPromptSchedule, conditioning_entry


@dataclass
class DemoWorldInputs(FamilyInputs):
    map_seed: int
    place: tuple  # (x, y) in patches, on the model's map
    actions: object  # an ActionScript (demo_world) or a LivePlay
    latent_frames: int  # of the video: the latent is the video, one frame each
    still_frames: int  # the start view's frames (the model's chunk), held still
    notes: list = field(default_factory=list)

    @property
    def start_frames(self) -> int:
        return self.still_frames

    def check_batch(self, batch: int) -> None:
        if batch != 1 and isinstance(self.actions, LivePlay):
            raise FastARError(f"a live play makes one video; batch_size is {batch}")

    def initial_latents(self, model, r: int) -> torch.Tensor:
        return start_view(model.family.world, self.map_seed, self.place).to(model.device)

    def conditioning(self, model, r: int) -> Conditioning:
        if isinstance(self.actions, LivePlay):
            actions = self.actions.actions(still_frames=self.still_frames)
        else:
            keyboard, _ = self.actions.to_tensors(self.latent_frames)
            actions = Actions(keyboard, None, time_stride=1)
        return Conditioning(actions=actions, place=self.place)

    def describe(self) -> str:
        where = f"map {self.map_seed} from ({self.place[0]}, {self.place[1]})"
        if isinstance(self.actions, LivePlay):
            return f"{where}, played live"
        return f"{where}, actions {self.actions.describe(self.latent_frames)}"


def read_demo_world_inputs(model, given: SamplerInputs) -> DemoWorldInputs:
    """The demo world's reader: refuse what does not fit the MODEL, naming the input to change."""
    world = model.family.world
    if given.from_guider or isinstance(given.positive, ARPromptSchedule):
        raise FastARError("the MODEL is the demo world, which takes no text: use the Long Video Sampler (or Live "
                          "World) with Demo World Start connected to 'positive'")
    _, extras = conditioning_entry(given.positive, "positive")
    start = extras.get(DEMO_WORLD_START_KEY)
    if not isinstance(start, dict):
        raise FastARError("the MODEL is the demo world: connect Demo World Start (its map and the camera's start) to "
                          "'positive'")
    height, width = world.frame_size
    if (given.latent_h, given.latent_w) != (height, width):
        raise FastARError(f"the demo world's frames are {width}x{height} pixels; set width {width} and height "
                          f"{height} (got {given.latent_w}x{given.latent_h})")
    if given.latent_frames <= world.frames_per_block:
        raise FastARError(f"length {given.latent_frames}: the demo world's start view is {world.frames_per_block} "
                          "frame(s); make the video longer")
    actions = given.actions
    if actions is None:
        raise FastARError("the demo world is steered by keys: connect an Action Script (variant demo_world) to "
                          "'actions'")
    variant = actions.variant.name if isinstance(actions, LivePlay) else getattr(actions, "variant", None)
    if not isinstance(actions, (ActionScript, LivePlay)):
        raise FastARError(f"'actions' is a {type(actions).__name__}; connect an Action Script node")
    if variant != VARIANT:
        raise FastARError(f"the Action Script is for {variant}, but this MODEL is the demo world: set its variant to "
                          f"{VARIANT}")
    patches = map_patches(world)
    place = (int(start["x"]) % patches, int(start["y"]) % patches)
    return DemoWorldInputs(int(start["map_seed"]), place, actions, given.latent_frames, world.frames_per_block)
