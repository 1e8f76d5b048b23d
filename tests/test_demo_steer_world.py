"""The steered world: a wrapping map, whole-patch camera moves, paths that come back, and the judge of rollouts."""

import pytest
import torch

from comfyui_fastar.fastar_core.families.demo.steer_world import (
    ACTIONS,
    MAP_SIZE,
    STEP,
    VIEW_SIZE,
    make_map,
    random_actions,
    render_track,
    revisit_path,
    scripted_path,
    track_from_actions,
)
from comfyui_fastar.tools.demo.world_eval import evaluate_world, followed_moves

pytestmark = pytest.mark.usefixtures("one_thread")
PATCHES = MAP_SIZE // STEP


def test_maps_are_seeded_wrap_at_the_edges_and_hold_spaced_landmarks():
    a, b, c = make_map(4), make_map(4), make_map(5)
    assert torch.equal(a.image(), b.image()) and not torch.equal(a.image(), c.image())
    # A map of the same seed and size with other landmarks is drawn afresh, not read from the first one's image.
    assert not torch.equal(make_map(4, landmarks=3).image(), a.image())
    img = a.image()
    assert img.shape == (3, MAP_SIZE, MAP_SIZE) and img.min() >= -1 and img.max() <= 1
    assert torch.equal(a.view(MAP_SIZE - 8, MAP_SIZE - 4), torch.roll(img, (4, 8), (1, 2))[:, :VIEW_SIZE, :VIEW_SIZE])
    assert torch.equal(a.view(3, 7), a.view(3 + MAP_SIZE, 7 - MAP_SIZE))
    for seed in range(6):
        lms = make_map(seed).landmarks
        assert 16 <= len(lms) <= 24
        assert len({(lm.shape, lm.colour) for lm in lms}) == len(lms)  # each one can be told apart
    # The ground is muted (most pixels nearly grey), the coloured landmarks saturated.
    sat = img.max(0).values - img.min(0).values
    assert (sat > 0.8).float().mean() > 0.03 and (sat < 0.3).float().mean() > 0.5


@pytest.mark.parametrize("action", ACTIONS)
def test_the_next_view_is_the_last_one_shifted_by_the_action_plus_a_strip(action):
    world = make_map(2)
    track = track_from_actions([action], start=(PATCHES - 1, 0))  # at the wrap edge
    a, b = render_track(world, track)
    dx, dy = {"none": (0, 0), "up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[action]
    shifted = torch.roll(b, (dy * STEP, dx * STEP), (1, 2))  # undo the camera move
    keep = (slice(None), slice(max(0, dy * STEP), VIEW_SIZE + min(0, dy * STEP)),
            slice(max(0, dx * STEP), VIEW_SIZE + min(0, dx * STEP)))
    assert torch.equal(shifted[keep], a[keep])
    if action != "none":
        assert not torch.equal(a, b)


def test_scripted_paths_come_back_and_revisit_paths_leave_the_view_first():
    for path in (scripted_path(96, side=8), revisit_path(56, away=12)):
        track = track_from_actions(path, start=(5, 9))
        returns = [t for t in range(1, len(track)) if tuple(track.positions[t].tolist()) == (5, 9)]
        assert returns, "the path never comes back to its start"
    track = track_from_actions(revisit_path(26, away=12), start=(0, 0))
    far = max(int(p[0]) for p in track.positions)
    assert far * STEP >= VIEW_SIZE  # the start view had left the screen entirely
    assert set(random_actions(__import__("numpy").random.default_rng(0), 400)) == set(ACTIONS)


def test_a_track_refuses_an_unknown_key():
    track = track_from_actions(["left"])
    with pytest.raises(ValueError, match="unknown action 'jump'"):
        track.extend("jump")
    assert track.positions[-1].tolist() == [PATCHES - 1, 0]


def test_the_judge_passes_the_truth_and_fails_frozen_reversed_and_washed_out_videos():
    world = make_map(7)
    track = track_from_actions(scripted_path(60, side=6), start=(3, 3))
    truth = render_track(world, track)
    good = evaluate_world(truth, truth, track, start_frames=3)
    assert good["passed"] and good["action_following"] >= 0.98 and good["carried_psnr_db"] == float("inf")
    assert good["revisit"]["views"] > 0 and good["revisit"]["psnr_vs_truth_db"] == float("inf")

    frozen = truth[:1].expand_as(truth).clone()
    bad = evaluate_world(frozen, truth, track, start_frames=3)
    assert not bad["checks"]["action_following"] and not bad["passed"]
    reverse = {"left": "right", "right": "left", "up": "down", "down": "up", "none": "none"}
    backwards = render_track(world, track_from_actions([reverse[a] for a in track.names()[1:]], start=(3, 3)))
    assert evaluate_world(backwards, truth, track, 3)["action_following"] < 0.3
    washed = truth.mean(dim=(2, 3), keepdim=True).expand_as(truth) * 0.5 + truth * 0.5
    report = evaluate_world(washed, truth, track, 3)
    assert not report["checks"]["no_collapse"]


def test_a_flat_video_follows_no_move():
    assert followed_moves(torch.zeros(4, 3, VIEW_SIZE, VIEW_SIZE)) == [None, None, None]
