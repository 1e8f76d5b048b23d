"""Action Script: the keys and mouse moves that steer a Matrix-Game 2.0 rollout, written as a timeline."""

from __future__ import annotations

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.action_script import DEFAULT_FPS, MAX_FPS, VARIANTS, parse_text
from .constants import ACTIONS, CATEGORY
from .inputs import combo, float_input, string_input

EXAMPLE = """# seconds  keys  [mouse pitch yaw]: each line holds until the next
0    W
2    W L
3.5  W A
5    -  mouse 0 -0.05
"""
SCRIPT_TOOLTIP = ("One line per change: the time in seconds, the keys held from then on ('-' for none), optionally "
                  "'mouse <pitch> <yaw>' per frame. universal: W S A D move, I K J L turn the camera (by "
                  "mouse_step, 0.1 per frame unless a 'mouse_step' line says otherwise). gta_drive: W S drive, A D "
                  "steer. templerun: one of W jump, S slide, A/D side, Z/C turn, Q no move (also when no key is "
                  "held); no mouse. '#' starts a comment. A JSON object {\"timeline\": [{\"at\": 0, \"keys\": "
                  "[\"W\"]}, ...]} works too.")


# LingBot-World 2.0's camera timelines (variant lingbot) have no sampler input yet: not offered here.
KEY_VARIANTS = [name for name, spec in VARIANTS.items() if not spec.camera]


def script_from_widgets(variant: str, fps: float, script: str):
    return parse_text(script, "Action Script", variant=variant, fps=float(fps))


class ActionScriptNode:
    DESCRIPTION = ("Steers a Matrix-Game 2.0 world model: a timeline of keys and mouse moves, in seconds of video, "
                   "each held until the next line, with the keys of the chosen variant (its model's own). The Long "
                   "Video Sampler turns it into per-frame keyboard and mouse actions for the video's length; "
                   "lines past the end are listed in its report. A bad line is refused when the prompt is queued, "
                   "with the line and the valid keys.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "variant": combo(KEY_VARIANTS, "The Matrix-Game 2.0 checkpoint this steers: universal (keyboard and "
                                             "mouse), gta_drive (driving: W S and steering), templerun (keyboard "
                                             "only). The sampler refuses a script for another variant."),
            "fps": float_input(DEFAULT_FPS, 1.0, MAX_FPS, "Video frames per second the times are counted in (12: "
                                                          "the rate Matrix-Game 2.0's own videos are written at; "
                                                          "use your Create Video fps).", step=1.0),
            "script": string_input(EXAMPLE, SCRIPT_TOOLTIP, multiline=True),
        }}

    RETURN_TYPES = (ACTIONS, "STRING")
    RETURN_NAMES = ("actions", "summary")
    OUTPUT_TOOLTIPS = ("The actions, for the Long Video Sampler's 'actions' input.",
                       "The script as read: each entry's time, first frame and keys.")
    FUNCTION = "build"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, variant=None, fps=None, script=None):
        # Linked inputs arrive only at run time; the widgets' values are checked when the prompt is queued.
        if not isinstance(script, str) or not isinstance(variant, str) or not isinstance(fps, (int, float)):
            return True
        try:
            script_from_widgets(variant, fps, script)
        except FastARError as e:
            return str(e)
        return True

    def build(self, variant, fps, script):
        parsed = script_from_widgets(variant, fps, script)
        return (parsed, parsed.describe())
