"""Wan2.1 DiT hyper-parameters, given explicitly or inferred from a state dict's shapes."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class WanConfig:
    dim: int = 1536
    num_heads: int = 12
    num_layers: int = 30
    ffn_dim: int = 8960
    in_dim: int = 16
    out_dim: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    text_len: int = 512
    patch_size: tuple = (1, 2, 2)
    eps: float = 1e-6

    def __post_init__(self):
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def family(self) -> str:
        """The published size this shape matches, or 'custom'."""
        for name, known in KNOWN_SIZES.items():
            if (self.dim, self.num_layers, self.ffn_dim) == (known.dim, known.num_layers, known.ffn_dim):
                return name
        return "custom"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WanConfig:
        d = dict(d)
        if "patch_size" in d:
            d["patch_size"] = tuple(d["patch_size"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


KNOWN_SIZES = {
    "Wan2.1-1.3B": WanConfig(dim=1536, num_heads=12, num_layers=30, ffn_dim=8960),
    "Wan2.1-14B": WanConfig(dim=5120, num_heads=40, num_layers=40, ffn_dim=13824),
}

_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.")


def infer_config(
    shapes: dict, head_dim: int | None = None, num_heads: int | None = None, eps: float = 1e-6
) -> WanConfig:
    """Infer the config from ``{key: shape}`` of a Wan state dict (prefixes already stripped).

    Head count is not in the shapes. Published Wan models use head_dim 128; small models can say otherwise
    through ``head_dim``/``num_heads`` (or the checkpoint's metadata, read by the loader).
    """
    dim = shapes["head.modulation"][-1]
    patch = shapes["patch_embedding.weight"]
    layers = 1 + max(int(m.group(1)) for k in shapes if (m := _BLOCK_KEY.match(k)))
    if num_heads is None:
        num_heads = dim // (head_dim or (128 if dim % 128 == 0 else dim))
    patch_size = tuple(int(s) for s in patch[2:])
    out_dim = shapes["head.head.weight"][0] // (patch_size[0] * patch_size[1] * patch_size[2])
    return WanConfig(
        dim=dim,
        num_heads=num_heads,
        num_layers=layers,
        ffn_dim=shapes["blocks.0.ffn.0.weight"][0],
        in_dim=patch[1],
        out_dim=out_dim,
        text_dim=shapes["text_embedding.0.weight"][1],
        freq_dim=shapes["time_embedding.0.weight"][1],
        patch_size=patch_size,
        eps=eps,
    )
