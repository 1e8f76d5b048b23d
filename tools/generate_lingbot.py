"""``fastar generate`` on a LingBot-World 2.0 model folder: a rollout steered by a camera path or a key timeline.

The camera is ``--camera FOLDER`` (the release's format: ``poses.npy`` and ``intrinsics.npy``, one pose per video
frame, cut at the video's end) or ``--actions FILE`` (a key timeline of variant ``lingbot``, turned into poses by the
motion model of ``fastar_core/rollout/camera_motion.py``). The prompt is ``--cond`` (UMT5 features ``[1, L, 4096]``)
or a seeded stand-in; the start image's VAE latent is a seeded stand-in (the command line loads no VAE), so the run
measures and checks the rollout, its cache and its camera, not a picture. Left to their defaults, the chunk, the
schedule and the cache are the release's own (``generate.py`` as ``run_fast.sh`` runs it: chunks of 4, 4 steps at
shift 10, a window of 18 latent frames with a 6-frame sink); ``--frames-per-block`` / ``--schedule`` / ``--cache`` /
``--fastar`` override, and TempCache left without ``--capacity`` / ``--sink`` holds what that window caches (14
frames' worth, sink 6).
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.families.lingbot.camera import check_path
from ..fastar_core.families.lingbot.checkpoint import build_lingbot, load_lingbot_checkpoint
from ..fastar_core.families.lingbot.rollout import FRAMES_PER_BLOCK, SCHEDULE, default_cache, lingbot_conditioning
from ..fastar_core.forward.runner import CausalRunner
from ..fastar_core.rollout.actions import pixel_frames
from ..fastar_core.rollout.sampler import RolloutConfig
from . import checks
from .outputs import LATENT_FILE, STATS_FILE, write_run

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def camera_of(args, inputs, frames: int, height: int, width: int):
    """(the rollout's CameraConditioning, what it came from for stats.json)."""
    if inputs.camera is not None:
        return inputs.camera.condition(frames, height, width), {"camera": str(args.camera),
                                                                "poses": inputs.camera.num_frames}
    script = inputs.actions
    if script is None:
        raise FastARError(f"{args.checkpoint} is LingBot-World 2.0, steered by a camera path: give --camera FOLDER "
                          "(poses.npy, intrinsics.npy) or --actions FILE (a key timeline: the lines 'variant "
                          "lingbot' and '0 W')")
    if script.variant != "lingbot":
        raise FastARError(f"--actions {args.actions} is for Matrix-Game 2.0 {script.variant}; LingBot-World 2.0 "
                          "takes a key timeline of variant lingbot (W A S D move, I J K L or the arrows look)")
    video = pixel_frames(frames)
    path = check_path(script.to_poses(video), script.intrinsics(), f"--actions {args.actions}")
    unused = script.unused(video)
    if unused:
        print(f"note: {len(unused)} timeline entr{'y' if len(unused) == 1 else 'ies'} from {unused[0].at:g} s on "
              f"come after the video's {video} frames and are not used")
    return (path.condition(frames, height, width, scale=script.camera_scale()),
            {"actions": script.to_dict(), "actions_summary": script.describe(video)})


def run_lingbot(args, inputs, device, parallel) -> int:
    from ..fastar_core.rollout.engine import build_sampler
    from .args import settings_from_arguments

    if parallel is not None:
        raise FastARError("a LingBot-World 2.0 rollout from the command line runs on one device; start it without "
                          "torchrun")
    if args.lora or args.weights_entry != "auto":
        flag = "--lora" if args.lora else f"--weights-entry {args.weights_entry}"
        raise FastARError(f"{flag} is for the Wan2.1 text families' single-file checkpoints; drop it")
    ckpt = load_lingbot_checkpoint(args.checkpoint, dtype=DTYPES.get(args.dtype))
    cfg = ckpt.config
    if inputs.context is not None and inputs.context.shape[-1] != cfg.text_dim:
        raise FastARError(f"--cond {args.cond}: conditioning has width {inputs.context.shape[-1]}; this model takes "
                          f"{cfg.text_dim} (UMT5 features [1, tokens, {cfg.text_dim}])")
    checks.fill_model_size(args, cfg)
    if not args.frames_per_block_given:
        args.frames_per_block = FRAMES_PER_BLOCK
    if not args.schedule_given:
        args.schedule = SCHEDULE
    own_cache = args.cache == "auto" and not checks.uses_tempcache(args) and args.window is None and args.sink is None
    release = default_cache(cfg)
    # Sizes left out are the release's: its sink, its window, and TempCache holding what the window caches.
    if args.sink is None:
        args.sink = release.sink_frames
    if args.window is None and args.cache == "window":
        args.window = release.window_frames
    if args.capacity is None and checks.uses_tempcache(args):
        args.capacity = release.window_frames - args.frames_per_block
    settings = settings_from_arguments(args, num_layers=cfg.num_layers)
    spec, fastar = (release if own_cache else settings.cache), settings.fastar
    latent_h, latent_w = args.height // cfg.vae_spatial_stride, args.width // cfg.vae_spatial_stride
    rollout = RolloutConfig(num_frames=args.frames, latent_height=latent_h, latent_width=latent_w,
                            frames_per_block=args.frames_per_block, schedule=args.schedule, seed=args.seed,
                            cache=spec, mode=args.mode, channels=cfg.out_dim)
    rollout.validate()
    checks.check_rollout_memory(args, cfg, device, checks.planned_cache_bytes(spec, cfg, args, ckpt.dtype))
    camera, steering = camera_of(args, inputs, args.frames, args.height, args.width)
    g = torch.Generator().manual_seed(args.seed)
    image = torch.randn(1, 16, args.frames, latent_h, latent_w, generator=g)
    prompt = inputs.context if inputs.context is not None else checks.random_conditioning(cfg.text_dim, args.seed)
    print("LingBot-World 2.0: the start image's latent is a seeded random stand-in"
          + ("" if inputs.context is not None else ", and so is the prompt (give --cond for UMT5 features)"))
    model = build_lingbot(ckpt, device=device)
    sampler = build_sampler(CausalRunner(model), fastar, measure=args.measure)

    def progress(report):
        print(f"chunk {report.index:4d}  frames {report.frame_start:5d}+{report.frames}  "
              f"{report.seconds * 1000:8.1f} ms  cache {report.cache_bytes / 2**20:9.2f} MiB", flush=True)

    start = time.perf_counter()
    result = sampler.generate(lingbot_conditioning(prompt, image, camera), rollout, callback=progress)
    options = {k: v for k, v in vars(args).items() if k not in ("argv", "command")}
    stats = {
        "command": ["fastar", *getattr(args, "argv", sys.argv[1:])],
        "seed": args.seed,
        "options": options,
        "checkpoint": str(args.checkpoint),
        "family": "LingBot-World 2.0",
        "size": cfg.size,
        "model_dtype": str(ckpt.dtype).replace("torch.", ""),
        "device": str(device),
        "frames": args.frames,
        "latent_shape": list(result.latent.shape),
        "conditioning": "seeded random stand-in for the start image latent"
                        + ("" if inputs.context is not None else " and the prompt"),
        **steering,
        "cache": spec.to_dict(),
        "cache_is_the_releases_own": own_cache,
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
