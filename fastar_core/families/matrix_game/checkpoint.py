"""Loading a released Matrix-Game 2.0 checkpoint: a flat safetensors file with ``model.``-prefixed keys, and the
sizes the reference builds ``CausalWanModel.from_config`` from.

The sizes come from the first of: the file's own ``fastar_config`` metadata (a ``config.json``'s content, which
``save_matrix_game`` can write into the file), a ``config.json`` beside the file (the release's folder layout), or,
for a file alone in a models folder as ComfyUI's model download leaves it, the released variant whose keys and
shapes the file has exactly (``config.RELEASED``). ``is_matrix_game(keys)`` recognises the layout (``img_emb.*``
and ``blocks.N.action_model.*``, no ``text_embedding``); ``load_matrix_game`` checks every key and shape against
the module tree the config builds before a tensor is read, and builds the model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...files.family_keys import PREFIX, is_matrix_game  # noqa: F401 - is_matrix_game is part of this module's API
from ...files.json_files import read_json
from ...files.raw import read_raw
from ...files.wan_checkpoint import checkpoint_errors, dtype_name
from ...files.wan_layout import layout_errors
from .config import CLIP_DIM, RELEASED, MatrixGameConfig, from_reference_config
from .model import MatrixGameModel

CONFIG_NAME = "config.json"
METADATA_KEY = "fastar_config"  # a config.json's content, carried in the file's own metadata
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class MatrixGameCheckpoint:
    path: str
    config: MatrixGameConfig
    config_source: str  # where its sizes came from: its metadata, the config.json beside it, the released variant
    state_dict: dict
    dtype: torch.dtype
    prefix: str
    file_dtypes: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"path": self.path, "family": "Matrix-Game 2.0", "variant": self.config.variant,
                "config_from": self.config_source, "config": self.config.to_dict(), "dtype": dtype_name(self.dtype),
                "prefix_stripped": self.prefix or "(none)", "action_layers": list(self.config.action.blocks),
                "parameters": sum(t.numel() for t in self.state_dict.values())}


def expected_shapes(config: MatrixGameConfig) -> dict:
    with torch.device("meta"):
        model = MatrixGameModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@cache
def released_shapes(variant: str) -> dict:
    return expected_shapes(RELEASED[variant])


def strip_prefix(path, declared: dict) -> tuple[str, dict]:
    """(prefix, {model key: file key}): the ``model.`` prefix on every key or on none."""
    prefixed = [k for k in declared if k.startswith(PREFIX)]
    prefix = PREFIX if prefixed and len(prefixed) == len(declared) else ""
    if prefixed and not prefix:
        raise CheckpointError(path, f"{len(prefixed)} of {len(declared)} keys start with {PREFIX!r}: expected all "
                                    "or none")
    return prefix, {k[len(prefix):]: k for k in declared}


def file_layout_errors(keys: dict, declared: dict, want: dict) -> tuple[int, list[str]]:
    """``layout_errors`` of the file's shapes under the model's key names (``keys``: model key -> file key)."""
    return layout_errors({k: declared[f] for k, f in keys.items()}, want)


def check_keys(path, declared: dict, config: MatrixGameConfig, source: str = "its config.json") -> tuple[str, dict]:
    """(prefix, {model key: file key}) once every key and shape fits ``config``; else one error naming them."""
    prefix, keys = strip_prefix(path, declared)
    _, errors = file_layout_errors(keys, declared, expected_shapes(config))
    if errors:
        raise CheckpointError(path, f"does not fit the Matrix-Game {config.variant} layout of {source}: "
                                    + "; ".join(errors))
    return prefix, keys


def reference_config_of(where, value) -> MatrixGameConfig:
    try:
        return from_reference_config(value)
    except (ValueError, TypeError) as e:
        raise CheckpointError(where, str(e)) from None


def choose_config(path: Path, declared: dict, metadata: dict) -> tuple[MatrixGameConfig, str]:
    """The file's sizes and where they came from: its metadata, the config.json beside it, or the released variant
    its keys and shapes are."""
    if METADATA_KEY in metadata:
        carried = metadata[METADATA_KEY]
        if not isinstance(carried, dict):
            raise CheckpointError(path, f"its {METADATA_KEY} metadata is not a JSON object (a config.json's content)")
        return reference_config_of(path, carried), f"the file's {METADATA_KEY} metadata"
    beside = path.parent / CONFIG_NAME
    if beside.is_file():
        return reference_config_of(beside, read_json(beside, "a Matrix-Game config")), str(beside)
    _, keys = strip_prefix(path, declared)
    differences = {variant: file_layout_errors(keys, declared, released_shapes(variant)) for variant in RELEASED}
    variant, (count, errors) = min(differences.items(), key=lambda item: item[1][0])
    if count == 0:
        return RELEASED[variant], f"the released {variant} model's config (recognised by its keys and shapes)"
    raise CheckpointError(path, f"has no {CONFIG_NAME} beside it and is none of the released Matrix-Game 2.0 models "
                                f"(closest, {variant}: {'; '.join(errors)}): put it in a folder of its own with the "
                                f"{CONFIG_NAME} it came with")


def load_matrix_game_checkpoint(path, dtype: torch.dtype | None = None,
                                config: MatrixGameConfig | None = None) -> MatrixGameCheckpoint:
    """Read and check a Matrix-Game 2.0 safetensors file; ``config`` overrides every other source of its sizes."""
    path = Path(path)
    with checkpoint_errors(path):
        chosen: dict = {}

        def fit(declared: dict, metadata: dict) -> None:
            if config is not None:
                chosen["config"], chosen["source"] = config, "(given)"
            else:
                chosen["config"], chosen["source"] = choose_config(path, declared, metadata)
            source = "its config.json" if chosen["source"].endswith(CONFIG_NAME) else chosen["source"]
            chosen["prefix"], chosen["keys"] = check_keys(path, declared, chosen["config"], source)

        def before_load(infos, metadata):
            declared = {}
            for k, info in infos.items():
                if info.dtype not in _ST_DTYPES:
                    raise CheckpointError(path, f"{k} has dtype {info.dtype}, which is not a weight dtype")
                declared[k] = tuple(info.shape)
            fit(declared, metadata)
            return list(chosen["keys"].values())

        raw, metadata = read_raw(path, before_load=before_load)
        if "keys" not in chosen:  # a torch file: checked once read
            fit({k: tuple(v.shape) for k, v in raw.items()}, metadata)
        stored = Counter(raw[k].dtype for k in chosen["keys"].values())
        counts = {dtype_name(d): n for d, n in stored.most_common()}
        target = dtype or stored.most_common(1)[0][0]
        sd = {k: raw[old].to(target) for k, old in chosen["keys"].items()}
        for k, t in sd.items():
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(path, f"{k} holds NaN or infinite values; the weights are damaged")
        return MatrixGameCheckpoint(str(path), chosen["config"], chosen["source"], sd, target, chosen["prefix"],
                                    counts)


def build_matrix_game(ckpt: MatrixGameCheckpoint, device="cpu") -> MatrixGameModel:
    with torch.device("meta"):
        model = MatrixGameModel(ckpt.config)
    model.load_state_dict(ckpt.state_dict, assign=True)
    return model.to(device=torch.device(device)).eval().requires_grad_(False)


def load_matrix_game(path, dtype: torch.dtype | None = None, device="cpu",
                     config: MatrixGameConfig | None = None) -> tuple[MatrixGameModel, MatrixGameCheckpoint]:
    ckpt = load_matrix_game_checkpoint(path, dtype=dtype, config=config)
    return build_matrix_game(ckpt, device=device), ckpt


def save_matrix_game(model: MatrixGameModel, path, dtype=torch.float32, config_in_file: bool = False) -> None:
    """Write a model as the released files are laid out (``model.``-prefixed safetensors) with a reference-style
    config.json beside it, or (``config_in_file``) carried in the file's metadata instead: what tests and the tiny
    host models use."""
    import json

    from safetensors.torch import save_file

    path = Path(path)
    sd = {PREFIX + k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    config = json.dumps(reference_config(model.config), indent=None if config_in_file else 2)
    save_file(sd, str(path), metadata={METADATA_KEY: config} if config_in_file else None)
    if not config_in_file:
        (path.parent / CONFIG_NAME).write_text(config)


def reference_config(c: MatrixGameConfig) -> dict:
    """``c`` as the reference's config.json writes it."""
    a = c.to_dict()["action"]
    return {"_class_name": "CausalWanModel", "model_type": "i2v", "dim": c.dim, "eps": c.eps, "ffn_dim": c.ffn_dim,
            "freq_dim": c.freq_dim, "in_dim": c.in_dim, "local_attn_size": c.local_attn_size,
            "num_heads": c.num_heads, "num_layers": c.num_layers, "out_dim": c.out_dim, "sink_size": c.sink_size,
            "text_len": c.text_len, "patch_size": list(c.patch_size), "action_config": a,
            **({"clip_dim": c.clip_dim} if c.clip_dim != CLIP_DIM else {})}
