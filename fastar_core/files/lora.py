"""LoRA files merged into a Wan state dict, in the key formats ComfyUI's own LoRA loader reads for Wan.

Each key names a Wan module (``blocks.0.self_attn.q``), under an optional prefix (``diffusion_model.``,
``model.diffusion_model.``, PEFT's ``base_model.model.``) or in kohya's flattened form
(``lora_unet_blocks_0_self_attn_q``; Wan Fun's ``lora_unet__...``), followed by what it holds:

- an up/down pair: ``.lora_B[.default].weight`` / ``.lora_A[.default].weight`` (PEFT, diffusers, LongLive),
  ``.lora_up.weight`` / ``.lora_down.weight`` (kohya), ``.lora.up.weight`` / ``.lora.down.weight``,
  ``_lora.up.weight`` / ``_lora.down.weight``, or bare ``.lora_B`` / ``.lora_A``;
- ``.alpha``: the pair's scale is alpha / rank (as ComfyUI: 1 when a file has no alpha);
- ``.diff`` / ``.diff_b``: a full difference added to the module's weight / bias.

The merged weight is ``W + scale * up @ down``, what ComfyUI's LoRA patch gives at strength 1. Formats that
are not low-rank pairs (LoCon mid weights, DoRA, LoHa, LoKr) are refused by name.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from ..errors import CheckpointError
from .raw import read_raw
from .wan_layout import KNOWN_PREFIXES, dtype_name

log = logging.getLogger("FAST-AR")

KEY_PREFIXES = ("base_model.model.", *KNOWN_PREFIXES)
KOHYA_PREFIXES = ("lora_unet__", "lora_unet_")
# (suffix, role), longest first so ".lora_A.default.weight" is not read as ".weight".
SUFFIXES = (
    (".lora_A.default.weight", "down"), (".lora_B.default.weight", "up"),
    (".lora_down.weight", "down"), (".lora_up.weight", "up"),
    (".lora.down.weight", "down"), (".lora.up.weight", "up"),
    ("_lora.down.weight", "down"), ("_lora.up.weight", "up"),
    (".lora_A.weight", "down"), (".lora_B.weight", "up"),
    (".lora_A", "down"), (".lora_B", "up"),
    (".alpha", "alpha"), (".diff_b", "diff_b"), (".diff", "diff"),
)
# PEFT names adapters: "<module>.lora_A.<adapter>.weight".
PEFT_NAMED = re.compile(r"^(?P<target>.+?)\.lora_(?P<which>[AB])\.[^.]+\.weight$")
UNSUPPORTED = {".lora_mid.weight": "LoCon mid weights", ".dora_scale": "DoRA", ".hada_w1_a": "LoHa",
               ".lokr_w1": "LoKr", ".oft_blocks": "OFT"}


def unwrap(raw, path: Path) -> dict:
    if isinstance(raw, dict):
        for key in ("generator_lora", "lora", "state_dict"):
            if isinstance(raw.get(key), dict):
                return raw[key]
        return raw
    raise CheckpointError(path, f"expected a dict of LoRA tensors, found {type(raw).__name__}")


def module_names(sd: dict) -> dict:
    """Every module of the base state dict, by its dotted name and by kohya's flattened one."""
    names = {}
    for key in sd:
        for end in (".weight", ".bias"):
            if key.endswith(end):
                module = key[: -len(end)]
                names[module] = module
                names[module.replace(".", "_")] = module
    return names


def parse_key(key: str, modules: dict) -> tuple[str, str] | None:
    """(module, role) for a LoRA key, or None when the key is not one of the formats."""
    for prefix in KEY_PREFIXES:  # in order, so "base_model.model.diffusion_model." loses both
        if key.startswith(prefix):
            key = key[len(prefix):]
    kohya = next((p for p in KOHYA_PREFIXES if key.startswith(p)), None)
    for suffix, role in SUFFIXES:
        if key.endswith(suffix):
            target = key[: -len(suffix)]
            if kohya is not None:
                target = modules.get(target[len(kohya):], target)
            return target, role
    m = PEFT_NAMED.match(key)
    if m is not None:
        return m["target"], "down" if m["which"] == "A" else "up"
    return None


