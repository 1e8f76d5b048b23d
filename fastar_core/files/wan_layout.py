"""The Wan2.1 T2V layout of a checkpoint, checked from declared names, shapes and dtypes alone.

``check_layout`` needs no tensor data: the loader runs it on a safetensors header before reading any tensor (and
on a torch file's tensors once they are read). It maps the file's keys to Wan keys (prefixes and training
wrappers stripped, collisions refused), refuses non-float weights, checks that layer indices run 0..N-1, reads the
config from the metadata or infers it from the shapes, and compares every shape with ``expected_shapes``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..model.wan_config import LIMITS, WanConfig, block_indices, infer_config

# Checked in this order: the longest prefix that every key carries is stripped.
KNOWN_PREFIXES = ("model.diffusion_model.", "model._fsdp_wrapped_module.", "diffusion_model.", "model.")
# Wrapper segments that FSDP / activation checkpointing / torch.compile insert in the middle of keys.
WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
I2V_MARKERS = ("img_emb.", "cross_attn.k_img.", "cross_attn.v_img.")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RUNNABLE = tuple(DTYPES.values())


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def expected_shapes(cfg: WanConfig) -> dict:
    """The exact key -> shape layout of a Wan2.1 T2V DiT with this config (``WanModel``'s state dict, written
    out so that checking a file builds no module tree; a test holds the two equal)."""
    d, f = cfg.dim, cfg.ffn_dim
    shapes = {"patch_embedding.weight": (d, cfg.in_dim, *cfg.patch_size), "patch_embedding.bias": (d,)}

    def linear(name, out_features, in_features):
        shapes[f"{name}.weight"] = (out_features, in_features)
        shapes[f"{name}.bias"] = (out_features,)

    linear("text_embedding.0", d, cfg.text_dim)
    linear("text_embedding.2", d, d)
    linear("time_embedding.0", d, cfg.freq_dim)
    linear("time_embedding.2", d, d)
    linear("time_projection.1", 6 * d, d)
    for i in range(cfg.num_layers):
        b = f"blocks.{i}"
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                linear(f"{b}.{attn}.{proj}", d, d)
            shapes[f"{b}.{attn}.norm_q.weight"] = (d,)
            shapes[f"{b}.{attn}.norm_k.weight"] = (d,)
        shapes[f"{b}.norm3.weight"] = (d,)
        shapes[f"{b}.norm3.bias"] = (d,)
        linear(f"{b}.ffn.0", f, d)
        linear(f"{b}.ffn.2", d, f)
        shapes[f"{b}.modulation"] = (1, 6, d)
    patch_volume = cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    linear("head.head", cfg.out_dim * patch_volume, d)
    shapes["head.modulation"] = (1, 2, d)
    return shapes


@dataclass
class Layout:
    config: WanConfig
    keys: dict  # Wan key -> key in the file
    prefix: str
    dtypes: Counter  # torch dtype -> parameter count



def layout_errors(declared: dict, want: dict) -> tuple[int, list[str]]:
    """(how many keys differ, what differs) between a file's keys and shapes (``declared``: key -> shape) and
    ``want``, the shapes a config gives; (0, []) when they fit. Families with a layout of their own (Matrix-Game,
    LingBot-World) compare theirs with it, and with each released size's to tell which one a file is."""
    missing = sorted(set(want) - set(declared))
    extra = sorted(set(declared) - set(want))
    bad = [(k, declared[k], want[k]) for k in want if k in declared and tuple(declared[k]) != want[k]]
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} keys ({', '.join(missing[:3])})")
    if extra:
        parts.append(f"{len(extra)} keys the model does not have ({', '.join(extra[:3])})")
    if bad and not parts:
        k, got, exp = bad[0]
        parts.append(f"{k} has shape {list(got)} where {list(exp)} is expected ({len(bad)} tensors differ)")
    return len(missing) + len(extra) + len(bad), parts


def _strip_prefix(keys: list, path: Path) -> tuple[dict, str]:
    """Map Wan keys to file keys: strip the prefix every key carries (or keep only the diffusion model's keys of
    a bundle), then the wrapper segments. Two file keys that become one Wan key are refused."""

    def unwrap(pairs):
        out = {}
        for new, old in pairs:
            for seg in WRAPPER_SEGMENTS:
                new = new.replace(seg, "")
            if new in out:
                raise CheckpointError(path, f"keys {out[new]} and {old} are the same weight ({new}) once training "
                                            "wrappers are removed; keep one of them")
            out[new] = old
        return out

    for prefix in KNOWN_PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            return unwrap((k[len(prefix):], k) for k in keys), prefix
    for prefix in KNOWN_PREFIXES:
        picked = [(k[len(prefix):], k) for k in keys if k.startswith(prefix)]
        if any(new == "head.modulation" for new, _ in picked):
            _refuse_second_set(path, prefix, [k for k in keys if not k.startswith(prefix)])
            return unwrap(picked), prefix
    return unwrap((k, k) for k in keys), ""


def _refuse_second_set(path: Path, prefix: str, others: list) -> None:
    """A bundle's other parts (text encoder, VAE) are left alone, but a second diffusion model beside the one
    read is refused: which of the two is meant cannot be known, and the one ignored may be the one wanted."""
    second = [k for k in others if k == "head.modulation" or k.endswith(".head.modulation")]
    if second:
        other = second[0][: -len("head.modulation")]
        where = f"under {other}*" if other else "without a prefix"
        raise CheckpointError(path, f"holds two Wan weight sets, under {prefix}* and {where}; keep one of "
                                    "them (a second full copy is never read, so it cannot be chosen here)")


