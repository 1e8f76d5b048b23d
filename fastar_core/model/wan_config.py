"""Wan DiT hyper-parameters (Wan2.1, and Wan2.2 TI2V-5B: the same block), given or inferred from a state dict.

Every config is checked for type and range when it is made, so one read from a file's metadata cannot build a
broken or absurdly large model before its tensors are compared with it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Generous bounds (Wan2.1-14B: dim 5120, 40 layers, ffn 13824).
LIMITS = {
    "dim": (2, 65536),
    "num_heads": (1, 1024),
    "num_layers": (1, 1024),
    "ffn_dim": (1, 262144),
    "in_dim": (1, 4096),
    "out_dim": (1, 4096),
    "text_dim": (1, 65536),
    "freq_dim": (2, 65536),
    "text_len": (1, 1 << 20),
}
MAX_PATCH = 64
WAN_HEAD_DIM = 128  # every published Wan2.1 size
WAN22_LATENT_CHANNELS = 48  # the Wan2.2 VAE's latent channels (TI2V-5B's in_dim and out_dim)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        for name, (lo, hi) in LIMITS.items():
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{name} {value} is out of range; valid: {lo}..{hi}")
        patch = self.patch_size
        if isinstance(patch, list):
            patch = tuple(patch)
            object.__setattr__(self, "patch_size", patch)
        if not (isinstance(patch, tuple) and len(patch) == 3 and all(_is_int(p) and 1 <= p <= MAX_PATCH
                                                                      for p in patch)):
            raise ValueError(f"patch_size must be 3 integers (t, h, w) in 1..{MAX_PATCH}, got {patch!r}")
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"eps must be a number in (0, 1), got {eps!r}")
        if self.num_heads > self.dim or self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} (dim {self.dim} / {self.num_heads} heads) must be even "
                             "(RoPE rotates pairs)")
        if self.freq_dim % 2:
            raise ValueError(f"freq_dim {self.freq_dim} must be even (cosine and sine halves)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def family(self) -> str:
        """The published size this shape matches, or 'custom'."""
        for name, known in {**KNOWN_SIZES, **PACK_SIZES}.items():
            if (self.dim, self.num_layers, self.ffn_dim) == (known.dim, known.num_layers, known.ffn_dim):
                return name
        return "custom"

    @property
    def architecture(self) -> str:
        """Which Wan generation the module tree is: the block is the same, the latent space is not. Wan2.2's
        TI2V-5B works in the Wan2.2 VAE's 48-channel latents (4 x 16 x 16 compression), Wan2.1 in 16 channels
        (4 x 8 x 8)."""
        return "Wan2.2 TI2V" if self.in_dim == WAN22_LATENT_CHANNELS else "Wan2.1 T2V"

    @property
    def vae_spatial_stride(self) -> int:
        """Pixels per latent row/column of the VAE this architecture's latents come from."""
        return 16 if self.in_dim == WAN22_LATENT_CHANNELS else 8

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WanConfig:
        """A config from a plain dict (e.g. a checkpoint's metadata); unknown keys are ignored, a bad value raises
        ValueError naming its field."""
        if not isinstance(d, dict):
            raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        if isinstance(d.get("patch_size"), list):
            d["patch_size"] = tuple(d["patch_size"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


KNOWN_SIZES = {
    "Wan2.1-1.3B": WanConfig(dim=1536, num_heads=12, num_layers=30, ffn_dim=8960),
    "Wan2.1-14B": WanConfig(dim=5120, num_heads=40, num_layers=40, ffn_dim=13824),
    # LongLive 2.0's base (wan_5b/configs/wan_ti2v_5B.py): Wan2.1's block at 5B sizes in the Wan2.2 latent space.
    "Wan2.2-TI2V-5B": WanConfig(dim=3072, num_heads=24, num_layers=30, ffn_dim=14336, in_dim=48, out_dim=48),
}

# The pack's own demo model (tools/demo/settings.py MODEL_CONFIG; a test holds the two equal).
PACK_SIZES = {
    "FastAR-demo": WanConfig(dim=128, num_heads=4, num_layers=4, ffn_dim=512, in_dim=3, out_dim=3, text_dim=64,
                             freq_dim=64, text_len=64, patch_size=(1, 4, 4)),
}


def known_heads(dim: int) -> int | None:
    """The head count a known family of this width has (the shapes do not hold it), None when none does."""
    heads = {cfg.num_heads for cfg in {**KNOWN_SIZES, **PACK_SIZES}.values() if cfg.dim == dim}
    return heads.pop() if len(heads) == 1 else None


_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.")

# The tensors the config is read from, with the rank each must have.
_CONFIG_TENSORS = {
    "head.modulation": 3,
    "patch_embedding.weight": 5,
    "head.head.weight": 2,
    "blocks.0.ffn.0.weight": 2,
    "text_embedding.0.weight": 2,
    "time_embedding.0.weight": 2,
}


def block_indices(keys) -> list:
    """The distinct layer indices of ``blocks.<i>.`` keys, sorted."""
    return sorted({int(m.group(1)) for k in keys if (m := _BLOCK_KEY.match(k))})


def infer_config(
    shapes: dict, head_dim: int | None = None, num_heads: int | None = None, eps: float = 1e-6
) -> WanConfig:
    """Infer the config from ``{key: shape}`` of a Wan state dict (prefixes already stripped).

    The head count is not in the shapes: it is given through ``head_dim``/``num_heads`` (or the checkpoint's
    metadata, read by the loader), else the known family's of this width (``known_heads``), else Wan2.1's head
    size of 128 where the width is a multiple of it (what ComfyUI builds from the same file); any other width is
    refused rather than guessed, so that a file and its conversion to another format build the same model.
    Raises ValueError (or KeyError for a missing tensor) naming what does not fit.
    """
    for key, rank in _CONFIG_TENSORS.items():
        shape = tuple(shapes[key])
        if len(shape) != rank or any(s < 1 for s in shape):
            raise ValueError(f"{key} has shape {list(shape)}; expected {rank} non-zero dimensions")
    dim = shapes["head.modulation"][-1]
    patch = shapes["patch_embedding.weight"]
    indices = block_indices(shapes)
    if indices != list(range(len(indices))):
        raise ValueError(f"layer indices are not 0..{len(indices) - 1}: {_sample(indices)}")
    layers = len(indices)
    if num_heads is None and head_dim is not None:
        num_heads = dim // head_dim
    if num_heads is None:
        num_heads = known_heads(dim)
    if num_heads is None and dim % WAN_HEAD_DIM == 0:
        num_heads = dim // WAN_HEAD_DIM  # Wan2.1's head size, as ComfyUI's own model detection assumes
    if num_heads is None:
        widths = ", ".join(f"{name} {cfg.dim}/{cfg.num_heads}" for name, cfg in {**KNOWN_SIZES, **PACK_SIZES}.items())
        raise ValueError(f"the head count is not in the tensor shapes: width {dim} is no known family's (width/heads: "
                         f"{widths}) nor a multiple of Wan's head size {WAN_HEAD_DIM}; the file must say it: a "
                         "fastar_config entry (safetensors metadata, or a .pt's top-level dict) with num_heads")
    patch_size = tuple(int(s) for s in patch[2:])
    volume = patch_size[0] * patch_size[1] * patch_size[2]
    head_out = shapes["head.head.weight"][0]
    if head_out % volume:
        raise ValueError(f"head.head.weight has {head_out} outputs, not a multiple of the patch volume {volume}")
    return WanConfig(
        dim=dim,
        num_heads=num_heads,
        num_layers=layers,
        ffn_dim=shapes["blocks.0.ffn.0.weight"][0],
        in_dim=patch[1],
        out_dim=head_out // volume,
        text_dim=shapes["text_embedding.0.weight"][1],
        freq_dim=shapes["time_embedding.0.weight"][1],
        patch_size=patch_size,
        eps=eps,
    )


def _sample(indices: list) -> str:
    shown = ", ".join(str(i) for i in indices[:6])
    return shown + (f", ... {indices[-1]}" if len(indices) > 6 else "")
