"""LingBot-World 2.0 steered live: the key motion model run causally (``families/lingbot/live.py``) makes, chunk by
chunk, the camera its whole path makes with the same fixed translation scale, and a rollout steered live equals the
rollout of the replayed path bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_lingbot import LATENT_HW, PIXELS, TINY

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.families.lingbot.camera import CameraPath, check_path, frame_motion
from comfyui_fastar.fastar_core.families.lingbot.live import KeyCamera, held_row
from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.families.lingbot.rollout import lingbot_conditioning, rollout_config
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.camera_motion import live_translation_scale, poses_from_keys
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def played(video_frames: int, seed: int = 0) -> np.ndarray:
    """Keys a person might hold: a walk that turns, looks, strafes, backs up and stops, changing every few
    frames (not on latent frame boundaries)."""
    rng = np.random.default_rng(seed)
    moves = [held_row(k) for k in (["W"], ["W", "L"], ["W", "I"], ["D"], ["S", "J"], [], ["W", "K"], ["A", "L"])]
    rows, frame = [], 0
    while frame < video_frames:
        hold = int(rng.integers(1, 11))
        rows += [moves[int(rng.integers(len(moves)))]] * hold
        frame += hold
    return np.array(rows[:video_frames])


def replay(held: np.ndarray, latent_frames: int, scale: float) -> torch.Tensor:
    """The whole path of the same keys through the release's path maths, divided by ``scale``: the video of
    ``latent_frames`` takes its first ``4 (T - 1) + 1`` video frames."""
    camera = KeyCamera(*PIXELS)
    path = CameraPath(poses_from_keys(held[:4 * (latent_frames - 1) + 1], 16.0), camera.intrinsics_480x832)
    return path.latent_motion(latent_frames, scale=scale)


@pytest.mark.parametrize("cuts", [[13, 16, 16, 16], [1, 3, 9, 4, 12, 7, 1, 27], [65]])
def test_chunk_by_chunk_equals_the_replayed_path_bit_for_bit(cuts):
    held = played(sum(cuts), seed=len(cuts))
    camera = KeyCamera(*PIXELS)
    pieces, at = [], 0
    for n in cuts:
        pieces.append(camera.advance(held[at:at + n]))
        at += n
    motion = torch.cat(pieces)
    latent = (sum(cuts) - 1) // 4 + 1
    assert motion.shape == (latent, 4, 4) and camera.latent_frames == latent
    assert torch.equal(motion, replay(held, latent, camera.scale))
    # A path played further keeps the frames already made: nothing waits for the path's end.
    longer = played(sum(cuts) + 40, seed=len(cuts))
    longer[:sum(cuts)] = held
    assert torch.equal(replay(longer, latent + 10, camera.scale)[:latent], motion)


def test_the_fixed_scale_is_the_releases_own_normalisation_where_the_longest_move_is_a_straight_walk():
    held = played(4 * 40 + 1, seed=3)
    held[:9] = held_row(["W"])  # two latent frames of walking straight ahead: the longest move a step can make
    camera = KeyCamera(*PIXELS)
    motion = camera.advance(held)
    path = CameraPath(poses_from_keys(held, 16.0), camera.intrinsics_480x832)
    release = path.latent_motion(41)  # divided by the longest move, which float32 rounding puts at 0.25 (1 + 1e-6)
    assert camera.scale == live_translation_scale(16.0) == 0.25
    assert torch.allclose(motion, release, rtol=0, atol=4e-6)
    assert torch.equal(motion, path.latent_motion(41, scale=camera.scale))
    assert torch.isclose(motion[1:3, :3, 3].norm(dim=-1), torch.tensor(1.0)).all()
    # Without a full latent frame of straight walking the release would divide by a shorter move; the live
    # camera keeps its scale (a turning walk's steps stay below 1).
    turning = np.tile(held_row(["W", "L"]), (4 * 10 + 1, 1))
    live = KeyCamera(*PIXELS).advance(turning)
    assert live[1:, :3, 3].norm(dim=-1).max() < 1.0
    assert frame_motion(torch.from_numpy(poses_from_keys(turning, 16.0)[::4]).float())[1:, :3, 3].norm(
        dim=-1).max() == pytest.approx(1.0)


def tiny_rollout(camera, frames: int, seed: int = 0):
    model = random_lingbot(TINY, seed=5)
    g = torch.Generator().manual_seed(seed)
    cond = lingbot_conditioning(torch.randn(1, 8, TINY.text_dim, generator=g),
                                torch.randn(1, 16, frames, *LATENT_HW, generator=g), camera)
    return ARSampler(CausalRunner(model)).generate(cond, rollout_config(model.config, frames, *LATENT_HW))


def test_a_rollout_steered_live_equals_the_replayed_path_bit_for_bit():
    frames = 24  # 6 chunks of 4: the window of 18 rolls
    held = played(4 * (frames - 1) + 1, seed=7)
    asked = []

    def keys(first, last):  # what a live node hands over before each chunk: the keys of its video frames
        asked.append((first, last))
        return held[first:last]

    live = KeyCamera(*PIXELS, held=keys)
    ours = tiny_rollout(live.conditioning(), frames)
    assert asked == [(0, 13)] + [(13 + 16 * i, 29 + 16 * i) for i in range(5)]  # one call per chunk
    path = check_path(poses_from_keys(held, 16.0), live.intrinsics_480x832)
    replayed = tiny_rollout(path.condition(frames, *PIXELS, scale=live.scale), frames)
    assert torch.equal(ours.latent, replayed.latent)
    other = tiny_rollout(path.condition(frames, *PIXELS), frames)  # the release's divisor: another video
    assert not torch.equal(other.latent, ours.latent)


def test_bad_keys_and_sources_are_refused_by_name():
    with pytest.raises(FastARError, match="'Q' is not a lingbot key"):
        held_row(["Q"])
    assert list(held_row(["up", "right", "W"])) == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(FastARError, match="each in -1..1"):
        KeyCamera(*PIXELS).advance([[2.0, 0, 0, 0]])
    with pytest.raises(FastARError, match="positive number"):
        KeyCamera(*PIXELS, scale=0.0)
    with pytest.raises(FastARError, match="needs a source of held keys"):
        KeyCamera(*PIXELS).conditioning()
    short = KeyCamera(*PIXELS, held=lambda first, last: np.zeros((last - first - 1, 4))).conditioning()
    with pytest.raises(FastARError, match="gave 12 video frames; 0..12 are 13"):
        short.require(4)
    broken = KeyCamera(*PIXELS, held=lambda first, last: None)
    broken.held = None
    with pytest.raises(FastARError, match="no source of held keys"):
        broken.pull(0, 4)
