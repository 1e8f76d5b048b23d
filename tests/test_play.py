"""``fastar play``: the server (127.0.0.1 only, keys to moves, frames that keep coming, the mode switch) and, where
node, playwright-core and Chromium are installed, a real browser pressing keys on the page."""

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from comfyui_fastar.fastar_core.families.demo.steer_world import STEP
from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.train_command import train_demo
from comfyui_fastar.tools.play import HOST, PlaySession, key_to_action, serve

CHECK_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "play_check" / "press_keys.cjs"


@pytest.fixture(scope="module")
def world_weights(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    before = torch.get_num_threads()
    train_demo(out, steps=1, batch=1, threads=1, report=False, log=lambda m: None, world="steer",
               recipe_overrides={"clip_frames": 6})
    torch.set_num_threads(before)
    return out / "demo_model.safetensors"


@pytest.fixture()
def server(world_weights):
    torch.set_num_threads(1)
    session = PlaySession(load_demo_model(world_weights), map_seed=3, max_fps=0)
    srv = serve(session, 0)
    session.start("fastar")
    yield session, f"http://{HOST}:{srv.server_address[1]}"
    session.stop()
    srv.shutdown()
    srv.server_close()


def _get(url, host=None):
    req = urllib.request.Request(url, headers={"Host": host} if host else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _frames_until(base, count, after=-1, timeout=60.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        state = json.loads(_get(f"{base}/api/state?after={after}")[1])
        assert state["error"] is None, state["error"]
        got += state["frames"]
        after = got[-1]["index"] if got else after
        time.sleep(0.02)
    assert len(got) >= count, f"only {len(got)} frames in {timeout} s"
    return got, state


def test_browser_keys_map_to_moves():
    assert [key_to_action(k) for k in ("ArrowUp", "s", "A", "ArrowRight", "Enter", "")] == \
        ["up", "down", "left", "right", None, None]


def test_the_server_listens_on_127_0_0_1_only_and_refuses_other_host_names(server):
    session, base = server
    assert base.startswith("http://127.0.0.1:")
    status, page = _get(base + "/")
    assert status == 200 and b"fastar play" in page and b"ArrowUp" in page
    with pytest.raises(urllib.error.HTTPError, match="403"):
        _get(base + "/api/state", host="attacker.example:80")
    code, body = _post(base + "/api/mode", {"mode": "sparse"})
    assert code == 400 and "fastar, dense" in body["error"]


def test_held_keys_steer_the_camera_and_frames_keep_coming(server):
    session, base = server
    first, _ = _frames_until(base, 6)
    assert _post(base + "/api/key", {"keys": ["ArrowRight"]}) == (200, {"held": ["D"], "action": "right"})
    moved, state = _frames_until(base, 12, after=first[-1]["index"])
    rights = [f for f in moved if f["action"] == "right"]
    assert len(rights) >= 6
    for a, b in zip(rights, rights[1:]):
        if b["index"] == a["index"] + 1:
            assert b["x"] == (a["x"] + 1) % state["map_patches"] and b["y"] == a["y"]
    assert _post(base + "/api/key", {"keys": []})[1] == {"held": [], "action": None}
    # The true view shipped with each frame is the map under the camera: a right move shifts it one patch left.
    a, b = (torch.frombuffer(bytearray(__import__("base64").b64decode(f["truth"])), dtype=torch.uint8)
            .view(24, 24, 3) for f in rights[-2:])
    if rights[-1]["index"] == rights[-2]["index"] + 1:
        assert torch.equal(b[:, :-STEP], a[:, STEP:])
    assert state["model_fps"] > 0 and state["cache_bytes"] > 0 and state["mode"] == "fastar"


def test_the_mode_switch_restarts_with_a_dense_cache_that_grows(server):
    session, base = server
    _frames_until(base, 3)
    assert _post(base + "/api/mode", {"mode": "dense"}) == (200, {"mode": "dense"})
    frames, early = _frames_until(base, 9, after=json.loads(_get(base + "/api/state")[1])["frames"][-1]["index"])
    assert all(f["mode"] == "dense" for f in frames[-3:])
    _, late = _frames_until(base, 18, after=frames[-1]["index"])
    assert late["mode"] == "dense" and late["frames_in_rollout"] > early["frames_in_rollout"]
    assert late["cache_bytes"] > early["cache_bytes"]  # dense keeps every frame


def _browser_tools():
    node, chromium = shutil.which("node"), shutil.which("chromium") or "/usr/bin/chromium"
    modules = os.environ.get("FASTAR_PLAYWRIGHT_MODULES", "/tmp/editor-check/node_modules")
    if not node or not Path(chromium).is_file() or not (Path(modules) / "playwright-core").is_dir():
        pytest.skip("needs node, Chromium and playwright-core (FASTAR_PLAYWRIGHT_MODULES, default "
                    "/tmp/editor-check/node_modules)")
    return node, chromium, modules


def test_a_real_browser_steers_the_view_with_the_arrow_keys(server):
    node, chromium, modules = _browser_tools()
    session, base = server
    session.max_fps = 10  # a held key moves a few patches, well under half the map (the page's shift is unambiguous)
    run = subprocess.run([node, str(CHECK_SCRIPT), base, chromium], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "NODE_PATH": modules})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["errors"] == []
    # Frames kept coming while the keys were held, and each key moved the camera its way on the page.
    assert result["frames_shown"] >= 20
    for key, (dx, dy) in {"ArrowRight": (1, 0), "ArrowDown": (0, 1), "a": (-1, 0), "w": (0, -1)}.items():
        step = result["moves"][key]
        assert step["action"] == {"ArrowRight": "right", "ArrowDown": "down", "a": "left", "w": "up"}[key]
        assert step["dx"] * dx > 0 or step["dy"] * dy > 0, (key, step)
        assert (dx == 0 or step["dy"] == 0) and (dy == 0 or step["dx"] == 0), (key, step)
        assert step["truth_shift_matches"], (key, step)
    assert result["mode_after_switch"] == "dense"


def test_fastar_play_refuses_bad_options_and_a_model_that_is_not_a_world_model(tmp_path, capsys):
    from comfyui_fastar.tools.cli import main as fastar_main
    from comfyui_fastar.tools.demo.bundled import default_weights_path

    assert fastar_main(["play", "--port", "70000"]) != 0
    assert "--port 70000 is invalid; valid: 0..65,535" in capsys.readouterr().err
    assert fastar_main(["play", "--weights", str(tmp_path / "none.safetensors")]) != 0
    assert "--weights" in capsys.readouterr().err
    assert fastar_main(["play", "--weights", str(default_weights_path()), "--port", "0"]) != 0
    assert "not a steered-world model" in capsys.readouterr().err