def _metadata_config(metadata: dict, path: Path) -> WanConfig | None:
    if "fastar_config" not in metadata:
        return None
    declared = metadata["fastar_config"]
    if not isinstance(declared, dict):
        raise CheckpointError(path, f"metadata fastar_config is not a JSON object of config fields: "
                                    f"{str(declared)[:80]!r}")
    try:
        return WanConfig.from_dict(declared)
    except (TypeError, ValueError) as e:
        raise CheckpointError(path, f"metadata fastar_config is invalid: {e}") from None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def check_layout(path: Path, declared: dict, metadata: dict, config: WanConfig | None = None,
                 expect: str = "t2v") -> Layout:
    """Check ``{file key: (shape, torch dtype)}`` against the Wan2.1 T2V layout; nothing has to be loaded."""
    bad_keys = [k for k in declared if not isinstance(k, str)]
    if bad_keys:
        raise CheckpointError(path, f"keys that are not strings: {', '.join(repr(k) for k in bad_keys[:3])}")
    keys, prefix = _strip_prefix(list(declared), path)
    shapes = {k: tuple(declared[old][0]) for k, old in keys.items()}

    if "head.modulation" not in shapes or "patch_embedding.weight" not in shapes:
        sample = ", ".join(list(shapes)[:3]) or "none"
        raise CheckpointError(
            path, f"not a Wan2.1 diffusion model (no head.modulation / patch_embedding; keys: {sample})"
        )
    i2v = sorted({m for m in I2V_MARKERS for k in shapes if k.startswith(m) or m in k})
    if expect == "t2v" and i2v:
        raise CheckpointError(
            path,
            f"this is an image-to-video (I2V) Wan model (has {', '.join(i2v)}); "
            "a text-to-video (T2V) model is expected",
        )

    dtypes: Counter = Counter()
    for old in keys.values():
        shape, dt = declared[old]
        if not dt.is_floating_point:
            raise CheckpointError(path, f"{old} is {dtype_name(dt)}; weights must be floating point (bf16, fp16 or "
                                        "fp32); integer and boolean tensors are not cast")
        dtypes[dt] += _numel(shape)

    indices = block_indices(shapes)
    if indices != list(range(len(indices))):
        stray = next(i for n, i in enumerate(indices) if i != n)
        example = next(k for k in shapes if k.startswith(f"blocks.{stray}."))
        raise CheckpointError(path, f"layer indices are not 0..{len(indices) - 1} without gaps: found "
                                    f"{_sample(indices)} (e.g. {keys[example]}; a stray or missing layer?)")
    if len(indices) > LIMITS["num_layers"][1]:
        raise CheckpointError(path, f"{len(indices)} layers; at most {LIMITS['num_layers'][1]} are supported")

    if config is None:
        config = _metadata_config(metadata, path)
    if config is None:
        try:
            config = infer_config(shapes)
        except KeyError as e:
            raise CheckpointError(path, f"cannot infer the Wan config: tensor {e.args[0]} is missing") from None
        except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:
            raise CheckpointError(path, f"cannot infer the Wan config from the tensor shapes: {e}") from None
    if config.num_layers != len(indices):
        raise CheckpointError(path, f"the config says {config.num_layers} layers but the file has {len(indices)} "
                                    f"(blocks.0 .. blocks.{len(indices) - 1})" if indices else
                                    f"the config says {config.num_layers} layers but the file has no blocks.* keys")

    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys (e.g. {', '.join(missing[:3])})")
        if extra:
            parts.append(f"{len(extra)} unexpected keys (e.g. {', '.join(e[:80] for e in extra[:3])})")
        raise CheckpointError(path, "; ".join(parts) + f" for a Wan2.1 T2V model with {_describe(config)}")
    wrong = [(k, shapes[k], expected[k]) for k in expected if shapes[k] != expected[k]]
    if wrong:
        k, got, want = wrong[0]
        raise CheckpointError(
            path, f"{len(wrong)} tensors have the wrong shape for {_describe(config)}, e.g. {k} is {list(got)}, "
                  f"expected {list(want)}"
        )
    return Layout(config=config, keys=keys, prefix=prefix, dtypes=dtypes)


def _sample(indices: list) -> str:
    shown = ", ".join(str(i) for i in indices[:5])
    return shown + (f", ... {indices[-1]}" if len(indices) > 5 else "")


def _describe(cfg: WanConfig) -> str:
    return f"dim {cfg.dim}, {cfg.num_layers} layers, ffn {cfg.ffn_dim}"


def resolve_dtype(path: Path, dtypes: Counter, dtype) -> tuple[torch.dtype, torch.dtype]:
    """(target dtype, the file's main dtype). A requested dtype casts; without one the file's own dtype is kept,
    and dtypes the engine cannot run (fp64, fp8) are refused, named, with the option that casts them."""
    main = dtypes.most_common(1)[0][0]
    if dtype is not None:
        target = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if target not in RUNNABLE:
            raise CheckpointError(path, f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return target, main
    if main not in RUNNABLE:
        raise CheckpointError(path, f"the weights are {dtype_name(main)}, which the engine does not compute in; "
                                    "load them cast to bf16, fp16 or fp32 (fastar --dtype, the loader node's "
                                    "weight_dtype, or dtype=)")
    return main, main

