"""``fastar generate``: a long latent video from a checkpoint, with per-chunk figures in stats.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..fastar_core.checkpoint import load_wan_model
from ..fastar_core.errors import FastARError
from ..fastar_core.runner import CausalRunner
from ..fastar_core.sampler import RolloutConfig
from ..fastar_core.video_geometry import check_pixel_size


def load_conditioning(path, text_dim: int) -> torch.Tensor:
    """A conditioning tensor ``[1, L, text_dim]`` from a safetensors file (key ``context`` or its only tensor)."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if "context" in tensors:
        ctx = tensors["context"]
    elif len(tensors) == 1:
        ctx = next(iter(tensors.values()))
    else:
        raise FastARError(f"{path}: holds {sorted(tensors)}; expected one tensor or one named 'context'")
    if ctx.ndim == 2:
        ctx = ctx[None]
    if ctx.ndim != 3 or ctx.shape[-1] != text_dim:
        raise FastARError(f"{path}: conditioning has shape {list(ctx.shape)}; expected [1, tokens, {text_dim}]")
    return ctx.float()


def random_conditioning(text_dim: int, seed: int, tokens: int = 512, used: int = 24) -> torch.Tensor:
    """UMT5-shaped stand-in: ``used`` random token rows, the rest zero-padded like a real prompt."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.zeros(1, tokens, text_dim)
    ctx[:, :used] = torch.randn(1, used, text_dim, generator=g) * 0.2
    return ctx


def pick_device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_generate(args) -> int:
    from ..fastar_core.engine import build_sampler
    from .args import settings_from_arguments

    device = pick_device(args.device)
    model, ckpt = load_wan_model(args.checkpoint, dtype=args.dtype, device=device, lora=args.lora)
    cfg = ckpt.config
    latent_h, latent_w = check_pixel_size("--height", args.height), check_pixel_size("--width", args.width)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cond:
        ctx, cond_note = load_conditioning(args.cond, cfg.text_dim), f"from {args.cond}"
    else:
        ctx, cond_note = random_conditioning(cfg.text_dim, args.seed), "seeded random stand-in (no --cond given)"
        print(f"no --cond given: using a {cond_note}")
    settings = settings_from_arguments(args, num_layers=cfg.num_layers)
    spec, fastar = settings.cache, settings.fastar
    rollout = RolloutConfig(num_frames=args.frames, latent_height=latent_h, latent_width=latent_w,
                            frames_per_block=args.frames_per_block, schedule=args.schedule, seed=args.seed,
                            cache=spec, mode=args.mode, channels=cfg.in_dim)
    runner = CausalRunner(model)
    sampler = build_sampler(runner, fastar, measure=args.measure)

    def progress(report):
        print(f"chunk {report.index:4d}  frames {report.frame_start:5d}+{report.frames}  "
              f"{report.seconds * 1000:8.1f} ms  cache {report.cache_bytes / 2**20:9.2f} MiB", flush=True)

    start = time.perf_counter()
    result = sampler.generate(ctx, rollout, callback=progress)
    from safetensors.torch import save_file

    save_file({"latent": result.latent.cpu().contiguous()}, str(out / "latent.safetensors"))
    stats = {
        "checkpoint": str(args.checkpoint),
        "family": cfg.family,
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
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    print(f"wrote {out / 'latent.safetensors'} and {out / 'stats.json'}")
    return 0
