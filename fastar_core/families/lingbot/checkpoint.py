"""Loading a released LingBot-World 2.0 model: a diffusers ``from_pretrained`` folder.

The release's ``WanModelFast.from_pretrained(ckpt_dir, subfolder="transformers")`` reads ``transformers/config.json``
and the weights beside it: ``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000i-of-0000n.safetensors`` listed by ``diffusion_pytorch_model.safetensors.index.json``
(``weight_map``: key -> shard). Keys carry no prefix (``blocks.0.cam_scale_layer.weight``). The 14B is the first;
the 1.3B (released after the code) is assumed to be laid out the same way at its own sizes (12 heads of 128, 30
layers), its T5 and VAE shared with the 14B: a folder of a config.json and one or more safetensors files.

``find_model_folder(path)`` accepts the folder, the release's root (holding ``transformers/``), or any weights or
index file inside the folder. ``load_lingbot`` checks every key and shape of every shard against the module tree
the config builds before a tensor is read, and builds the model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...files.family_keys import CONFIG_NAME, lingbot_folder
from ...files.family_keys import LINGBOT_SUBFOLDER as SUBFOLDER
from ...files.json_files import read_json
from ...files.raw import SAFETENSORS_SUFFIXES, check_regular_file, read_raw
from ...files.safetensors_reader import read_header
from ...files.wan_checkpoint import checkpoint_errors, dtype_name
from ...memory import format_bytes, free_bytes
from .config import CLASS_NAME, LingBotConfig, from_reference_config, reference_config
from .model import LingBotModel

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = WEIGHTS_NAME + ".index.json"
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
MAX_SHARDS = 1024


@dataclass
class LingBotCheckpoint:
    path: str  # the from_pretrained folder
    config: LingBotConfig
    shards: list
    state_dict: dict
    dtype: torch.dtype
    file_dtypes: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"path": self.path, "family": "LingBot-World 2.0", "size": self.config.size,
                "config": self.config.to_dict(), "dtype": dtype_name(self.dtype), "shards": len(self.shards),
                "parameters": sum(t.numel() for t in self.state_dict.values())}


def find_model_folder(path) -> Path | None:
    """The ``from_pretrained`` folder ``path`` names, or None when it is not one (nor inside one)."""
    return lingbot_folder(path)


def weight_files(folder: Path) -> tuple[list[Path], dict | None]:
    """(the safetensors files, {key: file name} from the index or None): the index's when there is one, else every
    ``*.safetensors`` in the folder."""
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = read_json(index_path, str(index_path), max_bytes=64 << 20)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(index_path, "has no weight_map of tensor names to shard files")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if Path(n).name != n or not n.endswith(SAFETENSORS_SUFFIXES)]
        if bad:
            raise CheckpointError(index_path, f"names {bad[0]!r} as a shard; shards are .safetensors files beside it")
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(index_path, f"lists {len(missing)} shard(s) not in {folder} "
                                              f"({', '.join(missing[:3])}): download every shard")
        return [folder / n for n in names], weight_map
    files = sorted(p for p in folder.iterdir() if p.name.endswith(SAFETENSORS_SUFFIXES) and p.is_file())
    if not files:
        raise CheckpointError(folder, f"holds {CONFIG_NAME} but no weights ({WEIGHTS_NAME}, or shards with "
                                      f"{INDEX_NAME})")
    return files, None


def expected_shapes(config: LingBotConfig) -> dict:
    with torch.device("meta"):
        model = LingBotModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_keys(folder: Path, declared: dict, config: LingBotConfig) -> None:
    """Every key and shape of the model, and nothing else; else one error naming what differs."""
    want = expected_shapes(config)
    missing = sorted(set(want) - set(declared))
    extra = sorted(set(declared) - set(want))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys ({', '.join(missing[:3])})")
        if extra:
            parts.append(f"{len(extra)} keys the model does not have ({', '.join(extra[:3])})")
        raise CheckpointError(folder, "does not fit the LingBot-World 2.0 layout of its config.json: "
                                      + "; ".join(parts))
    bad = [(k, declared[k], want[k]) for k in want if tuple(declared[k]) != want[k]]
    if bad:
        k, got, exp = bad[0]
        raise CheckpointError(folder, f"{k} has shape {list(got)}; its config.json gives {list(exp)} "
                                      f"({len(bad)} tensors differ)")


def load_lingbot_checkpoint(path, dtype: torch.dtype | None = None,
                            config: LingBotConfig | None = None) -> LingBotCheckpoint:
    """Read and check a LingBot-World 2.0 ``from_pretrained`` folder; ``config`` overrides its ``config.json``."""
    folder = find_model_folder(path) if config is None else Path(path)
    if folder is None:
        raise CheckpointError(path, f"is not a LingBot-World 2.0 model folder (a {CONFIG_NAME} naming {CLASS_NAME} "
                                    f"beside its safetensors, or a folder holding {SUBFOLDER}/ with them)")
    with checkpoint_errors(folder):
        if config is None:
            try:
                config = from_reference_config(read_json(folder / CONFIG_NAME, str(folder / CONFIG_NAME)))
            except ValueError as e:
                raise CheckpointError(folder / CONFIG_NAME, str(e)) from None
        files, weight_map = weight_files(folder)
        if len(files) > MAX_SHARDS:
            raise CheckpointError(folder, f"{len(files)} weight files; at most {MAX_SHARDS}")
        headers: dict = {}
        declared: dict = {}
        owner: dict[str, Path] = {}
        for f in files:
            header = read_header(f, check_regular_file(f))
            headers[f] = header
            for k, info in header.tensors.items():
                if k in owner:
                    raise CheckpointError(f, f"declares {k}, which {owner[k].name} declares too")
                if info.dtype not in _ST_DTYPES:
                    raise CheckpointError(f, f"{k} has dtype {info.dtype}, which is not a weight dtype")
                declared[k], owner[k] = tuple(info.shape), f
        if weight_map is not None:
            wrong = [k for k, f in weight_map.items() if owner.get(k) is None or owner[k].name != f]
            if wrong or set(weight_map) != set(declared):
                k = (wrong or sorted(set(weight_map) ^ set(declared)))[0]
                raise CheckpointError(folder / INDEX_NAME, f"does not match its shards ({k}: the index says "
                                                           f"{weight_map.get(k)}, found in "
                                                           f"{owner[k].name if k in owner else 'none'})")
        check_keys(folder, declared, config)
        need = sum(info.nbytes for h in headers.values() for info in h.tensors.values())
        free = free_bytes("cpu")
        if free is not None and need > free:
            raise CheckpointError(folder, f"its tensors take {format_bytes(need)} but the host has "
                                          f"{format_bytes(free)} free; refused before reading them")
        raw: dict = {}
        for f in files:
            tensors, _ = read_raw(f)
            raw.update(tensors)
        stored = Counter(t.dtype for t in raw.values())
        target = dtype or stored.most_common(1)[0][0]
        sd = {k: t.to(target) for k, t in raw.items()}
        for k, t in sd.items():
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(owner[k], f"{k} holds NaN or infinite values; the weights are damaged")
        counts = {dtype_name(d): n for d, n in stored.most_common()}
        return LingBotCheckpoint(str(folder), config, [str(f) for f in files], sd, target, counts)


def build_lingbot(ckpt: LingBotCheckpoint, device="cpu") -> LingBotModel:
    with torch.device("meta"):
        model = LingBotModel(ckpt.config)
    model.load_state_dict(ckpt.state_dict, assign=True)
    return model.to(device=torch.device(device)).eval().requires_grad_(False)


def load_lingbot(path, dtype: torch.dtype | None = None, device="cpu",
                 config: LingBotConfig | None = None) -> tuple[LingBotModel, LingBotCheckpoint]:
    ckpt = load_lingbot_checkpoint(path, dtype=dtype, config=config)
    return build_lingbot(ckpt, device=device), ckpt


def save_lingbot(model: LingBotModel, folder, dtype=torch.float32, max_shard_bytes: int | None = None) -> Path:
    """Write a model as the release lays it out: ``config.json`` and the weights, in shards of at most
    ``max_shard_bytes`` with an index when given (what tests and the tiny host models use). Returns the folder."""
    import json

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    (folder / CONFIG_NAME).write_text(json.dumps(reference_config(model.config), indent=2) + "\n")
    if max_shard_bytes is None:
        save_file(sd, str(folder / WEIGHTS_NAME))
        return folder
    shards: list[dict] = [{}]
    size = 0
    for k, v in sd.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name))
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2) + "\n")
    return folder
