"""Which model family a checkpoint holds, from its safetensors header or its config.json alone (no tensor is read).

The loaders differ by family (Wan2.1's ``checkpoint.load_checkpoint``, Matrix-Game 2.0's
``matrix_game.checkpoint.load_matrix_game``, LingBot-World 2.0's ``lingbot.checkpoint.load_lingbot``); the command
line and the loader node ask here which one to call. Matrix-Game 2.0 is released as safetensors only, so a torch file
is read as Wan's; LingBot-World 2.0 as a ``from_pretrained`` folder (config.json naming ``WanModelFast`` beside its
safetensors shards), named by the folder or any of its weights files, or as its shards on their own, recognised by
their camera layers. The bundled demo world is a safetensors file whose metadata says so
(``fastar_core/families/demo/model.py`` loads it).
"""

from __future__ import annotations

import json
from pathlib import Path

from .family_keys import is_matrix_game, lingbot_files
from .raw import SAFETENSORS_SUFFIXES, check_regular_file
from .safetensors_reader import read_header
from .wan_checkpoint import checkpoint_errors


def is_matrix_game_file(path) -> bool:
    """Whether ``path`` is a Matrix-Game 2.0 checkpoint (its keys: ``img_emb``, ``action_model``, no text)."""
    p = Path(path)
    if p.suffix.lower() not in SAFETENSORS_SUFFIXES:
        return False
    with checkpoint_errors(p):
        size = check_regular_file(p)
        return is_matrix_game(read_header(p, size).tensors)


def is_demo_world_file(path) -> bool:
    """Whether ``path`` is a steered demo world's file (``train-demo --world steer``: its metadata's ``demo`` entry
    has a ``world``)."""
    p = Path(path)
    if p.suffix.lower() not in SAFETENSORS_SUFFIXES:
        return False
    with checkpoint_errors(p):
        size = check_regular_file(p)
        demo = read_header(p, size).metadata.get("demo")
    try:
        return isinstance(demo, str) and "world" in (json.loads(demo) or {})
    except (ValueError, TypeError, RecursionError):
        return False


def is_lingbot(path) -> bool:
    """Whether ``path`` is a LingBot-World 2.0 model: its folder (or the release's root holding one), a file of its
    folder, or its shards on their own (``family_keys.lingbot_files``)."""
    return lingbot_files(path) is not None
