"""The Live World node in real ComfyUIs and their editors (headless Chromium through playwright-core): load the
live demo workflow, queue it, click the node and hold keys, see its frames arrive and move the way the keys say
(the camera on the demo world's map, and the pixels shifting with it), Cancel a play mid-way, check the server
still serves, and replay the played actions through the Long Video Sampler for the same latent, bit for bit.

Hosts as tests/test_comfyui_host.py takes them (COMFYUI_DIR / COMFYUI_DIRS), each with the editor it ships, and
every further editor in FASTAR_FRONTEND_ROOTS (``static`` folders of comfyui-frontend-package, ":"-separated;
docs/testing.md) on each host that can load it. Needs node, Chromium and playwright-core (FASTAR_PLAYWRIGHT_MODULES).
FASTAR_LIVE_SCREENSHOT names a file to copy the mid-play screenshot to (the README's)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest
import torch
from test_comfyui_host import HOSTS, Server, free_port, run_prompt

from comfyui_fastar.fastar_core.families.demo.steer_world import MOVES
from comfyui_fastar.nodes.node_loader import BUNDLED_DEMO_WORLD

from http_fuzz import BAD_BODIES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "live_check" / "play_live.cjs"
WORKFLOW = ROOT / "example_workflows" / "fastar_live_world_demo.json"
FRONTEND_ROOTS = [r for r in os.environ.get("FASTAR_FRONTEND_ROOTS", "").split(":") if r]
SETUPS = [(h, None) for h in HOSTS] + [(h, r) for h in HOSTS for r in FRONTEND_ROOTS]
PLAY_FRAMES = 41
KNOWN_PAGE_ERRORS = ("Cannot read properties of undefined (reading 'id')",  # 1.27.10, on every page
                     "graph accessed before initialization")  # 1.45.20, on every page
pytestmark = [pytest.mark.comfyui, pytest.mark.slow,
              pytest.mark.skipif(not HOSTS, reason="set COMFYUI_DIR (or COMFYUI_DIRS=a:b) to hosts built by "
                                                   "setup_comfyui.sh")]


def browser():
    node, chromium = shutil.which("node"), shutil.which("chromium") or "/usr/bin/chromium"
    modules = os.environ.get("FASTAR_PLAYWRIGHT_MODULES", "/tmp/editor-check/node_modules")
    if not node or not Path(chromium).is_file() or not (Path(modules) / "playwright-core").is_dir():
        pytest.skip("needs node, Chromium and playwright-core (FASTAR_PLAYWRIGHT_MODULES)")
    return node, chromium, modules


@pytest.fixture(scope="module", params=SETUPS,
                ids=[f"comfyui-{h.version}" + (f"-editor-{Path(r).parent.name}" if r else "") for h, r in SETUPS])
def live_server(request, tmp_path_factory):
    host, front_end = request.param
    base = tmp_path_factory.mktemp(f"live_{host.version}")
    pack_folder = host.stage(base)
    port = free_port(0)
    log_path = base / "server.log"
    args = [host.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--base-directory",
            str(base), "--output-directory", str(base / "output"), "--database-url", f"sqlite:///{base / 'c.db'}"]
    if front_end:
        args += ["--front-end-root", front_end]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=host.dir, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    srv = Server(host, port, log_path, base / "output", pack_folder)
    srv.front_end = front_end
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail("ComfyUI exited at start-up:\n" + log_path.read_text()[-3000:])
            try:
                if srv.http("GET", "/object_info/FastAR_LiveWorld", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        else:
            pytest.fail("ComfyUI did not come up:\n" + log_path.read_text()[-3000:])
        yield srv
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def workflow(tmp_path: Path, play: str, length: int) -> Path:
    """The shipped live workflow with one of its Live World nodes muted, a shorter play at 8 frames a second, and the
    FAST-AR play's latent saved (for the replay)."""
    wf = json.loads(WORKFLOW.read_text())
    for n in wf["nodes"]:
        if n["type"] == "FastAR_LiveWorld":
            n["widgets_values"][2], n["widgets_values"][6] = length, 8
            n["mode"] = 0 if n["title"].endswith(play) else 2
    live = next(n for n in wf["nodes"] if n.get("title", "").endswith("FAST-AR"))
    link = wf["last_link_id"] + 1
    live["outputs"][0]["links"].append(link)
    wf["nodes"].append({
        "id": 16, "type": "SaveLatent", "pos": [1460, 420], "size": [300, 60], "flags": {}, "order": 20,
        "mode": 0 if play == "FAST-AR" else 2, "outputs": [], "properties": {"Node name for S&R": "SaveLatent"},
        "inputs": [{"name": "samples", "type": "LATENT", "link": link},
                   {"name": "filename_prefix", "type": "STRING", "widget": {"name": "filename_prefix"}, "link": None}],
        "widgets_values": ["fastar_live/played"]})
    wf["links"].append([link, live["id"], 0, 16, 0, "LATENT"])
    wf["last_link_id"], wf["last_node_id"] = link, 16
    path = tmp_path / f"live_{play}.json"
    path.write_text(json.dumps(wf))
    return path


