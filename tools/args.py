"""Command-line options shared by the tools: the cache and FAST-AR's knobs as argparse arguments, turned into
engine settings by the engine's own ``resolve_settings`` (the same function the nodes and the benches call)."""

from __future__ import annotations

from ..fastar_core.caches.spec import SINK_FRAMES, WINDOW_FRAMES
from ..fastar_core.fastar.config import BACKENDS, PRESET_NAMES, parse_layers
from ..fastar_core.rollout.engine import EngineSettings, cache_choices, resolve_settings


def add_cache_arguments(p) -> None:
    g = p.add_argument_group("KV cache")
    g.add_argument("--cache", default="auto", choices=list(cache_choices()),
                   help="cache policy (auto: tempcache when the FAST-AR preset turns it on, else global)")
    g.add_argument("--sink", type=int, help=f"sink frames kept for good (window, rolling, tempcache; default "
                                            f"{SINK_FRAMES}); recompute: first frames kept in its context (Krea "
                                            "keep_first_frame: 1; 0 re-encodes through a VAE, which the command "
                                            "line does not load)")
    g.add_argument("--window", type=int, help="frames a chunk attends to, the sink and the chunk included (window and "
                                              f"recompute caches; LongLive 12, Krea 6; default {WINDOW_FRAMES})")


def add_fastar_arguments(p) -> None:
    g = p.add_argument_group("FAST-AR")
    g.add_argument("--fastar", default="off", choices=list(PRESET_NAMES), help="FAST-AR preset (off = dense reference)")
    g.add_argument("--tempcache", dest="tempcache", action="store_true", default=None,
                   help="turn TempCache on whatever the preset says")
    g.add_argument("--no-tempcache", dest="tempcache", action="store_false",
                   help="turn the preset's TempCache off (keep a dense cache)")
    g.add_argument("--threshold", type=float, help="TempCache merge threshold (cosine, (0, 1])")
    g.add_argument("--capacity", type=int, help="TempCache capacity in frames (sink included)")
    g.add_argument("--annca", dest="annca", action="store_true", default=None, help="turn AnnCA on")
    g.add_argument("--no-annca", dest="annca", action="store_false", help="turn AnnCA off")
    g.add_argument("--annca-prune", dest="annca_prune", action="store_true", default=None,
                   help="AnnCA also drops prompt tokens no query of a frame hashes near (implies --annca)")
    g.add_argument("--annsa", dest="annsa", action="store_true", default=None, help="turn AnnSA on")
    g.add_argument("--no-annsa", dest="annsa", action="store_false", help="turn AnnSA off")
    g.add_argument("--bits", type=int, help="LSH bits per table")
    g.add_argument("--tables", type=int, help="LSH tables")
    g.add_argument("--warmup", type=float, help="dense share of denoising steps for AnnSA")
    g.add_argument("--layers", help="AnnSA layers: all, auto, or e.g. 2,3,5")
    g.add_argument("--calibration", help="calibration JSON for --layers auto")
    g.add_argument("--annsa-min-keys", type=int, help="AnnSA runs only where a head has this many bucketed keys")
    g.add_argument("--backend", choices=list(BACKENDS), help="attention backend")
    g.add_argument("--no-verify-kernels", dest="verify_kernels", action="store_false", default=None,
                   help="skip the first-use check of accelerated kernels against torch (benchmarks)")
    g.add_argument("--measure", action="store_true", help="report attention density and recall per chunk")


def settings_from_arguments(args, num_layers: int | None = None) -> EngineSettings:
    return resolve_settings(
        preset=args.fastar, cache_policy=args.cache, tempcache=args.tempcache, sink_frames=args.sink,
        window_frames=args.window, num_layers=num_layers,
        tempcache_overrides={"threshold": args.threshold, "capacity_frames": args.capacity},
        attention_overrides={"annsa": args.annsa, "annca": args.annca, "annca_prune": args.annca_prune,
                             "bits": args.bits, "tables": args.tables, "dense_warmup": args.warmup,
                             "layers": parse_layers(args.layers), "calibration": args.calibration,
                             "backend": args.backend, "annsa_min_keys": args.annsa_min_keys,
                             "verify_kernels": args.verify_kernels},
    )
