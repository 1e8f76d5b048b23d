"""The steered world model: per-frame key conditioning through the engine's runner, its trainer and its file."""

import pytest
import torch

from comfyui_fastar.fastar_core.families.demo.actions import ActionEncoder, ActionRunner, batch_tracks, moved_reference
from comfyui_fastar.fastar_core.families.demo.steer_world import (
    make_map,
    render_track,
    scripted_path,
    track_from_actions,
)
from comfyui_fastar.fastar_core.forward.attention import PassInfo
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
from comfyui_fastar.tools.demo.train_command import train_demo
from comfyui_fastar.tools.demo.world_eval import evaluate_world, world_rollout

PATCHES = 24


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_each_frame_is_told_its_key_its_shift_since_the_last_clean_frame_and_its_place():
    enc = ActionEncoder(16, PATCHES, frames_per_block=3)
    track = track_from_actions(["right", "right", "down", "left", "none", "up"], start=(PATCHES - 1, 0))
    actions, positions = batch_tracks([track])
    key, offset, place = enc.frame_conditions(actions, positions, torch.arange(3, 6))
    assert key[0].tolist() == [2, 3, 0]  # down, left, none
    # Frames 3..5 are counted from frame 2 (the chunk before's last frame), across the map's wrap.
    assert offset[0].tolist() == [[0, 1], [-1, 1], [-1, 1]]
    assert place[0, 0].tolist() == [1, 1]
    with pytest.raises(ValueError, match="frame 7 has no action yet"):
        enc.frame_conditions(actions, positions, torch.arange(6, 8))


def test_the_runner_conditions_on_the_keys_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    cfg = WanConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=64, in_dim=3, out_dim=3, text_dim=16, freq_dim=16,
                    text_len=4, patch_size=(1, 4, 4))
    model = random_wan(cfg, seed=1)
    enc = ActionEncoder(32, PATCHES, frames_per_block=3)
    torch.nn.init.normal_(enc.out[1].weight, std=0.5)
    x = torch.randn(1, 3, 3, 24, 24)
    t = torch.full((1, 3), 500.0)
    info = PassInfo(chunk=1, step=0, num_steps=1, frame_start=3, num_frames=3, tokens_per_frame=36)

    def run(actions):
        runner = ActionRunner(model, enc, [track_from_actions(actions)])
        return runner.forward(x, t, runner.encode_text(torch.zeros(1, 4, 16)), None, info)

    right, left = run(["right"] * 5), run(["left"] * 5)
    assert not torch.allclose(right, left)
    assert torch.equal(right, run(["right"] * 5))
    assert not model.time_embedding._forward_hooks  # the conditioning hook is gone after each forward
    with pytest.raises(ValueError, match="has no action yet"):
        run(["right"] * 3)


def test_the_moved_reference_frame_is_the_next_view_where_both_see_the_map():
    track = track_from_actions(["right", "down", "left", "up", "none", "right"], start=(PATCHES - 1, 0))
    views = render_track(make_map(3), track).permute(1, 0, 2, 3)[None]  # [1, 3, T, H, W]
    enc = ActionEncoder(16, PATCHES, frames_per_block=1)
    actions, positions = batch_tracks([track])
    offset = enc.frame_conditions(actions, positions, torch.arange(1, len(track)))[1]
    previous, current = views[:, :, :-1], views[:, :, 1:]
    moved = moved_reference(previous, offset)
    inside = moved[:, 3:]
    moves = [0, 1, 2, 3, 5]
    assert inside[0, 0, 4].all() and inside[0, 0, moves].float().mean() == pytest.approx(5 / 6)  # one patch in
    assert torch.equal(moved[:, :3] * inside, current * inside) and torch.equal(moved[:, :3] * (1 - inside),
                                                                                torch.zeros_like(current))
    wrong = moved_reference(previous, -offset)  # the negative control: moved the other way it does not match
    assert not torch.allclose(wrong[:, :3, moves] * wrong[:, 3:, moves], current[:, :, moves] * wrong[:, 3:, moves],
                              atol=0.05)