def drive(server, tmp_path, path: Path, *args) -> dict:
    node, chromium, modules = browser()
    run = subprocess.run([node, str(SCRIPT), "--server", server.url, "--chromium", chromium, "--workflow", str(path),
                          "--out", str(tmp_path), *args], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "NODE_PATH": modules})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    errors = [e for e in result.get("errors", []) if not any(k in e for k in KNOWN_PAGE_ERRORS)]
    assert not errors, errors
    return result


def pixels(record) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(record["rgb"])), dtype=torch.uint8)
    return raw.view(record["height"], record["width"], 3).permute(2, 0, 1).float()


def best_move(a: torch.Tensor, b: torch.Tensor) -> str:
    def error(dx, dy):
        sx, sy, H, W = 4 * dx, 4 * dy, a.shape[1], a.shape[2]
        return float(((b[:, max(0, -sy):H - max(0, sy), max(0, -sx):W - max(0, sx)]
                       - a[:, max(0, sy):H - max(0, -sy), max(0, sx):W - max(0, -sx)]) ** 2).mean())
    return min(MOVES, key=lambda name: error(*MOVES[name]))


def saved_latent(server, name: str) -> torch.Tensor:
    from safetensors.torch import load_file

    files = sorted((server.out / "fastar_live").glob(f"{name}_*.latent"))
    assert files, f"no {name} latent in {server.out}"
    return load_file(str(files[-1]))["latent_tensor"]


def replay_prompt(script: str, seed: int = 0) -> dict:
    wf = json.loads(WORKFLOW.read_text())
    start = next(n for n in wf["nodes"] if n["type"] == "FastAR_DemoWorldStart")["widgets_values"]
    attention = next(n for n in wf["nodes"] if n["type"] == "FastAR_Attention")["widgets_values"]
    names = ["preset", "tempcache", "threshold", "capacity_frames", "annca", "annsa", "bits", "tables",
             "dense_warmup", "layers", "backend"]
    return {
        "1": {"class_type": "FastAR_LoadARVideoModel", "inputs": {"model_name": BUNDLED_DEMO_WORLD,
                                                                  "weight_dtype": "default", "lora_name": "none",
                                                                  "shift": 5.0}},
        "2": {"class_type": "FastAR_Attention", "inputs": {"model": ["1", 0], **dict(zip(names, attention))}},
        "3": {"class_type": "FastAR_DemoWorldStart", "inputs": dict(zip(("map_seed", "x", "y"), start))},
        "4": {"class_type": "FastAR_ActionScript", "inputs": {"variant": "demo_world", "fps": 16.0,
                                                              "script": script}},
        "5": {"class_type": "FastAR_LongVideoSampler",
              "inputs": {"model": ["2", 0], "positive": ["3", 0], "actions": ["4", 0], "width": 24, "height": 24,
                         "length": PLAY_FRAMES, "frames_per_block": 1, "schedule": "model's own", "mode": "auto",
                         "seed": seed, "cache_policy": "auto", "sink_frames": 3, "window_frames": 12,
                         "context_noise": 0.0}},
        "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": "fastar_live/replay"}},
    }


