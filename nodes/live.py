"""Live plays inside ComfyUI: the route a page sends its keys to, and the messages that carry each chunk's frames.

While a Live World node runs, its play is in ``PLAYS`` under a random id, which the page learns from the
``fastar.live.start`` message (sent to the client that queued the prompt, on ComfyUI's own websocket). The page
posts its key state to ``POST /fastar/live/{play_id}/keys`` (``KEYS_ROUTE``), a route on ComfyUI's own server with
its middlewares and trust model; ``rollout/live_actions.py`` reads the body, and the play answers: 200 with the
keys that steer now, 404 for an id that is not running (it ended, or never ran: a page left open after the run
changes nothing), 400 with one line for a body it refuses (nothing of it is used). After each chunk the node
sends ``fastar.live.frames``: the chunk's frames as RGB bytes (base64), its frame rate and the cache's MiB;
``fastar.live.end`` when the play stops, however it stops.
"""

from __future__ import annotations

import time

from ..fastar_core.rollout.live_actions import (
    LiveFeed,
    PayloadError,
    PlayRegistry,
    read_key_state,
    read_request_json,
)

PLAYS = PlayRegistry()
KEYS_ROUTE = "/fastar/live/{play_id}/keys"
START, FRAMES, END = "fastar.live.start", "fastar.live.frames", "fastar.live.end"


async def post_keys(request):
    """``POST /fastar/live/{play_id}/keys`` (aiohttp, as ComfyUI's server runs it)."""
    from aiohttp import web

    play = PLAYS.get(request.match_info.get("play_id"))
    if play is None:
        return web.json_response({"error": "no play with this id is running (it ended, or never started)"},
                                 status=404)
    try:
        state = read_key_state(await read_request_json(request), play.table)
    except PayloadError as e:
        return web.json_response({"error": str(e)}, status=400)
    play.update(state)
    return web.json_response({"held": list(play.held())})


def live_routes() -> list:
    return [("POST", KEYS_ROUTE, post_keys)]


class LiveView:
    """Sends each finished chunk to the page (``live_actions.LiveFeed``'s message) and paces the play to at most
    ``max_fps`` video frames a second (0: as fast as the model makes them). Pacing waits between chunks only; what
    the model makes does not change."""

    def __init__(self, host, model, play, play_id: str, node, video_frames_per_latent: int, max_fps: float = 0.0):
        self.host = host
        # the latent format's RGB factors (ComfyUI's latent2rgb preview) where the latent is not the video itself
        rgb = None if model.latent_channels == 3 else getattr(model.latent_format, "latent_rgb_factors", None)
        self.feed = LiveFeed(play, {"play": play_id, "node": node}, rgb_factors=rgb,
                             rgb_bias=getattr(model.latent_format, "latent_rgb_factors_bias", None),
                             camera=getattr(model.family, "camera", None), latent_is_video=model.latent_channels == 3)
        self.per_latent = video_frames_per_latent
        self.max_fps = max_fps
        self.last = time.perf_counter()

    def on_chunk(self, report) -> None:
        self.host.send_live(FRAMES, self.feed.message(report))
        if self.max_fps > 0:
            due = self.last + report.frames * self.per_latent / self.max_fps
            while time.perf_counter() < due and not self.host.interrupted():
                time.sleep(min(0.02, max(0.0, due - time.perf_counter())))
        self.last = time.perf_counter()
