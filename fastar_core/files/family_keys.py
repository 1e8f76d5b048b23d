"""Recognising a family's checkpoint before any tensor is read: Matrix-Game 2.0's from its keys, LingBot-World 2.0's
from the config.json of its ``from_pretrained`` folder, or from its camera layers' keys where the folder holds its
shards alone (as ComfyUI's model download leaves them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from .json_files import read_json
from .raw import SAFETENSORS_SUFFIXES
from .safetensors_reader import read_header

PREFIX = "model."  # the reference's WanDiffusionWrapper holds the model as ``self.model``


def is_matrix_game(keys) -> bool:
    """Whether checkpoint keys (prefixed or not) are Matrix-Game's: a CLIP-vision context (``img_emb``), action
    modules in its blocks, and no text embedding."""
    keys = [k[len(PREFIX):] if k.startswith(PREFIX) else k for k in keys]
    return (any(k.startswith("img_emb.") for k in keys) and any(".action_model." in k for k in keys)
            and not any(k.startswith("text_embedding.") for k in keys))


LINGBOT_CLASS = "WanModelFast"  # the release's model class, named in its config.json
CONFIG_NAME = "config.json"
LINGBOT_SUBFOLDER = "transformers"  # the release's fast_checkpoint subfolder of its ckpt_dir
LINGBOT_KEYS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer", ".cam_injector_layer", ".cam_scale_layer")
MAX_FOLDER_FILES = 1024  # safetensors files a folder may hold for its headers to be read here
# diffusers' shard names: diffusion_pytorch_model-00001-of-00004.safetensors
SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.safetensors$")


@dataclass(frozen=True)
class LingBotFiles:
    """Where a LingBot-World 2.0 model's files are. Either a ``from_pretrained`` folder (``shards`` None: the ones
    its index lists, else every safetensors in it), or shards named on their own, as ComfyUI's model download leaves
    them at the top of a models folder (``shards``: the set the named one belongs to, by its diffusers name, or
    the one file; ``index``: their index beside them, if there is one)."""

    folder: Path
    shards: tuple | None = None
    index: Path | None = None
    config: Path | None = None  # a config.json naming the release's class


def is_lingbot_keys(keys) -> bool:
    """Whether checkpoint keys are LingBot-World 2.0's: its camera layers (any shard of its blocks has them)."""
    return any(marker in k for k in keys for marker in LINGBOT_KEYS)


def _config_names_lingbot(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        data = read_json(path, str(path))
    except Exception:  # noqa: BLE001 - unreadable: not recognised here; the loader names the problem
        return False
    return isinstance(data, dict) and data.get("_class_name") == LINGBOT_CLASS


def _file_is_lingbot(path: Path) -> bool:
    try:
        return is_lingbot_keys(read_header(path, path.stat().st_size).tensors)
    except (CheckpointError, OSError):  # a damaged file: not recognised here; the loader names the problem
        return False


def shard_set(path: Path) -> tuple | None:
    """The shards a diffusers-named shard belongs to (every name of its set, present or not), or None."""
    found = SHARD_NAME.match(path.name)
    if found is None:
        return None
    count = int(found["count"])
    if not 1 <= count <= MAX_FOLDER_FILES:
        return None
    return tuple(path.parent / f"{found['stem']}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1))


def _folder_of(folder: Path) -> LingBotFiles | None:
    """A ``from_pretrained`` folder: its config.json names the release's class, or (without one) its safetensors
    hold the camera layers."""
    if not folder.is_dir():
        return None
    config = folder / CONFIG_NAME
    if config.is_file() and _config_names_lingbot(config):
        return LingBotFiles(folder, config=config)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(SAFETENSORS_SUFFIXES) and p.is_file())
    if not any(_file_is_lingbot(f) for f in files[:MAX_FOLDER_FILES]):
        return None
    # The camera layers are there: a config.json that is there but unreadable, damaged or naming another class is
    # this model's, and its loader names what is wrong with it (rather than the folder going unrecognised).
    there = config.exists() or config.is_symlink()
    return LingBotFiles(folder, config=config if there else None)


def lingbot_files(path) -> LingBotFiles | None:
    """The LingBot-World 2.0 model ``path`` names, or None: a folder (or the release's root holding
    ``transformers/``); an index or weights file of a ``from_pretrained`` folder (its config.json names the
    release's class); or a weights file that holds the camera layers (or whose diffusers-named set does), alone in
    a folder of other models' files, which are never read as its own."""
    p = Path(path)
    if p.is_dir():
        return next((f for f in (_folder_of(p), _folder_of(p / LINGBOT_SUBFOLDER)) if f is not None), None)
    if not p.is_file():
        return None
    if _config_names_lingbot(p.parent / CONFIG_NAME) and (p.name.endswith(SAFETENSORS_SUFFIXES)
                                                            or p.name.endswith(".index.json")):
        return LingBotFiles(p.parent, config=p.parent / CONFIG_NAME)
    if not p.name.endswith(SAFETENSORS_SUFFIXES):
        return None
    shards = shard_set(p)
    candidates = [p] if shards is None else [f for f in shards if f.is_file()]
    if not any(_file_is_lingbot(f) for f in candidates[:MAX_FOLDER_FILES]):
        return None
    if shards is None:
        return LingBotFiles(p.parent, (p,))
    stem = SHARD_NAME.match(p.name)["stem"]  # type: ignore[index]
    index = p.parent / f"{stem}.safetensors.index.json"
    return LingBotFiles(p.parent, shards, index if index.is_file() else None)
