"""``fastar play``: steer the world model live in a browser, on this machine only.

A page served on 127.0.0.1 (never another interface; requests naming another host are refused, so a web page
elsewhere cannot reach it through DNS tricks). The arrow keys or WASD steer the camera; the model generates the
view chunk by chunk in a background thread, each chunk conditioned on the keys held when it starts; the page
polls for new frames and draws them with the model's frame rate and the cache size. A switch restarts the
rollout from the current place with the dense global cache or with FAST-AR: with dense the frame rate falls as
the cache grows, with FAST-AR it stays flat.

Endpoints: ``GET /`` the page, ``GET /api/state?after=N`` frames after index N and the status (JSON, frames as
base64 RGB bytes), ``GET /api/map`` the map (base64 RGB), ``POST /api/key`` the key state ``{"keys": [held
KeyboardEvent.key names]}``, ``POST /api/mode`` ``{"mode": "dense" | "fastar"}``.

The server is aiohttp's (``pip install comfyui-fastar[demo]``; ComfyUI ships it), the same way the Live World
node is served inside ComfyUI, and bodies are read as that node's are (``rollout/live_actions.py``: a valid
Content-Length of at most 4 KiB, JSON nested at most 4 deep, key names from the demo world's table; anything else
is a 400 with one line). One rollout runs at a time: a mode switch stops the running one and joins its thread
before it starts the next. The first line is printed as soon as the port is bound, before the model loads.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from collections import deque
from pathlib import Path

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.live_actions import LivePlay, PayloadError, read_key_state, read_request_json
from .console import port_error

HOST = "127.0.0.1"
VARIANT = "demo_world"  # the keys: the demo world's table (W A S D, the arrows)
MODES = ("fastar", "dense")
KEPT_FRAMES = 600  # frames the server keeps for the page to fetch
BACKLOG = 1024  # connections the kernel queues while the server is busy: a burst of clients is accepted
MAX_AFTER = 2**62


def key_to_action(key: str) -> str | None:
    """The move of a browser key (``KeyboardEvent.key``), or None for a key that steers nothing."""
    play = LivePlay(VARIANT)
    letter = play.table.names.get(key)
    return None if letter is None else play.variant.of(letter).name


def _rgb(frame: torch.Tensor) -> str:
    """``[3, H, W]`` in [-1, 1] -> base64 of H*W*3 bytes (row-major RGB)."""
    x = ((frame.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return base64.b64encode(x.numpy().tobytes()).decode()


class PlaySession:
    """One live rollout at a time: keys in, frames out. ``start`` (re)starts generation in a thread."""

    def __init__(self, demo=None, map_seed: int = 1, seed: int = 0, max_frames: int = 1200, max_fps: float = 30.0):
        from ..fastar_core.families.demo.steer_world import MAP_SIZE, STEP, make_map

        self.demo = demo  # None until ``attach`` (the server listens before the model has loaded)
        self.world = make_map(map_seed)
        self.patches = MAP_SIZE // STEP
        self.seed = seed
        self.max_frames = max_frames
        self.max_fps = max_fps
        self.lock = threading.Lock()
        self.frames: deque = deque(maxlen=KEPT_FRAMES)  # dicts: index, rgb, truth, x, y, action
        self.next_index = 0
        self.keys = LivePlay(VARIANT)  # the page's key state; a tap between two frames still moves one patch
        self.position = (self.patches // 2, self.patches // 2)
        self.mode = "fastar"
        self.stats = {"model_fps": None, "cache_bytes": 0, "frames_in_rollout": 0, "chunks": 0, "rollouts": 0}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._switch = threading.Lock()  # one start or stop at a time: never two rollouts

    # -- input ----------------------------------------------------------------------------------------------
    def held(self) -> str | None:
        """The move the keys held now make, or None."""
        letters = self.keys.held()
        return self.keys.variant.of(letters[0]).name if letters else None

    def _next_action(self) -> str:
        keyboard, _ = self.keys(0, 1)  # one frame: the key held now, or the one tapped since the last frame
        return self.keys.variant.keys[int(keyboard[0].argmax())].name

    # -- generation -----------------------------------------------------------------------------------------
    def attach(self, demo) -> None:
        """The model, once loaded (the server answers before it is)."""
        with self.lock:
            self.demo = demo

    def start(self, mode: str | None = None) -> None:
        """(Re)start the rollout in ``mode``: the running one is stopped and its thread joined first."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        with self._switch:
            self._stop_and_join()
            self.mode = mode or self.mode
            if self.demo is None:
                return  # starts when the model is attached
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True, name="fastar-play")
            self._thread.start()

    def stop(self) -> None:
        with self._switch:
            self._stop_and_join()

    def _stop_and_join(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()  # the rollout checks its stop event before every step
            self._thread = None

    @property
    def running(self) -> int:
        """Rollout threads alive (0 or 1)."""
        return sum(t.is_alive() for t in threading.enumerate() if t.name == "fastar-play")

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
        from ..fastar_core.families.demo.steer_world import render_track, track_from_actions
        from ..fastar_core.rollout.engine import build_sampler
        from ..fastar_core.rollout.sampler import ARSampler

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
            view = list(self.demo.frame_size) if self.demo is not None else [24, 24]
            return {"frames": frames, "mode": self.mode, "held": self.held(), "error": self.error,
                    "loading": self.demo is None, "rollouts_running": self.running, "view": view,
                    "map_patches": self.patches, **self.stats}

    def map_image(self) -> dict:
        img = self.world.image()
        return {"size": img.shape[-1], "rgb": _rgb(img), "step": img.shape[-1] // self.patches}


def _slice(track, start: int, end: int):
    from ..fastar_core.families.demo.steer_world import Track

    return Track(track.actions[start:end], track.positions[start:end], track.map_patches)




def _json(data, status: int = 200):
    from aiohttp import web

    return web.json_response(data, status=status, headers={"Cache-Control": "no-store"})


def make_app(session: PlaySession, port_of):
    """The aiohttp application: the page, the state, the keys and the mode switch (``port_of()``: the bound port,
    for the Host check)."""
    from aiohttp import web

    page = (Path(__file__).resolve().parent / "play_page.html").read_text().encode()

    @web.middleware
    async def local_only(request, handler):
        host = (request.headers.get("Host") or "").strip()
        if host not in {f"{HOST}:{port_of()}", f"localhost:{port_of()}"}:
            return _json({"error": "only 127.0.0.1 / localhost may be named as the host"}, 403)
        return await handler(request)

    async def index(request):
        return web.Response(body=page, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def state(request):
        try:
            after = int(request.query.get("after", "-1"))
        except ValueError:
            return _json({"error": "after must be an integer frame index"}, 400)
        return _json(session.state(max(-1, min(after, MAX_AFTER))))

    async def world_map(request):
        return _json(session.map_image())

    async def key(request):
        try:
            keys = read_key_state(await read_request_json(request), session.keys.table)
        except PayloadError as e:
            return _json({"error": str(e)}, 400)
        session.keys.update(keys)
        return _json({"held": list(session.keys.held()), "action": session.held()})

    async def mode(request):
        try:
            body = await read_request_json(request)
        except PayloadError as e:
            return _json({"error": str(e)}, 400)
        chosen = body.get("mode") if isinstance(body, dict) else None
        if not isinstance(chosen, str) or chosen not in MODES:
            return _json({"error": f"mode must be one of {', '.join(MODES)}, got {str(chosen)[:40]!r}"}, 400)
        # Stopping the rollout joins its thread: off the event loop, so the page keeps being answered meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, session.start, chosen)
        return _json({"mode": chosen})

    async def not_found(request):
        return _json({"error": f"no such page {request.path[:80]}"}, 404)

    from ..fastar_core.rollout.live_actions import MAX_BODY_BYTES

    app = web.Application(middlewares=[local_only], client_max_size=MAX_BODY_BYTES)
    app.add_routes([web.get("/", index), web.get("/api/state", state), web.get("/api/map", world_map),
                    web.post("/api/key", key), web.post("/api/mode", mode), web.route("*", "/{tail:.*}", not_found)])
    return app


class PlayServer:
    """The play page's aiohttp server, on 127.0.0.1 in a thread of its own (its own event loop)."""

    def __init__(self, session: PlaySession, port: int = 0):
        self.session = session
        self.requested_port = port
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._runner = None
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fastar-play-server")

    @property
    def server_address(self) -> tuple:
        return HOST, self.port

    def start(self) -> PlayServer:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            error, self._error = self._error, None
            self._thread.join()
            if isinstance(error, OSError):  # one line naming the port ("Address already in use" names none)
                raise port_error(error, self.requested_port, HOST) from None
            raise error
        return self

    def _serve(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self.loop)
        # A client that goes away mid-answer is aiohttp's to drop, quietly (no traceback on the console).
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
        try:
            self._runner = web.AppRunner(make_app(self.session, lambda: self.port), access_log=None,
                                         handle_signals=False)
            self.loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, HOST, self.requested_port, backlog=BACKLOG, reuse_address=False)
            self.loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
        except BaseException as e:  # reported by start(), in the caller's thread
            self._error = e
            self._ready.set()
            self.loop.close()
            return
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self._runner.cleanup())
            self.loop.close()

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()

    def server_close(self) -> None:
        """Nothing left to close once ``shutdown`` has returned (kept for callers of the former server)."""


def serve(session: PlaySession, port: int = 0) -> PlayServer:
    """Bind 127.0.0.1 (``port`` 0: any free port) and serve in a thread; returns the server (``.server_address``)."""
    return PlayServer(session, port).start()


def require_aiohttp() -> None:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise FastARError("fastar play serves its page with aiohttp, which is not installed: pip install "
                          "'comfyui-fastar[demo]' (or pip install aiohttp)") from None


def run_play(weights=None, port: int = 8765, map_seed: int = 1, seed: int = 0, mode: str = "fastar",
             max_fps: float = 30.0) -> int:
    from .demo.bundled import load_demo_model
    from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

    require_aiohttp()
    path = Path(weights) if weights else WEIGHTS_DIR / WORLD_WEIGHTS_FILE
    session = PlaySession(None, map_seed=map_seed, seed=seed, max_fps=max_fps)
    session.mode = mode
    server = serve(session, port)
    print(f"fastar play: open http://{HOST}:{server.server_address[1]}/ (loading {path.name}; arrow keys or WASD "
          "steer; Ctrl-C stops)", flush=True)
    try:
        demo = load_demo_model(path)
        if not demo.is_world:
            raise FastARError(f"{path}: not a steered-world model; train one with `fastar train-demo --world steer`")
        torch.set_num_threads(max(1, torch.get_num_threads()))
        session.attach(demo)
        session.start(mode)
        print("fastar play: the model is loaded and playing", flush=True)
        while True:
            time.sleep(1.0)
    finally:
        session.stop()
        server.shutdown()
