"""Loading Wan2.1-family AR checkpoints (Self-Forcing, CausVid, Rolling Forcing, LongLive, Krea, Causal Forcing).

One entry point, ``load_checkpoint``: it reads ``.safetensors`` or ``.pt`` (never executing pickled code), picks
the EMA weights when present, strips the training wrappers' prefixes, checks every key and shape against the
Wan2.1 T2V layout, and says in one message what is wrong with a file that does not fit.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import CheckpointError
from .wan_config import WanConfig, infer_config
from .wan_model import WanModel

# Checked in this order: the longest prefix that every key carries is stripped.
KNOWN_PREFIXES = ("model.diffusion_model.", "model._fsdp_wrapped_module.", "diffusion_model.", "model.")
# Wrapper segments that FSDP / activation checkpointing insert in the middle of keys.
WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
# Top-level containers of training checkpoints, most preferred first.
CONTAINER_KEYS = ("generator_ema", "generator", "state_dict", "model")
I2V_MARKERS = ("img_emb.", "cross_attn.k_img.", "cross_attn.v_img.")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LoadedCheckpoint:
    path: str
    state_dict: dict
    config: WanConfig
    container: str  # which top-level entry held the weights ("flat" when none)
    prefix: str  # the prefix that was stripped ("" when none)
    dtype: torch.dtype  # the dtype the weights have now
    file_dtype: torch.dtype
    metadata: dict = field(default_factory=dict)
    lora: str | None = None

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self.state_dict.values())

    @property
    def causal_ar(self) -> bool | None:
        """What the file's metadata says (ComfyUI's marker), None when it does not say."""
        cfg = self.metadata.get("config")
        if isinstance(cfg, dict):
            return cfg.get("transformer", {}).get("causal_ar")
        return None

    def summary(self) -> dict:
        return {
            "path": self.path,
            "family": self.config.family,
            "config": self.config.to_dict(),
            "head_dim": self.config.head_dim,
            "dtype": str(self.dtype).replace("torch.", ""),
            "file_dtype": str(self.file_dtype).replace("torch.", ""),
            "parameters": self.num_parameters,
            "container": self.container,
            "prefix_stripped": self.prefix or "(none)",
            "causal_ar_marker": self.causal_ar,
            "lora_merged": self.lora,
        }


def expected_shapes(cfg: WanConfig) -> dict:
    """The exact key -> shape layout of a Wan2.1 T2V DiT with this config."""
    with torch.device("meta"):
        model = WanModel(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _read_raw(path: Path):
    """Return (tensor dict or nested dict, safetensors metadata)."""
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                metadata = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(path, f"not a readable safetensors file (truncated or corrupt?): {e}") from None
        for key, value in list(metadata.items()):
            if value.startswith(("{", "[")):
                try:
                    metadata[key] = json.loads(value)
                except json.JSONDecodeError:
                    pass
        return tensors, metadata
    if suffix in (".pt", ".pth", ".ckpt", ".bin"):
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True), {}
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported object"
            raise CheckpointError(
                path,
                "the pickle holds objects that would need arbitrary code to load, which is refused "
                f"(only tensors and plain containers are read): {first}",
            ) from None
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            raise CheckpointError(path, f"not a readable torch checkpoint (truncated or corrupt?): {e}") from None
    raise CheckpointError(path, f"unsupported file type '{suffix}'; expected .safetensors or .pt")


def _pick_container(raw, path: Path) -> tuple[dict, str]:
    if not isinstance(raw, dict):
        raise CheckpointError(path, f"expected a dict of tensors, found {type(raw).__name__}")
    for key in CONTAINER_KEYS:
        if key in raw and isinstance(raw[key], dict) and raw[key]:
            return raw[key], key
    return raw, "flat"


def _strip_prefix(sd: dict) -> tuple[dict, str]:
    """Strip the prefix every key carries (or keep only the diffusion model's keys of a bundle), then the
    wrapper segments FSDP / activation checkpointing put inside keys."""

    def unwrap(d):
        out = {}
        for k, v in d.items():
            for seg in WRAPPER_SEGMENTS:
                k = k.replace(seg, "")
            out[k] = v
        return out

    for prefix in KNOWN_PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            return unwrap({k[len(prefix):]: v for k, v in sd.items()}), prefix
    for prefix in KNOWN_PREFIXES:
        picked = unwrap({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
        if "head.modulation" in picked:
            return picked, prefix
    return unwrap(sd), ""


def _metadata_config(metadata: dict) -> dict:
    cfg = metadata.get("fastar_config")
    return cfg if isinstance(cfg, dict) else {}


def load_checkpoint(
    path,
    dtype: str | torch.dtype | None = None,
    expect: str = "t2v",
    config: WanConfig | None = None,
    lora: str | None = None,
    lora_alpha: float | None = None,
) -> LoadedCheckpoint:
    """Read, normalise and validate a Wan2.1 DiT checkpoint.

    ``dtype``: None keeps the file's dtype; "bf16"/"fp16"/"fp32" or a torch dtype casts.
    ``config``: the expected shape; inferred from the tensors when None.
    ``lora``: a LongLive-style PEFT LoRA file merged into the weights (scale alpha / rank; alpha defaults to rank).
    """
    path = Path(path)
    raw, metadata = _read_raw(path)
    sd, container = _pick_container(raw, path)
    non_tensors = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if non_tensors:
        raise CheckpointError(path, f"entries that are not tensors: {non_tensors[:3]}")
    sd, prefix = _strip_prefix(sd)

    if "head.modulation" not in sd or "patch_embedding.weight" not in sd:
        sample = ", ".join(list(sd)[:3])
        raise CheckpointError(
            path, f"not a Wan2.1 diffusion model (no head.modulation / patch_embedding; keys: {sample})"
        )
    i2v = sorted({m for m in I2V_MARKERS for k in sd if k.startswith(m) or m in k})
    if expect == "t2v" and i2v:
        raise CheckpointError(
            path,
            f"this is an image-to-video (I2V) Wan model (has {', '.join(i2v)}); "
            "a text-to-video (T2V) model is expected",
        )

    if config is None:
        meta_cfg = _metadata_config(metadata)
        if meta_cfg:
            config = WanConfig.from_dict(meta_cfg)
        else:
            try:
                config = infer_config({k: tuple(v.shape) for k, v in sd.items()})
            except (KeyError, ValueError) as e:
                raise CheckpointError(path, f"cannot infer the Wan config from the tensor shapes: {e}") from None

    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(sd))
    extra = sorted(set(sd) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys (e.g. {', '.join(missing[:3])})")
        if extra:
            parts.append(f"{len(extra)} unexpected keys (e.g. {', '.join(extra[:3])})")
        raise CheckpointError(path, "; ".join(parts) + f" for a Wan2.1 T2V model with {_describe(config)}")
    wrong = [(k, tuple(sd[k].shape), expected[k]) for k in expected if tuple(sd[k].shape) != expected[k]]
    if wrong:
        k, got, want = wrong[0]
        raise CheckpointError(
            path, f"{len(wrong)} tensors have the wrong shape, e.g. {k} is {list(got)}, expected {list(want)}"
        )

    file_dtype = sd["blocks.0.self_attn.q.weight"].dtype
    target = DTYPES.get(str(dtype), dtype) if dtype is not None else file_dtype
    if target not in (torch.float32, torch.float16, torch.bfloat16):
        raise CheckpointError(path, f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if lora:
        merge_lora(sd, lora, alpha=lora_alpha)
    sd = {k: v.to(target) for k, v in sd.items()}
    return LoadedCheckpoint(
        path=str(path), state_dict=sd, config=config, container=container, prefix=prefix,
        dtype=target, file_dtype=file_dtype, metadata=metadata, lora=str(lora) if lora else None,
    )


def _describe(cfg: WanConfig) -> str:
    return f"dim {cfg.dim}, {cfg.num_layers} layers, ffn {cfg.ffn_dim}"


def build_model(ckpt: LoadedCheckpoint, device="cpu") -> WanModel:
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
    raw, _ = _read_raw(lora_path)
    if isinstance(raw, dict):
        for key in ("generator_lora", "lora", "state_dict"):
            if isinstance(raw.get(key), dict):
                raw = raw[key]
                break
    pairs: dict = {}
    for key, tensor in raw.items():
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
    for target, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise CheckpointError(lora_path, f"{target} has lora_{''.join(ab)} but not both lora_A and lora_B")
        weight_key = f"{target}.weight"
        if weight_key not in sd:
            raise CheckpointError(lora_path, f"LoRA targets {target}, which the base model does not have")
        a, b = ab["A"].float(), ab["B"].float()
        rank = a.shape[0]
        delta = (b @ a) * ((alpha if alpha is not None else rank) / rank)
        if delta.shape != sd[weight_key].shape:
            raise CheckpointError(
                lora_path,
                f"LoRA for {target} has shape {list(delta.shape)}, the base weight {list(sd[weight_key].shape)}",
            )
        sd[weight_key] = (sd[weight_key].float() + delta).to(sd[weight_key].dtype)
    return len(pairs)


def save_checkpoint(model: WanModel, path, dtype=torch.float16, extra_metadata: dict | None = None) -> None:
    """Write a model as safetensors with its config in the metadata (used by the demo trainer and tests)."""
    from safetensors.torch import save_file

    metadata = {"fastar_config": json.dumps(model.config.to_dict())}
    metadata.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (extra_metadata or {}).items()})
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path), metadata=metadata)
