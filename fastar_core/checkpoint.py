"""Loading Wan2.1-family AR checkpoints (Self-Forcing, CausVid, Rolling Forcing, LongLive, Krea, Causal Forcing).

One entry point, ``load_checkpoint``: it reads ``.safetensors`` or ``.pt`` (never executing pickled code), picks
the EMA weights when present, strips the training wrappers' prefixes, checks every key, dtype and shape against
the Wan2.1 T2V layout, and says in one message what is wrong with a file that does not fit.

The layout is checked from the declared shapes before the model's memory is committed (a safetensors file's
header is checked before a tensor is read), and every failure, foreseen or not, leaves as one
``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoint_files import one_line, read_raw
from .checkpoint_layout import (  # noqa: F401 - KNOWN_PREFIXES, DTYPES and expected_shapes are part of this API
    DTYPES,
    KNOWN_PREFIXES,
    check_layout,
    dtype_name,
    expected_shapes,
    resolve_dtype,
)
from .errors import CheckpointError, FastARError
from .memory import check_fits
from .wan_config import WAN22_LATENT_CHANNELS, WanConfig
from .wan_model import WanModel

# Top-level containers of training checkpoints, most preferred first.
CONTAINER_KEYS = ("generator_ema", "generator", "state_dict", "model")
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
            "prefix_stripped": self.prefix or "(none)",
            "causal_ar_marker": self.causal_ar,
            "lora_merged": self.lora,
        }



@contextmanager
def checkpoint_errors(path):
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
        raise CheckpointError(path, f"cannot be read as a Wan2.1 checkpoint ({type(e).__name__}: {one_line(e)})") \
            from None


# --- the layout: keys, dtypes, config and shapes, checked from declared shapes -----------------------------


def _latent_channels(sd) -> int | None:
    """Input channels of a state dict's patch embedding (prefixed or not), None when it has none."""
    for k, v in sd.items():
        if isinstance(k, str) and k.endswith("patch_embedding.weight") and isinstance(v, torch.Tensor) and v.ndim == 5:
            return int(v.shape[1])
    return None


def _pick_container(raw, path: Path) -> tuple[dict, str]:
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"expected a dict of tensors, found {type(raw).__name__}")
    generator = raw.get("generator")
    if isinstance(generator, dict) and _latent_channels(generator) == WAN22_LATENT_CHANNELS:
        # LongLive 2.0 (Wan2.2 TI2V-5B) runs with use_ema false: its "generator" entry, not "generator_ema".
        return generator, "generator"
    for key in CONTAINER_KEYS:
        if key in raw and isinstance(raw[key], dict) and raw[key]:
            return raw[key], key
    return raw, "flat"



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
) -> LoadedCheckpoint:
    """Read, normalise and validate a Wan2.1 DiT checkpoint.

    ``dtype``: None keeps the file's dtype; "bf16"/"fp16"/"fp32" or a torch dtype casts.
    ``config``: the expected shape; read from the metadata or inferred from the tensors when None.
    ``lora``: a LongLive-style PEFT LoRA file merged into the weights (scale alpha / rank; alpha defaults to rank).
    ``check_finite``: refuse weights holding NaN or infinity (one pass over the weights).
    """
    path = Path(path)
    with checkpoint_errors(path):
        return _load(path, dtype, expect, config, lora, lora_alpha, check_finite)


