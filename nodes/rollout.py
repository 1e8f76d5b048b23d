"""A sampler's request run: the engine's sampler, with progress, previews and interrupts, and the report.

Everything here works in the model's latent space (ComfyUI's ``latent_format.process_in`` space); the callers
convert at the edges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..fastar_core.errors import GenerationCancelled
from ..fastar_core.rollout.engine import build_sampler
from ..fastar_core.rollout.sampler import RolloutResult
from .family_inputs import item_of
from .report import build_report
from .request import RolloutRequest

log = logging.getLogger("FAST-AR")


@dataclass
class RolloutOutcome:
    latent: torch.Tensor  # model space, [B, C, T, h, w] (C 16 or 48), start-image frames included
    result: RolloutResult
    report: str


def run_rollout(request: RolloutRequest, host, listener=None) -> RolloutOutcome:
    """The request's videos, one after another, with the host's progress bar, previews and interrupts;
    ``listener(report)`` after each chunk (a live play's view)."""
    model, cfg, engine, settings, sched = (request.model, request.config, request.engine, request.settings,
                                           request.schedule)
    batch, items, start_noise = request.batch, request.items, request.start_noise
    runner = model.runner()
    sampler = build_sampler(runner, engine.fastar, rope_max_distance=model.family.rope_max_distance)
    plan = request.plan()
    n_chunks = len(plan.chunks)
    per_video = plan.total_forwards
    bar = host.progress(per_video * batch)
    preview = host.previewer(model.patcher)
    done = [0]
    offset = [0]

    def on_step(steps_done, steps_total):
        done[0] = offset[0] + steps_done
        bar.update_absolute(done[0], per_video * batch)

    def on_chunk(report):
        nonlocal preview
        image = None
        if preview is not None:
            try:
                image = preview(report.x0[:, :, -1:])  # the chunk's newest frame
            except Exception:  # a preview must never end a long run
                preview = None
        if image is not None:
            bar.update_absolute(done[0], None, image)
        if listener is not None:
            listener(report)

    log.info("FAST-AR: sampling %d video(s) of %d latent frames in %d chunks, cache %s", batch, cfg.num_frames,
             n_chunks, engine.cache.describe())
    results = []
    try:
        for r in range(batch):
            offset[0] = r * per_video
            item_cfg = replace(cfg, batch_index=(items[r],))
            results.append(sampler.generate(request.inputs.conditioning(model, r), item_cfg,
                                            initial_latents=request.inputs.initial_latents(model, r),
                                            callback=on_chunk, cancel=host.interrupted, step_callback=on_step,
                                            output_device=host.intermediate_device(),
                                            initial_noise=item_of(start_noise, r), vae=request.vae))
    except GenerationCancelled:
        host.raise_interrupted()
        raise
    finally:
        host.soft_empty_cache()

    result = results[0]
    notes = list(request.notes)
    if runner.pieces.compiled:
        notes.append(f"the blocks run under {runner.pieces.describe()}, as the MODEL's TorchCompileModel asks (the "
                     "first chunks of a new size include compile time)")
    if batch > 1:
        times = ", ".join(f"{r.seconds:.2f} s" for r in results)
        notes.append(f"batch of {batch} videos, made one after another (video i is batch item i of seed "
                     f"{settings.seed}; the table shows the first): {times}")
    sigmas = ", ".join(f"{s:.4g}" for s in sched.sigmas)
    report = build_report(model=model, result=result, settings=settings, engine=engine, mode=cfg.sampler_mode,
                          n_init=request.start_frames, width=model.geometry.pixels(cfg.latent_width),
                          height=model.geometry.pixels(cfg.latent_height),
                          schedule_text=f"{sched.name} ({sched.num_steps} steps: {sigmas})",
                          prompts=request.inputs.describe(), notes=notes)
    latent = torch.cat([r.latent for r in results]) if batch > 1 else result.latent
    return RolloutOutcome(latent, result, report)
