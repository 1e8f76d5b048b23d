"""Hostile LingBot-World 2.0 inputs for the fuzz suite: model folders (config.json, the shards' index, the shards,
a shard's carried config) and camera folders (poses.npy, intrinsics.npy), each derived from a good one.

Every field of the config is given a value of each other JSON type, a non-finite or absurd number; every file of a
folder is replaced by what is not that file (text, bytes, a pickle, a directory, a link to nowhere or to a device,
a file cut short, a header that declares far more than the file holds); the camera's arrays get every wrong shape,
dtype and value a NumPy file can hold. Each case is ``name -> (path to hand in, what the error must name)``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
from comfyui_fastar.fastar_core.families.lingbot.config import LingBotConfig
from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.rollout.action_script import parse_text

TINY = LingBotConfig(dim=32, num_heads=2, num_layers=1, ffn_dim=64, freq_dim=16, text_len=8)
VIDEO_FRAMES = 13  # 4 latent frames
WRONG_VALUES = {"text": '"6"', "list": "[6]", "object": '{"a": 6}', "bool": "true", "null": "null",
                "nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "1e400": "1e400", "huge": str(10 ** 12),
                "digits": "9" * 5000, "negative": "-1", "zero": "0", "fraction": "2.5", "deep": "[" * 5000 + "]" * 5000}


def good_model(folder: Path, sharded: bool = True, config_in_files: bool = False) -> Path:
    return save_lingbot(random_lingbot(TINY, seed=1), folder, max_shard_bytes=40_000 if sharded else None,
                        config_in_files=config_in_files)


def good_camera(folder: Path, video_frames: int = VIDEO_FRAMES) -> Path:
    script = parse_text("variant lingbot\n0 W\n0.3 W L\n", "walk")
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "poses.npy", script.to_poses(video_frames).astype(np.float32))
    np.save(folder / "intrinsics.npy", np.tile(script.intrinsics(), (video_frames, 1)).astype(np.float32))
    return folder


def _npy_header(path: Path, descr: str, shape: tuple, extra: bytes = b"") -> None:
    """A .npy whose header says ``shape`` of ``descr`` over ``extra`` bytes of data (a file that lies)."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + extra)