def _load(path, dtype, expect, config, lora, lora_alpha, check_finite) -> LoadedCheckpoint:
    found = {}

    def before_load(infos, metadata):  # safetensors: the whole layout is checked from its header
        declared = {}
        for k, info in infos.items():
            if info.dtype not in _ST_DTYPES:
                raise CheckpointError(path, f"{k} has dtype {info.dtype}, which is not a weight dtype")
            declared[k] = (info.shape, _ST_DTYPES[info.dtype])
        found["layout"] = check_layout(path, declared, metadata, config, expect)
        check_fits(sum(i.nbytes for i in infos.values()), "cpu", f"reading {path.name}")

    raw, metadata = read_raw(path, before_load=before_load)
    sd, container = _pick_container(raw, path)
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
    if lora:
        merge_lora(sd, lora, alpha=lora_alpha)
    cast = any(t.dtype != target for t in sd.values())
    sd = {k: v.to(target) for k, v in sd.items()}
    if check_finite:
        _check_finite(path, sd, cast)
    return LoadedCheckpoint(
        path=str(path), state_dict=sd, config=layout.config, container=container, prefix=layout.prefix,
        dtype=target, file_dtype=main, metadata=metadata, lora=str(lora) if lora else None,
        file_dtypes=dict(counts.most_common()),
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


_LORA_KEY = re.compile(r"^(?P<target>.+?)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


def merge_lora(sd: dict, lora_path, alpha: float | None = None) -> int:
    """Merge a PEFT LoRA (``<module>.lora_A.weight`` / ``lora_B.weight``) into ``sd`` in place.

    LongLive's ``lora.pt`` holds rank/alpha 256 adapters on every Linear of each block, possibly under a
    ``generator_lora`` entry and a ``base_model.model.`` prefix. Returns the number of merged layers.
    """
    lora_path = Path(lora_path)
    with checkpoint_errors(lora_path):
        return _merge_lora(sd, lora_path, alpha)


def _merge_lora(sd: dict, lora_path: Path, alpha) -> int:
    raw, _ = read_raw(lora_path)
    if isinstance(raw, dict):
        for key in ("generator_lora", "lora", "state_dict"):
            if isinstance(raw.get(key), dict):
                raw = raw[key]
                break
    if not isinstance(raw, dict):
        raise CheckpointError(lora_path, f"expected a dict of LoRA tensors, found {type(raw).__name__}")
    pairs: dict = {}
    for key, tensor in raw.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            continue
        k = key
        for prefix in ("base_model.model.", *KNOWN_PREFIXES):
            if k.startswith(prefix):
                k = k[len(prefix):]
        m = _LORA_KEY.match(k)
        if m is None:
            continue
        pairs.setdefault(m["target"], {})[m["which"]] = tensor
    if not pairs:
        raise CheckpointError(lora_path, "no LoRA pairs found (expected keys like blocks.0.self_attn.q.lora_A.weight)")
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha == alpha and abs(alpha) < float("inf")):
        raise CheckpointError(lora_path, f"LoRA alpha {alpha!r} is not a finite number")
    for target, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise CheckpointError(lora_path, f"{target} has lora_{''.join(ab)} but not both lora_A and lora_B")
        weight_key = f"{target}.weight"
        if weight_key not in sd:
            raise CheckpointError(lora_path, f"LoRA targets {target}, which the base model does not have")
        a, b = ab["A"], ab["B"]
        if not (a.is_floating_point() and b.is_floating_point()):
            raise CheckpointError(lora_path, f"LoRA for {target} is {dtype_name(a.dtype)}/{dtype_name(b.dtype)}; "
                                             "expected floating point")
        want = tuple(sd[weight_key].shape)
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != want:
            raise CheckpointError(
                lora_path, f"LoRA for {target} has A {list(a.shape)} and B {list(b.shape)}; the base weight is "
                           f"{list(want)}, so A must be [rank, {want[1]}] and B [{want[0]}, rank]")
        rank = a.shape[0]
        delta = (b.float() @ a.float()) * ((alpha if alpha is not None else rank) / rank)
        sd[weight_key] = (sd[weight_key].float() + delta).to(sd[weight_key].dtype)
    return len(pairs)


def save_checkpoint(model: WanModel, path, dtype=torch.float16, extra_metadata: dict | None = None) -> None:
    """Write a model as safetensors with its config in the metadata (used by the demo trainer and tests)."""
    from safetensors.torch import save_file

    metadata = {"fastar_config": json.dumps(model.config.to_dict())}
    metadata.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (extra_metadata or {}).items()})
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path), metadata=metadata)
