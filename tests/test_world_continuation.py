"""``fastar bench world-continuation``: the strip a move brings in, sorted by what a perfect model knows of it, and
the model's frame drawn from the true history scored against the truth beside guesses that need no model."""

import json

import pytest
import torch

from comfyui_fastar.fastar_core.families.demo.steer_world import STEP, make_map, render_track, track_from_actions
from comfyui_fastar.tools.bench import world_continuation as wc


def test_the_strip_is_what_the_move_brings_in_and_the_smear_repeats_the_edge():
    frame = torch.arange(3 * 24 * 24, dtype=torch.float32).view(3, 24, 24)
    strip, smear = wc.strip_and_smear(frame, "right")
    assert strip[:, 24 - STEP:].all() and not strip[:, :24 - STEP].any()
    assert torch.equal(smear[..., 24 - STEP:], frame[..., 24 - STEP - 1:24 - STEP].expand(3, 24, STEP))
    assert torch.equal(smear[..., :24 - STEP], frame[..., :24 - STEP])
    strip, smear = wc.strip_and_smear(frame, "up")
    assert strip[:STEP].all() and not strip[STEP:].any()
    assert torch.equal(smear[:, :STEP], frame[:, STEP:STEP + 1].expand(3, STEP, 24))
    strip, smear = wc.strip_and_smear(frame, "none")
    assert not strip.any() and torch.equal(smear, frame)


def test_the_kinds_split_the_strip_and_a_place_seen_before_is_remembered():
    world = make_map(8)
    track = track_from_actions(["right"] * 6 + ["left"] * 8 + ["down"] * 4, start=(3, 5))
    truth = render_track(world, track)
    kinds = wc.pixel_kinds(world, track, truth)
    names = track.names()
    assert len(kinds) == len(track) - 1
    for t, k in enumerate(kinds, start=1):
        masks = torch.stack([k[name] for name in wc.KINDS]).int()
        strip, _ = wc.strip_and_smear(truth[t], names[t])
        assert torch.equal(masks.sum(0) > 0, strip) and (masks.sum(0) <= 1).all(), t  # disjoint, the whole strip
    # Going back left over the places the right moves showed: those strips are remembered, not invented.
    assert all(int(kinds[t - 1]["remembered"].sum()) == 24 * STEP for t in range(7, 13))
    assert not kinds[0]["remembered"].any()  # the first move brings in a place never seen
    continued = sum(int(k["continued"].sum()) for k in kinds)
    invented = sum(int((k["new"] | k["ground"]).sum()) for k in kinds)
    assert continued > 0 and invented > continued


def test_the_scores_tell_the_truth_from_the_bare_ground_and_a_real_model_runs(tmp_path, monkeypatch):
    frames, seeds = 16, (8,)
    real = wc.run_world_continuation(tmp_path / "model", seeds=seeds, frames=frames, log=lambda _: None)
    pooled = real["pooled"]
    assert sum(v["pixels"] for v in pooled.values()) > 0 and pooled["ground"]["model"] > 15
    saved = json.loads((tmp_path / "model" / "world_continuation.json").read_text())
    assert saved["pooled"] == pooled and (tmp_path / "model" / "world_continuation.png").is_file()

    # Controls through the same scoring: a model drawing the truth scores every kind exactly (no finite PSNR); one
    # drawing the bare ground scores what the bare-ground guess does.
    monkeypatch.setattr(wc, "teacher_forced_frame", lambda demo, truth, track, t, seed: truth[t])
    perfect = wc.run_world_continuation(tmp_path / "truth", seeds=seeds, frames=frames, log=lambda _: None)
    assert all(v["model"] is None and v["pixels"] == pooled[k]["pixels"] for k, v in perfect["pooled"].items())
    world = make_map(8)
    bare = render_track(wc.dataclasses.replace(world, landmarks=()), wc.bar_track(8, frames))
    monkeypatch.setattr(wc, "teacher_forced_frame", lambda demo, truth, track, t, seed: bare[t])
    ground = wc.run_world_continuation(tmp_path / "bare", seeds=seeds, frames=frames, log=lambda _: None)
    for k in ("continued", "new"):
        if ground["pooled"][k]["pixels"]:
            assert ground["pooled"][k]["model"] == ground["pooled"][k]["bare ground"], k


def test_the_command_refuses_one_frame_and_takes_a_world_models_weights(tmp_path, capsys):
    from comfyui_fastar.tools.cli import main as fastar_main
    from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR

    assert fastar_main(["bench", "world-continuation", "--out", str(tmp_path / "a"), "--frames", "1"]) != 0
    assert "--frames 1 is invalid" in capsys.readouterr().err
    sprites = WEIGHTS_DIR / "demo_model.safetensors"
    for bench in ("world-continuation", "live-world"):
        assert fastar_main(["bench", bench, "--out", str(tmp_path / "b"), "--weights", str(sprites)]) != 0
        assert "not a steered-world model" in capsys.readouterr().err, bench
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_bench_function_refuses_too_few_frames(tmp_path):
    with pytest.raises(ValueError, match="at least 2"):
        wc.run_world_continuation(tmp_path, frames=1)