def _replace_file(path: Path, kind: str) -> None:
    """``path`` made into what is not the file it was."""
    data = path.read_bytes() if path.is_file() else b""
    path.unlink()
    if kind == "text":
        path.write_text("hello, not this file\n")
    elif kind == "bytes":
        path.write_bytes(os.urandom(256))
    elif kind == "non-utf8":
        path.write_bytes(b"\xff\xfe{\x80\x81 not text")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: max(1, len(data) // 2)])
    elif kind == "header-only":
        path.write_bytes(data[:64])
    elif kind == "directory":
        path.mkdir()
    elif kind == "broken-link":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "pickle":
        path.write_bytes(pickle.dumps({"a": [1, 2, 3]}, protocol=2))
    elif kind == "giant-line":
        path.write_bytes(b"x" * (3 << 20))
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        raise ValueError(kind)


FILE_KINDS = ("text", "bytes", "non-utf8", "empty", "truncated", "header-only", "directory", "broken-link",
              "dev-zero", "fifo", "pickle", "giant-line", "deep")


def model_folder_cases(root: Path, good: Path) -> dict:
    """Hostile model folders, each a copy of ``good`` (a sharded folder with its config.json and index)."""
    cases = {}

    def copy(name: str) -> Path:
        dst = root / name
        shutil.copytree(good, dst, symlinks=True)
        cases[name] = (dst, dst.name)
        return dst

    config = json.loads((good / "config.json").read_text())
    kinds = list(WRONG_VALUES)
    for i, field in enumerate(config):
        # Sizes that become loops or allocations get every wrong value; the rest five each, in turn.
        every = field in ("dim", "num_layers", "num_heads", "ffn_dim", "text_len", "local_attn_size")
        for kind in kinds if every else [kinds[(5 * i + j) % len(kinds)] for j in range(5)]:
            text = WRONG_VALUES[kind]
            folder = copy(f"config-{field}-{kind}")
            body = json.dumps({**config, field: "@@"}).replace('"@@"', text)
            (folder / "config.json").write_text(body)
    for field in ("dim", "num_layers", "ffn_dim", "num_heads", "text_len", "freq_dim", "local_attn_size"):
        for value in (10 ** 6, 2 ** 31, 2 ** 63):
            folder = copy(f"config-{field}-{value}")
            (folder / "config.json").write_text(json.dumps({**config, field: value}))
    for kind in FILE_KINDS:
        _replace_file(copy(f"config-file-{kind}") / "config.json", kind)
    for what, body in {"list": "[]", "string": '"x"', "number": "7", "null": "null", "no-fields": "{}",
                       "other-class": json.dumps({**config, "_class_name": ["WanModel"]}),
                       "never-written": json.dumps({**config, "patch_size": [1, 2, 2]})}.items():
        (copy(f"config-is-{what}") / "config.json").write_text(body)

    index_name = "diffusion_pytorch_model.safetensors.index.json"
    index = json.loads((good / index_name).read_text())
    shard_names = sorted(set(index["weight_map"].values()))
    for kind in FILE_KINDS:
        _replace_file(copy(f"index-file-{kind}") / index_name, kind)
    key = next(iter(index["weight_map"]))
    for what, weight_map in {"list": [1], "empty": {}, "number-values": {key: 5},
                             "escape": {**index["weight_map"], key: "../../../etc/passwd.safetensors"},
                             "absolute": {**index["weight_map"], key: "/etc/x.safetensors"},
                             "missing-shard": {**index["weight_map"], key: "nope-00001-of-00009.safetensors"},
                             "moved-key": {**index["weight_map"], key: shard_names[-1]},
                             "extra-key": {**index["weight_map"], "blocks.99.x": shard_names[0]}}.items():
        (copy(f"index-{what}") / index_name).write_text(json.dumps({"weight_map": weight_map}))

    first = shard_names[0]
    for kind in FILE_KINDS:
        _replace_file(copy(f"shard-file-{kind}") / first, kind)
    (copy("shard-missing") / first).unlink()
    tensors = load_file(str(good / first))
    name = next(k for k, t in tensors.items() if t.ndim >= 2)
    for what, change in {
            "nan": lambda t: t.clone().fill_(float("nan")), "inf": lambda t: t.clone().fill_(float("inf")),
            "int32": lambda t: t.to(torch.int32), "bool": lambda t: t > 0, "uint8": lambda t: t.to(torch.uint8),
            "float8": lambda t: t.to(torch.float8_e4m3fn), "int64": lambda t: t.to(torch.int64),
            "reshaped": lambda t: t.reshape(-1), "scalar": lambda t: t.reshape(-1)[0].clone(),
            "grown": lambda t: torch.cat([t.reshape(-1), t.reshape(-1)])}.items():
        folder = copy(f"shard-tensor-{what}")
        save_file({**tensors, name: change(tensors[name]).contiguous()}, str(folder / first))
    header_len = struct.unpack("<Q", (good / first).read_bytes()[:8])[0]
    header = json.loads((good / first).read_bytes()[8:8 + header_len])
    for what, patch in {"huge-shape": {"shape": [10 ** 12, 10 ** 6]}, "negative-shape": {"shape": [-4, 8]},
                        "offsets-past-end": {"data_offsets": [0, 10 ** 12]},
                        "float-shape": {"shape": [2.5]}, "string-dtype": {"dtype": ["F32"]}}.items():
        folder = copy(f"shard-header-{what}")
        bad = json.loads(json.dumps(header))
        bad[name].update(patch)
        data = (good / first).read_bytes()[8 + header_len:]
        text = json.dumps(bad).encode()
        (folder / first).write_bytes(struct.pack("<Q", len(text)) + text + data)
    return cases


def carried_config_cases(root: Path, good: Path) -> dict:
    """Shards on their own carrying their config in metadata (no config.json), that metadata made hostile."""
    cases = {}
    shard = good / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(shard))
    from safetensors import safe_open

    with safe_open(str(shard), "pt") as f:
        config = json.loads(f.metadata()["fastar_config"])
    bodies = {f"{field}-{kind}": json.dumps({**config, field: "@@"}).replace('"@@"', text)
              for field in ("num_layers", "text_len") for kind, text in WRONG_VALUES.items()}
    bodies.update({"not-json": "{nope", "list": "[1]", "deep": "[" * 5000 + "]" * 5000,
                   "huge": "[" + "1," * 500_000 + "1]"})
    for what, body in bodies.items():
        folder = root / f"carried-{what}"
        folder.mkdir()
        save_file(tensors, str(folder / shard.name), metadata={"fastar_config": body})
        cases[folder.name] = (folder, folder.name)
    return cases


