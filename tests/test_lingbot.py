"""LingBot-World 2.0 without its reference: the camera maths, the key timeline's motion model, the loader, the
family's checks, FAST-AR on it and a rollout past the release's 1,024-frame cap (``test_lingbot_parity.py`` holds
the rollout to the release's own pipeline where ``FASTAR_REFERENCE_DIR`` is set)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from comfyui_fastar.fastar_core.caches.base import CacheShape
from comfyui_fastar.fastar_core.caches.spec import CacheSpec, TempCacheSettings
from comfyui_fastar.fastar_core.errors import CheckpointError, FastARError
from comfyui_fastar.fastar_core.families.lingbot.camera import (
    camera_tokens,
    check_path,
    frame_motion,
    read_camera_folder,
    resample_poses,
)
from comfyui_fastar.fastar_core.families.lingbot.checkpoint import find_model_folder, load_lingbot, save_lingbot
from comfyui_fastar.fastar_core.families.lingbot.config import LingBotConfig, from_reference_config
from comfyui_fastar.fastar_core.families.lingbot.family import LingBotFamily
from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.families.lingbot.rollout import default_cache, lingbot_conditioning, rollout_config
from comfyui_fastar.fastar_core.files.model_files import is_lingbot
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.action_script import parse_text
from comfyui_fastar.fastar_core.rollout.camera_motion import poses_from_keys
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler
from comfyui_fastar.fastar_core.rollout.schedule import get_schedule

TINY = LingBotConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, freq_dim=32, text_len=16)
LATENT_HW = (4, 6)
PIXELS = (32, 48)
SHAPE = CacheShape(num_layers=TINY.num_layers, batch=1, num_heads=TINY.num_heads, head_dim=TINY.head_dim,
                   grid_hw=(2, 3), frames_per_block=4)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def walk(video_frames: int) -> tuple:
    script = parse_text("variant lingbot\n0 W\n1 W L\n2 W I\n3 D J\n", "walk")
    return script.to_poses(video_frames), script.intrinsics()


def conditioning(frames: int, seed: int = 0, camera=None):
    g = torch.Generator().manual_seed(seed)
    if camera is None:
        camera = check_path(*walk(4 * (frames - 1) + 1)).condition(frames, *PIXELS)
    return lingbot_conditioning(torch.randn(1, 8, TINY.text_dim, generator=g),
                                torch.randn(1, 16, frames, *LATENT_HW, generator=g), camera)


def rollout(model, frames, cache=None, fastar=None, cond=None, seed=0):
    runner = CausalRunner(model)
    sampler = build_sampler(runner, fastar) if fastar is not None else ARSampler(runner)
    cfg = rollout_config(model.config, frames, *LATENT_HW, cache=cache, seed=seed)
    return sampler.generate(cond or conditioning(frames), cfg)


# -- the camera ------------------------------------------------------------------------------------------------

def test_resampling_keeps_the_poses_it_lands_on_and_turns_along_the_shortest_arc():
    poses = np.tile(np.eye(4), (3, 1, 1))
    c, s = math.cos(math.radians(90)), math.sin(math.radians(90))
    poses[2, :3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]  # a quarter turn right between pose 0 and pose 2
    poses[2, :3, 3] = [0, 0, 4]
    out = resample_poses(poses, 5)  # at 0, 0.5, 1, 1.5, 2
    assert np.allclose(out[[0, 2, 4]], poses, atol=1e-12)
    yaw = np.degrees(np.arctan2(out[:, 0, 2], out[:, 2, 2]))
    assert np.allclose(yaw, [0, 0, 0, 45, 90], atol=1e-9) and np.allclose(out[3, :3, 3], [0, 0, 2])
    flipped = poses.copy()
    flipped[2, :3, :3] = [[-1, 0, 0], [0, 1, 0], [0, 0, -1]]  # 180 degrees: either way is shortest
    assert np.allclose(np.linalg.det(resample_poses(flipped, 9)[:, :3, :3]), 1.0)


def test_frame_motion_is_each_frames_move_since_the_one_before_with_the_longest_move_one():
    poses = np.tile(np.eye(4), (4, 1, 1))
    poses[:, :3, 3] = [[5, 1, 0], [5, 1, 2], [5, 1, 3], [5, 1, 3]]  # moves of 2, 1, 0 along z
    motion = frame_motion(torch.from_numpy(poses))
    assert torch.allclose(motion[0], torch.eye(4))
    assert torch.allclose(motion[1:, 2, 3], torch.tensor([1.0, 0.5, 0.0]))
    still = frame_motion(torch.from_numpy(np.tile(np.eye(4), (3, 1, 1))))
    assert torch.equal(still, torch.eye(4).expand(3, 4, 4))  # a camera that never moves divides by nothing


def test_a_video_path_takes_the_pose_of_video_frame_4t_for_latent_frame_t():
    poses, intrinsics = walk(4 * 9 + 1)
    camera = check_path(poses, intrinsics).condition(10, *PIXELS)
    expected = frame_motion(torch.from_numpy(poses[::4]).float())
    assert torch.allclose(camera.motion, expected, atol=1e-5)
    longer = check_path(*walk(201)).condition(10, *PIXELS)  # a longer path is cut at the video's end
    assert torch.allclose(longer.motion, camera.motion, atol=1e-5)
    with pytest.raises(FastARError, match="holds 37 poses; 11 latent frames are 41 video frames"):
        check_path(poses, intrinsics).condition(11, *PIXELS)


def test_camera_tokens_hold_a_tokens_latent_pixels_row_major_each_its_pixels_channel_first():
    frames, height, width = 1, 16, 32  # 2 x 4 latent pixels: one row of 2 tokens
    image = torch.arange(frames * height * width * 6, dtype=torch.float32).reshape(frames, height, width, 6)
    tokens = camera_tokens(image)
    assert tokens.shape == (2, 6 * 8 * 8 * 4)
    feature = tokens[1].reshape(6, 8, 8, 2, 2)  # channel, row and column in the latent pixel, latent row, column
    for ch, r, c, p, q in ((0, 0, 0, 0, 0), (5, 7, 3, 1, 0), (2, 4, 6, 0, 1)):
        assert feature[ch, r, c, p, q] == image[0, p * 8 + r, 16 + q * 8 + c, ch]


def test_transposed_intrinsics_change_the_rays():
    camera = check_path(*walk(41)).condition(11, *PIXELS)
    fx, fy, cx, cy = camera.intrinsics
    swapped = replace(camera, intrinsics=(fy, fx, cy, cx)).tokens(0, 11, (1, 2, 2), "cpu", torch.float32)
    assert not torch.allclose(swapped, camera.tokens(0, 11, (1, 2, 2), "cpu", torch.float32))


def test_a_camera_folder_is_read_and_bad_ones_are_refused_by_name(tmp_path):
    poses, intrinsics = walk(41)
    np.save(tmp_path / "poses.npy", poses.astype(np.float32))
    np.save(tmp_path / "intrinsics.npy", np.tile(intrinsics, (41, 1)).astype(np.float32))
    path = read_camera_folder(tmp_path)
    assert path.num_frames == 41 and np.allclose(path.intrinsics, intrinsics, rtol=1e-6)
    with pytest.raises(FastARError, match="intrinsics.npy is missing"):
        (tmp_path / "intrinsics.npy").unlink()
        read_camera_folder(tmp_path)
    with pytest.raises(FastARError, match="not a folder|no such folder"):
        read_camera_folder(tmp_path / "poses.npy")
    bent = poses.copy()
    bent[3, 0, 0] = 3.0
    with pytest.raises(FastARError, match="pose 3 is not a rigid camera-to-world matrix"):
        check_path(bent, intrinsics)
    with pytest.raises(FastARError, match=r"poses have shape \[41, 3, 4\]"):
        check_path(poses[:, :3], intrinsics)
    with pytest.raises(FastARError, match="focal lengths"):
        check_path(poses, np.array([0.0, 500, 416, 240]))


# -- the key timeline --------------------------------------------------------------------------------------------

def test_the_motion_model_walks_turns_and_looks_at_its_rates():
    fps = 16
    forward = poses_from_keys(np.tile([1, 0, 0, 0], (fps + 1, 1)), fps)  # W held one second
    assert np.allclose(forward[0], np.eye(4)) and np.allclose(forward[-1, :3, 3], [0, 0, 1])
    turn = poses_from_keys(np.tile([0, 0, 0, 1], (fps + 1, 1)), fps)  # L one second: 16 degrees right
    assert np.isclose(np.degrees(np.arctan2(turn[-1, 0, 2], turn[-1, 2, 2])), 16.0)
    look = poses_from_keys(np.tile([0, 0, 1, 0], (20 * fps, 1)), fps)  # I held: up to the 60 degree limit
    assert np.isclose(np.degrees(np.arcsin(-look[-1, 1, 2])), 60.0) and np.allclose(look[:, :3, 3], 0)
    diagonal = poses_from_keys(np.tile([1, 1, 0, 0], (fps + 1, 1)), fps)  # W D: the same speed, at 45 degrees
    assert np.isclose(np.linalg.norm(diagonal[-1, :3, 3]), 1.0) and np.allclose(diagonal[-1, :3, 3], [0.5**0.5, 0,
                                                                                                      0.5**0.5])
    up_and_walk = poses_from_keys(np.array([[0, 0, 1, 0]] * 9 + [[1, 0, 0, 0]] * 8), fps)
    assert np.isclose(up_and_walk[-1, 1, 3], 0.0)  # looking up does not lift the walk off the ground


def test_a_lingbot_timeline_reads_arrows_holds_keys_and_refuses_what_is_not_its_own():
    script = parse_text("variant lingbot\nturn_rate 32\n0 W\n0.5 W right\n1 -\n", "timeline")
    assert script.fps == 16 and script.turn_rate == 32 and script.entries[1].keys == ("W", "L")
    poses = script.to_poses(25)
    yaw = np.degrees(np.arctan2(poses[:, 0, 2], poses[:, 2, 2]))
    # frames 8..15 (0.5 s to 1 s) turn 2 degrees each: a frame's keys move the camera from the frame before to it
    assert np.isclose(yaw[7], 0) and np.isclose(yaw[8], 2.0) and np.isclose(yaw[15], 16.0) and np.isclose(yaw[24], 16)
    assert np.allclose(poses[16:, :3, 3], poses[16, :3, 3])  # nothing held from 1 s: the camera stays
    assert parse_text(script.to_text()) == script and parse_text(json.dumps(script.to_dict())) == script
    with pytest.raises(FastARError, match="J .turn_left. and L .turn_right. are opposite"):
        parse_text("variant lingbot\n0 left right\n")
    with pytest.raises(FastARError, match="mouse_step is not for lingbot"):
        parse_text("variant lingbot\nmouse_step 0.2\n0 W\n")
    with pytest.raises(FastARError, match="turn_rate is not for universal"):
        parse_text("variant universal\nturn_rate 3\n0 W\n")
    with pytest.raises(FastARError, match="steers a camera"):
        script.to_tensors(5)
    with pytest.raises(FastARError, match="lingbot has no mouse input"):
        parse_text('{"variant": "lingbot", "timeline": [{"at": 0, "mouse": [0, 1]}]}')


# -- the loader ----------------------------------------------------------------------------------------------

def test_a_sharded_folder_loads_from_its_root_folder_or_a_file(tmp_path):
    model = random_lingbot(TINY, seed=1)
    folder = save_lingbot(model, tmp_path / "transformers", max_shard_bytes=200_000)
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) > 1 and (folder / "diffusion_pytorch_model.safetensors.index.json").is_file()
    for path in (tmp_path, folder, shards[0]):
        assert find_model_folder(path) == folder and is_lingbot(path)
        loaded, ckpt = load_lingbot(path)
        assert ckpt.config == TINY and ckpt.config.size == "custom"
        for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert torch.equal(a, b), k
    single = save_lingbot(model, tmp_path / "single")
    assert load_lingbot(single)[1].shards == [str(single / "diffusion_pytorch_model.safetensors")]


def test_a_damaged_folder_is_refused_naming_what_is_wrong(tmp_path):
    folder = save_lingbot(random_lingbot(TINY), tmp_path / "m", max_shard_bytes=200_000)
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    shards = sorted(folder.glob("*.safetensors"))
    shards[-1].rename(tmp_path / "away.safetensors")
    with pytest.raises(CheckpointError, match="lists 1 shard.s. not in"):
        load_lingbot(folder)
    (tmp_path / "away.safetensors").rename(shards[-1])
    data = json.loads(index.read_text())
    key = next(iter(data["weight_map"]))
    data["weight_map"][key] = shards[-1].name if data["weight_map"][key] != shards[-1].name else shards[0].name
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="does not match its shards"):
        load_lingbot(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    index.unlink()
    with pytest.raises(CheckpointError, match="missing .* keys"):
        load_lingbot(folder)
    assert not is_lingbot(tmp_path / "nothing") and find_model_folder(tmp_path) is None


def test_the_released_config_reads_as_14b_and_the_1_3b_as_its_own_size():
    base = {"_class_name": "WanModelFast", "model_type": "i2v", "in_dim": 36, "dim": 5120, "ffn_dim": 13824,
            "num_heads": 40, "num_layers": 40, "local_attn_size": -1, "sink_size": 0}
    big = from_reference_config(base)
    assert big.size == "14B" and big.text_dim == 4096 and big.camera_dim == 1536 and big.freq_dim == 256
    small = from_reference_config({**base, "dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30})
    assert small.size == "1.3B" and small.head_dim == 128
    assert default_cache(big) == CacheSpec(policy="window", window_frames=18, sink_frames=6)
    for bad, match in (({"model_type": "t2v"}, "image-to-video"), ({"_class_name": "WanModel"}, "WanModelFast"),
                       ({"patch_size": [1, 2, 2]}, "never writes"), ({"in_dim": 16}, "in_dim 16")):
        with pytest.raises(ValueError, match=match):
            from_reference_config({**base, **bad})


def test_the_schedule_is_generate_pys_with_its_renoise_levels():
    s = get_schedule("lingbot")
    assert s.timesteps == [999.0, 967.0, 908.0, 768.0] and s.shift == 10.0
    assert s.renoise_sigmas is not None and all(r < c for r, c in zip(s.renoise_sigmas, s.sigmas[1:]))


# -- the family --------------------------------------------------------------------------------------------------

def test_a_rollout_is_deterministic_rolls_its_window_and_reads_the_camera():
    model = random_lingbot(TINY, seed=2)
    first = rollout(model, 40)
    assert torch.equal(first.latent, rollout(model, 40).latent) and torch.isfinite(first.latent).all()
    assert first.cache_stats["frames"] == 14 and first.cache_stats["evicted_frames"] > 0
    assert isinstance(CausalRunner(model).family, LingBotFamily)
    still = conditioning(40, camera=check_path(np.tile(np.eye(4), (157, 1, 1)), [500, 500, 416, 240.0])
                         .condition(40, *PIXELS))
    assert not torch.allclose(rollout(model, 40, cond=still).latent, first.latent, atol=1e-3)


def test_what_a_lingbot_rollout_needs_is_asked_for_by_name():
    model = random_lingbot(TINY, seed=2)
    cond = conditioning(12)
    with pytest.raises(FastARError, match="steered by a camera path"):
        rollout(model, 12, cond=replace(cond, camera=None))
    with pytest.raises(FastARError, match="camera path covers 12 latent frames; the rollout makes 16"):
        rollout(model, 16, cond=replace(conditioning(16), camera=cond.camera))
    wrong_size = check_path(*walk(45)).condition(12, 64, 48)
    with pytest.raises(FastARError, match="rays are for 64x48 pixels"):
        rollout(model, 12, cond=replace(cond, camera=wrong_size))
    with pytest.raises(FastARError, match="give a prompt"):
        rollout(model, 12, cond=replace(cond, prompts=None))
    with pytest.raises(FastARError, match="re-encodes its context"):
        rollout(model, 12, cache=CacheSpec(policy="recompute", window_frames=8, sink_frames=1))


def test_tempcache_at_the_windows_capacity_and_at_half_stays_bounded_near_the_window():
    """FAST-AR on LingBot: TempCache holding the window's 14 cached frames' worth (sink 6) and half of it (7, sink
    3); bytes bounded by its capacity whatever the length; the output measured against the dense window."""
    model = random_lingbot(TINY, seed=3)
    frames = 48
    window = rollout(model, frames)
    allocated = {}
    for capacity, sink in ((14, 6), (7, 3)):
        s = resolve_settings(preset="balanced", sink_frames=sink,
                             tempcache_overrides={"capacity_frames": capacity},
                             attention_overrides={"annca": False, "annsa": False})
        assert s.cache.tempcache == TempCacheSettings().with_overrides(capacity_frames=capacity)
        result = rollout(model, frames, cache=s.cache, fastar=s.fastar)
        assert torch.isfinite(result.latent).all()
        allocated[capacity] = result.cache_stats["allocated_bytes"]
        assert result.cache_stats["live_bytes"] <= allocated[capacity]
        planned = [s.cache.policy_class.planned_bytes(s.cache, SHAPE, n) for n in (frames, 100 * frames)]
        assert planned == [allocated[capacity]] * 2  # the same for a rollout 100 times longer
        err = ((result.latent - window.latent).norm() / window.latent.norm()).item()
        assert 0 < err < 1.0
    assert allocated[7] < 0.6 * allocated[14]


def test_annsa_engages_where_a_head_has_enough_keys():
    model = random_lingbot(TINY, seed=3)
    s = resolve_settings(preset="balanced", sink_frames=6, tempcache_overrides={"capacity_frames": 14},
                         attention_overrides={"annca": False, "annsa": True, "annsa_min_keys": 0})
    sampler = build_sampler(CausalRunner(model), s.fastar, measure=True)
    result = sampler.generate(conditioning(24), rollout_config(model.config, 24, *LATENT_HW, cache=s.cache))
    late = result.chunks[-2].extra  # the cache is full: 14 frames of 6 keys beside the chunk's own
    assert 0.0 < late["density"] < 1.0 and 0.0 < late["recall"] <= 1.0


def test_a_rollout_runs_past_the_releases_1024_frame_cap_at_flat_bytes():
    """The release's RoPE table ends at latent frame 1,023; the pack has no table. A cheap model (one layer, 2x2
    latents) runs to frame 1,063 with the cache's bytes the same after every chunk once the window is full, and its
    first frames are those of a shorter rollout (a causal rollout does not depend on what comes after)."""
    cfg = replace(TINY, num_layers=1)
    model = random_lingbot(cfg, seed=4)
    frames = 1064
    g = torch.Generator().manual_seed(0)
    video = 4 * (frames - 1) + 1
    camera = check_path(*walk(video)).condition(frames, 16, 16)
    cond = lingbot_conditioning(torch.randn(1, 8, cfg.text_dim, generator=g),
                                torch.randn(1, 16, 1, 2, 2, generator=g).expand(-1, -1, frames, -1, -1), camera)
    bytes_after = []
    result = ARSampler(CausalRunner(model)).generate(
        cond, rollout_config(cfg, frames, 2, 2), callback=lambda r: bytes_after.append(r.cache_bytes))
    assert torch.isfinite(result.latent).all() and result.latent.shape[2] == frames
    assert len(set(bytes_after[4:])) == 1
    short_camera = check_path(*walk(video)).conditioning_over(frames, video, 16, 16)
    short = ARSampler(CausalRunner(model)).generate(replace(cond, camera=short_camera), rollout_config(cfg, 24, 2, 2))
    assert torch.equal(short.latent, result.latent[:, :, :24])
