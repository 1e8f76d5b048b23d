"""The command line on LingBot-World 2.0 model folders: ``fastar info`` names the family and its size, ``fastar
generate`` runs the release's rollout steered by a camera folder (``--camera``) or a key timeline (``--actions``)."""

import json

import numpy as np
import pytest
from safetensors.torch import load_file

from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
from comfyui_fastar.fastar_core.families.lingbot.config import LingBotConfig
from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.rollout.action_script import parse_text
from comfyui_fastar.tools.cli import main
from comfyui_fastar.tools.outputs import LATENT_FILE, STATS_FILE

TINY = LingBotConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, freq_dim=32, text_len=16)
SIZE = ["--height", "32", "--width", "48", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """The release's layout: <root>/transformers/config.json beside sharded safetensors."""
    root = tmp_path_factory.mktemp("lingbot")
    save_lingbot(random_lingbot(TINY, seed=1), root / "transformers", max_shard_bytes=300_000)
    return root


def camera_folder(path, video_frames):
    script = parse_text("variant lingbot\n0 W\n1 W L\n", "walk")
    path.mkdir()
    np.save(path / "poses.npy", script.to_poses(video_frames).astype(np.float32))
    np.save(path / "intrinsics.npy", np.tile(script.intrinsics(), (video_frames, 1)).astype(np.float32))
    return path


def test_info_names_the_family_its_size_and_how_it_is_run(model_root, capsys):
    assert main(["info", str(model_root)]) == 0
    out = capsys.readouterr().out
    assert "family      LingBot-World 2.0, size custom" in out and "(7 safetensors files)" in out
    assert "chunks of 4, window (18 frames attended, sink 6 and the chunk included), schedule lingbot (4 steps at " \
           "shift 10)" in out and "J (turn_left/left)" in out
    assert main(["info", str(model_root / "transformers"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["family"], summary["size"], summary["frames_per_block"]) == ("LingBot-World 2.0", "custom", 4)
    assert summary["cache"]["window_frames"] == 18 and summary["config"]["num_heads"] == 2


def test_generate_follows_a_camera_folder_with_the_releases_own_rollout(model_root, tmp_path, capsys):
    out = tmp_path / "run"
    camera = camera_folder(tmp_path / "camera", 81)
    assert main(["generate", "--checkpoint", str(model_root), "--camera", str(camera), "--frames", "12", "--out",
                 str(out), *SIZE]) == 0
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["family"] == "LingBot-World 2.0" and stats["cache_is_the_releases_own"]
    assert (stats["cache"]["window_frames"], stats["cache"]["sink_frames"]) == (18, 6)
    assert stats["schedule"]["timesteps"] == [999.0, 967.0, 908.0, 768.0] and stats["poses"] == 81
    assert [c["frames"] for c in stats["chunks"]] == [4, 4, 4]
    assert load_file(str(out / LATENT_FILE))["latent"].shape == (1, 16, 12, 4, 6)
    assert "start image's latent is a seeded random stand-in" in capsys.readouterr().out


def test_generate_follows_a_key_timeline_and_fastar_holds_what_the_window_caches(model_root, tmp_path):
    timeline = tmp_path / "keys.txt"
    timeline.write_text("variant lingbot\n0 W\n0.5 W right\n1 up\n")
    out = tmp_path / "run"
    assert main(["generate", "--checkpoint", str(model_root), "--actions", str(timeline), "--frames", "12",
                 "--out", str(out), "--fastar", "balanced", *SIZE]) == 0
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["cache"]["policy"] == "tempcache" and stats["cache"]["sink_frames"] == 6
    assert stats["cache"]["tempcache"]["capacity_frames"] == 14 and stats["actions"]["variant"] == "lingbot"


@pytest.mark.parametrize("extra, message", [
    ([], "steered by a camera path: give --camera FOLDER"),
    (["--actions", "{universal}"], "is for Matrix-Game 2.0 universal; LingBot-World 2.0 takes a key timeline"),
    (["--camera", "{camera}", "--frames", "30"], "holds 81 poses; 30 latent frames are 117 video frames"),
    (["--camera", "{camera}", "--actions", "{universal}"], "both steer the camera; give one"),
])
def test_what_a_lingbot_run_needs_is_asked_for_by_name(model_root, tmp_path, capsys, extra, message):
    camera = camera_folder(tmp_path / "camera", 81)
    universal = tmp_path / "mg.txt"
    universal.write_text("variant universal\n0 W\n")
    args = [a.format(camera=camera, universal=universal) for a in extra]
    if "--frames" not in args:
        args += ["--frames", "8"]
    assert main(["generate", "--checkpoint", str(model_root), "--out", str(tmp_path / "out"), *args, *SIZE]) == 2
    assert message in capsys.readouterr().err
