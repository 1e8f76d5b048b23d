"""Loading Wan2.1-family AR checkpoints (Self-Forcing, CausVid, Rolling Forcing, LongLive, Krea, Causal Forcing).

One entry point, ``load_checkpoint``: it reads ``.safetensors`` or ``.pt`` (never executing pickled code), picks
the weights the model family's own inference loads (``generator`` or ``generator_ema``, see ``WEIGHT_ENTRIES``),
strips the training wrappers' prefixes, checks every key, dtype and shape against
the Wan2.1 T2V layout, and says in one message what is wrong with a file that does not fit.

The layout is checked from the declared shapes before the model's memory is committed (a safetensors file's
header is checked before a tensor is read), and every failure, foreseen or not, leaves as one
``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CheckpointError, FastARError
from ..memory import check_fits
from ..model.wan_config import WAN22_LATENT_CHANNELS, WanConfig
from ..model.wan_model import WanModel
from . import lora as lora_file
from .family_keys import is_matrix_game
from .raw import read_raw
from .torch_archive import one_line
from .wan_layout import (  # noqa: F401 - KNOWN_PREFIXES, DTYPES and expected_shapes are part of this API
    DTYPES,
    KNOWN_PREFIXES,
    check_layout,
    dtype_name,
    expected_shapes,
    resolve_dtype,
)

# Top-level containers of training checkpoints, most preferred first.
CONTAINER_KEYS = ("generator_ema", "generator", "state_dict", "model")
# Which weights to take from a file holding both a generator and its EMA: "auto" (the family's own choice, below),
# or one entry by name.
WEIGHTS_ENTRY_CHOICES = ("auto", "generator_ema", "generator")
# What each family's published inference loads, and where it says so. Self-Forcing, Rolling Forcing and Causal
# Forcing default to ``generator`` in their inference.py but every command their READMEs give passes --use_ema
# (Causal Forcing's chunk-wise one excepted).
WEIGHT_ENTRIES = {
    "self-forcing": ("generator_ema", "its README runs inference.py --use_ema"),
    "rolling-forcing": ("generator_ema", "its README runs inference.py --use_ema"),
    "causal-forcing": ("generator_ema", "its README runs the frame-wise and Causal Forcing++ models with --use_ema"),
    "causal-forcing-chunkwise": ("generator", "its README runs the chunk-wise model without --use_ema"),
    "longlive": ("generator", "its inference configs set use_ema: false"),
    "causvid": ("generator", "its minimal_inference scripts load ['generator']"),
}
# File or folder names the released checkpoints go by, checked in order against the lower-cased path's last two
# parts with '-' and ' ' read as '_' (CausVid ships autoregressive_checkpoint/model.pt).
FAMILY_NAMES = (
    ("longlive", "longlive"),
    ("causvid", "causvid"),
    ("autoregressive_checkpoint", "causvid"),
    ("rolling_forcing", "rolling-forcing"),
    ("rollingforcing", "rolling-forcing"),
    ("self_forcing", "self-forcing"),
    ("selfforcing", "self-forcing"),
    ("chunkwise", "causal-forcing-chunkwise"),
    ("causal_forcing", "causal-forcing"),
    ("framewise", "causal-forcing"),
)


def family_from_path(path) -> str | None:
    """The model family a checkpoint's file (or folder) name says, None when it says none."""
    parts = Path(path).parts[-2:]
    name = "/".join(parts).lower().replace("-", "_").replace(" ", "_")
    for needle, family in FAMILY_NAMES:
        if needle in name:
            return family
    return None


def check_weights_entry(weights_entry: str) -> str:
    if weights_entry not in WEIGHTS_ENTRY_CHOICES:
        raise FastARError(f"weights_entry {weights_entry!r} is not one of {', '.join(WEIGHTS_ENTRY_CHOICES)}")
    return weights_entry
# Safetensors dtype names as torch dtypes (what a header declares before anything is read).
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


