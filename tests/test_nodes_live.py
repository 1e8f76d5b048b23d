"""The Live World node without ComfyUI: keys posted to its route steer the demo world and a tiny Matrix-Game 2.0
chunk by chunk, the frames go out as they come, the played actions replay through the ordinary Long Video Sampler
bit for bit, Cancel stops the play at once, and the route refuses whatever it should (404, one 400 line) and keeps
serving."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from matrix_game_models import CLIP_DIM, tiny_config

from comfyui_fastar.fastar_core.errors import FastARError, GenerationCancelled
from comfyui_fastar.fastar_core.families.demo.steer_world import MOVES
from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import save_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.live import KEYS_ROUTE, PLAYS, live_routes
from comfyui_fastar.nodes.node_loader import BUNDLED_DEMO_WORLD

from http_fuzz import BAD_BODIES, framing_cases, one_line_error, post, raw_request

pytestmark = pytest.mark.usefixtures("one_thread")
DEMO_FRAMES = 41


class RouteServer:
    """The routes the pack adds to ComfyUI's server, on an aiohttp server of their own (127.0.0.1, a free port)."""

    def __init__(self, routes):
        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        app = web.Application()
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()


@pytest.fixture()
def live(standalone_host):
    """The standalone host with the key route served, and every live message it sends."""
    assert standalone_host.add_routes(live_routes())
    server = RouteServer(standalone_host.routes)
    messages: list = []
    standalone_host.live_listeners.append(lambda event, data: messages.append((event, data)))
    yield SimpleNamespace(host=standalone_host, port=server.port, messages=messages)
    server.close()
    assert len(PLAYS) == 0  # every play is closed when its node returns, however it returns


def send_keys(port: int, play: str, keys, mouse=None):
    body = {"keys": list(keys)} if mouse is None else {"keys": list(keys), "mouse": mouse}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{KEYS_ROUTE.format(play_id=play)}",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def steer_on_frames(live, plan):
    """Hold ``plan[i] = (until_frame, keys)`` through the route, switching as the frames arrive."""
    def run(play):
        for until, keys in plan:
            assert send_keys(live.port, play, keys)[0] == 200
            while not any(e == "fastar.live.end" for e, _ in live.messages):
                frames = [d for e, d in live.messages if e == "fastar.live.frames"]
                if frames and frames[-1]["frame_start"] + frames[-1]["frames"] >= until:
                    break
                time.sleep(0.005)

    def on_message(event, data):
        if event == "fastar.live.start":
            threading.Thread(target=run, args=(data["play"],), daemon=True).start()

    live.host.live_listeners.append(on_message)


def demo_world(fastar: bool = True):
    model = NODES["FastAR_LoadARVideoModel"]().load(BUNDLED_DEMO_WORLD)[0]
    if fastar:
        model = NODES["FastAR_Attention"]().patch(model, preset="balanced")[0]
    return model, NODES["FastAR_DemoWorldStart"]().start(4, 10, 3)[0]


def play_demo(model, positive, seed=5, length=DEMO_FRAMES):
    return NODES["FastAR_LiveWorld"]().play(model, positive, 24, 24, length, seed, "auto", 0.0, unique_id="7")


def rgb(data: dict, i: int) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(data["rgb"][i])), dtype=torch.uint8)
    return raw.view(data["height"], data["width"], 3).permute(2, 0, 1).float()


def best_move(a: torch.Tensor, b: torch.Tensor) -> str:
    """The camera move that best explains frame ``b`` after frame ``a`` (``[3, H, W]``): the overlap of ``b`` with
    ``a`` shifted by the move's patch, least squared difference."""
    def error(dx, dy):
        sx, sy, H, W = 4 * dx, 4 * dy, a.shape[1], a.shape[2]
        return float(((b[:, max(0, -sy):H - max(0, sy), max(0, -sx):W - max(0, sx)]
                       - a[:, max(0, sy):H - max(0, -sy), max(0, sx):W - max(0, -sx)]) ** 2).mean())
    return min(MOVES, key=lambda name: error(*MOVES[name]))