def camera_cases(root: Path, good: Path) -> dict:
    """Hostile camera folders, each a copy of ``good``: every wrong shape, dtype and value of either array, and
    every kind of file that is not a NumPy array."""
    cases = {}
    poses = np.load(good / "poses.npy")
    intrinsics = np.load(good / "intrinsics.npy")

    def copy(name: str) -> Path:
        dst = root / name
        shutil.copytree(good, dst, symlinks=True)
        cases[name] = (dst, dst.name)
        return dst

    def nan_at(a, where):
        a = a.astype(np.float64)
        a[where] = np.nan
        return a

    def value_at(a, where, value):
        a = a.astype(np.float64)
        a[where] = value
        return a

    pose_arrays = {
        "one-pose-2d": poses[0], "empty": poses[:0], "3x4": poses[:, :3, :], "4x4x1": poses[..., None],
        "flat": poses.reshape(-1), "scalar": np.float32(1.0), "nan": nan_at(poses, (2, 0, 3)),
        "inf": value_at(poses, (1, 1, 3), np.inf), "huge-translation": value_at(poses, (3, 0, 3), 1e300),
        "float32-overflow": value_at(poses, (3, 0, 3), 1e39), "tiny-rotation": poses * 1e-30,
        "all-huge": np.full_like(poses, 1e300, dtype=np.float64), "int": poses.astype(np.int32),
        "bool": poses > 0, "complex": poses.astype(np.complex64), "float16": poses.astype(np.float16),
        "big-endian": poses.astype(">f8"), "fortran": np.asfortranarray(poses.astype(np.float64)),
        "not-rigid": value_at(poses, (0, 0, 0), 3.0), "mirrored": value_at(poses, (0, 0, 0), -1.0),
        "last-row": value_at(poses, (0, 3, 0), 1.0), "structured": np.zeros(4, dtype=[("a", "f4"), ("b", "i4")]),
        "strings": np.array(["a", "b"]), "datetime": np.array(["2020-01-01"] * 16, dtype="datetime64[D]"),
    }
    intrinsic_arrays = {
        "3": intrinsics[0, :3], "5-columns": np.ones((4, 5), np.float32), "empty": intrinsics[:0],
        "3d": intrinsics[None], "nan-fx": nan_at(intrinsics, (0, 0)), "nan-cx": nan_at(intrinsics, (0, 2)),
        "inf-cy": value_at(intrinsics, (0, 3), np.inf), "zero-fx": value_at(intrinsics, (0, 0), 0.0),
        "negative-fy": value_at(intrinsics, (0, 1), -5.0), "tiny-fx": value_at(intrinsics, (0, 0), 1e-300),
        "huge-fx": value_at(intrinsics, (0, 0), 1e300), "huge-cx": value_at(intrinsics, (0, 2), 1e300),
        "subnormal-fy": value_at(intrinsics, (0, 1), 5e-324),
        "int": intrinsics.astype(np.int64), "complex": intrinsics.astype(np.complex128),
        "float16-overflow": np.where(np.arange(4) == 0, np.float16(np.inf), intrinsics.astype(np.float16)),
    }
    for file, arrays in (("poses.npy", pose_arrays), ("intrinsics.npy", intrinsic_arrays)):
        stem = file.split(".")[0]
        for what, array in arrays.items():
            np.save(copy(f"{stem}-{what}") / file, array, allow_pickle=False)
        np.save(copy(f"{stem}-object") / file, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        with open(copy(f"{stem}-npz") / file, "wb") as f:
            np.savez(f, poses=poses)
        _npy_header(copy(f"{stem}-declares-huge") / file, "<f8", (10 ** 9, 4, 4), b"\0" * 128)
        _npy_header(copy(f"{stem}-declares-more") / file, "<f4", (1000, 4, 4), b"\0" * 128)
        _npy_header(copy(f"{stem}-declares-negative") / file, "<f4", (-5, 4, 4), b"\0" * 128)
        _npy_header(copy(f"{stem}-declares-object") / file, "|O", (13, 4, 4), b"\0" * 128)
        (copy(f"{stem}-bad-header") / file).write_bytes(b"\x93NUMPY\x01\x00\x20\x00{'descr': nope}" + b" " * 20)
        for kind in FILE_KINDS:
            _replace_file(copy(f"{stem}-file-{kind}") / file, kind)
        (copy(f"{stem}-missing") / file).unlink()
    return cases


# Camera folders that differ from the release's in ways NumPy and the path allow: they run.
CAMERAS_THAT_RUN = ("poses-float16", "poses-big-endian", "poses-fortran")

# Model folders that differ from the release's in ways its loader allows: they are read.
MODELS_THAT_LOAD = ("config-_diffusers_version-", "config-local_attn_size-negative", "config-sink_size-zero",
                    # an index that is not a file is not read: the folder's shards are, and checked whole
                    "index-file-directory", "index-file-broken-link", "index-file-dev-zero", "index-file-fifo")


def loads(name: str) -> bool:
    return name.startswith(MODELS_THAT_LOAD)


def command_line_cases(root: Path, good: Path, camera: Path) -> dict:
    """Hostile options and side files for ``generate`` on a LingBot-World 2.0 folder, ``info`` on odd paths and
    ``bench lingbot-cap``: ``name -> (argv, what the error must name)``."""
    out = str(root / "out")
    size = {"--height": "32", "--width": "48", "--device": "cpu"}

    def gen(*extra, camera_folder=camera):
        argv = ["generate", "--checkpoint", str(good), "--out", out, *extra]
        if camera_folder is not None:
            argv += ["--camera", str(camera_folder)]
        if "--frames" not in extra:
            argv += ["--frames", "4"]
        for flag, value in size.items():
            if flag not in extra:
                argv += [flag, value]
        return argv

    def side(name, data) -> str:
        path = root / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        return str(path)

    for name in ("a-folder", "empty-camera"):
        (root / name).mkdir()
    side("a-file", "x")
    save_file({"context": torch.full((1, 8, 4096), float("nan"))}, str(root / "nan-cond.safetensors"))
    save_file({"context": torch.ones((1, 8, 17))}, str(root / "narrow-cond.safetensors"))
    torch.save({"x": torch.ones(1)}, root / "no-context.pt")
    cases = {
        "frames-0": (gen("--frames", "0"), "--frames"), "frames-negative": (gen("--frames", "-1"), "--frames"),
        "frames-billion": (gen("--frames", str(10 ** 9)), "--frames"),
        "frames-2^63": (gen("--frames", str(2 ** 63)), "--frames"),
        "frames-nan": (gen("--frames", "nan"), "--frames"),
        "height-0": (gen("--height", "0"), "--height"), "height-33": (gen("--height", "33"), "--height"),
        "height-huge": (gen("--height", str(10 ** 6)), "--height"),
        "width-negative": (gen("--width", "-48"), "--width"),
        "block-0": (gen("--frames-per-block", "0"), "--frames-per-block"),
        "block-huge": (gen("--frames-per-block", str(10 ** 6)), "--frames-per-block"),
        "schedule-nan": (gen("--schedule", "nan,0.5"), "--schedule"),
        "schedule-inf": (gen("--schedule", "1e400"), "--schedule"),
        "schedule-empty": (gen("--schedule", ""), "--schedule"),
        "schedule-junk": (gen("--schedule", "1,2,x"), "--schedule"),
        "schedule-100k": (gen("--schedule", ",".join(["0.5"] * 100_000)), "--schedule"),
        "seed-negative": (gen("--seed", "-1"), "--seed"), "seed-2^64": (gen("--seed", str(2 ** 64)), "--seed"),
        "sink-huge": (gen("--cache", "window", "--window", "18", "--sink", str(10 ** 9)), "--sink"),
        "window-huge": (gen("--cache", "window", "--window", str(10 ** 9)), "--window"),
        "cond-folder": (gen("--cond", str(root / "a-folder")), "a-folder"),
        "cond-missing": (gen("--cond", str(root / "none.pt")), "none.pt"),
        "cond-nan": (gen("--cond", str(root / "nan-cond.safetensors")), "nan-cond"),
        "cond-narrow": (gen("--cond", str(root / "narrow-cond.safetensors")), "narrow-cond"),
        "cond-dev-zero": (gen("--cond", "/dev/zero"), "/dev/zero"),
        "cond-no-context": (gen("--cond", str(root / "no-context.pt")), "no-context.pt"),
        "lora-missing": (gen("--lora", str(root / "none.safetensors")), "none.safetensors"),
        "camera-a-file": (gen("--camera", str(root / "a-file"), camera_folder=None), "a-file"),
        "camera-missing": (gen("--camera", str(root / "none"), camera_folder=None), "none"),
        "camera-empty": (gen("--camera", str(root / "empty-camera"), camera_folder=None), "empty-camera"),
        "camera-dev-zero": (gen("--camera", "/dev/zero", camera_folder=None), "/dev/zero"),
        "camera-too-short": (gen("--frames", "12"), camera.name),
        "out-a-file": (gen("--out", str(root / "a-file")), "a-file"),
        "out-under-a-file": (gen("--out", str(root / "a-file" / "x")), "a-file"),
        "out-dev-null": (gen("--out", "/dev/null"), "/dev/null"), "out-proc": (gen("--out", "/proc/x"), "/proc/x"),
        "checkpoint-empty-folder": (["generate", "--checkpoint", str(root / "a-folder"), "--camera", str(camera),
                                     "--frames", "4", "--out", out], "a-folder"),
        "info-empty-folder": (["info", str(root / "a-folder")], "a-folder"),
        "info-dev-zero": (["info", "/dev/zero"], "/dev/zero"), "info-root": (["info", "/"], "/"),
        "info-camera-folder": (["info", str(camera)], camera.name),
        "info-config-json": (["info", str(good / "config.json")], "config.json"),
        "info-empty-name": (["info", ""], "directory"),
    }
    for name, extra in {"frames-0": ["--frames", "0"], "frames-1": ["--frames", "1"],
                        "frames-billion": ["--frames", str(10 ** 9)], "repeats-0": ["--repeats", "0"],
                        "repeats-billion": ["--repeats", str(10 ** 9)], "seed-negative": ["--seed", "-1"],
                        "out-a-file": ["--out", str(root / "a-file")], "out-empty": ["--out", ""],
                        "scenario": ["--model", "lingbot"], "modes": ["--modes", "x"],
                        "budget-nan": ["--budget", "nan"]}.items():
        flag = extra[0] if extra[0] != "--model" else "--scenario"
        argv = ["bench", "lingbot-cap", "--out", out, *extra]
        cases[f"bench-{name}"] = (argv, "a-file" if name == "out-a-file" else flag)
    scripts = {
        "non-utf8.txt": b"variant lingbot\n0 W\xff\xfe\n",
        "giant-line.txt": "variant lingbot\n0 " + "W" * (5 << 20),
        "deep.json": "[" * 100_000 + "]" * 100_000, "deep-object.json": '{"timeline": ' + "[" * 5000 + "]" * 5000 + "}",
        "time-nan.txt": "variant lingbot\nnan W\n", "time-inf.txt": "variant lingbot\ninf W\n",
        "time-huge.txt": "variant lingbot\n1e308 W\n", "time-negative.txt": "variant lingbot\n-1 W\n",
        "many-lines.txt": "variant lingbot\n" + "".join(f"{i * 0.001:.3f} W\n" for i in range(300_000)),
        "variant-list.json": json.dumps({"variant": ["lingbot"], "timeline": [{"at": 0, "keys": ["W"]}]}),
        "variant-object.json": json.dumps({"variant": {"a": 1}, "timeline": [{"at": 0, "keys": ["W"]}]}),
        "timeline-nested.json": '{"variant": "lingbot", "timeline": ' + "[" * 30 + "]" * 30 + "}",
        "speed-nan.json": '{"variant": "lingbot", "move_speed": NaN, "timeline": [{"at": 0, "keys": ["W"]}]}',
        "fov-huge.json": '{"variant": "lingbot", "fov": 1e308, "timeline": [{"at": 0, "keys": ["W"]}]}',
        "turn-text.json": '{"variant": "lingbot", "turn_rate": "9", "timeline": [{"at": 0, "keys": ["W"]}]}',
        "fps-nan.json": '{"variant": "lingbot", "fps": NaN, "timeline": [{"at": 0, "keys": ["W"]}]}',
        "digits.json": '{"variant": "lingbot", "timeline": [{"at": ' + "9" * 5000 + ', "keys": ["W"]}]}',
        "empty.txt": "", "nul.txt": "variant lingbot\n0 W\x00\n",
        "mouse.txt": "variant lingbot\n0 W mouse 1e308 1\n",
        "unknown-key.txt": "variant lingbot\n0 Q\n", "universal.txt": "variant universal\n0 W\n",
    }
    for name, text in scripts.items():
        cases[f"actions-{name}"] = (gen("--actions", side(name, text), camera_folder=None), name)
    cases["actions-folder"] = (gen("--actions", str(root / "a-folder"), camera_folder=None), "a-folder")
    cases["actions-dev-zero"] = (gen("--actions", "/dev/zero", camera_folder=None), "/dev/zero")
    cases["actions-and-camera"] = (gen("--actions", side("ok.txt", "variant lingbot\n0 W\n")), "--camera")
    return cases