@dataclass
class LoadedCheckpoint:
    path: str
    state_dict: dict
    config: WanConfig
    container: str  # which top-level entry held the weights ("flat" when none)
    prefix: str  # the prefix that was stripped ("" when none)
    dtype: torch.dtype  # the dtype the weights have now
    file_dtype: torch.dtype  # the dtype of most of the file's weights
    metadata: dict = field(default_factory=dict)
    lora: str | None = None
    file_dtypes: dict = field(default_factory=dict)  # dtype name -> tensor count, as stored
    weights_choice: str = ""  # why ``container`` was taken (the family's rule, the override, the only one)

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.state_dict.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict.values())

    @property
    def mixed_dtypes(self) -> bool:
        return len(self.file_dtypes) > 1

    @property
    def causal_ar(self) -> bool | None:
        """What the file's metadata says (ComfyUI's marker), None when it does not say."""
        cfg = self.metadata.get("config")
        transformer = cfg.get("transformer") if isinstance(cfg, dict) else None
        marker = transformer.get("causal_ar") if isinstance(transformer, dict) else None
        return marker if isinstance(marker, bool) else None

    def summary(self) -> dict:
        return {
            "path": self.path,
            "family": self.config.family,
            "architecture": self.config.architecture,
            "config": self.config.to_dict(),
            "head_dim": self.config.head_dim,
            "dtype": dtype_name(self.dtype),
            "file_dtype": dtype_name(self.file_dtype),
            "file_dtypes": dict(self.file_dtypes),
            "parameters": self.num_parameters,
            "container": self.container,
            "weights_choice": self.weights_choice,
            "prefix_stripped": self.prefix or "(none)",
            "causal_ar_marker": self.causal_ar,
            "lora_merged": self.lora,
        }



@contextmanager
def checkpoint_errors(path, what: str = "a Wan2.1 checkpoint"):
    """Whatever goes wrong inside leaves as one CheckpointError naming ``path`` (no traceback, no torch advice)."""
    try:
        yield
    except CheckpointError:
        raise
    except FastARError as e:
        raise CheckpointError(path, str(e)) from None
    except MemoryError:
        raise CheckpointError(path, "not enough memory to read it") from None
    except Exception as e:
        raise CheckpointError(path, f"cannot be read as {what} ({type(e).__name__}: {one_line(e)})") \
            from None


# --- the layout: keys, dtypes, config and shapes, checked from declared shapes -----------------------------


def _latent_channels(sd) -> int | None:
    """Input channels of a state dict's patch embedding (prefixed or not), None when it has none."""
    for k, v in sd.items():
        if isinstance(k, str) and k.endswith("patch_embedding.weight") and isinstance(v, torch.Tensor) and v.ndim == 5:
            return int(v.shape[1])
    return None


def _pick_container(raw, path: Path, weights_entry: str = "auto") -> tuple[dict, str, str]:
    """(weights, entry, why): the entry the override names, else the family's own, else the first present."""
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"expected a dict of tensors, found {type(raw).__name__}")
    present = [key for key in CONTAINER_KEYS if key in raw and isinstance(raw[key], dict) and raw[key]]
    if weights_entry != "auto":
        if weights_entry not in present:
            held = ", ".join(present) if present else "no named entry (a flat dict of weights)"
            raise CheckpointError(path, f"weights_entry {weights_entry!r}: the file has no such entry; it holds "
                                        f"{held} (weights_entry: auto, or one of those)")
        return raw[weights_entry], weights_entry, "chosen by weights_entry"
    if not present:
        return raw, "flat", "the file's only weights"
    generator = raw.get("generator")
    if "generator" in present and len(present) > 1 and _latent_channels(generator) == WAN22_LATENT_CHANNELS:
        return raw["generator"], "generator", "auto: LongLive 2.0 (Wan2.2 TI2V-5B) loads generator (use_ema: false)"
    family = family_from_path(path)
    rule = WEIGHT_ENTRIES.get(family or "")
    if rule is not None and rule[0] in present and len(present) > 1:
        return raw[rule[0]], rule[0], f"auto: {family} loads {rule[0]} ({rule[1]})"
    if len(present) == 1:
        return raw[present[0]], present[0], "the file's only weights"
    return raw[present[0]], present[0], (f"auto: the first of {', '.join(present)} (the file name names no family "
                                         "whose inference says otherwise)")



def _check_finite(path: Path, sd: dict, cast: bool) -> None:
    for k, t in sd.items():
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            note = f" after the cast to {dtype_name(t.dtype)} (values out of its range)" if cast else ""
            raise CheckpointError(path, f"{k} holds {bad} NaN or infinite values{note}; the weights are damaged")


def load_checkpoint(
    path,
    dtype: str | torch.dtype | None = None,
    expect: str = "t2v",
    config: WanConfig | None = None,
    lora: str | None = None,
    lora_alpha: float | None = None,
    check_finite: bool = True,
    weights_entry: str = "auto",
) -> LoadedCheckpoint:
    """Read, normalise and validate a Wan2.1 DiT checkpoint.

    ``dtype``: None keeps the file's dtype; "bf16"/"fp16"/"fp32" or a torch dtype casts.
    ``config``: the expected shape; read from the metadata or inferred from the tensors when None.
    ``lora``: a LongLive-style PEFT LoRA file merged into the weights (scale alpha / rank; alpha defaults to rank).
    ``check_finite``: refuse weights holding NaN or infinity (one pass over the weights).
    ``weights_entry``: which weights of a training ``.pt`` holding several: "auto" takes the one the family's own
    inference loads (``WEIGHT_ENTRIES``, the family read from the file name), else ``generator_ema`` before
    ``generator``; "generator" or "generator_ema" names one.
    """
    path = Path(path)
    check_weights_entry(weights_entry)
    with checkpoint_errors(path):
        return _load(path, dtype, expect, config, lora, lora_alpha, check_finite, weights_entry)