def test_the_extension_is_served_and_nothing_else_of_the_pack(live_server):
    from http_fuzz import raw_request

    port = int(live_server.url.rsplit(":", 1)[1])
    status, listed = live_server.http("GET", "/extensions")
    ours = [e for e in listed if "/ComfyUI-FastAR/" in e]
    assert status == 200 and ours == ["/extensions/ComfyUI-FastAR/fastar_live.js"], ours
    status, body = raw_request(port, b"GET /extensions/ComfyUI-FastAR/fastar_live.js HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     b"Connection: close\r\n\r\n")
    assert status == 200 and b"registerExtension" in body
    for path in ("/extensions/ComfyUI-FastAR/../__init__.py", "/extensions/ComfyUI-FastAR/%2e%2e/__init__.py",
                 "/extensions/ComfyUI-FastAR/..%2f__init__.py", "/extensions/ComfyUI-FastAR/../nodes/live.py"):
        status, body = raw_request(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                                         .encode())
        assert status in (400, 403, 404) and b"NODE_CLASS_MAPPINGS" not in body and b"PLAYS" not in body, (path, status)
    # The key route of a play that is not running: 404, for any id.
    assert live_server.http("POST", "/fastar/live/0123/keys", {"keys": ["d"]})[0] == 404


def wait_for_idle(server, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, queue = server.http("GET", "/queue")
        if status == 200 and not queue["queue_running"] and not queue["queue_pending"]:
            return
        time.sleep(0.5)
    pytest.fail(f"ComfyUI's queue did not empty in {timeout:g} s")


def test_a_person_plays_the_demo_world_in_the_editor_cancels_and_replays(live_server, tmp_path):
    server = live_server
    # -- play: hold the right arrow, then S, then nothing, while the frames come -------------------------------------
    played = drive(server, tmp_path, workflow(tmp_path, "FAST-AR", PLAY_FRAMES),
                   "--keys", json.dumps([["ArrowRight", 10], ["s", 10], [None, 6]]))
    assert played["selected"], "clicking the node's title did not select it"
    assert played["ended"][-1]["reason"] == "finished" and played["frames_shown"] >= PLAY_FRAMES - 1
    frames = {r["frame"]: r for r in played["recent"]}
    cameras = {t: r["camera"] for t, r in frames.items()}
    moves = []
    for t in sorted(frames):
        if t - 1 not in frames:
            continue
        dx, dy = ((now - before + 12) % 24 - 12 for now, before in zip(cameras[t], cameras[t - 1]))
        move = next(name for name, step in MOVES.items() if step == (dx, dy))  # one patch a frame, or still
        moves.append((move, best_move(pixels(frames[t - 1]), pixels(frames[t]))))
    made = [m for m, _ in moves]
    assert made.count("right") >= 5 and made.count("down") >= 5, made  # the keys held steered the camera
    assert set(made) <= {"right", "down", "none"}, made  # and nothing else did
    assert sum(m == seen for m, seen in moves) >= 0.8 * len(moves), moves  # the frames moved with the camera
    sent = [s["keys"] for s in played["sent"]]
    assert ["ArrowRight"] in sent and ["s"] in sent and sent[-1] == []
    shot = Path(played["screenshot"])
    assert shot.is_file() and shot.stat().st_size > 5000
    if os.environ.get("FASTAR_LIVE_SCREENSHOT"):
        shutil.copy(shot, os.environ["FASTAR_LIVE_SCREENSHOT"])
    wait_for_idle(server)  # the nodes after the play (its frames saved, the texts shown) run once it ends
    status, history = server.http("GET", "/history")
    texts = [o["text"][0] for e in history.values() for o in e["outputs"].values()
             if isinstance(o.get("text"), list) and o["text"] and str(o["text"][0]).startswith("variant demo_world")]
    assert texts, json.dumps(history)[:3000]  # the script the play wrote (its node's text, and Preview Any's)
    script = texts[0]
    played_latent = saved_latent(server, "played")
    assert played_latent.shape == (1, 3, PLAY_FRAMES, 24, 24)
    # -- cancel: the dense play, stopped mid-way; hostile bodies to its route on the way --------------------------
    bodies = tmp_path / "hostile.json"
    bodies.write_text(json.dumps([[n, base64.b64encode(b).decode()] for n, b in BAD_BODIES]
                                 + [["over 4 KiB", base64.b64encode(b" " * 5000).decode()]]))
    cancelled = drive(server, tmp_path, workflow(tmp_path, "dense", 2000), "--cancel", "--hostile", str(bodies))
    assert cancelled["ended"][-1]["reason"] == "cancelled" and cancelled["frames_before_end"] < 200
    assert [s for _, s in cancelled["hostile"][:-1]] == [400] * (len(BAD_BODIES) + 1), cancelled["hostile"]
    assert cancelled["hostile"][-1][1] == 200 and cancelled["after_end"] == 404
    # -- the server is healthy: it answers, its queue is empty, and the replay runs -------------------------------
    assert server.http("GET", "/system_stats")[0] == 200
    wait_for_idle(server, 60)
    entry = run_prompt(server, replay_prompt(script), timeout=600)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    assert torch.equal(saved_latent(server, "replay"), played_latent)  # the same latent, bit for bit
