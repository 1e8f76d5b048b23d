"""The nodes on LingBot-World 2.0, without ComfyUI: the loader recognises its folder where the docs put it, LingBot
World Start and a camera (an Action Script of variant lingbot, or a Camera Path folder) feed the Long Video Sampler,
whose rollout is the engine's own for the same inputs, bit for bit."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_lingbot import TINY
from test_nodes_world import SeededVAE

from comfyui_fastar.fastar_core.errors import CheckpointError, FastARError
from comfyui_fastar.fastar_core.families.lingbot.camera import check_path
from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.families.lingbot.rollout import lingbot_conditioning, rollout_config
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.action_script import parse_text
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES

WIDTH, HEIGHT, LENGTH = 48, 32, 25  # a 4x6 latent, 7 latent frames: chunks 4 + 3
FOLDER = "lingbot-world-v2-14b-causal-fast/transformers"  # the release's own paths, under a folder of its name
KEYS = "variant lingbot\n0 W\n0.5 W L\n1 - \n1.25 I\n"


@pytest.fixture()
def lingbot_host(standalone_host, tmp_path):
    save_lingbot(random_lingbot(TINY, seed=4), tmp_path / FOLDER, max_shard_bytes=200_000)
    standalone_host.input_dir = tmp_path / "input"
    camera = standalone_host.input_dir / "cameras" / "walk"
    camera.mkdir(parents=True)
    script = parse_text(KEYS)
    np.save(camera / "poses.npy", script.to_poses(41).astype(np.float32))
    np.save(camera / "intrinsics.npy", np.tile(script.intrinsics(), (41, 1)).astype(np.float32))
    return standalone_host


def shard(tmp_path: Path) -> str:
    return f"{FOLDER}/{sorted((tmp_path / FOLDER).glob('*.safetensors'))[-1].name}"


def load(tmp_path):
    return NODES["FastAR_LoadARVideoModel"]().load(shard(tmp_path), "default", "none", 5.0)


def prompt(width=4096):
    return [[torch.randn(1, 12, width, generator=torch.Generator().manual_seed(8)), {"pooled_output": None}]]


def start(positive=None, length=LENGTH):
    image = torch.rand(1, 40, 60, 3, generator=torch.Generator().manual_seed(6))  # resized to 48x32 as the release
    return NODES["FastAR_LingBotWorldStart"]().encode(positive or prompt(), SeededVAE(), image, WIDTH, HEIGHT, length)


def keys(script=KEYS, fps=16.0):
    return NODES["FastAR_ActionScript"]().build("lingbot", fps, script)[0]


def sample(model, positive, actions, **kw):
    args = dict(width=WIDTH, height=HEIGHT, length=LENGTH, frames_per_block=4, schedule="LingBot-World 4-step",
                seed=3, actions=actions)
    args.update(kw)
    latent, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, **args)
    return latent["samples"], report


def test_the_loader_reads_the_folder_from_any_of_its_shards(lingbot_host, tmp_path):
    model, info = load(tmp_path)
    summary = json.loads(info)
    assert summary["family"] == "LingBot-World 2.0" and summary["shards"] > 1
    assert summary["config_from"].endswith("config.json") and summary["frames_per_block"] == 4
    assert "I (look_up/up)" in summary["steering"] and summary["schedule"] == "lingbot"
    assert shard(tmp_path) in lingbot_host.list_files("diffusion_models")
    with pytest.raises(FastARError, match="LoRAs are for the Wan2.1 text models; a LingBot-World 2.0 checkpoint"):
        NODES["FastAR_LoadARVideoModel"]().load(shard(tmp_path), "default", "x.safetensors", 5.0)
    # One shard away (an editor's missing-model dialog fetches only the one the loader names): the loader names the
    # rest and where they go.
    first = sorted((tmp_path / FOLDER).glob("*.safetensors"))[0]
    moved = first.rename(tmp_path / first.name)
    with pytest.raises(CheckpointError, match=rf"\({first.name}\): the model needs its whole set; download the "
                                              "missing shards into that folder under their own names"):
        load(tmp_path)
    moved.rename(first)
    # Without its config.json a folder is still recognised by its camera layers; a size the release never had
    # then has nothing to read its sizes from, and says what to put beside the shards.
    (tmp_path / FOLDER / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json and its shards are none of the released"):
        load(tmp_path)


def test_the_sampler_runs_the_engines_rollout_of_the_same_inputs(lingbot_host, tmp_path):
    model, _ = load(tmp_path)
    (positive, width, height, length), actions = start(), keys()
    assert (width, height, length) == (WIDTH, HEIGHT, LENGTH)
    latent, report = sample(model, positive, actions)
    assert latent.shape == (1, 16, 7, 4, 6) and bool(latent.isfinite().all())
    assert "keys lingbot at 16 fps: 0 s (frame 0): W(forward); 0.5 s (frame 8)" in report, report
    assert "cache 'auto' is LingBot-World 2.0 (custom)'s own: window (18 frames attended, sink 6" in report, report
    assert "lingbot (4 steps" in report and "not LingBot-World 2.0's own" not in report

    extras = positive[0][1]
    start_latent = extras["fastar_world_start"]
    assert start_latent.shape[:2] == (1, 16) and extras["fastar_world_start_index"].shape == (7,)
    script = parse_text(KEYS)
    camera = check_path(script.to_poses(LENGTH), script.intrinsics()).condition(7, HEIGHT, WIDTH)
    full = start_latent.index_select(2, extras["fastar_world_start_index"])
    cond = lingbot_conditioning(positive[0][0], full, camera)
    dm = model.model.diffusion_model
    direct = ARSampler(CausalRunner(dm)).generate(cond, rollout_config(dm.config, 7, 4, 6, seed=3)).latent
    assert torch.equal(latent, direct)

    # The same keys as the release's camera format, through the Camera Path node: the same video.
    path, summary = NODES["FastAR_CameraPath"]().read("cameras/walk")
    assert summary.startswith("cameras/walk: 41 poses") and path.source == "input/cameras/walk"
    from_folder, report = sample(model, positive, path)
    assert "camera path input/cameras/walk (41 poses)" in report
    assert torch.allclose(from_folder, latent, atol=1e-4)  # float32 poses in the files, float64 from the keys
    other = sample(model, positive, keys("variant lingbot\n0 S\n0.5 J\n"))[0]
    assert (other - latent).abs().max() > 1e-3


def test_the_sampler_refuses_what_does_not_fit_lingbot_and_notes_settings_not_its_own(lingbot_host, tmp_path):
    model, _ = load(tmp_path)
    positive = start()[0]
    with pytest.raises(FastARError, match="steered by a camera: connect a Camera Path node"):
        sample(model, positive, None)
    with pytest.raises(FastARError, match="the Action Script is for universal, but this MODEL is LingBot-World 2.0"):
        sample(model, positive, NODES["FastAR_ActionScript"]().build("universal", 12.0, "0 W")[0])
    with pytest.raises(FastARError, match="which starts from an image: connect LingBot World Start"):
        sample(model, prompt(), keys())
    with pytest.raises(FastARError, match="makes length 29 but 'positive' comes from LingBot World Start"):
        sample(model, positive, keys(), length=29)
    with pytest.raises(FastARError, match="'positive' is 1280 wide; LingBot-World 2.0 reads UMT5-XXL's 4096"):
        start(prompt(1280))
    _, report = sample(model, positive, keys(), schedule="Self-Forcing 4-step", frames_per_block=3)
    assert "schedule 'Self-Forcing 4-step' is not LingBot-World 2.0's own ('LingBot-World 4-step')" in report
    assert "frames_per_block 3 is not LingBot-World 2.0's own chunk (4 latent frames)" in report


def test_a_camera_path_and_a_lingbot_script_are_refused_by_the_other_models(lingbot_host, tmp_path):
    from comfyui_fastar.nodes.node_camera_path import CameraPathNode, camera_folders

    assert camera_folders(lingbot_host.input_dir) == ["cameras/walk"]
    assert CameraPathNode.INPUT_TYPES()["required"]["folder"][0] == ["cameras/walk"]
    assert "not inside ComfyUI's input folder" in CameraPathNode.VALIDATE_INPUTS("../" + FOLDER)
    assert "poses.npy is missing" in CameraPathNode.VALIDATE_INPUTS("cameras")
    assert CameraPathNode.VALIDATE_INPUTS("cameras/walk") is True
    from comfyui_fastar.nodes.prompting import check_no_world_inputs

    path = CameraPathNode().read("cameras/walk")[0]
    with pytest.raises(FastARError, match=r"'actions' \(a camera path\) steer LingBot-World 2.0, but this MODEL is a "
                                          "text-to-video Wan model"):
        check_no_world_inputs(path, prompt())
    with pytest.raises(FastARError, match=r"'actions' \(lingbot\) steer a LingBot-World 2.0 model, but this MODEL is a "
                                          "text-to-video"):
        check_no_world_inputs(keys(), prompt())


def test_tempcache_and_fast_ar_attention_hold_what_lingbots_window_holds(lingbot_host, tmp_path):
    """The sampler's TempCache on LingBot, or FAST-AR Attention's preset under cache 'auto', holds what the release's
    window caches beside the chunk (14 frames, sink 6: the workflow's sink), and the report says which ran."""
    model, _ = load(tmp_path)
    (positive, *_), actions = start(), keys()
    _, report = sample(model, positive, actions, cache_policy="tempcache", sink_frames=6)
    assert "cache     : tempcache (sink 6, capacity 14 frames" in report, report
    assert ("TempCache capacity 14 frames, sink 6: what LingBot-World 2.0 (custom)'s own cache (window (18 frames "
            "attended, sink 6 and the chunk included)) holds with chunks of 4, in place of TempCache's default 21"
            ) in report, report
    patched = NODES["FastAR_Attention"]().patch(model, preset="balanced")[0]
    latent, report = sample(patched, positive, actions)
    assert bool(latent.isfinite().all())
    assert "cache     : tempcache (sink 6, capacity 14 frames" in report, report
    assert "in place of preset balanced's 21" in report, report
