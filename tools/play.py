"""``fastar play``: steer the world model live in a browser, on this machine only.

A page served on 127.0.0.1 (never another interface; requests naming another host are refused, so a web page
elsewhere cannot reach it through DNS tricks). The arrow keys or WASD steer the camera; the model generates the
view chunk by chunk in a background thread, each chunk conditioned on the keys held when it starts; the page
polls for new frames and draws them with the model's frame rate and the cache size. A switch restarts the
rollout from the current place with the dense global cache or with FAST-AR: with dense the frame rate falls as
the cache grows, with FAST-AR it stays flat.

Endpoints: ``GET /`` the page, ``GET /api/state?after=N`` frames after index N and the status (JSON, frames as
base64 RGB bytes), ``GET /api/map`` the map (base64 RGB), ``POST /api/key`` ``{"key": KeyboardEvent.key,
"down": bool}``, ``POST /api/mode`` ``{"mode": "dense" | "fastar"}``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import torch

HOST = "127.0.0.1"
KEYS = {"ArrowUp": "up", "ArrowDown": "down", "ArrowLeft": "left", "ArrowRight": "right",
        "w": "up", "s": "down", "a": "left", "d": "right", "W": "up", "S": "down", "A": "left", "D": "right"}
MODES = ("fastar", "dense")
KEPT_FRAMES = 600  # frames the server keeps for the page to fetch


def key_to_action(key: str) -> str | None:
    """The move of a browser key (``KeyboardEvent.key``), or None for a key that steers nothing."""
    return KEYS.get(key)


def _rgb(frame: torch.Tensor) -> str:
    """``[3, H, W]`` in [-1, 1] -> base64 of H*W*3 bytes (row-major RGB)."""
    x = ((frame.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return base64.b64encode(x.numpy().tobytes()).decode()


class PlaySession:
    """One live rollout at a time: keys in, frames out. ``start`` (re)starts generation in a thread."""

    def __init__(self, demo, map_seed: int = 1, seed: int = 0, max_frames: int = 1200, max_fps: float = 30.0):
        from .demo.steer_world import MAP_SIZE, STEP, make_map

        self.demo = demo
        self.world = make_map(map_seed)
        self.patches = MAP_SIZE // STEP
        self.seed = seed
        self.max_frames = max_frames
        self.max_fps = max_fps
        self.lock = threading.Lock()
        self.frames: deque = deque(maxlen=KEPT_FRAMES)  # dicts: index, rgb, truth, x, y, action
        self.next_index = 0
        self.held: str | None = None
        self.taps: deque = deque(maxlen=16)
        self.position = (self.patches // 2, self.patches // 2)
        self.mode = "fastar"
        self.stats = {"model_fps": None, "cache_bytes": 0, "frames_in_rollout": 0, "chunks": 0, "rollouts": 0}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- input ----------------------------------------------------------------------------------------------
    def key(self, key: str, down: bool) -> str | None:
        action = key_to_action(key)
        if action is None:
            return None
        with self.lock:
            if down:
                if self.held != action:
                    self.taps.append(action)  # a short tap still moves one patch
                self.held = action
            elif self.held == action:
                self.held = None
        return action

    def _next_action(self) -> str:
        with self.lock:
            if self.taps:
                return self.taps.popleft()
            return self.held or "none"

    # -- generation -----------------------------------------------------------------------------------------
    def start(self, mode: str | None = None) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        self.stop()
        self.mode = mode or self.mode
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None

    def _modes(self):
        from .demo_world_command import world_modes

        modes = world_modes(self.demo.places_on_map)
        return modes["fastar"] if self.mode == "fastar" else modes["dense-global"]

    def _run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self._rollout(stop)
                with self.lock:
                    self.stats["rollouts"] += 1
        except Exception as e:  # the page shows it; the server stays up
            from ..fastar_core.rollout.sampler import GenerationCancelled

            if not isinstance(e, GenerationCancelled):
                self.error = f"{type(e).__name__}: {e}"

    def _rollout(self, stop: threading.Event) -> None:
        from ..fastar_core.rollout.engine import build_sampler
        from ..fastar_core.rollout.sampler import ARSampler
        from .demo.steer_world import render_track, track_from_actions

        demo = self.demo
        fpb = demo.frames_per_block
        track = track_from_actions(["none"] * (fpb - 1), start=self.position, map_patches=self.patches)
        truth = render_track(self.world, track)
        cache, fastar = self._modes()
        runner = demo.world_runner([track])
        sampler = build_sampler(runner, fastar, rope_max_distance=demo.rope_max_distance) if fastar else \
            ARSampler(runner)
        for _ in range(fpb):  # the first generated chunk's keys
            track.extend(self._next_action())
        self._publish(truth, truth, track, 0)
        last = [time.perf_counter()]
        recent: deque = deque(maxlen=8)

        def on_chunk(report):
            frames = report.x0[0].permute(1, 0, 2, 3).float().cpu()
            recent.append((report.frames, report.seconds))
            end = report.frame_start + report.frames
            views = render_track(self.world, _slice(track, report.frame_start, end))
            self._publish(frames, views, track, report.frame_start)
            with self.lock:
                self.stats.update(model_fps=round(sum(n for n, _ in recent) / sum(s for _, s in recent), 2),
                                  cache_bytes=report.cache_bytes, frames_in_rollout=end,
                                  chunks=self.stats["chunks"] + 1)
                self.position = tuple(int(v) for v in track.positions[end - 1])
            for _ in range(min(fpb, self.max_frames - end)):
                track.extend(self._next_action())
            if self.max_fps:  # the page shows at most this many frames per second
                wait = report.frames / self.max_fps - (time.perf_counter() - last[0])
                if wait > 0:
                    stop.wait(wait)
            last[0] = time.perf_counter()

        cfg = demo.rollout_config(self.max_frames - fpb, cache, self.seed)
        initial = truth.permute(1, 0, 2, 3)[None].to(demo.device)
        sampler.generate(demo.world_prompt(), cfg, initial_latents=initial, callback=on_chunk, cancel=stop.is_set)

    def _publish(self, frames, views, track, first: int) -> None:
        with self.lock:
            for k in range(frames.shape[0]):
                t = first + k
                x, y = (int(v) for v in track.positions[t])
                self.frames.append({"index": self.next_index, "rgb": _rgb(frames[k]), "truth": _rgb(views[k]),
                                    "x": x, "y": y, "action": track.names()[t], "mode": self.mode})
                self.next_index += 1

    # -- output ---------------------------------------------------------------------------------------------
    def state(self, after: int = -1, limit: int = 48) -> dict:
        with self.lock:
            frames = [f for f in self.frames if f["index"] > after][:limit]
            return {"frames": frames, "mode": self.mode, "held": self.held, "error": self.error,
                    "view": list(self.demo.frame_size), "map_patches": self.patches, **self.stats}

    def map_image(self) -> dict:
        img = self.world.image()
        return {"size": img.shape[-1], "rgb": _rgb(img), "step": img.shape[-1] // self.patches}


def _slice(track, start: int, end: int):
    from .demo.steer_world import Track

    return Track(track.actions[start:end], track.positions[start:end], track.map_patches)


def make_handler(session: PlaySession, port_holder: list):
    page = (Path(__file__).resolve().parent / "play_page.html").read_text()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: the page polls many times a second
            pass

        def _host_ok(self) -> bool:
            host = (self.headers.get("Host") or "").strip()
            return host in {f"{HOST}:{port_holder[0]}", f"localhost:{port_holder[0]}"}

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self):
            if not self._host_ok():
                return self._json(403, {"error": "only 127.0.0.1 / localhost may be named as the host"})
            url = urlparse(self.path)
            if url.path == "/":
                return self._send(200, page.encode(), "text/html; charset=utf-8")
            if url.path == "/api/state":
                try:
                    after = int(parse_qs(url.query).get("after", ["-1"])[0])
                except ValueError:
                    return self._json(400, {"error": "after must be an integer frame index"})
                return self._json(200, session.state(after))
            if url.path == "/api/map":
                return self._json(200, session.map_image())
            return self._json(404, {"error": f"no such page {url.path}"})

        def do_POST(self):
            if not self._host_ok():
                return self._json(403, {"error": "only 127.0.0.1 / localhost may be named as the host"})
            try:
                length = min(int(self.headers.get("Content-Length") or 0), 4096)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("expected a JSON object")
            except ValueError as e:
                return self._json(400, {"error": f"bad JSON body: {e}"})
            path = urlparse(self.path).path
            if path == "/api/key":
                action = session.key(str(body.get("key", "")), bool(body.get("down", True)))
                return self._json(200, {"action": action})
            if path == "/api/mode":
                mode = body.get("mode")
                if mode not in MODES:
                    return self._json(400, {"error": f"mode must be one of {', '.join(MODES)}, got {mode!r}"})
                session.start(mode)
                return self._json(200, {"mode": mode})
            return self._json(404, {"error": f"no such endpoint {path}"})

    return Handler


def serve(session: PlaySession, port: int = 0) -> ThreadingHTTPServer:
    """Bind 127.0.0.1 (``port`` 0: any free port) and serve in a thread; returns the server (``.server_address``)."""
    holder = [port]
    server = ThreadingHTTPServer((HOST, port), make_handler(session, holder))
    holder[0] = server.server_address[1]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_play(weights=None, port: int = 8765, map_seed: int = 1, seed: int = 0, mode: str = "fastar",
             max_fps: float = 30.0) -> int:
    from ..fastar_core.errors import FastARError
    from .demo.model import load_demo_model
    from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

    path = Path(weights) if weights else WEIGHTS_DIR / WORLD_WEIGHTS_FILE
    demo = load_demo_model(path)
    if not demo.is_world:
        raise FastARError(f"{path}: not a steered-world model; train one with `fastar train-demo --world steer`")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    session = PlaySession(demo, map_seed=map_seed, seed=seed, max_fps=max_fps)
    server = serve(session, port)
    session.start(mode)
    print(f"fastar play: open http://{HOST}:{server.server_address[1]}/ (arrow keys or WASD steer; Ctrl-C stops)",
          flush=True)
    try:
        while True:
            time.sleep(1.0)
    finally:
        session.stop()
        server.shutdown()
