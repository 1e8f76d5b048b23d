"""Action scripts: what a person writes to steer a world model (Matrix-Game 2.0's keys and mouse, LingBot-World
2.0's camera), turned into per-frame actions or camera poses.

A script is a timeline in seconds of video. Each entry names the keys held from its time on, and optionally a
mouse move; it holds until the next entry. As JSON::

    {"variant": "universal", "fps": 12,
     "timeline": [{"at": 0, "keys": ["W"]},
                  {"at": 1.5, "keys": ["W", "L"]},
                  {"at": 3, "keys": [], "mouse": [0.05, 0]}]}

or as lines (the same script; ``#`` starts a comment, ``-`` is no key)::

    variant universal
    fps 12
    0    W
    1.5  W L
    3    -  mouse 0.05 0

The keys are the ones Matrix-Game 2.0's own interactive inference offers for each variant (letters, or the
action names of its benchmark conditions), so a script means what the model was trained on:

- universal: W forward, S back, A left, D right (keyboard, 4 columns); I, K, J, L turn the camera up, down, left,
  right by ``mouse_step`` per frame (mouse [pitch, yaw]).
- gta_drive: W forward, S back (keyboard, 2 columns); A, D steer left, right (mouse yaw, by ``mouse_step``).
- templerun: Q no move, W jump, S slide, Z turn left, C turn right, A left side, D right side (keyboard, 7 columns,
  one action at a time; no key held is Q, the model's own "no move"); no mouse.
- demo_world (the bundled demo world, ``fastar_core/families/demo``): W up, S down, A left, D right, one at a time,
  Q (or no key) holds the camera still; no mouse. Its latent is the video itself, so it takes one action per frame
  (``time_stride`` 1) and its ``fps`` defaults to 16, the demo's video rate.

- lingbot (LingBot-World 2.0, steered by a camera path): W forward, S back, A strafe left, D strafe right; I or the
  up arrow ("up") looks up, K ("down") down, J ("left") turns left, L ("right") right. The script becomes a camera
  pose per video frame (``to_poses``) by the motion model of ``camera_motion.py``: ``move_speed`` (units per
  second; only ratios reach the model), ``turn_rate`` and ``look_rate`` (degrees per second; defaults 16 and 7,
  the release's example paths' medians), ``fov`` (the horizontal field of view of its intrinsics, default 79
  degrees); its ``fps`` defaults to 16, the release's video rate. A held key keeps moving or turning the camera
  every frame; releasing it stops it at once. ``translation_scale`` (default 0: the release's, every translation
  divided by the path's longest) divides by a fixed number instead: a live play's (``live_actions.LivePlay``), which
  could not know the longest move of a path still being played, so its script replays it bit for bit.

``mouse`` gives [pitch, yaw] per frame directly instead of camera or steering keys (Matrix-Game only).
``mouse_step`` (default 0.1, the reference's camera value) is the per-frame move of those keys. ``fps`` (default 12,
the rate Matrix-Game writes its videos at; 16 for lingbot) converts seconds to video frames; an entry starts at the
nearest frame.

Actions live at the video (pixel) frame rate: a video of ``1 + 4(T - 1)`` frames for ``T`` latent frames takes a
keyboard tensor ``[frames, keys]`` (multi-hot) and a mouse tensor ``[frames, 2]`` (or none for templerun).
``script_from_tensors`` is the reverse, for reports and for reading actions made elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import FastARError, shown
from ..files.json_files import parse_json
from .camera_motion import FOV, LOOK_RATE, MOVE_SPEED, TURN_RATE, intrinsics_for_fov, poses_from_keys
from .video_geometry import VAE_TEMPORAL

DEFAULT_FPS = 12.0
DEFAULT_MOUSE_STEP = 0.1
CAMERA_DEFAULTS = (MOVE_SPEED, TURN_RATE, LOOK_RATE, FOV, 0.0)
MAX_FPS = 240.0
MAX_ENTRIES = 100_000
MAX_SECONDS = 24 * 3600.0
MAX_FILE_BYTES = 1 << 20  # an action script's text, from a file or a node's widget
# the camera variants' motion model, and the divisor of its translations (0: the path's longest move)
CAMERA_FIELDS = ("move_speed", "turn_rate", "look_rate", "fov", "translation_scale")
BASE_FIELDS = ("variant", "fps", "mouse_step", "timeline")
SCRIPT_FIELDS = (*BASE_FIELDS, *CAMERA_FIELDS)
ENTRY_FIELDS = ("at", "keys", "mouse")


@dataclass(frozen=True)
class Key:
    letter: str
    name: str  # the action name in the reference's benchmark conditions
    column: int | None = None  # keyboard column it sets, or None for a mouse key
    mouse: tuple[float, float] = (0.0, 0.0)  # unit [pitch, yaw] a mouse key moves per frame
    motion: tuple = (0.0, 0.0, 0.0, 0.0)  # a camera key's unit (forward, right, up, turn right)
    aliases: tuple = ()  # other names it answers to (arrow keys)


@dataclass(frozen=True)
class Variant:
    name: str
    keys: tuple[Key, ...]
    has_mouse: bool
    one_at_a_time: bool = False
    idle_letter: str | None = None  # the key that means "no move" when none is held
    camera: bool = False  # steered by a camera path: the script becomes poses (to_poses), not tensors
    # video frames per latent frame after the first: 4 through Wan's VAE, 1 where the latent is the video (demo)
    time_stride: int = VAE_TEMPORAL
    default_fps: float = DEFAULT_FPS
    # the letters a browser's ArrowUp, ArrowDown, ArrowLeft, ArrowRight press (live play), if any
    arrows: tuple = ()

    @property
    def keyboard_dim(self) -> int:
        return sum(1 for k in self.keys if k.column is not None)

    def key(self, token: str) -> Key | None:
        t = token.strip().lower()
        return next((k for k in self.keys if t in (k.letter.lower(), k.name, *k.aliases)), None)

    def of(self, letter: str) -> Key:
        """The key of a letter already checked (an entry's)."""
        return next(k for k in self.keys if k.letter == letter)

    def valid_keys(self) -> str:
        return ", ".join(f"{k.letter} ({'/'.join((k.name, *k.aliases))})" for k in self.keys)


VARIANTS = {
    "universal": Variant("universal", (
        Key("W", "forward", 0), Key("S", "back", 1), Key("A", "left", 2), Key("D", "right", 3),
        Key("I", "camera_up", mouse=(1.0, 0.0)), Key("K", "camera_down", mouse=(-1.0, 0.0)),
        Key("J", "camera_l", mouse=(0.0, -1.0)), Key("L", "camera_r", mouse=(0.0, 1.0)),
    ), has_mouse=True, arrows=("I", "K", "J", "L")),
    "gta_drive": Variant("gta_drive", (
        Key("W", "forward", 0), Key("S", "back", 1),
        Key("A", "camera_l", mouse=(0.0, -1.0)), Key("D", "camera_r", mouse=(0.0, 1.0)),
    ), has_mouse=True, arrows=("W", "S", "A", "D")),
    "templerun": Variant("templerun", (
        Key("Q", "nomove", 0), Key("W", "jump", 1), Key("S", "slide", 2), Key("Z", "turnleft", 3),
        Key("C", "turnright", 4), Key("A", "leftside", 5), Key("D", "rightside", 6),
    ), has_mouse=False, one_at_a_time=True, idle_letter="Q", arrows=("W", "S", "Z", "C")),
    "lingbot": Variant("lingbot", (
        Key("W", "forward", motion=(1.0, 0.0, 0.0, 0.0)), Key("S", "back", motion=(-1.0, 0.0, 0.0, 0.0)),
        Key("A", "strafe_left", motion=(0.0, -1.0, 0.0, 0.0)), Key("D", "strafe_right", motion=(0.0, 1.0, 0.0, 0.0)),
        Key("I", "look_up", motion=(0.0, 0.0, 1.0, 0.0), aliases=("up",)),
        Key("K", "look_down", motion=(0.0, 0.0, -1.0, 0.0), aliases=("down",)),
        Key("J", "turn_left", motion=(0.0, 0.0, 0.0, -1.0), aliases=("left",)),
        Key("L", "turn_right", motion=(0.0, 0.0, 0.0, 1.0), aliases=("right",)),
    ), has_mouse=False, camera=True, default_fps=16.0, arrows=("I", "K", "J", "L")),
    # The bundled demo world (fastar_core/families/demo): a camera moved one patch a frame, or held still (Q).
    "demo_world": Variant("demo_world", (
        Key("Q", "none", 0), Key("W", "up", 1), Key("S", "down", 2), Key("A", "left", 3), Key("D", "right", 4),
    ), has_mouse=False, one_at_a_time=True, idle_letter="Q", time_stride=1, default_fps=16.0,
        arrows=("W", "S", "A", "D")),
}


@dataclass(frozen=True)
class ActionEntry:
    at: float  # seconds, as written
    frame: int  # the first video frame it holds for
    keys: tuple[str, ...]  # letters, in the variant's order
    mouse: tuple[float, float] | None = None  # explicit [pitch, yaw] per frame


@dataclass(frozen=True)
class ActionScript:
    variant: str
    fps: float
    mouse_step: float
    entries: tuple[ActionEntry, ...]
    # the camera variants' motion model (camera_motion.py)
    move_speed: float = MOVE_SPEED
    turn_rate: float = TURN_RATE
    look_rate: float = LOOK_RATE
    fov: float = FOV
    translation_scale: float = 0.0  # 0: the release's (the path's longest move); else a fixed divisor (a live play's)

    @property
    def spec(self) -> Variant:
        return VARIANTS[self.variant]

    def keyboard_row(self, entry: ActionEntry) -> list[float]:
        row = [0.0] * self.spec.keyboard_dim
        letters = entry.keys or ((self.spec.idle_letter,) if self.spec.idle_letter else ())
        for letter in letters:
            column = self.spec.of(letter).column
            if column is not None:
                row[column] = 1.0
        return row

    def mouse_row(self, entry: ActionEntry) -> list[float]:
        if entry.mouse is not None:
            return list(entry.mouse)
        pitch = yaw = 0.0
        for letter in entry.keys:
            dp, dy = self.spec.of(letter).mouse
            pitch, yaw = pitch + dp * self.mouse_step, yaw + dy * self.mouse_step
        return [pitch, yaw]

    def _spans(self, pixel_frames: int):
        """(entry, first frame, end frame) of each entry that starts within ``pixel_frames``."""
        for i, entry in enumerate(self.entries):
            if entry.frame >= pixel_frames:
                break
            end = self.entries[i + 1].frame if i + 1 < len(self.entries) else pixel_frames
            yield entry, entry.frame, min(end, pixel_frames)

    def to_poses(self, pixel_frames: int) -> np.ndarray:
        """A camera variant's path: a camera-to-world pose per video frame ``[pixel_frames, 4, 4]`` (OpenCV axes,
        float64), by the motion model of ``camera_motion.py``."""
        check_pixel_frames(pixel_frames)
        if not self.spec.camera:
            raise FastARError(f"a {self.variant} script steers by keyboard and mouse (to_tensors), not a camera path")
        held = np.zeros((pixel_frames, 4))
        for entry, start, end in self._spans(pixel_frames):
            held[start:end] = np.sum([self.spec.of(k).motion for k in entry.keys], axis=0) if entry.keys else 0.0
        return poses_from_keys(held, self.fps, self.move_speed, self.turn_rate, self.look_rate)

    def camera_scale(self) -> float | None:
        """What a camera variant's translations are divided by: None for the release's own (the longest move of
        the path), else the script's fixed ``translation_scale``."""
        return self.translation_scale or None

    def intrinsics(self) -> np.ndarray:
        """A camera variant's intrinsics ``[fx, fy, cx, cy]`` (pixels of a 480 x 832 video) for its ``fov``."""
        return intrinsics_for_fov(self.fov)

    def to_tensors(self, pixel_frames: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(keyboard [pixel_frames, keys], mouse [pixel_frames, 2] or None), float32: each entry's actions from
        its frame until the next entry's. Entries at or past the end are left out (``unused``)."""
        check_pixel_frames(pixel_frames, stride=self.spec.time_stride)
        if self.spec.camera:
            raise FastARError(f"a {self.variant} script steers a camera: turn it into poses (to_poses)")
        keyboard = torch.zeros(pixel_frames, self.spec.keyboard_dim)
        mouse = torch.zeros(pixel_frames, 2) if self.spec.has_mouse else None
        for entry, start, end in self._spans(pixel_frames):
            keyboard[start:end] = torch.tensor(self.keyboard_row(entry))
            if mouse is not None:
                mouse[start:end] = torch.tensor(self.mouse_row(entry))
        return keyboard, mouse

    def unused(self, pixel_frames: int) -> list[ActionEntry]:
        return [e for e in self.entries if e.frame >= pixel_frames]

    def to_dict(self) -> dict:
        timeline = []
        for e in self.entries:
            item: dict = {"at": e.at, "keys": list(e.keys)}
            if e.mouse is not None:
                item["mouse"] = list(e.mouse)
            timeline.append(item)
        if self.spec.camera:
            return {"variant": self.variant, "fps": self.fps, **{f: getattr(self, f) for f in CAMERA_FIELDS},
                    "timeline": timeline}
        return {"variant": self.variant, "fps": self.fps, "mouse_step": self.mouse_step, "timeline": timeline}

    def to_text(self) -> str:
        """The script in the line format (``parse_text`` reads it back to the same script)."""
        lines = [f"variant {self.variant}", f"fps {_exact(self.fps)}"]
        if self.mouse_step != DEFAULT_MOUSE_STEP:
            lines.append(f"mouse_step {_exact(self.mouse_step)}")
        for name, default in zip(CAMERA_FIELDS, CAMERA_DEFAULTS):
            if getattr(self, name) != default:
                lines.append(f"{name} {_exact(getattr(self, name))}")
        for e in self.entries:
            mouse = "" if e.mouse is None else f"  mouse {_exact(e.mouse[0])} {_exact(e.mouse[1])}"
            lines.append(f"{_exact(e.at)}  {' '.join(e.keys) or '-'}{mouse}")
        return "\n".join(lines) + "\n"

    def describe(self, pixel_frames: int | None = None) -> str:
        """One line for a report: the variant, then each entry with its seconds, first frame and actions."""
        parts = []
        for e in self.entries:
            if pixel_frames is not None and e.frame >= pixel_frames:
                continue
            what = " ".join(f"{k}({self.spec.of(k).name})" for k in e.keys) or (
                f"{self.spec.idle_letter}(nomove)" if self.spec.idle_letter else "no key")
            if e.mouse is not None:
                what += f", mouse pitch {_number(e.mouse[0])} yaw {_number(e.mouse[1])}/frame"
            parts.append(f"{_number(e.at)} s (frame {e.frame}): {what}")
        text = f"{self.variant} at {_number(self.fps)} fps: " + "; ".join(parts)
        if pixel_frames is not None and self.unused(pixel_frames):
            n = len(self.unused(pixel_frames))
            text += f" ({n} later entr{'y' if n == 1 else 'ies'} past the video's {pixel_frames} frames unused)"
        return text


def _number(x: float) -> str:
    return f"{x:.6g}"


def _exact(x: float) -> str:
    """The shortest text that reads back as the same float."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def check_pixel_frames(pixel_frames, what: str = "pixel_frames", stride: int = VAE_TEMPORAL) -> int:
    """A video's frame count: ``1 + stride (T - 1)`` for ``T`` latent frames (any count where ``stride`` is 1)."""
    if isinstance(pixel_frames, bool) or not isinstance(pixel_frames, int) or pixel_frames < 1 \
            or (pixel_frames - 1) % stride:
        raise FastARError(f"{what} {shown(pixel_frames)}: actions cover a video of 1 + {stride}(T - 1) frames for T "
                          f"latent frames ({', '.join(str(1 + stride * t) for t in range(3))}, ...)")
    return pixel_frames


def _finite_number(value, what: str) -> float:
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            if math.isfinite(value):
                return float(value)
        except OverflowError:  # an integer too large for a float
            pass
    raise FastARError(f"{what} is {shown(value)}; expected a finite number")


def check_variant(value, what: str) -> str:
    """A variant's name; anything else (a list, an object, a number where the name goes) is refused by type."""
    if not isinstance(value, str) or value not in VARIANTS:
        kind = "" if isinstance(value, str) else f" ({type(value).__name__}, not a name)"
        raise FastARError(f"{what}: variant {shown(value)}{kind} is not a world model's variant; valid: "
                          f"{', '.join(VARIANTS)}")
    return value


def _unknown_fields(given, valid) -> list[str]:
    names = sorted(set(map(str, given)) - set(valid))
    return [n[:40] for n in names[:5]] + (["..."] if len(names) > 5 else [])


def parse_keys(spec: Variant, tokens, where: str) -> tuple[str, ...]:
    """Key names -> letters in the variant's order, refusing unknown keys, repeats and contradictions."""
    letters = []
    for token in tokens:
        if not isinstance(token, str):
            raise FastARError(f"{where}: key {shown(token)} is not a name; valid keys for {spec.name}: "
                              f"{spec.valid_keys()}")
        key = spec.key(token)
        if key is None:
            raise FastARError(f"{where}: unknown key {shown(token)} for {spec.name}; valid: {spec.valid_keys()}")
        if key.letter in letters:
            raise FastARError(f"{where}: key {key.letter} ({key.name}) is named twice")
        letters.append(key.letter)
    if spec.one_at_a_time and len(letters) > 1:
        raise FastARError(f"{where}: {spec.name} takes one action at a time (its model was trained on single "
                          f"actions), got {' '.join(letters)}; valid: one of {spec.valid_keys()}, or none")
    order = [k.letter for k in spec.keys]
    letters.sort(key=order.index)
    keys = [spec.of(letter) for letter in letters]
    for i, a in enumerate(keys):  # opposite keys cancel nothing: the model never saw both held
        for b in keys[i + 1:]:
            if (a.column is None) == (b.column is None) and _opposite(spec, a, b):
                raise FastARError(f"{where}: {a.letter} ({a.name}) and {b.letter} ({b.name}) are opposite; hold "
                                  "one of them")
    return tuple(letters)


def _opposite(spec: Variant, a: Key, b: Key) -> bool:
    if spec.camera:
        return a.motion == tuple(-m for m in b.motion)
    if a.column is None:
        return a.mouse[0] == -b.mouse[0] and a.mouse[1] == -b.mouse[1]
    pairs = {"universal": ({0, 1}, {2, 3}), "gta_drive": ({0, 1},)}.get(spec.name, ())
    return {a.column, b.column} in pairs


def parse_script(data, what: str = "action script", entry_names: list[str] | None = None) -> ActionScript:
    """A script as JSON gives it (a dict); ``what`` names the input in every message, ``entry_names`` each entry
    (default ``timeline[i]``; the line format names its lines)."""
    if not isinstance(data, dict):
        raise FastARError(f"{what}: expected an object with {', '.join(BASE_FIELDS)}; got "
                          f"{type(data).__name__}")
    unknown = _unknown_fields(data, SCRIPT_FIELDS)
    if unknown:
        raise FastARError(f"{what}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(SCRIPT_FIELDS)}")
    if "variant" not in data:
        raise FastARError(f"{what}: no variant; name the model's variant ({', '.join(VARIANTS)}): its keys differ")
    variant = check_variant(data["variant"], what)
    spec = VARIANTS[variant]
    fps = _finite_number(data.get("fps", spec.default_fps), f"{what}: fps")
    if not 0 < fps <= MAX_FPS:
        raise FastARError(f"{what}: fps {fps:g} is out of range; valid: more than 0, at most {MAX_FPS:g}")
    wrong = [f for f in (("mouse_step",) if spec.camera else CAMERA_FIELDS) if f in data]
    if wrong:
        kind = (f"a camera path ({', '.join(CAMERA_FIELDS)})" if spec.camera
                else "keys and a mouse (mouse_step)")
        raise FastARError(f"{what}: {', '.join(wrong)} is not for {variant}, which is steered by {kind}")
    camera = {}
    for name, default in zip(CAMERA_FIELDS, CAMERA_DEFAULTS):
        value = _finite_number(data.get(name, default), f"{what}: {name}")
        if name == "translation_scale":
            if value < 0:
                raise FastARError(f"{what}: translation_scale {value:g} is out of range; valid: 0 (the path's "
                                  "longest move, as the release divides) or more")
        elif value <= 0 or (name == "fov" and value >= 180):
            raise FastARError(f"{what}: {name} {value:g} is out of range; valid: more than 0"
                              + (", less than 180 (degrees)" if name == "fov" else ""))
        camera[name] = value
    step = _finite_number(data.get("mouse_step", DEFAULT_MOUSE_STEP), f"{what}: mouse_step")
    if step <= 0:
        raise FastARError(f"{what}: mouse_step {step:g} must be more than 0 (the per-frame move of the camera or "
                          "steering keys; the reference's is 0.1)")
    timeline = data.get("timeline")
    if not isinstance(timeline, list) or not timeline:
        raise FastARError(f"{what}: timeline must be a non-empty list of entries like {{\"at\": 0, \"keys\": "
                          "[\"W\"]}")
    if len(timeline) > MAX_ENTRIES:
        raise FastARError(f"{what}: {len(timeline):,} timeline entries; at most {MAX_ENTRIES:,}")
    names = entry_names or [f"timeline[{i}]" for i in range(len(timeline))]
    entries: list[ActionEntry] = []
    for i, item in enumerate(timeline):
        entry = _parse_entry(spec, item, f"{what}: {names[i]}", fps)
        if not entries and entry.at != 0:
            raise FastARError(f"{what}: {names[0]} is at {entry.at:g} s; the first entry must be at 0 (what the "
                              "video starts with)")
        if entries:
            prev = entries[-1]
            if entry.at <= prev.at:
                raise FastARError(f"{what}: {names[i]} at {entry.at:g} s does not come after {names[i - 1]} "
                                  f"at {prev.at:g} s; list the entries in increasing time")
            if entry.frame == prev.frame:
                raise FastARError(f"{what}: {names[i]} at {entry.at:g} s starts at the same frame ({entry.frame} "
                                  f"at {fps:g} fps) as {names[i - 1]} at {prev.at:g} s, which would never "
                                  f"apply; space them at least {1 / fps:.4g} s apart")
        entries.append(entry)
    return ActionScript(variant, fps, step, tuple(entries), **camera)


def _parse_entry(spec: Variant, item, where: str, fps: float) -> ActionEntry:
    if not isinstance(item, dict):
        raise FastARError(f"{where}: expected an object like {{\"at\": 0, \"keys\": [\"W\"]}}; got "
                          f"{type(item).__name__}")
    unknown = _unknown_fields(item, ENTRY_FIELDS)
    if unknown:
        raise FastARError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(ENTRY_FIELDS)}")
    if "at" not in item:
        raise FastARError(f"{where}: no \"at\" (the entry's time in seconds of video)")
    at = _finite_number(item["at"], f"{where}: at")
    if not 0 <= at <= MAX_SECONDS:
        raise FastARError(f"{where}: at {at:g} s is out of range; valid: 0 .. {MAX_SECONDS:g} s")
    where = f"{where} (at {at:g} s)"
    keys = item.get("keys", [])
    if not isinstance(keys, list):
        raise FastARError(f"{where}: keys must be a list of key names (e.g. [\"W\", \"A\"]; [] for none); valid "
                          f"for {spec.name}: {spec.valid_keys()}")
    letters = parse_keys(spec, keys, where)
    mouse = None
    if "mouse" in item:
        if not spec.has_mouse:
            raise FastARError(f"{where}: {spec.name} has no mouse input (its model takes "
                              f"{'a camera path: look with I J K L' if spec.camera else 'the keyboard only'}); drop "
                              "\"mouse\"")
        raw = item["mouse"]
        if not isinstance(raw, list) or len(raw) != 2:
            raise FastARError(f"{where}: mouse must be [pitch, yaw], the camera move per frame (e.g. [0, 0.1])")
        mouse = (_finite_number(raw[0], f"{where}: mouse pitch"), _finite_number(raw[1], f"{where}: mouse yaw"))
        moving = [k for k in letters if spec.of(k).column is None]
        if moving:
            raise FastARError(f"{where}: keys {' '.join(moving)} already move the mouse and \"mouse\" sets it too; "
                              "use one of the two")
    frame = int(math.floor(at * fps + 0.5))
    return ActionEntry(at, frame, letters, mouse)


def parse_text(text: str, what: str = "action script", variant: str | None = None,
               fps: float | None = None) -> ActionScript:
    """A script as text: JSON (starting with ``{``) or the line format. ``variant`` and ``fps``, when given (a
    node's widgets), are the script's unless the text names its own, which must then agree."""
    if not isinstance(text, str):
        raise FastARError(f"{what}: expected text, got {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise FastARError(f"{what}: {len(text):,} characters; an action script is a few lines (at most "
                          f"{MAX_FILE_BYTES:,})")
    # A node's widgets (or a caller) give these beside the text: a name and a number, checked by type first.
    if variant is not None:
        check_variant(variant, what)
    if fps is not None:
        fps = _finite_number(fps, f"{what}: fps")
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors save UTF-8
    stripped = text.strip()
    names = None
    if stripped.startswith("{"):
        data = parse_json(stripped, what)  # nesting and integers bounded, each refusal naming the script
    else:
        data, names = _lines_to_dict(text, what)
    if isinstance(data, dict):
        for name, given in (("variant", variant), ("fps", fps)):
            if given is None:
                continue
            if name in data and data[name] != given:
                raise FastARError(f"{what}: the script says {name} {shown(data[name])} but {given!r} was chosen "
                                  "beside it; make them agree (or drop the script's line)")
            data = {**data, name: given}
    return parse_script(data, what, names)


def parse_with_choices(text, variant, fps, what: str = "Action Script") -> ActionScript:
    """A script beside the variant and fps chosen for it (a node's inputs): both required, each checked by type
    before the text is read."""
    check_variant(variant, what)
    return parse_text(text, what, variant=variant, fps=_finite_number(fps, f"{what}: fps"))


def _lines_to_dict(text: str, what: str) -> tuple[dict, list[str]]:
    """The line format as the JSON object it stands for, and each timeline entry's line ("line 3")."""
    data: dict = {}
    timeline: list = []
    names: list[str] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        tokens = line.split()
        head = tokens[0].rstrip(":").lower()
        where = f"{what}: line {n}"
        if head in ("variant", "fps", "mouse_step", *CAMERA_FIELDS):
            if len(tokens) != 2:
                raise FastARError(f"{where}: write '{head} <value>' (e.g. 'variant universal', 'fps 12')")
            if head in data:
                raise FastARError(f"{where}: {head} is given twice")
            data[head] = tokens[1] if head == "variant" else _text_number(tokens[1], f"{where}: {head}")
            continue
        entry: dict = {"at": _text_number(head, f"{where}: the time (seconds) that starts the line")}
        rest = tokens[1:]
        if "mouse" in (t.lower() for t in rest):
            i = [t.lower() for t in rest].index("mouse")
            values = rest[i + 1:]
            if len(values) != 2:
                raise FastARError(f"{where}: write 'mouse <pitch> <yaw>' at the end of the line (e.g. mouse 0 0.1)")
            entry["mouse"] = [_text_number(v, f"{where}: mouse") for v in values]
            rest = rest[:i]
        entry["keys"] = [t for t in rest if t not in ("-", "none")]
        timeline.append(entry)
        names.append(f"line {n}")
    if not timeline:
        raise FastARError(f"{what}: no timeline lines; write one per change, e.g. '0 W' then '1.5 W A'")
    data["timeline"] = timeline
    return data, names


def _text_number(token: str, what: str) -> float:
    try:
        value = float(token.rstrip(":"))
    except ValueError:
        raise FastARError(f"{what}: {shown(token)} is not a number") from None
    if not math.isfinite(value):
        raise FastARError(f"{what}: {shown(token)} is not a finite number")
    return value


def script_from_tensors(keyboard: torch.Tensor, mouse: torch.Tensor | None, variant: str,
                        fps: float = DEFAULT_FPS, mouse_step: float = DEFAULT_MOUSE_STEP,
                        what: str = "actions") -> ActionScript:
    """The reverse of ``to_tensors``: per-frame actions as the shortest script that makes them (a change of
    actions starts an entry). Mouse moves that are a sum of the variant's mouse keys at ``mouse_step`` are
    written as those keys, others as explicit [pitch, yaw]."""
    spec = VARIANTS[check_variant(variant, what)]
    if spec.camera:
        raise FastARError(f"{what}: {variant} is steered by a camera path, not keyboard and mouse tensors")
    if keyboard.ndim != 2 or keyboard.shape[1] != spec.keyboard_dim:
        raise FastARError(f"{what}: keyboard has shape {list(keyboard.shape)}; {variant} takes [frames, "
                          f"{spec.keyboard_dim}]")
    frames = keyboard.shape[0]
    check_pixel_frames(frames, f"{what}: keyboard frames", spec.time_stride)
    if spec.has_mouse != (mouse is not None):
        raise FastARError(f"{what}: {variant} {'takes' if spec.has_mouse else 'has no'} mouse actions")
    if mouse is not None and tuple(mouse.shape) != (frames, 2):
        raise FastARError(f"{what}: mouse has shape {list(mouse.shape)}; expected [{frames}, 2] like the keyboard")
    kb = keyboard.detach().double().cpu().tolist()
    ms: list = mouse.detach().double().cpu().tolist() if mouse is not None else [None] * frames
    timeline = []
    previous = None
    for f in range(frames):
        move = ms[f]
        row = (tuple(kb[f]), None if move is None else tuple(move))
        if row == previous:
            continue
        previous = row
        entry: dict = {"at": round(f / fps, 6), "keys": _keys_of_row(spec, row[0], f, what)}
        if row[1] is not None:
            mouse_keys = _mouse_keys(spec, row[1], mouse_step)
            if mouse_keys is None:
                entry["mouse"] = [_shortest(v) for v in row[1]]
            else:
                entry["keys"] += mouse_keys
        timeline.append(entry)
    return parse_script({"variant": variant, "fps": fps, "mouse_step": mouse_step, "timeline": timeline}, what)


def script_from_held(held: list, variant: str, fps: float, what: str = "actions", **camera) -> ActionScript:
    """A camera variant's keys held in each video frame (``held[f]``: letters) as the shortest script that holds
    them (a change starts an entry); ``camera``: its motion model's fields (``CAMERA_FIELDS``)."""
    spec = VARIANTS[check_variant(variant, what)]
    if not spec.camera:
        raise FastARError(f"{what}: {variant} is steered by keyboard and mouse tensors (script_from_tensors)")
    check_pixel_frames(len(held), f"{what}: frames", spec.time_stride)
    timeline = []
    previous = None
    for f, letters in enumerate(held):
        if tuple(letters) != previous:
            previous = tuple(letters)
            timeline.append({"at": round(f / fps, 6), "keys": list(letters)})
    return parse_script({"variant": variant, "fps": fps, **camera, "timeline": timeline}, what)


def _keys_of_row(spec: Variant, row, frame: int, what: str) -> list[str]:
    if any(v not in (0.0, 1.0) for v in row):
        raise FastARError(f"{what}: keyboard frame {frame} is {list(row)}; keys are 0 or 1")
    keys = [k.letter for k in spec.keys if k.column is not None and row[k.column] == 1.0]
    if spec.idle_letter and keys == [spec.idle_letter]:
        return []
    if spec.idle_letter and not keys:
        raise FastARError(f"{what}: keyboard frame {frame} holds no key; {spec.name}'s idle is "
                          f"{spec.idle_letter} (nomove)")
    return keys


def _mouse_keys(spec: Variant, move, step: float) -> list[str] | None:
    """The mouse keys whose moves add up to ``move`` exactly (no key for no move), or None if none do."""
    mouse_keys = [k for k in spec.keys if k.column is None]
    for pitch_key in [None, *[k for k in mouse_keys if k.mouse[0]]]:
        for yaw_key in [None, *[k for k in mouse_keys if k.mouse[1]]]:
            chosen = [k for k in (pitch_key, yaw_key) if k is not None]
            total = (sum(k.mouse[0] for k in chosen) * step, sum(k.mouse[1] for k in chosen) * step)
            if all(_as_float32(t) == _as_float32(m) for t, m in zip(total, move)):
                return [k.letter for k in chosen]
    return None


def _as_float32(x: float) -> float:
    """``x`` as the float32 the action tensors hold (a key's 0.1 comes back from them as 0.10000000149)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _shortest(x: float) -> float:
    """The shortest decimal that is the same float32 (0.05, not 0.05000000074505806)."""
    for digits in range(1, 10):
        candidate = float(f"{x:.{digits}g}")
        if _as_float32(candidate) == _as_float32(x):
            return candidate
    return x



def read_script_file(path, what: str | None = None) -> ActionScript:
    """An action script file (JSON, or the line format), checked whole; ``what`` defaults to the path."""
    from pathlib import Path

    p = Path(path)
    what = what or str(path)
    try:
        if not p.is_file():
            raise FastARError(f"{what}: {'no such file' if not p.exists() else 'not a regular file'}")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise FastARError(f"{what}: {size:,} bytes; an action script is a few lines (at most "
                              f"{MAX_FILE_BYTES:,} bytes)")
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise FastARError(f"{what}: not a text file (not UTF-8)") from None
    except OSError as e:
        raise FastARError(f"{what}: cannot be read ({e.strerror or e})") from None
    return parse_text(text, what)
