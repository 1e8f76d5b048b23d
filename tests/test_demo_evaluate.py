"""The rollout bar: the real world passes; noise, frozen, flat, smeared and emptied videos fail."""

import pytest
import torch

from comfyui_fastar.tools.demo.evaluate import Thresholds, colour_masks, evaluate_rollout
from comfyui_fastar.tools.demo.world import PALETTE, make_scene, palette_tensor

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = (0, 1, 2, 3)
FRAMES = 120


def _scene_video(seed, frames=FRAMES):
    scene = make_scene(seed)
    return scene, scene.render(frames)


def _judge(scene, video):
    return evaluate_rollout(video, scene.background(), reference_areas=scene.sprite_areas())


@pytest.mark.parametrize("seed", SEEDS)
def test_the_rendered_video_passes(seed):
    scene, video = _scene_video(seed)
    report = _judge(scene, video)
    assert report["passed"], report["summary"]
    assert set(report["colours"]) == set(scene.colours)


@pytest.mark.parametrize("seed", SEEDS)
def test_collapse_to_noise_fails_on_the_background(seed):
    scene, video = _scene_video(seed)
    g = torch.Generator().manual_seed(seed)
    noise = torch.rand(video[3:].shape, generator=g) * 2 - 1
    report = _judge(scene, torch.cat([video[:3], noise]))
    assert not report["passed"]
    assert not report["checks"]["background"]
    assert report["summary"]["background_psnr_low_quantile_db"] < 15


@pytest.mark.parametrize("seed", SEEDS)
def test_a_frozen_frame_fails_on_motion_only(seed):
    scene, video = _scene_video(seed)
    frozen = torch.cat([video[:3], video[2:3].expand(FRAMES - 3, -1, -1, -1)])
    report = _judge(scene, frozen)
    assert not report["passed"]
    assert report["checks"] == {"background": True, "areas": True, "no_new_colours": True, "motion": False}


def test_a_drift_into_noise_midway_fails():
    scene, video = _scene_video(0)
    g = torch.Generator().manual_seed(0)
    drifted = video.clone()
    ramp = torch.linspace(0, 1, FRAMES)[:, None, None, None].clamp(min=0) ** 2
    drifted = (1 - ramp) * drifted + ramp * (torch.rand(video.shape, generator=g) * 2 - 1)
    report = _judge(scene, drifted)
    assert not report["passed"]
    psnr = report["curves"]["background_psnr_db"]
    assert psnr[5] > psnr[-1] + 15  # the per-frame curve shows the drift


def test_a_flat_background_with_the_right_sprites_fails_on_the_background():
    scene, video = _scene_video(1)
    background = scene.background()
    flat = video - background + background.mean(dim=(1, 2), keepdim=True)
    report = _judge(scene, torch.cat([video[:3], flat[3:]]))
    assert report["checks"]["areas"] and report["checks"]["motion"]
    assert not report["checks"]["background"]


def test_vanished_sprites_fail_on_areas():
    scene, video = _scene_video(2)
    empty = scene.background()[None].expand(FRAMES - 3, -1, -1, -1)
    report = _judge(scene, torch.cat([video[:3], empty]))
    assert not report["checks"]["areas"] and not report["passed"]


def test_a_new_colour_blob_fails():
    scene, video = _scene_video(11)  # one red sprite
    assert scene.colours == ["red"]
    painted = video.clone()
    new = next(i for i, name in enumerate(PALETTE) if name not in scene.colours)
    painted[3:, :, 2:8, 2:8] = palette_tensor()[new][:, None, None]
    report = _judge(scene, painted)
    assert not report["checks"]["no_new_colours"]


def test_colour_masks_pick_the_nearest_palette_colour_within_tolerance():
    pal = palette_tensor()
    pixels = torch.stack([pal[0], pal[0] * 0.9, torch.zeros(3), pal[3]])  # red, dull red, grey, yellow
    masks = colour_masks(pixels.T.reshape(1, 3, 1, 4), pal, Thresholds().colour_tolerance)[0, :, 0]
    assert masks[0].tolist() == [True, True, False, False]
    assert masks[3].tolist() == [False, False, False, True]


def test_per_frame_backgrounds_judge_a_moving_background():
    """A camera panning one pixel per frame (the background rolled sideways, sprites left where they are): judged
    against each frame's own background it passes; against the first frame's, it fails on the background."""
    scene, video = _scene_video(1, 60)
    background = scene.background()
    moving = torch.stack([background.roll(t, dims=-1) for t in range(60)])
    panned = video - background + moving
    report = evaluate_rollout(panned, moving, reference_areas=scene.sprite_areas())
    assert report["passed"], report["summary"]
    assert not evaluate_rollout(panned, background, reference_areas=scene.sprite_areas())["checks"]["background"]
    with pytest.raises(ValueError, match="per-frame backgrounds"):
        evaluate_rollout(panned, moving[:-1])
