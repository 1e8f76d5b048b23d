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

import base64
import time

import torch

from ..fastar_core.rollout.live_actions import PayloadError, PlayRegistry, read_key_state, read_request_json

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


def rgb_frames(model, x0: torch.Tensor) -> torch.Tensor | None:
    """A chunk's frames ``[F, H, W, 3]`` uint8 for the page: the latent itself where it is the video (the demo
    world), else a preview through the latent format's RGB factors (ComfyUI's latent2rgb), or None without them."""
    x = x0[0].detach().float().cpu()  # [C, F, h, w]
    if model.latent_channels == 3:
        rgb = x.permute(1, 2, 3, 0)
    else:
        factors = getattr(model.latent_format, "latent_rgb_factors", None)
        if factors is None:
            return None
        weight = torch.tensor(factors, dtype=torch.float32)  # [C, 3]
        bias = getattr(model.latent_format, "latent_rgb_factors_bias", None)
        rgb = torch.einsum("cfhw,cr->fhwr", x, weight)
        if bias is not None:
            rgb = rgb + torch.tensor(bias, dtype=torch.float32)
    return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class LiveView:
    """Sends each finished chunk to the page and paces the play to at most ``max_fps`` video frames a second (0: as
    fast as the model makes them). Pacing waits between chunks only; what the model makes does not change."""

    def __init__(self, host, model, play_id: str, node, video_frames_per_latent: int, max_fps: float = 0.0):
        self.host, self.model, self.play_id, self.node = host, model, play_id, node
        self.per_latent = video_frames_per_latent
        self.max_fps = max_fps
        self.recent: list = []  # (frames, seconds) of the last chunks: the frame rate shown
        self.last = time.perf_counter()

    def message(self, report, play) -> dict:
        self.recent = [*self.recent[-7:], (report.frames, report.seconds)]
        frames = rgb_frames(self.model, report.x0)
        seconds = sum(s for _, s in self.recent)
        payload = {
            "play": self.play_id, "node": self.node, "chunk": report.index, "frame_start": report.frame_start,
            "frames": report.frames, "fps": round(sum(n for n, _ in self.recent) / seconds, 3) if seconds else None,
            "chunk_seconds": round(report.seconds, 6), "cache_mib": round(report.cache_bytes / 2**20, 4),
            "held": list(play.held()), "width": None, "height": None, "rgb": [],
        }
        camera = getattr(self.model.family, "camera", None)  # the demo world's place on its map, per frame
        if camera is not None:
            payload["camera"] = [list(camera(f)) for f in range(report.frame_start, report.frame_start + report.frames)]
        if frames is not None:
            payload.update(width=int(frames.shape[2]), height=int(frames.shape[1]),
                           rgb=[base64.b64encode(f.contiguous().numpy().tobytes()).decode() for f in frames])
        return payload

    def on_chunk(self, report, play) -> None:
        self.host.send_live(FRAMES, self.message(report, play))
        if self.max_fps > 0:
            due = self.last + report.frames * self.per_latent / self.max_fps
            while time.perf_counter() < due and not self.host.interrupted():
                time.sleep(min(0.02, max(0.0, due - time.perf_counter())))
        self.last = time.perf_counter()
