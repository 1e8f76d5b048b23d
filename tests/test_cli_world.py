"""The command line on Matrix-Game 2.0 checkpoints: ``fastar info`` names the variant, ``fastar generate --actions``
runs the variant's own rollout steered by the script (tiny models in the release's file layout)."""

import json

import pytest
import torch
from matrix_game_models import tiny_config
from safetensors.torch import load_file, save_file

from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import save_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.tools.cli import main
from comfyui_fastar.tools.outputs import LATENT_FILE, STATS_FILE

SIZE = ["--height", "32", "--width", "48", "--device", "cpu"]


def world_checkpoint(tmp_path, variant):
    folder = tmp_path / variant
    folder.mkdir()
    path = folder / "model.safetensors"
    save_matrix_game(random_matrix_game(tiny_config(variant), seed=1), path)
    return path


def script(tmp_path, text, name="actions.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("variant, keys, mouse, window, schedule", [
    ("universal", "W (forward), S (back), A (left), D (right), I (camera_up)", "4 keys, mouse [pitch, yaw]", 6,
     "matrix-game"),
    ("gta_drive", "W (forward), S (back), A (camera_l), D (camera_r)", "2 keys, mouse [pitch, yaw]", 4,
     "matrix-game"),
    ("templerun", "Q (nomove), W (jump), S (slide)", "7 keys, no mouse", 6, "self-forcing"),
])
def test_info_names_the_family_its_variant_and_its_keys(tmp_path, capsys, variant, keys, mouse, window, schedule):
    path = world_checkpoint(tmp_path, variant)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"family      Matrix-Game 2.0, variant {variant} (sizes from {path.parent / 'config.json'})" in out
    assert keys in out and mouse in out and f"window of {window} latent frames, no sink; schedule {schedule}" in out
    assert main(["info", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["family"], summary["variant"], summary["schedule"]) == ("Matrix-Game 2.0", variant, schedule)
    assert summary["config"]["local_attn_size"] == window


def test_generate_runs_the_variants_own_rollout_steered_by_the_script(tmp_path, capsys):
    path = world_checkpoint(tmp_path, "universal")
    walk = script(tmp_path, "variant universal\n0 W\n0.5 W L\n1 - mouse 0.05 0\n9 S\n")
    out = tmp_path / "run"
    assert main(["generate", "--checkpoint", str(path), "--frames", "7", "--out", str(out), "--actions", str(walk),
                 "--seed", "4", *SIZE]) == 0
    printed = capsys.readouterr().out
    assert "note: 1 action entry from 9 s on comes after the video's 25 frames and is not used" in printed
    stats = json.loads((out / STATS_FILE).read_text())
    assert (stats["family"], stats["variant"], stats["schedule"]["name"]) == ("Matrix-Game 2.0", "universal",
                                                                               "matrix-game")
    assert stats["cache"]["policy"] == "window" and stats["cache"]["window_frames"] == 6
    assert stats["cache"]["sink_frames"] == 0 and stats["cache_is_the_variants_own"]
    assert stats["actions"]["timeline"][1] == {"at": 0.5, "keys": ["W", "L"]}
    assert stats["actions_summary"].startswith("universal at 12 fps: 0 s (frame 0): W(forward)")
    latent = load_file(str(out / LATENT_FILE))["latent"]
    assert list(latent.shape) == [1, 16, 7, 4, 6] and bool(latent.isfinite().all())

    again = tmp_path / "again"
    assert main(["generate", "--checkpoint", str(path), "--frames", "7", "--out", str(again), "--actions",
                 str(walk), "--seed", "4", *SIZE]) == 0
    assert load_file(str(again / LATENT_FILE))["latent"].equal(latent)  # same seed and actions, same bits
    other = script(tmp_path, "variant universal\n0 S\n0.5 S J\n", "back.txt")
    moved = tmp_path / "moved"
    assert main(["generate", "--checkpoint", str(path), "--frames", "7", "--out", str(moved), "--actions",
                 str(other), "--seed", "4", *SIZE]) == 0
    changed = load_file(str(moved / LATENT_FILE))["latent"]
    assert changed[:, :, 1:].sub(latent[:, :, 1:]).abs().max() > 1e-3  # other actions, another video


def test_generate_refuses_a_world_checkpoint_without_actions_or_with_another_variants(tmp_path, capsys):
    path = world_checkpoint(tmp_path, "gta_drive")
    out = tmp_path / "run"
    args = ["generate", "--checkpoint", str(path), "--frames", "4", "--out", str(out), *SIZE]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is Matrix-Game 2.0 gta_drive, steered by keyboard and mouse actions: give --actions FILE" in err
    assert not out.exists()
    jump = script(tmp_path, "variant templerun\n0 W\n")
    assert main(args + ["--actions", str(jump)]) == 2
    assert "is for templerun, but" in capsys.readouterr().err and not out.exists()
    drive = script(tmp_path, "variant gta_drive\n0 W\n", "drive.txt")
    cond = tmp_path / "cond.safetensors"
    save_file({"context": torch.zeros(1, 4, 8)}, str(cond))
    assert main(args + ["--actions", str(drive), "--cond", str(cond)]) == 2
    assert "a Matrix-Game 2.0 checkpoint takes no text" in capsys.readouterr().err