def test_the_runner_hands_the_model_the_last_clean_frame_moved_by_the_key_and_refuses_a_gap():
    cfg = WanConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=64, in_dim=7, out_dim=3, text_dim=16, freq_dim=16,
                    text_len=4, patch_size=(1, 4, 4))
    model = random_wan(cfg, seed=1)
    enc = ActionEncoder(32, PATCHES, frames_per_block=1)
    runner = ActionRunner(model, enc, [track_from_actions(["right"] * 4)], moved_reference=True)
    text = runner.encode_text(torch.zeros(1, 4, 16))
    x = torch.randn(1, 3, 1, 24, 24)
    t = torch.full((1, 1), 500.0)

    def info(frame):
        return PassInfo(chunk=frame, step=0, num_steps=1, frame_start=frame, num_frames=1, tokens_per_frame=36)

    with pytest.raises(ValueError, match="frame 1 needs the clean pass of frame 0 first"):
        runner.forward(x, t, text, None, info(1))
    seen = []
    handle = model.patch_embedding.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    from comfyui_fastar.fastar_core.caches import CacheSpec
    from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig

    cfg_roll = RolloutConfig(num_frames=1, latent_height=24, latent_width=24, frames_per_block=1,
                             cache=CacheSpec("global"), channels=3)
    cache = ARSampler(runner).build_cache(cfg_roll, 2, (6, 6))
    clean = torch.randn(1, 3, 1, 24, 24)
    runner.forward(clean, torch.zeros(1, 1), text, cache, info(0), commit=True, need_output=False)
    runner.forward(x, t, text, cache, info(1))
    handle.remove()
    assert seen[1].shape[1] == 7 and torch.equal(seen[1][:, :3], x)
    assert torch.equal(seen[1][:, 3:6, :, :, :20], clean[..., 4:]) and seen[1][:, 6, :, :, 20:].eq(0).all()


def test_a_world_run_trains_resumes_and_its_file_rolls_out_through_the_sampler(tmp_path):
    out = tmp_path / "world"
    over = {"clip_frames": 6}
    train_demo(out, steps=1, batch=1, threads=1, report=False, log=lambda m: None, world="steer",
               recipe_overrides=over)
    lines = []
    summary = train_demo(out, steps=2, batch=1, threads=1, report=False, log=lines.append, world="steer",
                         recipe_overrides=over)
    assert summary["steps"] == 2 and lines[0].startswith("resumed at step 1")
    with pytest.raises(ValueError, match="another seed or recipe|not a steered-world"):
        train_demo(out, steps=3, batch=1, threads=1, report=False, log=lambda m: None, world="sprites",
                   recipe_overrides=over)

    demo = load_demo_model(out / "demo_model.safetensors")
    assert demo.is_world and demo.metadata["world"]["map_size"] == 96
    assert demo.schedule.solver == "unipc"  # a world file names its ODE sampler (settings.WORLD_SAMPLER)
    world = make_map(11)
    track = track_from_actions(scripted_path(8, side=2), start=(4, 4))
    frames, truth, _ = world_rollout(demo, world, track)
    fpb = demo.frames_per_block
    assert frames.shape == truth.shape == (9, 3, 24, 24) and fpb == 1
    assert demo.model.config.in_dim == 7  # the noisy frame, the moved reference frame and where it is defined
    assert torch.equal(frames[:fpb], truth[:fpb])  # the true start chunk, continued
    report = evaluate_world(frames, truth, track, start_frames=fpb)
    assert not report["passed"]  # two steps of training cannot carry a view

    from comfyui_fastar.tools.demo.world_report import write_world_report

    result = write_world_report(out, seeds=(1,), frames=9, log=lambda m: None, band_draws=5)
    assert result == {"passes": {"dense-global": 0, "fastar": 0, "tempcache": 0}, "seeds": 1}
    card = (out / "WORLD_MODEL_CARD.md").read_text()
    assert "0 of 1 seeds pass with dense-global, 0 of 1 with FAST-AR, 0 of 1 with TempCache alone" in card
    assert "| fastar | 1 | FAIL |" in card and "| dense-window | 1 | reported |" in card
    assert "UNIPC with 6 steps" in card and "Positions on the map" in card
    assert (out / "world_frames.png").stat().st_size > 0 and (out / "world_eval.json").is_file()

    import json

    from comfyui_fastar.tools.cli import main as fastar_main

    demo_out = tmp_path / "demo"
    args = ["demo", "--weights", str(out / "demo_model.safetensors"), "--frames", "6"]
    assert fastar_main([*args, "--out", str(demo_out)]) == 0
    stats = json.loads((demo_out / "stats.json").read_text())
    assert set(stats["modes"]) == {"dense-global", "dense-window", "tempcache"}
    tempcache = stats["modes"]["tempcache"]
    assert tempcache["evaluation"]["frames"] == 6 and stats["modes"]["dense-global"]["speedup_cpu"] == 1
    assert "groups are places" in tempcache["cache"]
    assert (demo_out / "world.gif").stat().st_size > 0 and (demo_out / "world.png").stat().st_size > 0
    assert fastar_main(["demo", "--world", "sprites", "--weights", str(out / "demo_model.safetensors"),
                        "--out", str(demo_out)]) != 0

    # The revisit figures of `fastar bench pareto --model world`: every point scores the returning views.
    pareto_out = tmp_path / "pareto"
    assert fastar_main(["bench", "pareto", "--model", "world", "--weights", str(out / "demo_model.safetensors"),
                        "--frames", "30", "--capacities", "9", "--thresholds", "0.9", "--out", str(pareto_out)]) == 0
    points = json.loads((pareto_out / "pareto.json").read_text())["points"]
    assert set(points) == {"dense-global", "dense-window@9", "tempcache-0.9@9"}
    for row in points.values():
        assert row["revisit"]["views"] > 0 and row["revisit"]["psnr_vs_own_earlier_db"] > 0
    assert fastar_main(["bench", "rollout", "--model", "world", "--out", str(pareto_out)]) != 0