@pytest.mark.parametrize("fastar", [True, False], ids=["fastar", "dense"])
def test_keys_steer_the_demo_world_and_the_play_replays_bit_for_bit(live, fastar):
    model, positive = demo_world(fastar)
    steer_on_frames(live, [(12, ["d"]), (22, ["ArrowDown"]), (30, []), (DEMO_FRAMES, ["a", "w"])])
    out = play_demo(model, positive)
    latent, actions, script, report = out["result"]
    assert out["ui"]["text"] == [script] and "played live" in report
    events = [e for e, _ in live.messages]
    assert events[0] == "fastar.live.start" and events[-1] == "fastar.live.end"
    assert live.messages[-1][1]["reason"] == "finished"
    frames = [d for e, d in live.messages if e == "fastar.live.frames"]
    assert len(frames) == DEMO_FRAMES - 1  # a chunk of one frame each, after the start view
    # Each frame is sent as made: the latent (the video) in bytes, with its camera on the map.
    video = latent["samples"][0]
    for d in frames:
        shown = rgb(d, 0)
        made = ((video[:, d["frame_start"]].clamp(-1, 1) + 1) * 127.5).round()
        assert torch.equal(shown, made) and d["cache_mib"] > 0 and d["fps"] > 0
    # The camera moved as the recorded keys say, and the frames moved with it (the world's true shift).
    keys = actions.to_tensors(DEMO_FRAMES)[0].argmax(1).tolist()
    names = ["none", "up", "down", "left", "right"]
    moved = {"right", "down", "left", "up"} & {names[k] for k in keys}
    assert {"right", "down"} <= moved
    cameras = {d["frame_start"]: d["camera"][0] for d in frames}
    agree = 0
    for t in range(2, DEMO_FRAMES):
        dx, dy = MOVES[names[keys[t]]]
        assert cameras[t] == [(cameras[t - 1][0] + dx) % 24, (cameras[t - 1][1] + dy) % 24], t
        agree += best_move(rgb(frames[t - 2], 0), rgb(frames[t - 1], 0)) == names[keys[t]]
    assert agree >= 0.8 * (DEMO_FRAMES - 2), agree
    # The ordinary sampler, given the recorded actions, makes the same latent bit for bit.
    replay, _ = NODES["FastAR_LongVideoSampler"]().sample(model, positive, 24, 24, DEMO_FRAMES, frames_per_block=1,
                                                         schedule="model's own", seed=5, actions=actions)
    assert torch.equal(replay["samples"], latent["samples"])
    # The script text is that ACTIONS, as an Action Script node reads it back.
    again = NODES["FastAR_ActionScript"]().build("demo_world", 16.0, script)[0]
    assert torch.equal(again.to_tensors(DEMO_FRAMES)[0], actions.to_tensors(DEMO_FRAMES)[0])


def test_cancel_stops_the_play_at_once_and_its_route_then_answers_404(live):
    model, positive = demo_world()
    seen = {}

    def on_message(event, data):
        if event == "fastar.live.start":
            seen["play"] = data["play"]
        if event == "fastar.live.frames" and data["frame_start"] == 3:
            live.host.interrupt_requested = True  # ComfyUI's Cancel
    live.host.live_listeners.append(on_message)
    with pytest.raises(GenerationCancelled):
        play_demo(model, positive, length=200)
    frames = [d for e, d in live.messages if e == "fastar.live.frames"]
    assert frames[-1]["frame_start"] <= 4  # stopped at the next step, not the end of the video
    assert live.messages[-1] == ("fastar.live.end", {"play": seen["play"], "node": "7", "reason": "cancelled"})
    # A page left open after the run: its keys find no play and change nothing.
    assert send_keys(live.port, seen["play"], ["d"]) == (404, {"error": "no play with this id is running (it ended, "
                                                                        "or never started)"})


