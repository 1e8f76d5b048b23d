"""Demo World Start: where the bundled demo world begins, its map and the camera's place on it."""

from __future__ import annotations

from ..fastar_core.families.demo.steer_world import MAP_SIZE, STEP, VIEW_SIZE, make_map
from .constants import CATEGORY, DEMO_WORLD_START_KEY
from .host import get_host
from .inputs import int_input

MAP_PATCHES = MAP_SIZE // STEP


class DemoWorldStart:
    DESCRIPTION = ("The start of the bundled demo world (a camera over a wrapping map of landmarks, steered with "
                   "W A S D or the arrows; runs on a CPU): which map and where the camera starts. Connect it to "
                   "the Live World node's or the Long Video Sampler's 'positive', with the demo world MODEL "
                   "(world_model.safetensors) from Load AR Video Model.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "map_seed": int_input(1, 0, 2**31 - 1, "The map: every seed is another arrangement of ground and landmarks "
                                                   "(the world is a pure function of it)."),
            "x": int_input(MAP_PATCHES // 2, 0, 4095, f"The camera's start column on the map, in patches of {STEP} "
                                                     f"pixels (the map wraps every {MAP_PATCHES})."),
            "y": int_input(MAP_PATCHES // 2, 0, 4095, "The camera's start row on the map, in patches."),
        }}

    RETURN_TYPES = ("CONDITIONING",)
    RETURN_NAMES = ("positive",)
    OUTPUT_TOOLTIPS = ("The start view's pixels carrying the map and the place, for 'positive'.",)
    FUNCTION = "start"
    CATEGORY = CATEGORY

    def start(self, map_seed, x, y):
        # The tensor is the start view on the bundled map size, [1, pixels, RGB]; the samplers render the start from
        # the MODEL's own map (the same one for the bundled world) with the values beside it.
        view = make_map(map_seed).view(x % MAP_PATCHES * STEP, y % MAP_PATCHES * STEP)
        tokens = view.reshape(3, VIEW_SIZE * VIEW_SIZE).T[None].to(get_host().intermediate_device())
        return ([[tokens, {DEMO_WORLD_START_KEY: {"map_seed": int(map_seed), "x": int(x), "y": int(y)}}]],)