def _rewritten(tmp_path, name, keep_channels=None, inputs="keep", positions="keep"):
    """The bundled world file with its patch embedding cut to ``keep_channels`` inputs and/or its world
    metadata's ``inputs`` (or ``positions``) entry dropped or changed."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from comfyui_fastar.tools.demo.settings import MODEL_PREFIX

    src = WEIGHTS_DIR / WORLD_WEIGHTS_FILE
    with safe_open(str(src), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    key = MODEL_PREFIX + "patch_embedding.weight"
    if keep_channels is not None:
        tensors[key] = tensors[key][:, :keep_channels].contiguous()
        config = json.loads(metadata["fastar_config"])
        metadata["fastar_config"] = json.dumps({**config, "in_dim": keep_channels})
    demo = json.loads(metadata["demo"])
    if inputs is None:
        demo["world"].pop("inputs")
        demo["world"].pop("positions", None)  # map positions come with the moved reference frame
    elif inputs != "keep":
        demo["world"]["inputs"] = inputs
    if positions is None:
        demo["world"].pop("positions", None)
    elif positions != "keep":
        demo["world"]["positions"] = positions
    metadata["demo"] = json.dumps(demo)
    path = tmp_path / name
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_a_keys_only_world_file_still_runs_and_a_mismatched_one_is_refused(tmp_path):
    from comfyui_fastar.fastar_core.errors import FastARError

    old = load_demo_model(_rewritten(tmp_path, "keys_only.safetensors", keep_channels=3, inputs=None))
    assert old.model.config.in_dim == 3 and not old.world_runner([track_from_actions([])]).moved_reference
    track = track_from_actions(["right", "right", "down"], start=(2, 2))
    frames, truth, _ = world_rollout(old, make_map(4), track)
    assert frames.shape == truth.shape == (4, 3, 24, 24) and torch.isfinite(frames).all()
    assert load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE).world_runner([track]).moved_reference
    with pytest.raises(FastARError, match="patch embedding takes 7 channels, but a world model with inputs 'keys only' "
                                          "reads 3"):
        load_demo_model(_rewritten(tmp_path, "no_inputs.safetensors", inputs=None))
    with pytest.raises(FastARError, match="entry 'world.inputs' is 'optical-flow'; valid: one of 'moved-reference'"):
        load_demo_model(_rewritten(tmp_path, "unknown.safetensors", inputs="optical-flow"))
    with pytest.raises(FastARError, match="entry 'world.positions' is 'sphere'; valid: one of 'map'"):
        load_demo_model(_rewritten(tmp_path, "sphere.safetensors", positions="sphere"))
    with pytest.raises(FastARError, match="world entry 'positions' is 'map' but its 'inputs' are 'keys only'"):
        load_demo_model(_rewritten(tmp_path, "map_keys_only.safetensors", keep_channels=3, inputs=None,
                                    positions="map"))
    screen = load_demo_model(_rewritten(tmp_path, "screen.safetensors", positions=None))
    assert not screen.places_on_map and screen.world_runner([track]).map_rope is None
    assert load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE).places_on_map


def test_the_loss_weighs_the_strip_a_move_brings_in():
    from comfyui_fastar.tools.demo.world_train import new_region_weights

    # One frame per key: right brings in the rightmost 4-pixel columns, up the top rows, none nothing.
    offset = torch.tensor([[[1, 0], [0, -1], [0, 0]]])
    w = new_region_weights(offset, (24, 24), 4.0)
    assert w.shape == (1, 1, 3, 24, 24)
    assert (w[0, 0, 0, :, 20:] == 4).all() and (w[0, 0, 0, :, :20] == 1).all()
    assert (w[0, 0, 1, :4] == 4).all() and (w[0, 0, 1, 4:] == 1).all()
    assert (w[0, 0, 2] == 1).all()
    assert torch.equal(new_region_weights(offset, (24, 24), 1.0), torch.ones_like(w))


def test_the_landmark_pixels_are_those_a_landmark_changes_and_no_ground_pixel():
    import dataclasses
    import math

    from comfyui_fastar.fastar_core.families.demo.steer_world import STEP
    from comfyui_fastar.tools.demo.world_train import landmark_pixels, world_batch

    world = make_map(3)
    track = track_from_actions(scripted_path(40), start=(2, 5))
    video = render_track(world, track)
    marked = landmark_pixels(world, track, video)
    assert marked.shape == (len(track), 1, 24, 24) and 0 < marked.float().mean() < 0.5
    n = world.size
    for t, (px, py) in enumerate(track.positions.tolist()):
        rows, cols = torch.nonzero(marked[t, 0], as_tuple=True)
        for r, c in zip(rows.tolist(), cols.tolist()):  # every marked pixel lies within some landmark's reach
            x, y = (px * STEP + c + 0.5) % n, (py * STEP + r + 0.5) % n
            assert any(max(abs((x - lm.x + n / 2) % n - n / 2), abs((y - lm.y + n / 2) % n - n / 2))
                       <= math.ceil(lm.radius) + 1 for lm in world.landmarks), (t, r, c)
    bare = dataclasses.replace(world, landmarks=())
    assert not landmark_pixels(bare, track, render_track(bare, track)).any()
    # The training batch renders the bare ground only when a run weighs landmarks.
    assert world_batch(0, 0, 1, 5).landmarks is None
    assert world_batch(0, 0, 1, 5, landmarks=True).landmarks.shape == (1, 1, 5, 24, 24)


def test_the_command_line_sets_the_new_strips_and_the_landmarks_loss_weights(tmp_path):
    from comfyui_fastar.tools.demo.train_command import main

    out = tmp_path / "w"
    assert main(["--world", "steer", "--out", str(out), "--steps", "1", "--batch", "1", "--threads", "1",
                 "--no-report", "--new-region-weight", "3", "--landmark-weight", "2"]) == 0
    recipe = load_demo_model(out / "demo_model.safetensors").metadata["training"]["recipe"]
    assert (recipe["new_region_loss_weight"], recipe["landmark_loss_weight"]) == (3.0, 2.0)


def test_a_world_run_can_start_from_a_world_file_and_refuses_a_sprite_file(tmp_path):
    from safetensors import safe_open

    from comfyui_fastar.fastar_core.errors import CheckpointError
    from comfyui_fastar.fastar_core.families.demo.actions import STATE_PREFIX
    from comfyui_fastar.tools.demo.settings import WEIGHTS_FILE
    from comfyui_fastar.tools.demo.world_train import WorldTrainer, world_recipe

    bundled = WEIGHTS_DIR / WORLD_WEIGHTS_FILE
    trainer = WorldTrainer(tmp_path / "run", world_recipe(clip_frames=6), seed=3, log=lambda m: None)
    trainer.warm_start_from_weights(bundled)
    with safe_open(str(bundled), "pt") as f:
        key = next(k for k in f.keys() if k.startswith(STATE_PREFIX))
        saved = f.get_tensor(key).float()
    name = key[len(STATE_PREFIX):]
    for encoder in (trainer.action_encoder, trainer.ema_action):
        assert torch.equal(encoder.state_dict()[name], saved)
    assert trainer.phases[-1]["steps"] >= 1000 and trainer.phases[-1]["weights_file"] == WORLD_WEIGHTS_FILE

    with pytest.raises(CheckpointError, match="is not a steered-world weights file"):
        train_demo(tmp_path / "bad", steps=1, batch=1, threads=1, report=False, log=lambda m: None,
                   world="steer", recipe_overrides={"clip_frames": 6}, init_from=WEIGHTS_DIR / WEIGHTS_FILE)
    assert not (tmp_path / "bad").exists()  # nothing written for a refused start