def merge_lora(sd: dict, lora_path, alpha: float | None = None) -> int:
    """Merge the LoRA file at ``lora_path`` into ``sd`` in place; returns the number of modules changed.

    ``alpha`` (LongLive's config value) overrides the file's alphas; without either a pair's scale is 1."""
    lora_path = Path(lora_path)
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha == alpha and abs(alpha) < float("inf")):
        raise CheckpointError(lora_path, f"LoRA alpha {alpha!r} is not a finite number")
    raw, _ = read_raw(lora_path)
    entries = {k: v for k, v in unwrap(raw, lora_path).items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    for key in entries:
        for marker, name in UNSUPPORTED.items():
            if marker in key:
                raise CheckpointError(lora_path, f"{key} is a {name} entry; only low-rank LoRA pairs (with alpha) "
                                                 "and .diff/.diff_b differences can be merged")
    modules = module_names(sd)
    parts: dict = {}
    ignored = []
    for key, tensor in entries.items():
        parsed = parse_key(key, modules)
        if parsed is None:
            ignored.append(key)
            continue
        target, role = parsed
        parts.setdefault(target, {})[role] = tensor
    if not any({"up", "down", "diff", "diff_b"} & set(p) for p in parts.values()):
        raise CheckpointError(lora_path, "no LoRA pairs found (expected keys like blocks.0.self_attn.q.lora_A.weight, "
                                         "diffusion_model.blocks.0.self_attn.q.lora_down.weight or "
                                         "lora_unet_blocks_0_self_attn_q.lora_up.weight)")
    if ignored:
        log.warning("%s: %d LoRA keys in no known format were left out (e.g. %s)", lora_path.name, len(ignored),
                    ", ".join(ignored[:3]))
    for target, p in parts.items():
        _merge_module(sd, lora_path, target, p, alpha)
    return sum(1 for p in parts.values() if {"up", "down", "diff", "diff_b"} & set(p))


def _merge_module(sd: dict, path: Path, target: str, parts: dict, alpha: float | None) -> None:
    if {"up", "down"} & set(parts):
        if not {"up", "down"} <= set(parts):
            have = "up" if "up" in parts else "down"
            raise CheckpointError(path, f"{target} has a LoRA {have} matrix but not its "
                                        f"{'down' if have == 'up' else 'up'} matrix")
        weight_key = _base_key(sd, path, target, ".weight")
        up, down = parts["up"], parts["down"]
        if not (up.is_floating_point() and down.is_floating_point()):
            raise CheckpointError(path, f"LoRA for {target} is {dtype_name(down.dtype)}/{dtype_name(up.dtype)}; "
                                        "expected floating point")
        want = tuple(sd[weight_key].shape)
        if down.ndim != 2 or up.ndim != 2 or up.shape[1] != down.shape[0] or (up.shape[0], down.shape[1]) != want:
            raise CheckpointError(path, f"LoRA for {target} has A {list(down.shape)} and B {list(up.shape)}; the base "
                                        f"weight is {list(want)}, so A must be [rank, {want[1]}] and B "
                                        f"[{want[0]}, rank]")
        rank = down.shape[0]
        file_alpha = parts.get("alpha")
        scale = 1.0
        if alpha is not None:
            scale = alpha / rank
        elif file_alpha is not None:
            scale = float(file_alpha.float().reshape(-1)[0]) / rank
        _add(sd, weight_key, (up.float() @ down.float()) * scale)
    for role, end in (("diff", ".weight"), ("diff_b", ".bias")):
        if role in parts:
            key = _base_key(sd, path, target, end)
            if tuple(parts[role].shape) != tuple(sd[key].shape):
                raise CheckpointError(path, f"LoRA {role} for {target} has shape {list(parts[role].shape)}; the base "
                                            f"{end[1:]} is {list(sd[key].shape)}")
            _add(sd, key, parts[role].float())


def _base_key(sd: dict, path: Path, target: str, end: str) -> str:
    key = f"{target}{end}"
    if key not in sd:
        raise CheckpointError(path, f"LoRA targets {target}, which the base model does not have")
    return key


def _add(sd: dict, key: str, delta: torch.Tensor) -> None:
    sd[key] = (sd[key].float() + delta).to(sd[key].dtype)
