"""Recognising a family's checkpoint before any tensor is read: Matrix-Game 2.0's from its keys, LingBot-World 2.0's
from the config.json of its ``from_pretrained`` folder, or from its camera layers' keys where the folder holds its
shards alone (as ComfyUI's model download leaves them)."""

from __future__ import annotations

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


def is_lingbot_keys(keys) -> bool:
    """Whether checkpoint keys are LingBot-World 2.0's: its camera layers (any shard of its blocks has them)."""
    return any(marker in k for k in keys for marker in LINGBOT_KEYS)


def _config_names_lingbot(path: Path) -> bool:
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


def _shards_are_lingbot(folder: Path) -> bool:
    files = sorted(p for p in folder.iterdir() if p.name.endswith(SAFETENSORS_SUFFIXES) and p.is_file())
    return any(_file_is_lingbot(f) for f in files[:MAX_FOLDER_FILES])


def _declares_lingbot(folder: Path) -> bool:
    """Whether a folder is a LingBot-World 2.0 model: its config.json names the release's class, or (without one)
    its safetensors hold the camera layers."""
    if not folder.is_dir():
        return False
    path = folder / CONFIG_NAME
    if path.is_file():
        return _config_names_lingbot(path)
    return _shards_are_lingbot(folder)


def lingbot_folder(path) -> Path | None:
    """The LingBot-World 2.0 ``from_pretrained`` folder ``path`` names (the folder, the release's root holding
    ``transformers/``, or a weights or index file in the folder), or None when it names none."""
    p = Path(path)
    if p.is_dir():
        return next((f for f in (p, p / LINGBOT_SUBFOLDER) if _declares_lingbot(f)), None)
    if p.is_file() and p.name.endswith(".index.json"):
        return p.parent if _declares_lingbot(p.parent) else None
    if p.is_file() and p.name.endswith(SAFETENSORS_SUFFIXES):
        # its folder's config.json says so, or (without one) the file itself holds the camera layers: a LingBot
        # shard beside other models' files makes none of them LingBot's
        config = p.parent / CONFIG_NAME
        own = config.is_file() and _config_names_lingbot(config)
        return p.parent if own or (not config.is_file() and _file_is_lingbot(p)) else None
    return None
