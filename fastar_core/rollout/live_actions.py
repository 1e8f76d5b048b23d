"""Actions a person plays live: key state from a browser, checked, held, and pulled by the sampler chunk by chunk.

A page sends its *key state* whenever it changes: the keys held now, in the order they were pressed, and for a
variant steered by a mouse too, the mouse movement since its last message::

    {"keys": ["w", "ArrowLeft"], "mouse": [12, -3]}

``read_json_body`` reads such a message without trusting it (a valid length no larger than ``MAX_BODY_BYTES``,
nesting no deeper than ``MAX_JSON_DEPTH``, UTF-8 JSON with finite numbers) and ``read_key_state`` checks it against
the variant's key table (``KeyTable``: the variant's own letters and its arrow keys); anything else is a
``PayloadError``, one line that a server answers with 400. Nothing of a refused message is used.

``LivePlay`` holds the state and is the rollout's action source (``rollout/actions.py``'s ``ActionSource``): before
each chunk the sampler asks it for the next frames and gets what is held then, plus any key pressed since the
chunk before (a tap between two chunks still steers one chunk). Keys that cannot be held together (opposites, or
two keys of a one-at-a-time variant) resolve to the one pressed last. What the sampler pulled is the rollout's
``Actions``, so a play replays as the script ``script_from_tensors`` writes of them.

A camera variant (LingBot-World 2.0's ``lingbot``) is steered the same way, through its family's live camera
instead of action tensors: ``held_motion`` is the camera's source of held keys (``lingbot/live.KeyCamera``), each
chunk's video frames holding what is held when the chunk starts. Its translations are divided by a fixed
``translation_scale`` (``camera_motion.live_translation_scale``), which its script names, so the script replays
the play through the release's path maths bit for bit.

``PlayRegistry`` holds the plays that are running, by an unguessable id: only those take keys.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import FastARError
from .action_script import (
    DEFAULT_MOUSE_STEP,
    VARIANTS,
    ActionEntry,
    ActionScript,
    Variant,
    _opposite,
    script_from_held,
    script_from_tensors,
)
from .actions import Actions
from .camera_motion import live_translation_scale

MAX_BODY_BYTES = 4096  # a key state is a few dozen bytes
MAX_JSON_DEPTH = 4  # {"keys": [...], "mouse": [...]} nests two deep
MAX_KEYS = 16  # names in one key state
MAX_MOUSE_PIXELS = 100_000.0  # movement in one message, per axis
MOUSE_PER_PIXEL = 0.01  # [pitch, yaw] over a chunk per pixel of movement (100 pixels: 1, as ten frames of a key)
MAX_MOUSE_PER_FRAME = 0.5  # a fast flick turns at most this much a frame
BODY_TIMEOUT_S = 5.0  # a client that declares a body and does not send it
ARROWS = ("ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight")
STATE_FIELDS = ("keys", "mouse")


class PayloadError(FastARError):
    """A message a server refuses (400), with the one line it answers."""


def read_json_body(body: bytes | None, content_length, max_bytes: int = MAX_BODY_BYTES,
                   max_depth: int = MAX_JSON_DEPTH):
    """The JSON value of a request body whose declared ``content_length`` (an int, or the header's text) matches
    it, checked before it is parsed."""
    if content_length is None or content_length == "":
        raise PayloadError("the request has no Content-Length; send the JSON body with its length")
    try:
        length = int(content_length)
    except (TypeError, ValueError):
        raise PayloadError(f"Content-Length {str(content_length)[:40]!r} is not a number of bytes") from None
    if not 0 < length <= max_bytes:
        raise PayloadError(f"Content-Length {length} is out of range; valid: 1..{max_bytes} bytes")
    if body is None or len(body) != length:
        raise PayloadError(f"the body has {0 if body is None else len(body)} bytes but Content-Length says {length}")
    depth = json_depth(body)
    if depth > max_depth:
        raise PayloadError(f"the JSON nests {depth} deep; at most {max_depth}")
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise PayloadError("the body is not UTF-8 text") from None
    except ValueError as e:  # JSONDecodeError, and NaN/Infinity refused by _no_constant
        raise PayloadError(f"the body is not JSON: {str(e)[:120]}") from None


async def read_request_json(request, max_bytes: int = MAX_BODY_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON body of an HTTP request (an aiohttp ``web.Request``: its ``headers`` and ``content`` stream), read no
    further than its Content-Length, which must be valid and at most ``max_bytes``: a body that declares more, or
    no length, is refused before a byte of it is read; one that stops short or stalls is refused too."""
    declared = request.headers.get("Content-Length")
    try:
        length = int(declared) if declared is not None else None
    except ValueError:
        length = None
    if length is None or not 0 < length <= max_bytes:
        read_json_body(None, declared, max_bytes)  # raises the message for this length
    try:
        body = await asyncio.wait_for(request.content.readexactly(length), BODY_TIMEOUT_S)
    except asyncio.IncompleteReadError as e:
        raise PayloadError(f"the body ended after {len(e.partial)} of its {length} bytes") from None
    except asyncio.TimeoutError:
        raise PayloadError(f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    return read_json_body(body, length, max_bytes, max_depth)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a bare value), outside strings; read without
    parsing, so a deeply nested body is refused before the parser recurses into it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


@dataclass(frozen=True)
class KeyTable:
    """A variant's keys as a browser names them (``KeyboardEvent.key``): its letters in either case, and its
    arrow keys (``Variant.arrows``, where it gives them)."""

    variant: Variant

    @property
    def names(self) -> dict:
        table = {}
        for key in self.variant.keys:
            table[key.letter.lower()] = key.letter
            table[key.letter.upper()] = key.letter
        table.update(zip(ARROWS, self.variant.arrows))
        return table

    def describe(self) -> str:
        arrows = ", ".join(f"{a}={letter}" for a, letter in zip(ARROWS, self.variant.arrows))
        return f"{self.variant.valid_keys()}" + (f"; arrows: {arrows}" if arrows else "")

    def letter(self, name) -> str:
        if not isinstance(name, str):
            raise PayloadError(f"key {json.dumps(name)[:40]} is not a key name; valid for {self.variant.name}: "
                               f"{self.describe()}")
        letter = self.names.get(name)
        if letter is None:
            raise PayloadError(f"key {name[:40]!r} is not one of {self.variant.name}'s keys; valid: {self.describe()}")
        return letter


@dataclass(frozen=True)
class KeyState:
    letters: tuple  # the variant's letters held, in the order they were pressed
    mouse: tuple | None = None  # (dx, dy) pixels moved since the page's last message, or None


def read_key_state(value, table: KeyTable) -> KeyState:
    """A key state (``read_json_body``'s value) checked against ``table``."""
    if not isinstance(value, dict):
        raise PayloadError(f"a key state is a JSON object like {{\"keys\": [\"w\"]}}, not {type(value).__name__}")
    unknown = sorted(str(k)[:20] for k in value if k not in STATE_FIELDS)
    if unknown:
        raise PayloadError(f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(STATE_FIELDS)}")
    keys = value.get("keys", [])
    if not isinstance(keys, list) or len(keys) > MAX_KEYS:
        raise PayloadError(f"'keys' must be a list of at most {MAX_KEYS} key names")
    letters: list[str] = []
    for name in keys:
        letter = table.letter(name)
        if letter not in letters:  # "w" and "W" are one key
            letters.append(letter)
    mouse = value.get("mouse")
    if mouse is not None:
        if not table.variant.has_mouse:
            raise PayloadError(f"{table.variant.name} takes no mouse movement; send 'keys' only")
        if not isinstance(mouse, list) or len(mouse) != 2 or not all(_finite(v) for v in mouse):
            raise PayloadError("'mouse' must be [dx, dy]: the pixels moved since the last message")
        if any(abs(v) > MAX_MOUSE_PIXELS for v in mouse):
            raise PayloadError(f"'mouse' moves more than {MAX_MOUSE_PIXELS:g} pixels in one message")
        mouse = (float(mouse[0]), float(mouse[1]))
    return KeyState(tuple(letters), mouse)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def resolve_held(variant: Variant, letters) -> tuple:
    """The letters that steer, in the variant's order: of keys that cannot be held together (opposites, or any two
    of a one-at-a-time variant), the one pressed last."""
    kept: list = []
    for letter in letters:
        key = variant.of(letter)
        kept = [k for k in kept if k.letter != letter and not variant.one_at_a_time
                and not ((k.column is None) == (key.column is None) and _opposite(variant, k, key))]
        kept.append(key)
    order = [k.letter for k in variant.keys]
    return tuple(sorted((k.letter for k in kept), key=order.index))


class LivePlay:
    """One running play: the key state a page sends, and the action source its rollout pulls from."""

    def __init__(self, variant: str, fps: float | None = None, mouse_step: float = DEFAULT_MOUSE_STEP):
        self.variant = VARIANTS[variant]
        self.table = KeyTable(self.variant)
        self.fps = fps or self.variant.default_fps
        self.mouse_step = mouse_step
        self._lock = threading.Lock()
        self._held: tuple = ()
        self._pressed: list = []  # letters pressed since the last pull (a tap between two chunks)
        self._mouse = [0.0, 0.0]  # movement since the last pull, pixels
        self.updates = 0
        self.pulled = 0  # frames handed to the sampler
        self.played: Actions | None = None
        # a camera variant: the divisor of its translations, and the letters held in each video frame pulled
        self.translation_scale = live_translation_scale(self.fps) if self.variant.camera else 0.0
        self._held_frames: list = []

    def actions(self, still_frames: int = 0) -> Actions:
        """The rollout's ``Actions``: ``still_frames`` frames with no key held (a start view that holds still), then
        the frames this play's keys give, pulled chunk by chunk. Kept as ``played``: what the rollout was steered by."""
        script = ActionScript(self.variant.name, self.fps, self.mouse_step, ())
        idle = torch.tensor([script.keyboard_row(ActionEntry(0.0, 0, ()))]).expand(still_frames, -1).clone()
        mouse = torch.zeros(still_frames, 2) if self.variant.has_mouse else None
        self.played = Actions(idle, mouse, source=self, time_stride=self.variant.time_stride)
        return self.played

    def script(self, frames: int) -> ActionScript:
        """What was played over the video's first ``frames`` frames, as the shortest script that replays it."""
        if self.variant.camera:
            if len(self._held_frames) < frames:
                raise FastARError(f"the play holds the keys of {len(self._held_frames)} frames; its video has "
                                  f"{frames}")
            return script_from_held(self._held_frames[:frames], self.variant.name, self.fps, "the played keys",
                                    translation_scale=self.translation_scale)
        if self.played is None or self.played.num_frames < frames:
            have = 0 if self.played is None else self.played.num_frames
            raise FastARError(f"the play holds the actions of {have} frames; its video has {frames}")
        mouse = None if self.played.mouse is None else self.played.mouse[:frames]
        return script_from_tensors(self.played.keyboard[:frames], mouse, self.variant.name, self.fps,
                                   self.mouse_step, what="the played actions")

    def update(self, state: KeyState) -> None:
        with self._lock:
            for letter in state.letters:
                if letter not in self._held and letter not in self._pressed:
                    self._pressed.append(letter)
            self._held = state.letters
            if state.mouse is not None:
                self._mouse[0] += state.mouse[0]
                self._mouse[1] += state.mouse[1]
            self.updates += 1

    def held(self) -> tuple:
        with self._lock:
            return resolve_held(self.variant, self._held)

    def held_motion(self, first: int, last: int) -> np.ndarray:
        """A camera variant's source of held keys: video frames ``first .. last - 1`` each hold the keys held now
        (and any pressed since the call before), as rows of (forward, right, up, turn right)."""
        if not self.variant.camera:
            raise FastARError(f"{self.variant.name} is steered by action tensors (the play's actions()), not a camera")
        if first != len(self._held_frames) or last <= first:
            raise FastARError(f"the play has the keys of {len(self._held_frames)} video frames; asked for "
                              f"{first}..{last - 1}")
        letters = self._take_letters()
        self._held_frames.extend([letters] * (last - first))
        self.pulled += last - first
        row = np.sum([self.variant.of(k).motion for k in letters], axis=0) if letters else np.zeros(4)
        return np.tile(np.asarray(row, dtype=np.float64), (last - first, 1))

    def _take_letters(self) -> tuple:
        """The keys that steer the next frames: those held now and any pressed since the last pull."""
        with self._lock:
            letters = resolve_held(self.variant, [*self._pressed, *self._held])
            self._pressed.clear()
            return letters

    def __call__(self, known: int, need: int):
        """The actions of frames ``known .. need - 1`` (the sampler's source call): the keys held now and any
        pressed since the last call, and the mouse movement since then spread over those frames."""
        frames = max(1, need - known)
        letters = self._take_letters()
        with self._lock:
            dx, dy = self._mouse
            self._mouse = [0.0, 0.0]
            self.pulled += frames
        script = ActionScript(self.variant.name, self.fps, self.mouse_step, ())
        entry = ActionEntry(0.0, 0, letters)
        keyboard = torch.tensor([script.keyboard_row(entry)]).expand(frames, -1).clone()
        if not self.variant.has_mouse:
            return keyboard, None
        pitch, yaw = script.mouse_row(entry)
        limit = MAX_MOUSE_PER_FRAME
        move = [max(-limit, min(limit, pitch - dy * MOUSE_PER_PIXEL / frames)),
                max(-limit, min(limit, yaw + dx * MOUSE_PER_PIXEL / frames))]
        return keyboard, torch.tensor([move]).expand(frames, -1).clone()


def preview_rgb(x0: torch.Tensor, latent_is_video: bool, rgb_factors=None, rgb_bias=None) -> torch.Tensor | None:
    """A chunk's frames ``[F, H, W, 3]`` uint8 from its latent ``x0 [1, C, F, h, w]``: the latent itself where it is
    the video (the demo world), else a preview through RGB factors ``[C][3]`` (ComfyUI's latent2rgb), or None."""
    x = x0[0].detach().float().cpu()
    if latent_is_video:
        rgb = x.permute(1, 2, 3, 0)
    elif rgb_factors is None:
        return None
    else:
        rgb = torch.einsum("cfhw,cr->fhwr", x, torch.tensor(rgb_factors, dtype=torch.float32))
        if rgb_bias is not None:
            rgb = rgb + torch.tensor(rgb_bias, dtype=torch.float32)
    return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class LiveFeed:
    """What a page is sent after each chunk of a play: the chunk's frames as base64 RGB bytes, the frame rate over
    the last chunks, the cache's MiB, the keys held, and (the demo world) the camera's place per frame."""

    RECENT = 8  # chunks the frame rate is taken over

    def __init__(self, play: LivePlay, ids: dict, latent_is_video: bool, rgb_factors=None, rgb_bias=None,
                 camera=None):
        self.play, self.ids = play, ids
        self.latent_is_video, self.rgb_factors, self.rgb_bias = latent_is_video, rgb_factors, rgb_bias
        self.camera = camera  # frame -> (x, y), or None
        self.recent: list = []  # (frames, seconds) of the last chunks

    def message(self, report) -> dict:
        self.recent = [*self.recent[1 - self.RECENT:], (report.frames, report.seconds)]
        seconds = sum(s for _, s in self.recent)
        message = {
            **self.ids, "chunk": report.index, "frame_start": report.frame_start, "frames": report.frames,
            "fps": round(sum(n for n, _ in self.recent) / seconds, 3) if seconds else None,
            "chunk_seconds": round(report.seconds, 6), "cache_mib": round(report.cache_bytes / 2**20, 4),
            "held": list(self.play.held()), "width": None, "height": None, "rgb": [],
        }
        if self.camera is not None:
            message["camera"] = [list(self.camera(f)) for f in range(report.frame_start,
                                                                     report.frame_start + report.frames)]
        frames = preview_rgb(report.x0, self.latent_is_video, self.rgb_factors, self.rgb_bias)
        if frames is not None:
            message.update(width=int(frames.shape[2]), height=int(frames.shape[1]),
                           rgb=[base64.b64encode(f.contiguous().numpy().tobytes()).decode() for f in frames])
        return message


class PlayRegistry:
    """The plays running in this process, by id. An id is 128 random bits: a page learns it from the server that
    runs the play, and no other id is accepted."""

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._plays: dict = {}
        self._lock = threading.Lock()

    def open(self, play: LivePlay) -> str:
        with self._lock:
            if len(self._plays) >= self.limit:
                raise FastARError(f"{len(self._plays)} plays are running already; at most {self.limit}")
            play_id = secrets.token_hex(16)
            self._plays[play_id] = play
            return play_id

    def close(self, play_id: str) -> None:
        with self._lock:
            self._plays.pop(play_id, None)

    def get(self, play_id) -> LivePlay | None:
        with self._lock:
            return self._plays.get(play_id) if isinstance(play_id, str) else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._plays)
