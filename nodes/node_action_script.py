"""Action Script: the keys (and mouse moves) that steer a world model's rollout, written as a timeline: Matrix-Game
2.0's keyboard and mouse, or LingBot-World 2.0's camera (variant ``lingbot``, turned into poses by the motion model
of ``fastar_core/rollout/camera_motion.py``)."""

from __future__ import annotations

from ..fastar_core.rollout.action_script import DEFAULT_FPS, MAX_FPS, VARIANTS, parse_with_choices
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
                  "held); no mouse. lingbot (LingBot-World 2.0's camera, at 16 fps): W S walk, A D strafe, I K (or "
                  "up down) look, J L (or left right) turn; 'turn_rate 16', 'look_rate 7', 'fov 79' lines change "
                  "the motion model. '#' starts a comment. A JSON object {\"timeline\": [{\"at\": 0, \"keys\": "
                  "[\"W\"]}, ...]} works too.")


KEY_VARIANTS = list(VARIANTS)


def script_from_widgets(variant, fps, script):
    """The script as the node's inputs give it; each input is checked by type there (a linked input can carry
    anything: a list where the variant's name goes, text where fps goes)."""
    return parse_with_choices(script, variant, fps, "Action Script")


class ActionScriptNode:
    DESCRIPTION = ("Steers a world model: a timeline of keys and mouse moves, in seconds of video, each held until "
                   "the next line, with the keys of the chosen variant (its model's own). The Long Video Sampler turns "
                   "it into per-frame keyboard and mouse actions for the video's length (Matrix-Game 2.0), or into a "
                   "camera path by a documented motion model (LingBot-World 2.0, variant lingbot: a held key keeps "
                   "walking or turning, at 1 unit and 16 degrees a second); lines past the end are listed in its "
                   "report. A bad line is refused when the prompt is queued, "
                   "with the line and the valid keys.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "variant": combo(KEY_VARIANTS, "The model this steers: Matrix-Game 2.0 universal (keyboard and mouse), "
                                             "gta_drive (driving: W S and steering), templerun (keyboard only), or "
                                             "lingbot (LingBot-World 2.0's camera). The sampler refuses a script for "
                                             "another model."),
            "fps": float_input(DEFAULT_FPS, 1.0, MAX_FPS, "Video frames per second the times are counted in (12: "
                                                          "the rate Matrix-Game 2.0's own videos are written at; 16 "
                                                          "for LingBot-World 2.0; use your Create Video fps).",
                               step=1.0),
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
        # Linked inputs arrive only at run time; the widgets' values are checked when the prompt is queued. A bad
        # script raises: ComfyUI reports a returned message once per input this function takes (three times here),
        # a raised one once.
        if not isinstance(script, str) or not isinstance(variant, str) or not isinstance(fps, (int, float)):
            return True
        script_from_widgets(variant, fps, script)
        return True

    def build(self, variant, fps, script):
        parsed = script_from_widgets(variant, fps, script)
        return (parsed, parsed.describe())
