"""Loading a released Matrix-Game 2.0 checkpoint: a flat safetensors file with ``model.``-prefixed keys, and the
``config.json`` beside it that gives its sizes (the reference builds ``CausalWanModel.from_config`` from it).

``is_matrix_game(keys)`` recognises the layout (``img_emb.*`` and ``blocks.N.action_model.*``, no
``text_embedding``); ``load_matrix_game`` checks every key and shape against the module tree the config builds
before a tensor is read, and builds the model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...files.family_keys import PREFIX, is_matrix_game  # noqa: F401 - is_matrix_game is part of this module's API
from ...files.json_files import read_json
from ...files.raw import read_raw
from ...files.wan_checkpoint import checkpoint_errors, dtype_name
from .config import CLIP_DIM, MatrixGameConfig, from_reference_config
from .model import MatrixGameModel

CONFIG_NAME = "config.json"
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class MatrixGameCheckpoint:
    path: str
    config: MatrixGameConfig
    config_path: str
    state_dict: dict
    dtype: torch.dtype
    prefix: str
    file_dtypes: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"path": self.path, "family": "Matrix-Game 2.0", "variant": self.config.variant,
                "config_file": self.config_path, "config": self.config.to_dict(), "dtype": dtype_name(self.dtype),
                "prefix_stripped": self.prefix or "(none)", "action_layers": list(self.config.action.blocks),
                "parameters": sum(t.numel() for t in self.state_dict.values())}


def find_config(path: Path) -> Path:
    found = path.parent / CONFIG_NAME
    if not found.is_file():
        raise CheckpointError(path, f"a Matrix-Game checkpoint needs the {CONFIG_NAME} it ships with beside it "
                                    f"({found} is missing): its sizes (window, keys, mouse) are not in the file")
    return found


def expected_shapes(config: MatrixGameConfig) -> dict:
    with torch.device("meta"):
        model = MatrixGameModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_keys(path, declared: dict, config: MatrixGameConfig) -> tuple[str, dict]:
    """(prefix, {model key: file key}) once every key and shape fits ``config``; else one error naming them."""
    prefixed = [k for k in declared if k.startswith(PREFIX)]
    prefix = PREFIX if prefixed and len(prefixed) == len(declared) else ""
    if prefixed and not prefix:
        raise CheckpointError(path, f"{len(prefixed)} of {len(declared)} keys start with {PREFIX!r}: expected all "
                                    "or none")
    keys = {k[len(prefix):]: k for k in declared}
    want = expected_shapes(config)
    missing = sorted(set(want) - set(keys))
    extra = sorted(set(keys) - set(want))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys ({', '.join(missing[:3])})")
        if extra:
            parts.append(f"{len(extra)} keys the model does not have ({', '.join(extra[:3])})")
        raise CheckpointError(path, f"does not fit the Matrix-Game {config.variant} layout of its config.json: "
                                    + "; ".join(parts))
    bad = [(k, declared[keys[k]], want[k]) for k in want if tuple(declared[keys[k]]) != want[k]]
    if bad:
        k, got, exp = bad[0]
        raise CheckpointError(path, f"{k} has shape {list(got)}; its config.json gives {list(exp)} "
                                    f"({len(bad)} tensors differ)")
    return prefix, keys


def load_matrix_game_checkpoint(path, dtype: torch.dtype | None = None,
                                config: MatrixGameConfig | None = None) -> MatrixGameCheckpoint:
    """Read and check a Matrix-Game 2.0 safetensors file; ``config`` overrides the ``config.json`` beside it."""
    path = Path(path)
    with checkpoint_errors(path):
        config_path = "(given)"
        if config is None:
            found = find_config(path)
            config_path = str(found)
            try:
                config = from_reference_config(read_json(found, "a Matrix-Game config"))
            except ValueError as e:
                raise CheckpointError(found, str(e)) from None
        layout: dict = {}

        def before_load(infos, metadata):
            declared = {}
            for k, info in infos.items():
                if info.dtype not in _ST_DTYPES:
                    raise CheckpointError(path, f"{k} has dtype {info.dtype}, which is not a weight dtype")
                declared[k] = tuple(info.shape)
            layout["prefix"], layout["keys"] = check_keys(path, declared, config)
            return list(layout["keys"].values())

        raw, _ = read_raw(path, before_load=before_load)
        if "keys" not in layout:  # a torch file: checked once read
            layout["prefix"], layout["keys"] = check_keys(path, {k: tuple(v.shape) for k, v in raw.items()}, config)
        stored = Counter(raw[k].dtype for k in layout["keys"].values())
        counts = {dtype_name(d): n for d, n in stored.most_common()}
        target = dtype or stored.most_common(1)[0][0]
        sd = {k: raw[old].to(target) for k, old in layout["keys"].items()}
        for k, t in sd.items():
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(path, f"{k} holds NaN or infinite values; the weights are damaged")
        return MatrixGameCheckpoint(str(path), config, config_path, sd, target, layout["prefix"], counts)


def build_matrix_game(ckpt: MatrixGameCheckpoint, device="cpu") -> MatrixGameModel:
    with torch.device("meta"):
        model = MatrixGameModel(ckpt.config)
    model.load_state_dict(ckpt.state_dict, assign=True)
    return model.to(device=torch.device(device)).eval().requires_grad_(False)


def load_matrix_game(path, dtype: torch.dtype | None = None, device="cpu",
                     config: MatrixGameConfig | None = None) -> tuple[MatrixGameModel, MatrixGameCheckpoint]:
    ckpt = load_matrix_game_checkpoint(path, dtype=dtype, config=config)
    return build_matrix_game(ckpt, device=device), ckpt


def save_matrix_game(model: MatrixGameModel, path, dtype=torch.float32) -> None:
    """Write a model as the released files are laid out (``model.``-prefixed safetensors and a reference-style
    config.json beside it): what tests and the tiny host models use."""
    import json

    from safetensors.torch import save_file

    path = Path(path)
    sd = {PREFIX + k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path))
    (path.parent / CONFIG_NAME).write_text(json.dumps(reference_config(model.config), indent=2))


def reference_config(c: MatrixGameConfig) -> dict:
    """``c`` as the reference's config.json writes it."""
    a = c.to_dict()["action"]
    return {"_class_name": "CausalWanModel", "model_type": "i2v", "dim": c.dim, "eps": c.eps, "ffn_dim": c.ffn_dim,
            "freq_dim": c.freq_dim, "in_dim": c.in_dim, "local_attn_size": c.local_attn_size,
            "num_heads": c.num_heads, "num_layers": c.num_layers, "out_dim": c.out_dim, "sink_size": c.sink_size,
            "text_len": c.text_len, "patch_size": list(c.patch_size), "action_config": a,
            **({"clip_dim": c.clip_dim} if c.clip_dim != CLIP_DIM else {})}
