"""``fastar generate`` on a Matrix-Game 2.0 checkpoint: a world rollout steered by an action script.

The checkpoint and its ``config.json`` say the variant; the script (``--actions``) must be for it. Without a VAE
or CLIP model on the command line, the start image's latent and CLIP features are seeded random stand-ins (as
the text conditioning is for Wan2.1 without ``--cond``): the run measures and checks the rollout, its cache and
its actions, not a picture. Left to their defaults, the schedule and the cache are the variant's own (3 or 4
steps; a window of ``local_attn_size`` frames, no sink); ``--cache`` / ``--fastar`` / ``--schedule`` override.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.matrix_game.checkpoint import build_matrix_game, load_matrix_game_checkpoint
from ..fastar_core.families.matrix_game.config import CLIP_TOKENS
from ..fastar_core.families.matrix_game.rollout import default_cache, matrix_game_conditioning
from ..fastar_core.forward.runner import CausalRunner
from ..fastar_core.rollout.actions import Actions, pixel_frames
from ..fastar_core.rollout.sampler import RolloutConfig
from . import checks
from .outputs import LATENT_FILE, STATS_FILE, write_run

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WORLD_SIZE = (352, 640)  # height, width: Matrix-Game 2.0's own


def refuse_text_options(args) -> None:
    if args.cond:
        raise FastARError(f"--cond {args.cond}: a Matrix-Game 2.0 checkpoint takes no text; its context is the "
                          "start image's CLIP features (seeded stand-ins here); drop --cond")
    if args.lora:
        raise FastARError(f"--lora {args.lora}: LoRAs are for the Wan2.1 text families; drop --lora")
    if args.weights_entry != "auto":
        raise FastARError(f"--weights-entry {args.weights_entry}: a Matrix-Game 2.0 checkpoint holds one set of "
                          "weights; drop --weights-entry")


def stand_in_start(frames: int, latent_h: int, latent_w: int, clip_dim: int, seed: int):
    """Seeded stand-ins for the start image's VAE latent (every frame) and its CLIP-vision tokens."""
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(1, 16, frames, latent_h, latent_w, generator=g)
    clip = torch.randn(1, CLIP_TOKENS, clip_dim, generator=g)
    return image, clip


def run_world(args, inputs, device, parallel) -> int:
    from ..fastar_core.rollout.engine import build_sampler
    from .args import settings_from_arguments

    if parallel is not None:
        raise FastARError("a Matrix-Game 2.0 rollout runs on one device; start it without torchrun")
    refuse_text_options(args)
    if inputs.camera is not None:
        raise FastARError(f"--camera {args.camera}: a Matrix-Game 2.0 checkpoint is steered by keys and mouse "
                          "(--actions), not a camera path; drop --camera")
    ckpt = load_matrix_game_checkpoint(args.checkpoint, dtype=DTYPES.get(args.dtype))
    cfg = ckpt.config
    if inputs.actions is None:
        keys = "keyboard and mouse" if cfg.action.enable_mouse else "keyboard"
        raise FastARError(f"{args.checkpoint} is Matrix-Game 2.0 {cfg.variant}, steered by {keys} actions: give "
                          f"--actions FILE (an action script, e.g. the lines 'variant {cfg.variant}' and '0 W')")
    script = inputs.actions
    if script.variant != cfg.variant:
        raise FastARError(f"--actions {args.actions} is for {script.variant}, but {args.checkpoint} is Matrix-Game "
                          f"2.0 {cfg.variant}; write the script for {cfg.variant} (its keys differ)")
    args.height = WORLD_SIZE[0] if args.height is None else args.height
    args.width = WORLD_SIZE[1] if args.width is None else args.width
    checks.fill_model_size(args, cfg)
    if not args.schedule_given:
        args.schedule = cfg.schedule_name
    settings = settings_from_arguments(args, num_layers=cfg.num_layers)
    spec, fastar = settings.cache, settings.fastar
    own_cache = args.cache == "auto" and not checks.uses_tempcache(args) and args.window is None and args.sink is None
    if own_cache:
        spec = default_cache(cfg)
    stride = cfg.vae_spatial_stride
    latent_h, latent_w = args.height // stride, args.width // stride
    rollout = RolloutConfig(num_frames=args.frames, latent_height=latent_h, latent_width=latent_w,
                            frames_per_block=args.frames_per_block, schedule=args.schedule, seed=args.seed,
                            cache=spec, mode=args.mode, channels=cfg.out_dim)
    rollout.validate()
    checks.check_rollout_memory(args, cfg, device, checks.planned_cache_bytes(spec, cfg, args, ckpt.dtype))
    n_pixel = pixel_frames(args.frames)
    keyboard, mouse = script.to_tensors(n_pixel)
    unused = script.unused(n_pixel)
    if unused:
        one = len(unused) == 1
        print(f"note: {len(unused)} action entr{'y' if one else 'ies'} from {unused[0].at:g} s on "
              f"{'comes' if one else 'come'} after the video's {n_pixel} frames and {'is' if one else 'are'} not used")
    image, clip = stand_in_start(args.frames, latent_h, latent_w, cfg.clip_dim, args.seed)
    print("Matrix-Game 2.0: the start image's latent and CLIP features are seeded random stand-ins")
    cond = matrix_game_conditioning(image, clip, Actions(keyboard, mouse))
    model = build_matrix_game(ckpt, device=device)
    sampler = build_sampler(CausalRunner(model), fastar, measure=args.measure)

    def progress(report):
        print(f"chunk {report.index:4d}  frames {report.frame_start:5d}+{report.frames}  "
              f"{report.seconds * 1000:8.1f} ms  cache {report.cache_bytes / 2**20:9.2f} MiB", flush=True)

    start = time.perf_counter()
    result = sampler.generate(cond, rollout, callback=progress)
    options = {k: v for k, v in vars(args).items() if k not in ("argv", "command")}
    stats = {
        "command": ["fastar", *getattr(args, "argv", sys.argv[1:])],
        "seed": args.seed,
        "options": options,
        "checkpoint": str(args.checkpoint),
        "family": "Matrix-Game 2.0",
        "variant": cfg.variant,
        "model_dtype": str(ckpt.dtype).replace("torch.", ""),
        "device": str(device),
        "frames": args.frames,
        "latent_shape": list(result.latent.shape),
        "conditioning": "seeded random stand-ins for the start image latent and CLIP features",
        "actions": script.to_dict(),
        "actions_summary": script.describe(n_pixel),
        "cache": spec.to_dict(),
        "cache_is_the_variants_own": own_cache,
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
