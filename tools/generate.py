"""``fastar generate``: a long latent video from a checkpoint, with per-chunk figures in stats.json.

Order: every option is checked first (``checks.py``), then the output folder is locked for this run (a second run
into it is refused), the checkpoint is read and checked, the rollout's memory is checked against the device, and
only after the rollout succeeds are its two files written as one unit (``outputs.py``); a run that fails removes
the folder again if it created it. stats.json records the seed, every option and the command line,
enough to rerun the same video.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import torch

from ..fastar_core.errors import CheckpointError, FastARError
from ..fastar_core.files.wan_checkpoint import build_model, load_checkpoint
from ..fastar_core.forward.parallel import (
    check_settings,
    collective_failure,
    init_from_launcher,
    leave_group,
    local_device,
)
from ..fastar_core.forward.runner import CausalRunner
from ..fastar_core.rollout.sampler import RolloutConfig
from ..fastar_core.rollout.vae import CAUSVID_RESTART
from . import checks
from .outputs import LATENT_FILE, STATS_FILE, run_lock, write_run


def pick_device(name: str | None) -> torch.device:
    return checks.parse_device(name)


def run_generate(args) -> int:
    inputs = checks.check_generate(args)
    device = local_device(inputs.device)
    parallel = init_from_launcher(device)  # under torchrun: this rank's share of a sequence-parallel rollout
    try:
        if parallel is None or parallel.rank == 0:  # the rank that writes holds the folder
            with run_lock(Path(args.out)):
                return _run(args, inputs, device, parallel)
        return _run(args, inputs, device, parallel)
    finally:
        if parallel is not None:
            leave_group()


def _run(args, inputs, device, parallel) -> int:
    from ..fastar_core.files.model_files import is_lingbot, is_matrix_game_file
    from ..fastar_core.rollout.engine import build_sampler
    from .args import settings_from_arguments

    if is_lingbot(args.checkpoint):
        from .generate_lingbot import run_lingbot

        return run_lingbot(args, inputs, device, parallel)
    if is_matrix_game_file(args.checkpoint):
        from .generate_world import run_world

        return run_world(args, inputs, device, parallel)
    is_main = parallel is None or parallel.rank == 0
    try:
        ckpt = load_checkpoint(args.checkpoint, dtype=args.dtype, lora=args.lora, weights_entry=args.weights_entry)
    except CheckpointError as e:
        if args.lora and e.path == str(Path(args.lora)):  # the LoRA's fault: said with its option
            raise FastARError(f"--lora {e}") from None
        raise
    cfg = ckpt.config
    checks.fill_model_size(args, cfg)
    checks.check_against_model(args, inputs, cfg)
    settings = settings_from_arguments(args, num_layers=cfg.num_layers)
    spec, fastar = settings.cache, settings.fastar
    stride = cfg.vae_spatial_stride  # pixels per latent row: 8 for Wan2.1's VAE, 16 for Wan2.2's
    rollout = RolloutConfig(num_frames=args.frames, latent_height=args.height // stride,
                            latent_width=args.width // stride,
                            frames_per_block=args.frames_per_block, schedule=args.schedule, seed=args.seed,
                            cache=spec, mode=args.mode, channels=cfg.in_dim,
                            first_chunk_schedule=getattr(args, "first_schedule", None))
    rollout.validate()
    needs_vae = rollout.vae_needed()
    if needs_vae is not None:  # the command line loads no VAE (it writes latents)
        raise FastARError(f"--cache recompute --sink 0: {needs_vae}, and the command line loads no VAE: use --sink 1 "
                          "(keep_first_frame on), or the Long Video Sampler node with its 'vae' input")
    if parallel is not None:
        _, ph, pw = cfg.patch_size
        parallel.check_geometry(cfg.num_heads, (args.height // stride // ph) * (args.width // stride // pw))
        check_settings(spec, fastar)
    if is_main and args.schedule == "causvid" and args.frames > CAUSVID_RESTART.every:
        print(f"note: CausVid's own long video restarts every {CAUSVID_RESTART.every} latent frames from VAE "
              "re-encoded frames; the command line loads no VAE, so this rollout keeps one cache past them (the Long "
              f"Video Sampler node with a VAE and restart_every {CAUSVID_RESTART.every} runs CausVid's restarts)")
    checks.check_rollout_memory(args, cfg, device, checks.planned_cache_bytes(spec, cfg, args, ckpt.dtype))
    if ckpt.mixed_dtypes:
        print(f"note: the file mixes dtypes {ckpt.file_dtypes}; all weights run as {ckpt.summary()['dtype']}")
    model = build_model(ckpt, device=device)
    if inputs.context is not None:
        ctx, cond_note = inputs.context, f"from {args.cond}"
    else:
        ctx, cond_note = checks.random_conditioning(cfg.text_dim, args.seed), "seeded random stand-in (no --cond given)"
        if is_main:
            print("no --cond given: using a seeded random stand-in for the text conditioning")
    runner = CausalRunner(model, parallel=parallel)
    sampler = build_sampler(runner, fastar, measure=args.measure)
    traffic: list[dict] = []

    def progress(report):
        if parallel is not None:
            traffic.append(parallel.traffic.take())
        if not is_main:
            return
        print(f"chunk {report.index:4d}  frames {report.frame_start:5d}+{report.frames}  "
              f"{report.seconds * 1000:8.1f} ms  cache {report.cache_bytes / 2**20:9.2f} MiB", flush=True)

    start = time.perf_counter()
    try:
        result = sampler.generate(ctx, rollout, callback=progress)
    except RuntimeError as e:
        if parallel is None:
            raise
        # A collective failed: a peer rank stopped (killed, interrupted, out of memory) or timed out.
        raise FastARError(f"rank {parallel.rank} of {parallel.world}: the sequence-parallel rollout stopped because "
                          f"another rank did ({collective_failure(e)}); every rank ends, nothing was written") from None
    if not is_main:
        return 0
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
        "chunks": [c.to_dict() | t for c, t in zip(result.chunks, traffic)] if traffic else
                  [c.to_dict() for c in result.chunks],
        "cache_stats": result.cache_stats,
    }
    if parallel is not None:  # cache_bytes and sent_bytes are per rank; every rank holds the same share
        stats["sequence_parallel"] = {"ranks": parallel.world, "heads_per_rank": runner.local_heads}
    out = Path(args.out)
    write_run(out, result.latent, stats, run_id=uuid.uuid4().hex)
    print(f"wrote {out / LATENT_FILE} and {out / STATS_FILE}")
    return 0
