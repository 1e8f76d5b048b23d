"""LingBot-World 2.0's sizes, read from the ``config.json`` of its released ``from_pretrained`` folder.

The backbone is Wan's (``WanConfig``) with a 36-channel input (noisy latent 16 + first-frame mask 4 + start image
latent 16), the T5 prompt as cross-attention context (no CLIP), and a camera path: per latent pixel the rays of
its 8 x 8 video pixels (origin and direction, 6 channels each: 384), patchified like the latent (1 x 2 x 2: 1,536
per token), embedded once per pass and injected into every block as a scale and shift of the hidden state.

The released file's ``config.json`` is what ``WanModelFast.from_pretrained`` reads: its constructor's arguments
less ``patch_size``, ``cross_attn_norm``, ``qk_norm`` and ``text_dim``, which the class never writes (their defaults
hold: 1 x 2 x 2, on, on, 4,096). A key missing from the file takes the constructor's default, as diffusers does.
Its ``local_attn_size`` and ``sink_size`` are the constructor's -1 and 0 unless the file says otherwise: the release
runs with ``--local_attn_size 18 --sink_size 6`` given on its command line (``run_fast.sh``), which is this pack's
default cache whatever the file says (``rollout.default_cache``).

| size | dim  | heads | layers | ffn   |
| 14B  | 5120 | 40    | 40     | 13824 |
| 1.3B | 1536 | 12    | 30     | 8960  |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...files.family_keys import LINGBOT_CLASS as CLASS_NAME
from ...model.wan_config import WanConfig

CONCAT_CHANNELS = 20  # the 4-channel first-frame mask and the start image's 16-channel latent
RAY_CHANNELS = 6  # a ray's origin (3) and direction (3) per video pixel
VAE_STRIDE = 8  # video pixels per latent row and column (the Wan2.1 VAE the release uses)
# The release's run_fast.sh: a self-attention window of 18 latent frames (the 6-frame sink and the chunk included).
RELEASED_WINDOW = 18
RELEASED_SINK = 6
SIZES = {
    "14B": {"dim": 5120, "num_heads": 40, "num_layers": 40, "ffn_dim": 13824},
    "1.3B": {"dim": 1536, "num_heads": 12, "num_layers": 30, "ffn_dim": 8960},
}
# WanModelFast's constructor defaults: what a key missing from config.json means.
CONSTRUCTOR_DEFAULTS = {"model_type": "t2v", "text_len": 512, "in_dim": 16, "dim": 2048, "ffn_dim": 8192,
                        "freq_dim": 256, "out_dim": 16, "num_heads": 16, "num_layers": 32, "local_attn_size": -1,
                        "sink_size": 0, "eps": 1e-6}
MAX_WINDOW = 4096
MAX_TEXT_LEN = 4096
NEVER_WRITTEN = ("patch_size", "cross_attn_norm", "qk_norm", "text_dim")  # the class's ignore_for_config


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LingBotConfig(WanConfig):
    in_dim: int = 36
    local_attn_size: int = -1  # as config.json says it; -1: the file leaves it to the command line
    sink_size: int = 0

    def __post_init__(self):
        if _is_int(self.text_len) and self.text_len > MAX_TEXT_LEN:  # a prompt of text_len x 4,096 features
            raise ValueError(f"text_len {self.text_len} is out of range; valid: 1..{MAX_TEXT_LEN} (UMT5 tokens; the "
                             "release's is 512)")
        super().__post_init__()
        if self.in_dim != self.out_dim + CONCAT_CHANNELS:
            raise ValueError(f"in_dim {self.in_dim} must be out_dim {self.out_dim} + {CONCAT_CHANNELS} (the mask and "
                             "the start image latent): LingBot-World 2.0 is an image-to-video model")
        window = self.local_attn_size
        if not _is_int(window) or not (window == -1 or 1 <= window <= MAX_WINDOW):
            raise ValueError(f"local_attn_size must be -1 (set at run time) or an integer in 1..{MAX_WINDOW}, got "
                             f"{window!r}")
        if not _is_int(self.sink_size) or not 0 <= self.sink_size < (window if window > 0 else MAX_WINDOW):
            raise ValueError(f"sink_size must be an integer >= 0 and below local_attn_size (or {MAX_WINDOW} when it "
                             f"is -1), got {self.sink_size!r}")

    @property
    def camera_dim(self) -> int:
        """Inputs of ``patch_embedding_wancamctrl``: 6 ray channels x 8 x 8 pixels per latent pixel, times the
        patch volume."""
        t, h, w = self.patch_size
        return RAY_CHANNELS * VAE_STRIDE * VAE_STRIDE * t * h * w

    @property
    def size(self) -> str:
        """Which released size these are ('14B', '1.3B'), or 'custom' (the tests' tiny models)."""
        shape = {"dim": self.dim, "num_heads": self.num_heads, "num_layers": self.num_layers, "ffn_dim": self.ffn_dim}
        return next((name for name, known in SIZES.items() if known == shape), "custom")

    @property
    def family(self) -> str:
        return f"LingBot-World-2.0 {self.size}"

    @property
    def architecture(self) -> str:
        return "LingBot-World 2.0"

    @property
    def vae_spatial_stride(self) -> int:
        return VAE_STRIDE

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d


def from_reference_config(d: dict) -> LingBotConfig:
    """A config from the release's ``config.json`` (``WanModelFast``'s arguments); ValueError naming a bad field."""
    if not isinstance(d, dict):
        raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
    name = d.get("_class_name", CLASS_NAME)
    if name != CLASS_NAME:
        raise ValueError(f"_class_name {name!r}: a LingBot-World 2.0 causal-fast model is a {CLASS_NAME}")
    written = [k for k in NEVER_WRITTEN if k in d]
    if written:  # the release never writes them; a file that does is another model's
        raise ValueError(f"config.json sets {', '.join(written)}, which {CLASS_NAME} never writes (its defaults hold)")
    merged = {**CONSTRUCTOR_DEFAULTS, **{k: v for k, v in d.items() if k in CONSTRUCTOR_DEFAULTS}}
    if merged.pop("model_type") != "i2v":
        raise ValueError(f"model_type {d.get('model_type', 't2v')!r}: the released LingBot-World 2.0 models are "
                         "image-to-video ('i2v')")
    return LingBotConfig(**merged)


def reference_config(c: LingBotConfig) -> dict:
    """``c`` as the release's config.json writes it (what the tests' tiny models and the host models save)."""
    return {"_class_name": CLASS_NAME, "_diffusers_version": "0.35.1", "model_type": "i2v", "text_len": c.text_len,
            "in_dim": c.in_dim, "dim": c.dim, "ffn_dim": c.ffn_dim, "freq_dim": c.freq_dim, "out_dim": c.out_dim,
            "num_heads": c.num_heads, "num_layers": c.num_layers, "local_attn_size": c.local_attn_size,
            "sink_size": c.sink_size, "eps": c.eps}


def released_config(size: str) -> LingBotConfig:
    """The ``config.json`` of a released size, as ``WanModelFast`` reads it: the 14B's as the release writes it
    (``model_type`` i2v, 36 input channels, no window of its own), the 1.3B assumed to differ only in its sizes."""
    return from_reference_config({"_class_name": CLASS_NAME, "model_type": "i2v", "in_dim": 36,
                                  "local_attn_size": -1, "sink_size": 0, **SIZES[size]})


RELEASED = {size: released_config(size) for size in SIZES}
