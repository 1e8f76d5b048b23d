"""``FastARConfig``: FAST-AR's attention knobs (AnnCA, AnnSA), validated; and the presets ``off``, ``quality``,
``balanced``, ``fast``, each an attention config plus the TempCache settings it turns on (TempCache's knobs
live with the cache, in ``caches.spec.TempCacheSettings``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ...kernels import registered_host_backends
from ...kernels.dispatch import BACKENDS as KERNEL_BACKENDS
from ..caches.spec import TempCacheSettings
from ..errors import FastARError

BACKENDS = ("auto", *KERNEL_BACKENDS)


@dataclass(frozen=True)
class FastARConfig:
    preset: str = "off"
    # AnnCA: cross-attention prompt pruning (the exact merge of identical padded tokens is always on with it).
    annca: bool = False
    # Pruning on top of the exact pad merge. Off in every preset: measured on a CPU it never paid for its hashing
    # (a 1,560-token frame hits nearly every bucket, so it keeps almost every real prompt token); see README.
    annca_prune: bool = False
    # AnnSA: bucketed sparse self-attention.
    annsa: bool = False
    dense_warmup: float = 0.3  # share of denoising steps that stay dense
    layers: str | tuple = "all"  # "all", "auto" (from `fastar calibrate`), or a tuple of layer indices
    calibration: str | None = None  # JSON written by `fastar calibrate`, used when layers == "auto"
    # Below this many bucketed keys per head, planning and gathering cost more than the attention they save,
    # so the layer runs dense (the paper, too, finds sparse kernels lose on short sequences). On a GPU AnnSA also
    # needs its sparse kernel (Triton): without it the layer runs dense.
    annsa_min_keys: int = 8192
    # The sign-LSH hashing shared by AnnCA and AnnSA.
    bits: int = 6  # LSH bits per table (buckets = 2**bits), or coarse-quantizer bits
    tables: int = 1
    multiprobe: bool = True  # also visit Hamming-1 neighbour buckets
    block_size: int = 64  # query/key block of the sparse layout
    seed: int = 0  # hash projections come from their own generator seeded here
    backend: str = "auto"
    # Check each accelerated kernel against torch the first time it runs a kind of call, falling back on failure
    # (kernels/verify.py). False turns the check off for the rollouts run with this config, as benchmarks want.
    verify_kernels: bool = True

    @property
    def enabled(self) -> bool:
        """True when attention differs from the dense reference (AnnCA or AnnSA on)."""
        return self.annca or self.annsa

    def validate(self, num_layers: int | None = None) -> FastARConfig:
        def bad(field, value, valid):
            raise FastARError(f"FAST-AR {field} = {value!r} is invalid; valid: {valid}")

        backends = BACKENDS + tuple(registered_host_backends())
        if self.backend not in backends:
            bad("backend", self.backend, ", ".join(backends))
        if not (1 <= self.bits <= 16):
            bad("bits", self.bits, "1..16")
        if not (1 <= self.tables <= 8):
            bad("tables", self.tables, "1..8")
        if not (0.0 <= self.dense_warmup <= 1.0):
            bad("dense_warmup", self.dense_warmup, "a fraction in [0, 1]")
        if self.annsa_min_keys < 0:
            bad("annsa_min_keys", self.annsa_min_keys, ">= 0")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            bad("block_size", self.block_size, "a power of two >= 16")
        layers = self.layers
        if isinstance(layers, str):
            if layers not in ("all", "auto"):
                bad("layers", layers, "'all', 'auto' or a list of layer indices")
            if layers == "auto" and self.annsa and not self.calibration:
                bad("layers", layers, "'auto' needs calibration=<file written by `fastar calibrate`>")
        else:
            idx = list(layers)
            if num_layers is not None and any(not (0 <= i < num_layers) for i in idx):
                bad("layers", idx, f"indices in 0..{num_layers - 1}")
        return self

    def sparse_layers(self, num_layers: int) -> set:
        if self.layers == "all":
            return set(range(num_layers))
        if self.layers == "auto":
            if not self.calibration:
                raise FastARError("layers 'auto' needs calibration=<file written by `fastar calibrate`>")
            from ..files.json_files import read_json

            data = read_json(self.calibration, f"calibration {self.calibration}")
            layers = data.get("layers") if isinstance(data, dict) else None
            if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                        for i in layers):
                raise FastARError(f"calibration {self.calibration}: expected an object with \"layers\": [layer "
                                  "indices], as `fastar calibrate` writes it")
            return set(layers)
        return {int(i) for i in self.layers}

    def to_dict(self) -> dict:
        d = asdict(self)
        if not isinstance(d["layers"], str):
            d["layers"] = list(d["layers"])
        return d

    def with_overrides(self, **changes) -> FastARConfig:
        changes = {k: v for k, v in changes.items() if v is not None}
        if isinstance(changes.get("layers"), list):
            changes["layers"] = tuple(changes["layers"])
        return replace(self, **changes).validate()


@dataclass(frozen=True)
class Preset:
    """A named FAST-AR setting: attention knobs, and the TempCache it turns on (None: the cache stays dense)."""

    name: str
    attention: FastARConfig
    tempcache: TempCacheSettings | None


PRESETS = {
    "off": Preset("off", FastARConfig(preset="off"), None),
    # Exact or near-exact pieces only: conservative merging and the exact prompt pad merge.
    "quality": Preset("quality", FastARConfig(preset="quality", annca=True), TempCacheSettings(threshold=0.95)),
    # The paper's defaults: tau 0.9, last-key, first 30 % of steps dense, sparse SA in every block.
    "balanced": Preset("balanced", FastARConfig(preset="balanced", annca=True, annsa=True),
                       TempCacheSettings(threshold=0.9)),
    # More merging, narrower buckets.
    "fast": Preset("fast", FastARConfig(preset="fast", annca=True, annsa=True, bits=7, multiprobe=False),
                   TempCacheSettings(threshold=0.85, capacity_frames=15)),
}
PRESET_NAMES = tuple(PRESETS)


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise FastARError(f"FAST-AR preset {name!r} is not one of {', '.join(PRESETS)}")
    return PRESETS[name]


def parse_layers(text: str | None):
    if text is None or text in ("all", "auto"):
        return text
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise FastARError(f"layers {text!r} is not 'all', 'auto' or a comma-separated list of indices") from None
