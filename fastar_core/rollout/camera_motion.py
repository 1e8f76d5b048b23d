"""A motion model for camera-steered world models: keys held per video frame -> a camera pose per video frame.

LingBot-World 2.0 is steered by a camera path (``lingbot/camera.py``); a person writes keys instead
(``action_script.py``, variant ``lingbot``). This turns one into the other, as a first-person camera moves:

- **Start**: frame 0 is the identity pose (camera at the origin, level, looking along +z; OpenCV axes: x right,
  y down, z forward); frame 0's keys act from frame 1 on.
- **Moving** (W forward, S back, A left, D right): every video frame a move key is held, the camera moves by
  ``move_speed / fps`` along the ground in the direction it faces (its heading: looking up or down does not lift
  it). Two move keys together (W and D) move diagonally at the same speed, not faster. Opposite keys are refused
  by the script.
- **Turning** (J / left arrow, L / right arrow): the heading turns by ``turn_rate / fps`` degrees per frame held,
  about the world's vertical (positive to the right).
- **Looking** (I / up arrow, K / down arrow): the pitch changes by ``look_rate / fps`` degrees per frame held,
  positive up, held within +-``max_pitch`` degrees (a held key stops turning the camera at the limit).
- **Releasing** a key stops its motion at once: no inertia, no acceleration.

Only directions and ratios reach the model: the release expresses each latent frame's pose relative to the one
before and divides every translation by the path's largest, so ``move_speed`` sets no scale of its own (a walk at
any constant speed gives the same input); the turn rates are angles and do count. The defaults are the medians
of the release's own example paths over their frames labelled with one look key (``examples/00``-``02``,
``ijkl_action.npy``): about 1 degree a video frame for turning (16 per second at 16 fps) and 0.43 for looking (7
per second); ``tests/test_lingbot_reference.py`` measures them.

**Live play** (causal): ``KeyWalk`` is the model with its state kept (where the camera is, its heading and
pitch), advanced by the keys of the next video frames, so a live caller gets, chunk by chunk, the poses one whole
path would have. What a live caller cannot have is the release's divisor, the longest move of the whole path:
``live_translation_scale`` is the fixed one it divides by instead (the longest move a latent frame can make, 4
video frames walking straight ahead). ``lingbot/live.py`` (``KeyCamera``) turns both into the model's camera, one
call per chunk, equal bit for bit to the release's path maths replayed with that scale.
"""

from __future__ import annotations

import math

import numpy as np

from .actions import VAE_TIME_STRIDE

MOVE_SPEED = 1.0  # units per second (only ratios reach the model)
TURN_RATE = 16.0  # degrees per second of heading, J / L
LOOK_RATE = 7.0  # degrees per second of pitch, I / K
MAX_PITCH = 60.0  # degrees up or down
FOV = 79.0  # horizontal field of view in degrees of the intrinsics a key timeline gets (the release's examples')
REFERENCE_SIZE = (480, 832)  # height, width the intrinsics are given for


def rotation(heading: float, pitch: float) -> np.ndarray:
    """Camera-to-world rotation (OpenCV axes, world y down) of a camera turned by ``heading`` (radians, right
    positive) about the vertical, then tilted by ``pitch`` (radians, up positive) about its own x axis."""
    ch, sh, cp, sp = math.cos(heading), math.sin(heading), math.cos(pitch), math.sin(pitch)
    turn = np.array([[ch, 0.0, sh], [0.0, 1.0, 0.0], [-sh, 0.0, ch]])
    tilt = np.array([[1.0, 0.0, 0.0], [0.0, cp, -sp], [0.0, sp, cp]])
    return turn @ tilt


class KeyWalk:
    """The motion model run causally: hand it the keys held in the next video frames, get their poses. A walk
    starts at frame 0 (the identity pose, whatever is held in it) and remembers where the camera is, which way it
    faces and its pitch, so a live caller advances it chunk by chunk and gets the poses one whole path would
    have (``poses_from_keys`` is one call of it)."""

    def __init__(self, fps: float, move_speed: float = MOVE_SPEED, turn_rate: float = TURN_RATE,
                 look_rate: float = LOOK_RATE, max_pitch: float = MAX_PITCH):
        self.step = move_speed / fps
        self.turn = math.radians(turn_rate / fps)
        self.look = math.radians(look_rate / fps)
        self.limit = math.radians(max_pitch)
        self.position, self.heading, self.pitch = np.zeros(3), 0.0, 0.0
        self.frames = 0  # video frames walked so far

    def advance(self, held) -> np.ndarray:
        """Poses ``[N, 4, 4]`` (float64, camera-to-world) of the next ``N`` video frames, from what is held in each:
        ``held`` ``[N, 4]`` = (forward, right, up, turn right), each -1, 0 or 1 (S, A, K, J are the negative
        ones)."""
        held = np.asarray(held, dtype=np.float64).reshape(-1, 4)
        poses = np.zeros((held.shape[0], 4, 4))
        for f in range(held.shape[0]):
            if self.frames > 0:
                forward, right, up, turn_right = held[f]
                self.heading += turn_right * self.turn
                self.pitch = min(self.limit, max(-self.limit, self.pitch + up * self.look))
                along = np.array([math.sin(self.heading), 0.0, math.cos(self.heading)])
                across = np.array([math.cos(self.heading), 0.0, -math.sin(self.heading)])
                move = forward * along + right * across
                length = float(np.linalg.norm(move))
                if length > 0:
                    self.position = self.position + move / length * self.step
            poses[f, :3, :3] = rotation(self.heading, self.pitch)
            poses[f, :3, 3] = self.position
            poses[f, 3, 3] = 1.0
            self.frames += 1
        return poses


def poses_from_keys(held: np.ndarray, fps: float, move_speed: float = MOVE_SPEED, turn_rate: float = TURN_RATE,
                    look_rate: float = LOOK_RATE, max_pitch: float = MAX_PITCH) -> np.ndarray:
    """Camera-to-world poses ``[N, 4, 4]`` (float64) from what is held in each of ``N`` video frames: ``held``
    ``[N, 4]`` = (forward, right, up, turn right), each -1, 0 or 1 (S, A, K, J are the negative ones)."""
    return KeyWalk(fps, move_speed, turn_rate, look_rate, max_pitch).advance(held)


def live_translation_scale(fps: float, move_speed: float = MOVE_SPEED,
                           video_frames_per_step: int = VAE_TIME_STRIDE) -> float:
    """The translation a live camera divides every move by: the longest one step (a latent frame, 4 video frames)
    can make, walking straight ahead the whole time. A steered path whose longest move is such a walk gets the
    release's own normalisation from it (up to the rounding of the release's division)."""
    return video_frames_per_step * move_speed / fps


def intrinsics_for_fov(fov: float = FOV) -> np.ndarray:
    """``[fx, fy, cx, cy]`` of a centred pinhole with horizontal field of view ``fov`` degrees, in pixels of the
    480 x 832 video camera paths are given for."""
    height, width = REFERENCE_SIZE
    focal = (width / 2) / math.tan(math.radians(fov) / 2)
    return np.array([focal, focal, width / 2, height / 2])
