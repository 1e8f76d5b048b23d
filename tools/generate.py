"""``fastar generate``: a long latent video from a checkpoint, with per-chunk figures in stats.json.

Order: every option is checked first (``checks.py``), then the checkpoint is read and checked, then the rollout's
memory is checked against the device, and only after the rollout succeeds is the output folder created, its two
files written as one unit (``outputs.py``). stats.json records the seed, every option and the command line,
enough to rerun the same video.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import torch

from ..fastar_core.caches.base import CacheShape
from ..fastar_core.caches.spec import CacheSpec
from ..fastar_core.checkpoint import build_model, load_checkpoint
from ..fastar_core.runner import CausalRunner
from ..fastar_core.sampler import RolloutConfig
from . import checks
from .outputs import LATENT_FILE, STATS_FILE, write_run


def random_conditioning(text_dim: int, seed: int, tokens: int = 512, used: int = 24) -> torch.Tensor:
    """UMT5-shaped stand-in: ``used`` random token rows, the rest zero-padded like a real prompt."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.zeros(1, tokens, text_dim)
    ctx[:, :used] = torch.randn(1, used, text_dim, generator=g) * 0.2
    return ctx


def pick_device(name: str | None) -> torch.device:
    return checks.parse_device(name)


def planned_cache_bytes(spec: CacheSpec, cfg, args, dtype: torch.dtype) -> int:
    """Bytes the rollout's cache will allocate, as its policy counts them."""
    _, ph, pw = cfg.patch_size
    shape = CacheShape(num_layers=cfg.num_layers, batch=1, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                       grid_hw=(args.height // 8 // ph, args.width // 8 // pw), dtype=dtype,
                       frames_per_block=args.frames_per_block)
    return spec.policy_class.planned_bytes(spec, shape, args.frames)


def run_generate(args) -> int:
    from ..fastar_core.engine import build_sampler
    from .args import settings_from_arguments

    inputs = checks.check_generate(args)
    device = inputs.device
    ckpt = load_checkpoint(args.checkpoint, dtype=args.dtype, lora=args.lora)
    cfg = ckpt.config
    checks.check_against_model(args, inputs, cfg)
    settings = settings_from_arguments(args, num_layers=cfg.num_layers)
    spec, fastar = settings.cache, settings.fastar
    rollout = RolloutConfig(num_frames=args.frames, latent_height=args.height // 8, latent_width=args.width // 8,
                            frames_per_block=args.frames_per_block, schedule=args.schedule, seed=args.seed,
                            cache=spec, mode=args.mode, channels=cfg.in_dim,
                            first_chunk_schedule=getattr(args, "first_schedule", None))
    rollout.validate()
    checks.check_rollout_memory(args, cfg, device, planned_cache_bytes(spec, cfg, args, ckpt.dtype))
    if ckpt.mixed_dtypes:
        print(f"note: the file mixes dtypes {ckpt.file_dtypes}; all weights run as {ckpt.summary()['dtype']}")
    model = build_model(ckpt, device=device)
    if inputs.context is not None:
        ctx, cond_note = inputs.context, f"from {args.cond}"
    else:
        ctx, cond_note = random_conditioning(cfg.text_dim, args.seed), "seeded random stand-in (no --cond given)"
        print(f"no --cond given: using a {cond_note}")
    runner = CausalRunner(model)
    sampler = build_sampler(runner, fastar, measure=args.measure)

    def progress(report):
        print(f"chunk {report.index:4d}  frames {report.frame_start:5d}+{report.frames}  "
              f"{report.seconds * 1000:8.1f} ms  cache {report.cache_bytes / 2**20:9.2f} MiB", flush=True)

    start = time.perf_counter()
    result = sampler.generate(ctx, rollout, callback=progress)
    options = {k: v for k, v in vars(args).items() if k not in ("argv", "command")}
    stats = {
        "command": ["fastar", *getattr(args, "argv", sys.argv[1:])],
        "seed": args.seed,
        "options": options,
        "checkpoint": str(args.checkpoint),
        "family": cfg.family,
        "model_dtype": str(model.dtype).replace("torch.", ""),
        "device": str(device),
        "frames": args.frames,
        "latent_shape": list(result.latent.shape),
        "conditioning": cond_note,
        "cache": spec.to_dict(),
        "fastar": fastar.to_dict(),
        "schedule": result.schedule.to_dict(),
        "seconds_total": round(time.perf_counter() - start, 4),
        "chunks": [c.to_dict() for c in result.chunks],
        "cache_stats": result.cache_stats,
    }
    out = Path(args.out)
    write_run(out, result.latent, stats, run_id=uuid.uuid4().hex)
    print(f"wrote {out / LATENT_FILE} and {out / STATS_FILE}")
    return 0
