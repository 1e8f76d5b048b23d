"""Loading a released LingBot-World 2.0 model: a diffusers ``from_pretrained`` folder.

The release's ``WanModelFast.from_pretrained(ckpt_dir, subfolder="transformers")`` reads ``transformers/config.json``
and the weights beside it: ``diffusion_pytorch_model.safetensors``, or shards
``diffusion_pytorch_model-0000i-of-0000n.safetensors`` listed by ``diffusion_pytorch_model.safetensors.index.json``
(``weight_map``: key -> shard). Keys carry no prefix (``blocks.0.cam_scale_layer.weight``). The 14B is the first;
the 1.3B (released after the code) is assumed to be laid out the same way at its own sizes (12 heads of 128, 30
layers), its T5 and VAE shared with the 14B: a folder of a config.json and one or more safetensors files.

``find_model_folder(path)`` accepts the folder, the release's root (holding ``transformers/``), or any weights or
index file inside the folder. The sizes come from the folder's ``config.json``, or, where it holds the shards alone
(as ComfyUI's model download leaves them), from the released size whose keys and shapes they are exactly
(``config.RELEASED``). ``load_lingbot`` checks every key and shape of every shard against the module tree the
config builds before a tensor is read, and builds the model.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from ...errors import CheckpointError, FastARError
from ...files.family_keys import CONFIG_NAME, LingBotFiles, lingbot_files
from ...files.family_keys import LINGBOT_SUBFOLDER as SUBFOLDER
from ...files.json_files import parse_json, read_json
from ...files.raw import SAFETENSORS_SUFFIXES, check_regular_file, read_raw
from ...files.safetensors_reader import read_header
from ...files.wan_checkpoint import checkpoint_errors, dtype_name
from ...files.wan_layout import layout_errors
from ...memory import format_bytes, free_bytes
from .config import CLASS_NAME, RELEASED, LingBotConfig, from_reference_config, reference_config
from .model import LingBotModel

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
METADATA_KEY = "fastar_config"  # a config.json's content, carried in a shard's own metadata
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
    config_source: str = CONFIG_NAME  # where the sizes came from: the config.json, or the released size

    def summary(self) -> dict:
        return {"path": self.path, "family": "LingBot-World 2.0", "size": self.config.size,
                "config_from": self.config_source,
                "config": self.config.to_dict(), "dtype": dtype_name(self.dtype), "shards": len(self.shards),
                "parameters": sum(t.numel() for t in self.state_dict.values())}


def find_model_folder(path) -> Path | None:
    """The folder of the model ``path`` names (``family_keys.lingbot_files``), or None when it names none."""
    files = lingbot_files(path)
    return None if files is None else files.folder


def _json_file(path: Path, max_bytes: int = 1 << 20):
    """A JSON file of the folder, its problems said once, naming it."""
    try:
        return read_json(path, str(path), max_bytes=max_bytes)
    except CheckpointError:
        raise
    except FastARError as e:
        raise CheckpointError(path, str(e).removeprefix(f"{path}: ")) from None


def _what_is(path: Path) -> str:
    """What stands where a shard should be, when it is not a regular file."""
    if path.is_symlink() and not path.exists():
        return "a broken symbolic link"
    if not path.exists():
        return "missing"
    return "a directory" if path.is_dir() else "not a regular file"


def read_index(index_path: Path) -> dict:
    """{tensor name: shard file name} of a diffusers index, checked."""
    index = _json_file(index_path, max_bytes=64 << 20)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(index_path, "has no weight_map of tensor names to shard files")
    bad = [n for n in sorted(set(weight_map.values())) if Path(n).name != n or not n.endswith(SAFETENSORS_SUFFIXES)]
    if bad:
        raise CheckpointError(index_path, f"names {bad[0]!r} as a shard; shards are .safetensors files beside it")
    return weight_map


def weight_files(files: LingBotFiles) -> tuple[list[Path], dict | None]:
    """(the safetensors files, {key: file name} from the index or None). A folder: its index's shards when it has
    one, else every ``*.safetensors`` in it. Shards named on their own: their set, every one of which must be
    there, and their index beside them when there is one."""
    folder = files.folder
    index_path = files.index if files.shards is not None else folder / INDEX_NAME
    weight_map = read_index(index_path) if index_path is not None and index_path.is_file() else None
    if files.shards is not None:
        names = [f.name for f in files.shards]
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(folder, f"holds {len(names) - len(missing)} of the {len(names)} shards of "
                                          f"{names[0]} ({', '.join(missing[:3])} missing): the model needs its whole "
                                          "set; download the missing shards into this folder under their own names")
        if weight_map is not None and set(weight_map.values()) != set(names):
            raise CheckpointError(index_path, f"lists other shards than {names[0]}'s set of {len(names)}")
        return list(files.shards), weight_map
    if weight_map is not None:
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            shown = [n if _what_is(folder / n) == "missing" else f"{n}: {_what_is(folder / n)}" for n in missing[:3]]
            raise CheckpointError(index_path, f"lists {len(missing)} shard(s) not in {folder} ({', '.join(shown)}): "
                                              "the model needs its whole set; download the missing shards into that "
                                              "folder under their own names")
        return [folder / n for n in names], weight_map
    found = sorted(p for p in folder.iterdir() if p.name.endswith(SAFETENSORS_SUFFIXES) and p.is_file())
    if not found:
        raise CheckpointError(folder, f"holds {CONFIG_NAME} but no weights ({WEIGHTS_NAME}, or shards with "
                                      f"{INDEX_NAME})")
    return found, None


def expected_shapes(config: LingBotConfig) -> dict:
    with torch.device("meta"):
        model = LingBotModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@cache
def released_shapes(size: str) -> dict:
    return expected_shapes(RELEASED[size])


def check_keys(folder: Path, declared: dict, config: LingBotConfig, source: str = f"its {CONFIG_NAME}") -> None:
    """Every key and shape of the model, and nothing else; else one error naming what differs."""
    _, errors = layout_errors(declared, expected_shapes(config))
    if errors:
        raise CheckpointError(folder, f"does not fit the LingBot-World 2.0 layout of {source}: " + "; ".join(errors))


def released_size(folder: Path, declared: dict) -> LingBotConfig:
    """The released size whose keys and shapes the shards are exactly (a folder without its config.json)."""
    differences = {size: layout_errors(declared, released_shapes(size)) for size in RELEASED}
    size, (count, errors) = min(differences.items(), key=lambda item: item[1][0])
    if count == 0:
        return RELEASED[size]
    raise CheckpointError(folder, f"has no {CONFIG_NAME} and its shards are none of the released LingBot-World 2.0 "
                                  f"sizes (closest, {size}: {'; '.join(errors)}): put the {CONFIG_NAME} of its "
                                  "transformers/ folder beside them")


def config_in_metadata(headers: dict) -> tuple[LingBotConfig, str] | None:
    """The sizes a shard carries in its ``fastar_config`` metadata (a config.json's content), if any does."""
    for f, header in headers.items():
        carried = header.metadata.get(METADATA_KEY)
        if carried is None:
            continue
        try:
            return (from_reference_config(parse_json(carried, f"its {METADATA_KEY} metadata")),
                    f"{f.name}'s {METADATA_KEY} metadata")
        except (ValueError, TypeError) as e:
            raise CheckpointError(f, f"its {METADATA_KEY} metadata is not a LingBot config.json: {e}") from None
    return None


def load_lingbot_checkpoint(path, dtype: torch.dtype | None = None,
                            config: LingBotConfig | None = None) -> LingBotCheckpoint:
    """Read and check a LingBot-World 2.0 model (``find_model_folder``'s kinds of path). Its sizes, in order: the
    ``config`` given, its folder's ``config.json``, a shard's ``fastar_config`` metadata, or the released size its
    keys and shapes are."""
    files = lingbot_files(path) if config is None else LingBotFiles(Path(path))
    if files is None:
        raise CheckpointError(path, f"is not a LingBot-World 2.0 model: a folder of its safetensors shards (with "
                                    f"the {CONFIG_NAME} naming {CLASS_NAME} beside them, or a folder holding "
                                    f"{SUBFOLDER}/ with them), or its shards on their own")
    folder = files.folder
    with checkpoint_errors(folder, "a LingBot-World 2.0 model"):
        source = "(given)"
        if config is None and files.config is not None:
            source = str(files.config)
            data = _json_file(files.config)
            try:
                config = from_reference_config(data)
            except (ValueError, TypeError) as e:
                raise CheckpointError(files.config, str(e)) from None
        shard_files, weight_map = weight_files(files)
        if len(shard_files) > MAX_SHARDS:
            raise CheckpointError(folder, f"{len(shard_files)} weight files; at most {MAX_SHARDS}")
        headers: dict = {}
        declared: dict = {}
        owner: dict[str, Path] = {}
        for f in shard_files:
            header = read_header(f, check_regular_file(f))
            headers[f] = header
            for k, info in header.tensors.items():
                if k in owner:
                    raise CheckpointError(f, f"declares {k}, which {owner[k].name} declares too")
                if info.dtype not in _ST_DTYPES:
                    raise CheckpointError(f, f"{k} has dtype {info.dtype}, which is not a weight dtype")
                declared[k], owner[k] = tuple(info.shape), f
        if weight_map is not None:
            index_path = files.index or folder / INDEX_NAME
            wrong = [k for k, f in weight_map.items() if owner.get(k) is None or owner[k].name != f]
            if wrong or set(weight_map) != set(declared):
                k = (wrong or sorted(set(weight_map) ^ set(declared)))[0]
                raise CheckpointError(index_path, f"does not match its shards ({k}: the index says "
                                                  f"{weight_map.get(k)}, found in "
                                                  f"{owner[k].name if k in owner else 'none'})")
        if config is None:
            carried = config_in_metadata(headers)
            if carried is not None:
                config, source = carried
            else:
                config = released_size(folder, declared)
                source = f"the released {config.size} model's config (recognised by its keys and shapes)"
        check_keys(folder, declared, config, f"its {CONFIG_NAME}" if source.endswith(CONFIG_NAME) else source)
        need = sum(info.nbytes for h in headers.values() for info in h.tensors.values())
        free = free_bytes("cpu")
        if free is not None and need > free:
            raise CheckpointError(folder, f"its tensors take {format_bytes(need)} but the host has "
                                          f"{format_bytes(free)} free; refused before reading them")
        raw: dict = {}
        for f in shard_files:
            tensors, _ = read_raw(f)
            raw.update(tensors)
        stored = Counter(t.dtype for t in raw.values())
        target = dtype or stored.most_common(1)[0][0]
        sd = {k: t.to(target) for k, t in raw.items()}
        for k, t in sd.items():
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(owner[k], f"{k} holds NaN or infinite values; the weights are damaged")
        counts = {dtype_name(d): n for d, n in stored.most_common()}
        return LingBotCheckpoint(str(folder), config, [str(f) for f in shard_files], sd, target, counts, source)


def build_lingbot(ckpt: LingBotCheckpoint, device="cpu") -> LingBotModel:
    with torch.device("meta"):
        model = LingBotModel(ckpt.config)
    model.load_state_dict(ckpt.state_dict, assign=True)
    return model.to(device=torch.device(device)).eval().requires_grad_(False)


def load_lingbot(path, dtype: torch.dtype | None = None, device="cpu",
                 config: LingBotConfig | None = None) -> tuple[LingBotModel, LingBotCheckpoint]:
    ckpt = load_lingbot_checkpoint(path, dtype=dtype, config=config)
    return build_lingbot(ckpt, device=device), ckpt


def save_lingbot(model: LingBotModel, folder, dtype=torch.float32, max_shard_bytes: int | None = None,
                 shards: int | None = None, config_in_files: bool = False) -> Path:
    """Write a model as the release lays it out: ``config.json`` and the weights, in shards of at most
    ``max_shard_bytes`` (or in ``shards`` shards) with an index when sharded. ``config_in_files``: the config in
    every shard's ``fastar_config`` metadata instead, and neither config.json nor index: shards on their own, as a
    model download leaves them (what the tiny host models use). Returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    config = json.dumps(reference_config(model.config), indent=None if config_in_files else 2)
    metadata = {METADATA_KEY: config} if config_in_files else None
    if not config_in_files:
        (folder / CONFIG_NAME).write_text(config + "\n")
    if max_shard_bytes is None and shards is None:
        save_file(sd, str(folder / WEIGHTS_NAME), metadata=metadata)
        return folder
    total = sum(v.numel() * v.element_size() for v in sd.values())
    limit = max_shard_bytes if shards is None else -(-total // shards)
    groups: list[dict] = [{}]
    size = 0
    for k, v in sd.items():
        nbytes = v.numel() * v.element_size()
        if groups[-1] and size + nbytes > limit and (shards is None or len(groups) < shards):
            groups.append({})
            size = 0
        groups[-1][k] = v
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(groups, start=1):
        name = f"diffusion_pytorch_model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(shard, str(folder / name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    if not config_in_files:
        (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                    indent=2) + "\n")
    return folder
