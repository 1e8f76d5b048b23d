"""LingBot-World 2.0 steered live from keys: the key motion model run causally, one chunk at a time.

The release turns a whole camera path into the model's input at once (``camera.py``): its latent frames' poses,
each as its motion since the frame before, every translation divided by **the longest of the whole path**. A
person at the keys has not played the rest of the path yet, so a live camera cannot know that divisor, and a
divisor learnt later would change the rays of frames already made. ``KeyCamera`` therefore divides by a **fixed
translation scale**, given up front: by default ``camera_motion.live_translation_scale(fps, move_speed)``, the
longest move one latent frame can make (4 video frames walking straight ahead, ``4 * move_speed / fps``), so a
straight walk is a translation of length 1, as it is in any released path whose longest move is a walk.

Everything else is the release's maths, done frame by frame: the keys held in each video frame walk the camera
(``camera_motion.KeyWalk``: speeds, turn rates and what a held key does are documented there); latent frame ``t``
takes the pose of video frame ``4 t`` (``camera.key_poses``, as a resampled path holds a point on a pose); it is
expressed in latent frame 0's camera and then as its motion since latent frame ``t - 1``
(``camera.in_camera_of``, ``camera.steps_between``); its translation is divided by the scale.

**Exactness.** The motion of latent frames ``0 .. T - 1`` made by any sequence of ``advance`` calls equals, bit for
bit, ``CameraPath(poses, intrinsics).latent_motion(T, scale=scale)`` of the same keys' whole path: the release's
path maths with the same divisor (``tests/test_lingbot_live.py``). Where the played path's longest move is the scale
(a latent frame of walking straight ahead), that is the release's own normalisation of the path, up to the
rounding of the release's computed divisor.

One call per chunk: ``camera.advance(held)`` with the keys held in each of the chunk's video frames (``[n, 4]``
rows of (forward, right, up, turn right), ``held_row`` makes one from a lingbot variant's letters) returns the motion
of the latent frames they complete; or give the camera a ``held`` source and hand ``conditioning()`` to the rollout,
which pulls the keys of each chunk before it runs (``CameraConditioning.require``, from the family's
``before_chunk``). The first chunk's latent frame 0 is video frame 0; each later latent frame takes 4 video frames.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...errors import FastARError
from ...rollout.action_script import VARIANTS
from ...rollout.actions import VAE_TIME_STRIDE, pixel_frames
from ...rollout.camera_motion import (
    FOV,
    LOOK_RATE,
    MAX_PITCH,
    MOVE_SPEED,
    TURN_RATE,
    KeyWalk,
    intrinsics_for_fov,
    live_translation_scale,
)
from .camera import (
    CameraConditioning,
    divide_translations,
    in_camera_of,
    key_poses,
    scaled_intrinsics,
    steps_between,
)
from .config import VAE_STRIDE

# (video frames known, video frames needed) -> the keys held in each of those frames, [needed - known, 4]
HeldSource = Callable[[int, int], object]
LIVE_FPS = VARIANTS["lingbot"].default_fps


def held_row(letters) -> np.ndarray:
    """The (forward, right, up, turn right) row of lingbot keys held together (letters or names: 'W', 'left')."""
    variant = VARIANTS["lingbot"]
    row = np.zeros(4)
    for name in letters:
        key = variant.key(str(name))
        if key is None:
            raise FastARError(f"{name!r} is not a lingbot key; valid: {variant.valid_keys()}")
        row += np.asarray(key.motion)
    return np.clip(row, -1.0, 1.0)


class KeyCamera:
    """A LingBot-World 2.0 camera steered by keys as they are pressed (see the module docstring)."""

    def __init__(self, height: int, width: int, fps: float = LIVE_FPS, scale: float | None = None,
                 move_speed: float = MOVE_SPEED, turn_rate: float = TURN_RATE, look_rate: float = LOOK_RATE,
                 max_pitch: float = MAX_PITCH, fov: float = FOV, held: HeldSource | None = None):
        if height % VAE_STRIDE or width % VAE_STRIDE or height <= 0 or width <= 0:
            raise FastARError(f"video size {height}x{width} must be a positive multiple of {VAE_STRIDE} pixels")
        self.scale = live_translation_scale(fps, move_speed) if scale is None else float(scale)
        if not self.scale > 0 or not np.isfinite(self.scale):
            raise FastARError(f"the live camera's translation scale must be a positive number, got {self.scale!r}")
        self.walk = KeyWalk(fps, move_speed, turn_rate, look_rate, max_pitch)
        self.intrinsics_480x832 = intrinsics_for_fov(fov)
        self.intrinsics = tuple(float(v) for v in scaled_intrinsics(torch.from_numpy(self.intrinsics_480x832),
                                                                    height, width))
        self.height, self.width = height, width
        self.held = held
        self.latent_frames = 0  # latent frames whose motion has been made
        self._first: torch.Tensor | None = None  # latent frame 0's pose, float32 [1, 4, 4]
        self._previous = torch.eye(4)[None]  # the last latent frame's pose in frame 0's camera

    def advance(self, held) -> torch.Tensor:
        """Walk the next video frames with the keys ``held`` in each (``[n, 4]``) and return the motion
        ``[k, 4, 4]`` of the ``k`` latent frames they complete (possibly none)."""
        held = np.asarray(held, dtype=np.float64).reshape(-1, 4)
        if not np.isfinite(held).all() or np.abs(held).max(initial=0.0) > 1.0:
            raise FastARError("held keys must be rows of (forward, right, up, turn right), each in -1..1")
        start = self.walk.frames
        poses = self.walk.advance(held)
        # Video frame v is latent frame v / 4 when 4 divides it.
        on_latent = [i for i in range(poses.shape[0]) if (start + i) % VAE_TIME_STRIDE == 0]
        if not on_latent:
            return torch.zeros(0, 4, 4)
        latent = torch.from_numpy(key_poses(poses[on_latent])).float()
        rows = []
        if self._first is None:
            self._first = latent[:1]
            rows.append(torch.eye(4)[None])
            latent = latent[1:]
        if latent.shape[0]:
            in_first = in_camera_of(self._first, latent)
            rows.append(steps_between(self._previous, in_first))
            self._previous = in_first[-1:]
        motion = divide_translations(torch.cat(rows), torch.tensor(self.scale))
        self.latent_frames += motion.shape[0]
        return motion

    def pull(self, known: int, need: int) -> torch.Tensor:
        """The ``CameraConditioning`` source: the motion of latent frames ``known .. need - 1``, walked with the
        keys the ``held`` source gives for their video frames."""
        if self.held is None:
            raise FastARError("this live camera has no source of held keys; call advance() with each chunk's keys")
        if known != self.latent_frames:
            raise FastARError(f"the live camera has made {self.latent_frames} latent frames; asked from {known}")
        first, last = self.walk.frames, pixel_frames(need)
        held = np.asarray(self.held(first, last), dtype=np.float64).reshape(-1, 4)
        if held.shape[0] != last - first:
            raise FastARError(f"the held-keys source gave {held.shape[0]} video frames; {first}..{last - 1} are "
                              f"{last - first}")
        return self.advance(held)

    def conditioning(self) -> CameraConditioning:
        """A rollout's camera that asks this one for each chunk's motion (needs a ``held`` source)."""
        if self.held is None:
            raise FastARError("a live camera's conditioning needs a source of held keys (KeyCamera(held=...))")
        return CameraConditioning(torch.zeros(0, 4, 4), self.intrinsics, self.height, self.width, source=self.pull)