def test_hostile_key_requests_get_a_4xx_change_nothing_and_the_route_keeps_serving(live):
    from comfyui_fastar.fastar_core.rollout.live_actions import LivePlay

    play = LivePlay("demo_world")
    play_id = PLAYS.open(play)
    try:
        path, host = KEYS_ROUTE.format(play_id=play_id), f"127.0.0.1:{live.port}"
        assert send_keys(live.port, play_id, ["d"]) == (200, {"held": ["D"]})
        for name, body in BAD_BODIES:
            status, answer = raw_request(live.port, post(path, host, body))
            assert status == 400 and one_line_error(status, answer), (name, status, answer[:200])
        for name, data, expected, options in framing_cases(path, host):
            status, answer = raw_request(live.port, data, **options)
            assert status == expected, (name, status, answer[:200])
        assert (play.held(), play.updates) == (("D",), 1)  # nothing refused reached the play
        assert send_keys(live.port, "0" * 32, ["d"])[0] == 404
        assert raw_request(live.port, post(KEYS_ROUTE.format(play_id="../../etc"), host, b"{}"))[0] == 404
        assert send_keys(live.port, play_id, ["ArrowLeft"]) == (200, {"held": ["A"]})  # still serving
    finally:
        PLAYS.close(play_id)


def test_matrix_game_plays_live_with_keys_and_mouse_and_replays_bit_for_bit(live, tmp_path):
    folder = tmp_path / "matrix_game_universal"
    folder.mkdir()
    save_matrix_game(random_matrix_game(tiny_config("universal"), seed=2), folder / "model.safetensors")
    model = NODES["FastAR_LoadARVideoModel"]().load("matrix_game_universal/model.safetensors")[0]
    tokens = torch.randn(1, 257, CLIP_DIM, generator=torch.Generator().manual_seed(5))
    image = torch.rand(1, 32, 48, 3, generator=torch.Generator().manual_seed(6))

    class SeededVAE:
        def encode(self, pixels):
            g = torch.Generator().manual_seed(pixels.shape[0])
            return torch.randn(1, 16, (pixels.shape[0] - 1) // 4 + 1, 4, 6, generator=g)

    positive = NODES["FastAR_WorldModelStart"]().encode(SimpleNamespace(penultimate_hidden_states=tokens),
                                                        SeededVAE(), image, 48, 32, 25)[0]

    def run(play):
        send_keys(live.port, play, ["w"], mouse=[40, -10])
        while not any(e == "fastar.live.frames" for e, _ in live.messages):
            time.sleep(0.005)
        assert send_keys(live.port, play, ["ArrowLeft", "s"], mouse=[-25, 0])[0] == 200

    live.host.live_listeners.append(
        lambda event, data: event == "fastar.live.start" and threading.Thread(target=run, args=(data["play"],)).start())
    out = NODES["FastAR_LiveWorld"]().play(model, positive, 48, 32, 25, 3, "auto", 0.0, unique_id="3")
    latent, actions, script, report = out["result"]
    keyboard, mouse = actions.to_tensors(25)
    assert actions.variant == "universal" and mouse is not None and bool((mouse != 0).any())
    assert "mouse" in script  # mouse movement is written as explicit [pitch, yaw] moves
    replay, _ = NODES["FastAR_LongVideoSampler"]().sample(model, positive, 48, 32, 25, schedule="model's own",
                                                         seed=3, actions=actions)
    assert torch.equal(replay["samples"], latent["samples"])
    frames = [d for e, d in live.messages if e == "fastar.live.frames"]
    assert len(frames) == 3 and all(d["rgb"] == [] for d in frames)  # no latent2rgb factors outside ComfyUI


def test_the_live_node_refuses_a_model_nobody_steers_and_a_batch(live):
    from comfyui_fastar.fastar_core.model.wan_config import WanConfig
    from comfyui_fastar.fastar_core.model.wan_model import random_wan
    from comfyui_fastar.nodes.standalone import StandaloneModel

    wan = StandaloneModel(random_wan(WanConfig(dim=64, num_heads=2, num_layers=1, ffn_dim=64, text_dim=32,
                                               freq_dim=32), seed=0))
    with pytest.raises(FastARError, match="which is not steered: Live World plays world models"):
        NODES["FastAR_LiveWorld"]().play(wan, [[torch.zeros(1, 4, 32), {}]], 32, 32, 5, 0)
    model, positive = demo_world()
    with pytest.raises(FastARError, match="the demo world's frames are 24x24 pixels"):
        NODES["FastAR_LiveWorld"]().play(model, positive, 32, 32, 9, 0)
    with pytest.raises(FastARError, match="the Action Script is for universal, but this MODEL is the demo world"):
        universal = NODES["FastAR_ActionScript"]().build("universal", 12.0, "0 W")[0]
        NODES["FastAR_LongVideoSampler"]().sample(model, positive, 24, 24, 9, frames_per_block=1,
                                                  schedule="model's own", actions=universal)
    with pytest.raises(FastARError, match="samples with its file's unipc-6"):
        demo_actions = NODES["FastAR_ActionScript"]().build("demo_world", 16.0, "0 D")[0]
        NODES["FastAR_LongVideoSampler"]().sample(model, positive, 24, 24, 9, frames_per_block=1,
                                                  actions=demo_actions)


def test_lingbot_plays_live_its_keys_walk_the_camera_and_the_script_replays_bit_for_bit(live, tmp_path):
    """LingBot-World 2.0 through its family's live variant: the keys held at each chunk walk a live camera
    (``lingbot/live.KeyCamera``, one call per chunk); the script names the play's fixed translation scale, so the
    Long Video Sampler replays it through the release's path maths to the same latent."""
    from test_lingbot import TINY as LINGBOT_TINY
    from test_nodes_lingbot import FOLDER, HEIGHT, LENGTH, WIDTH, shard, start

    from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
    from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
    from comfyui_fastar.fastar_core.rollout.action_script import parse_text

    save_lingbot(random_lingbot(LINGBOT_TINY, seed=4), tmp_path / FOLDER, max_shard_bytes=200_000)
    model = NODES["FastAR_LoadARVideoModel"]().load(shard(tmp_path), "default", "none", 5.0)[0]
    positive = start()[0]
    # The second chunk starts at video frame 13 (latent frame 4); the play waits 1 s after each chunk (max_fps 13).
    steer_on_frames(live, [(4, ["w"]), (LENGTH, ["ArrowLeft", "d"])])
    out = NODES["FastAR_LiveWorld"]().play(model, positive, WIDTH, HEIGHT, LENGTH, 3, "auto", 13.0, unique_id="7")
    latent, actions, script, report = out["result"]
    assert actions.variant == "lingbot" and actions.translation_scale == 0.25  # 4 frames of walking at 16 fps
    assert "translation_scale 0.25" in script and parse_text(script) == actions
    held = {e.frame: e.keys for e in actions.entries}
    # The second chunk's frames hold what the page held then (and W, if it was pressed after the first chunk began:
    # a key pressed between two pulls steers the next chunk).
    assert {"D", "J"} <= set(held.get(13, ())) <= {"W", "D", "J"}, script
    assert "keys played live (lingbot)" in report
    replay, replay_report = NODES["FastAR_LongVideoSampler"]().sample(
        model, positive, WIDTH, HEIGHT, LENGTH, frames_per_block=4, schedule="model's own", seed=3, actions=actions)
    assert torch.equal(replay["samples"], latent["samples"])
    assert "not LingBot-World 2.0's own" not in replay_report
    # The scale reaches the model: the same keys divided by another make another video (a negative control).
    halved = parse_text(script.replace("translation_scale 0.25\n", "translation_scale 0.5\n"))
    other, _ = NODES["FastAR_LongVideoSampler"]().sample(
        model, positive, WIDTH, HEIGHT, LENGTH, frames_per_block=4, schedule="model's own", seed=3, actions=halved)
    assert not torch.equal(other["samples"], latent["samples"])
    frames = [d for e, d in live.messages if e == "fastar.live.frames"]
    assert [d["frames"] for d in frames] == [4, 3]


def test_a_camera_scripts_translation_scale_is_checked_and_kept():
    from comfyui_fastar.fastar_core.rollout.action_script import parse_script, parse_text

    assert parse_text("variant lingbot\n0 W\n").camera_scale() is None  # the release's: the path's longest move
    fixed = parse_text("variant lingbot\ntranslation_scale 0.25\n0 W\n")
    assert fixed.camera_scale() == 0.25 and parse_text(fixed.to_text()) == fixed
    assert parse_script(fixed.to_dict()) == fixed
    for bad in ("-1", "nan", "x"):
        with pytest.raises(FastARError, match="translation_scale"):
            parse_text(f"variant lingbot\ntranslation_scale {bad}\n0 W\n")
    with pytest.raises(FastARError, match="translation_scale is not for universal"):
        parse_script({"variant": "universal", "translation_scale": 1, "timeline": [{"at": 0, "keys": []}]})
