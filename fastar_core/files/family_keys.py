"""Recognising a family's checkpoint before any tensor is read: Matrix-Game 2.0's from its keys, LingBot-World 2.0's
from the config.json of its ``from_pretrained`` folder."""

from __future__ import annotations

from pathlib import Path

from .json_files import read_json
from .raw import SAFETENSORS_SUFFIXES

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


def _declares_lingbot(folder: Path) -> bool:
    """Whether a folder's config.json names the release's class (a cheap look before the loader's full check)."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        return False
    try:
        data = read_json(path, str(path))
    except Exception:  # noqa: BLE001 - unreadable: not recognised here; the loader names the problem
        return False
    return isinstance(data, dict) and data.get("_class_name") == LINGBOT_CLASS


def lingbot_folder(path) -> Path | None:
    """The LingBot-World 2.0 ``from_pretrained`` folder ``path`` names (the folder, the release's root holding
    ``transformers/``, or a weights or index file in the folder), or None when it names none."""
    p = Path(path)
    if p.is_dir():
        return next((f for f in (p, p / LINGBOT_SUBFOLDER) if _declares_lingbot(f)), None)
    if p.is_file() and (p.name.endswith(SAFETENSORS_SUFFIXES) or p.name.endswith(".index.json")):
        return p.parent if _declares_lingbot(p.parent) else None
    return None
