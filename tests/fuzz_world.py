"""Hostile steered-world weight files and action scripts for the fuzz suite.

World files are derived from the bundled world model: every entry of its ``demo`` metadata is given a value of
each other JSON type, a non-finite or absurd number, a size that would become a loop count or an allocation
(10,000 denoising steps, a billion-token text), or is removed; the whole entry is replaced by what is not an
object; tensors are made non-finite, reshaped or dropped. The entries are walked from the file itself, so an
entry added to the file is fuzzed without a line here. Action scripts put a value of the wrong type at every
place of a script, in JSON and in the line format.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

_RAW = "@@raw-json@@"


def tiny_world_file(path: Path) -> Path:
    """A steered-world weights file as ``fastar train-demo --world steer`` writes it (the bundled model's
    metadata, the world's frame and map), at a fraction of its size: a one-layer model of width 32."""
    from dataclasses import replace

    from comfyui_fastar.fastar_core.model.wan_model import random_wan
    from comfyui_fastar.tools.demo.actions import STATE_PREFIX, ActionEncoder
    from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_MODEL_CONFIG, WORLD_WEIGHTS_FILE
    from comfyui_fastar.tools.demo.steer_world import STEP
    from comfyui_fastar.tools.demo.text import TextEncoder
    from comfyui_fastar.tools.demo.weights_io import save_demo_weights

    with safe_open(str(WEIGHTS_DIR / WORLD_WEIGHTS_FILE), "pt") as f:
        meta = json.loads(f.metadata()["demo"])
    meta["text_len"] = 8
    cfg = replace(WORLD_MODEL_CONFIG, dim=32, num_heads=2, num_layers=1, ffn_dim=64, text_dim=16, freq_dim=16,
                  text_len=8)
    torch.manual_seed(0)
    model = random_wan(cfg, seed=0)
    text = TextEncoder(len(meta["vocabulary"]), cfg.text_dim, meta["text_len"])
    actions = ActionEncoder(cfg.dim, meta["world"]["map_size"] // STEP, meta["frames_per_block"])
    save_demo_weights(model, text, path, meta, extra={STATE_PREFIX: actions})
    return path
# Entries that are records nothing computes with (a loss curve's last value, the recipe, earlier phases).
RECORDS = ("training.final_loss", "training.recipe.", "training.earlier_phases", "world.path_kinds.")
# Entries a file may leave out (the loader then uses its default or another entry).
OPTIONAL = {"context_noise", "sampler", "world.step_pixels", "world.view_size", "training.total_steps",
            "training.total_wall_seconds", "training.final_loss", "training.earlier_phases", "world.positions",
            "world.path_kinds", "world.long_return_gap"}
ONE_OF_EACH = {"text": "6", "number": 6, "list": [6], "object": {"steps": 6}, "bool": True, "null": None}
SIZES = {  # sizes that become loop counts or allocations, and values just out of range
    "sampler.steps": [10_000, 1e4, 0, 101, 2.5, 10**12],
    "sampler.shift": [0, -1.0, 1e6],
    "sampler.solver": ["euler", "UNIPC", ""],
    "sampler": ["unipc", "unipc-6"],
    "text_len": [65, 10**9, 0, 63],
    "frame_size": [[24], [25, 24], [10**6, 10**6], [0, 0], [24, 24, 24], [24.0, 24.0], ["24", "24"]],
    "frames_per_block": [2, 10**6, 0],
    "channels": [4, 0, 10**6],
    "schedule": [[], [1.0, 1.0], [0.5, 0.8], [0.0], [2000.0], [1.0] * 101, [1.0, "x"], [[1.0]]],
    "trained_span_frames": [0, 10**9],
    "rope_max_distance": [100_001, 10**9],
    "context_noise": [2.0, -0.5],
    "vocabulary": [[], ["<pad>"], ["a", "b"], [0, 1], ["<pad>", "<unk>", 7], ["<pad>", "<unk>", "x" * 200]],
    "world.map_size": [97, 4, 10**9, 0],
    "world.kind": ["fly", "sprites"],
    "world.inputs": ["pixels", ""],
    "world.positions": ["screen", ""],
    "world.path_kinds": [{"loop": 2.0}, {"loop": "x"}, {f"k{i}": 0.1 for i in range(17)}],
    "world.long_return_gap": [[30], [0, 150], [30, 10**9]],
    "world.prompt": ["", "x" * 5000],
    "world.step_pixels": [8, 0],
    "world.view_size": [32, 0],
    "training.seed": [2**64],
    "training.steps": [10**12],
}
NON_FINITE = ["NaN", "-Infinity", "1e400", "-1"]  # 1e400 reads as infinity; 10**30 and the like are in SIZES


def _leaves(meta: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted path, value) of every entry, objects included, records left out."""
    found = []
    for key, value in meta.items():
        path = f"{prefix}{key}"
        if any(path == r or path.startswith(r) for r in RECORDS):
            continue
        found.append((path, value))
        if isinstance(value, dict):
            found.extend(_leaves(value, path + "."))
    return found


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def _set(meta: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(meta))
    *parents, last = path.split(".")
    target = out
    for p in parents:
        target = target[p]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return out


_DELETE = object()


class WorldFiles:
    """Writes variants of a good world file; ``cases`` maps a name to the path of each."""

    def __init__(self, root: Path, good: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.tensors = load_file(str(good))
        with safe_open(str(good), "pt") as f:
            self.metadata = dict(f.metadata())
        self.meta = json.loads(self.metadata["demo"])
        self.cases: dict[str, Path] = {}

    def write(self, name: str, demo_text: str | None = None, tensors: dict | None = None, meta=None) -> Path:
        metadata = dict(self.metadata)
        if demo_text is None and meta is not None:
            demo_text = json.dumps(meta)
        if demo_text is None and meta is None:
            demo_text = self.metadata["demo"]
        if demo_text is _DELETE:
            del metadata["demo"]
        else:
            metadata["demo"] = demo_text
        path = self.root / f"{name}.safetensors"
        save_file(tensors if tensors is not None else self.tensors, str(path), metadata=metadata)
        self.cases[name] = path
        return path

    def with_value(self, name: str, path: str, value) -> None:
        self.write(name, meta=_set(self.meta, path, value))

    def with_raw(self, name: str, path: str, raw: str) -> None:
        self.write(name, demo_text=json.dumps(_set(self.meta, path, _RAW)).replace(f'"{_RAW}"', raw))


def world_file_cases(root: Path, good: Path) -> dict:
    """name -> a world weights file every command that reads one must refuse with one line."""
    w = WorldFiles(root, good)
    for path, value in _leaves(w.meta):
        safe = path.replace(".", "-")
        for kind, wrong in ONE_OF_EACH.items():
            if kind != _kind(value):
                w.with_value(f"{safe}-as-{kind}", path, wrong)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for i, raw in enumerate(NON_FINITE):
                w.with_raw(f"{safe}-nonfinite-{i}", path, raw)
            if isinstance(value, int) and path not in SIZES:
                w.with_value(f"{safe}-fraction", path, value + 0.5)
        if path not in OPTIONAL:
            w.with_value(f"{safe}-missing", path, _DELETE)
        for i, bad in enumerate(SIZES.get(path, [])):
            w.with_value(f"{safe}-size-{i}", path, bad)
    for name, text in (("not-json", "{vocabulary: oops"), ("a-list", "[1, 2]"), ("a-number", "42"),
                       ("a-string", '"demo"'), ("null", "null"), ("deep", "[" * 100_000 + "]" * 100_000),
                       ("deep-object", '{"a":' * 50_000 + "1" + "}" * 50_000),
                       ("huge-int", '{"text_len": 1' + "0" * 5000 + "}")):
        w.write(f"demo-{name}", demo_text=text)
    w.write("demo-missing", demo_text=_DELETE)
    w.with_value("vocabulary-one-short", "vocabulary", w.meta["vocabulary"][:-1])
    w.with_value("vocabulary-huge", "vocabulary", ["<pad>", "<unk>"] + [f"w{i}" for i in range(200_000)])
    w.with_value("sampler-extra-steps-as-text", "sampler", {"solver": "unipc", "steps": "6", "shift": 1.0})
    # Tensors: non-finite weights in each part, a part missing or of another shape.
    for part in ("model.diffusion_model.head.head.weight", "text_encoder.position", "action_encoder.key.weight"):
        for label, value in (("nan", float("nan")), ("inf", float("inf"))):
            tensors = dict(w.tensors)
            t = tensors[part].clone()
            t.view(-1)[0] = value
            tensors[part] = t
            w.write(f"tensor-{label}-{part.split('.')[0]}", tensors=tensors)
    for part in ("text_encoder.token.weight", "action_encoder.offset_x.weight"):
        short = part.split(".")[0] + "-" + part.split(".")[1]
        tensors = {k: v for k, v in w.tensors.items() if k != part}
        w.write(f"tensor-missing-{short}", tensors=tensors)
        tensors = dict(w.tensors)
        tensors[part] = torch.zeros(tensors[part].shape[0] + 1, tensors[part].shape[1], dtype=tensors[part].dtype)
        w.write(f"tensor-reshaped-{short}", tensors=tensors)
    pt = root / "world-as-pt.pt"
    torch.save(dict(w.tensors), pt)
    w.cases["world-as-pt"] = pt
    return w.cases


def accepted_world_files(root: Path, good: Path) -> dict:
    """name -> a world file that differs from the bundled one in ways a file may: it loads and runs."""
    w = WorldFiles(root, good)
    w.with_value("two-unipc-steps", "sampler.steps", 2)
    w.with_value("no-sampler", "sampler", _DELETE)  # the re-noising steps of its schedule
    w.with_value("screen-positions", "world.positions", _DELETE)  # an earlier file: positions on the screen
    return w.cases


# --- action scripts ---------------------------------------------------------------------------------------

GOOD_SCRIPT = {"variant": "universal", "fps": 12, "mouse_step": 0.1,
               "timeline": [{"at": 0, "keys": ["W"]}, {"at": 1, "keys": ["W", "L"], "mouse": None}]}
WRONG_VALUES = {"list": ["universal"], "object": {"name": "universal"}, "null": None, "bool": True,
                "number": 7, "text": "W", "nested": [[[["W"]]]], "huge-int": _RAW}


def _script_places() -> list[tuple[str, tuple]]:
    """(name, path in GOOD_SCRIPT) of every place a value goes."""
    return [("variant", ("variant",)), ("fps", ("fps",)), ("mouse_step", ("mouse_step",)),
            ("timeline", ("timeline",)), ("entry", ("timeline", 0)), ("at", ("timeline", 0, "at")),
            ("keys", ("timeline", 0, "keys")), ("key", ("timeline", 0, "keys", 0)),
            ("mouse", ("timeline", 1, "mouse")), ("mouse-pitch", ("timeline", 1, "mouse", 0))]


def action_script_texts() -> dict:
    """name -> the text of a script that must be refused (a value of a wrong type at every place)."""
    texts = {}
    for place, path in _script_places():
        for label, wrong in WRONG_VALUES.items():
            script = json.loads(json.dumps(GOOD_SCRIPT))
            script["timeline"][1]["mouse"] = [0.0, 0.1]
            script["timeline"][1]["keys"] = ["W"]
            target = script
            for p in path[:-1]:
                target = target[p]
            if label == "text" and place in ("variant", "key"):
                wrong = "not-a-key"
            if label == "number" and place == "mouse-pitch":
                continue  # any finite number is a mouse move
            if label == "number" and place in ("fps", "mouse_step", "at"):
                wrong = -7
            target[path[-1]] = wrong
            texts[f"json-{place}-{label}"] = json.dumps(script).replace(f'"{_RAW}"', "1" + "0" * 400)
    lines = {"variant-list": "variant [universal]\n0 W\n", "fps-word": "variant universal\nfps twelve\n0 W\n",
             "fps-huge": "variant universal\nfps 1" + "0" * 400 + "\n0 W\n", "at-nan": "variant universal\nnan W\n",
             "mouse-text": "variant universal\n0 W mouse x y\n", "key-bracket": "variant universal\n0 [W]\n",
             "at-inf": "variant universal\ninf W\n", "huge-text": "variant universal\n" + "0 W\n" * 400_000}
    texts.update({f"lines-{k}": v for k, v in lines.items()})
    return texts


def node_widget_values() -> dict:
    """name -> (variant, fps, script) the Action Script node may be handed through links: wrong types each."""
    good = "0 W\n1 W L\n"
    cases = {}
    for label, wrong in WRONG_VALUES.items():
        if wrong == _RAW:
            wrong = 10**400
        if label != "text":
            cases[f"variant-{label}"] = (wrong, 12.0, good)
            cases[f"script-{label}"] = ("universal", 12.0, wrong)
        if label != "number":
            cases[f"fps-{label}"] = ("universal", wrong, good)
    cases["fps-nan"] = ("universal", float("nan"), good)
    cases["fps-huge-int"] = ("universal", 10**400, good)
    return cases