def _load(path, dtype, expect, config, lora, lora_alpha, check_finite, weights_entry) -> LoadedCheckpoint:
    found = {}

    def before_load(infos, metadata):  # safetensors: the whole layout is checked from its header
        if is_matrix_game(infos):
            raise CheckpointError(path, "is a Matrix-Game 2.0 checkpoint (CLIP-vision context and action modules, "
                                        "no text embedding): load it with matrix_game.checkpoint.load_matrix_game, "
                                        "which reads the config.json beside it")
        declared = {}
        for k, info in infos.items():
            if info.dtype not in _ST_DTYPES:
                raise CheckpointError(path, f"{k} has dtype {info.dtype}, which is not a weight dtype")
            declared[k] = (info.shape, _ST_DTYPES[info.dtype])
        found["layout"] = check_layout(path, declared, metadata, config, expect)
        return list(found["layout"].keys.values())  # a bundle's other parts (text encoder, VAE) are not read

    raw, metadata = read_raw(path, before_load=before_load)
    sd, container, why = _pick_container(raw, path, weights_entry)
    if "layout" not in found:
        bad_keys = [k for k in sd if not isinstance(k, str)]
        if bad_keys:
            raise CheckpointError(path, f"keys that are not strings: {', '.join(repr(k) for k in bad_keys[:3])}")
        non_tensors = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
        if non_tensors:
            raise CheckpointError(path, f"entries that are not tensors: {non_tensors[:3]}")
        found["layout"] = check_layout(path, {k: (tuple(v.shape), v.dtype) for k, v in sd.items()}, metadata,
                                       config, expect)
    layout = found["layout"]
    target, main = resolve_dtype(path, layout.dtypes, dtype)
    sd = {k: sd[old] for k, old in layout.keys.items()}
    counts = Counter(dtype_name(t.dtype) for t in sd.values())
    cast = any(t.dtype != target for t in sd.values())
    sd = {k: v.to(target) for k, v in sd.items()}
    if lora:  # after the cast: the merged weight is rounded once, to the dtype the model runs in
        merge_lora(sd, lora, alpha=lora_alpha)
    if check_finite:
        _check_finite(path, sd, cast)
    return LoadedCheckpoint(
        path=str(path), state_dict=sd, config=layout.config, container=container, prefix=layout.prefix,
        dtype=target, file_dtype=main, metadata=metadata, lora=str(lora) if lora else None,
        file_dtypes=dict(counts.most_common()), weights_choice=why,
    )


def build_model(ckpt: LoadedCheckpoint, device="cpu") -> WanModel:
    device = torch.device(device)
    if device.type != "cpu":
        check_fits(ckpt.nbytes, device, f"the model ({ckpt.config.family}, {dtype_name(ckpt.dtype)})",
                   "use a smaller dtype (--dtype bf16) or another device")
    with torch.device("meta"):
        model = WanModel(ckpt.config)
    model.load_state_dict(ckpt.state_dict, assign=True)
    return model.to(device=device).eval().requires_grad_(False)


def load_wan_model(path, dtype=None, device="cpu", lora=None, **kw) -> tuple[WanModel, LoadedCheckpoint]:
    ckpt = load_checkpoint(path, dtype=dtype, lora=lora, **kw)
    return build_model(ckpt, device=device), ckpt


def merge_lora(sd: dict, lora_path, alpha: float | None = None) -> int:
    """Merge a LoRA file into ``sd`` in place (the formats ComfyUI reads for Wan, LongLive's PEFT file among them;
    see ``lora.py``). Returns the number of modules changed."""
    lora_path = Path(lora_path)
    with checkpoint_errors(lora_path):
        return lora_file.merge_lora(sd, lora_path, alpha=alpha)


def save_checkpoint(model: WanModel, path, dtype=torch.float16, extra_metadata: dict | None = None) -> None:
    """Write a model as safetensors with its config in the metadata (used by the demo trainer and tests)."""
    from safetensors.torch import save_file

    metadata = {"fastar_config": json.dumps(model.config.to_dict())}
    metadata.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (extra_metadata or {}).items()})
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path), metadata=metadata)
