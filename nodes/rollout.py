"""One AR rollout as both samplers run it: settings -> engine sampler, with progress, previews and interrupts.

Everything here works in the model's latent space (ComfyUI's ``latent_format.process_in`` space); the callers
convert at the edges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..fastar_core.engine import EngineSettings, build_sampler
from ..fastar_core.errors import FastARError, GenerationCancelled
from ..fastar_core.sampler import RolloutConfig, RolloutResult, plan_rollout
from ..fastar_core.sampler import resolve_mode as engine_resolve_mode
from ..fastar_core.schedule import get_schedule
from ..fastar_core.video_geometry import pixel_size
from .model_access import ARModel
from .prompting import ARPromptSchedule
from .report import build_report

log = logging.getLogger("FAST-AR")


@dataclass
class RolloutSettings:
    frames_per_block: int = 3
    schedule: object = "self-forcing"  # engine preset name, or sigmas (ComfyUI SIGMAS accepted)
    mode: str = "auto"  # auto: rolling for the Rolling Forcing schedule, chunk otherwise
    seed: int = 0
    cache_policy: str = "auto"  # auto: tempcache when the FAST-AR patch turns TempCache on, else global
    sink_frames: int = 3
    window_frames: int = 12  # frames a chunk attends to, sink and chunk included (window and recompute caches)
    context_noise: float = 0.0
    first_chunk_schedule: object = None  # the first chunk's own step list (preset name or sigmas); None: preset's


@dataclass
class RolloutOutcome:
    latent: torch.Tensor  # model space, [B, 16, T, h, w], start-image frames included
    result: RolloutResult
    report: str


def resolve_settings_for(model: ARModel, settings: RolloutSettings) -> EngineSettings:
    """The FAST-AR patch on the MODEL and the sampler's cache inputs, resolved by the engine in one place."""
    return model.fastar.resolve(cache_policy=settings.cache_policy, sink_frames=settings.sink_frames,
                                window_frames=settings.window_frames, num_layers=len(model.diffusion_model.blocks))


def resolve_mode(settings: RolloutSettings, schedule_name: str) -> str:
    return engine_resolve_mode(settings.mode, schedule_name)  # the engine decides "auto", as for the CLI


def initial_latents(model: ARModel, schedule: ARPromptSchedule, latent_h: int, latent_w: int):
    raw = schedule.initial_latent
    if raw is None:
        return None
    if raw.ndim == 4:  # [B, C, h, w]: one frame
        raw = raw[:, :, None]
    if raw.ndim != 5 or raw.shape[1] != 16:
        raise FastARError(f"the start image latent has shape {list(raw.shape)}; expected [batch, 16, frames, h, w] "
                          "from a Wan2.1 VAE")
    if tuple(raw.shape[3:]) != (latent_h, latent_w):
        raise FastARError(f"the start image was encoded at {pixel_size(raw.shape[4])}x{pixel_size(raw.shape[3])} but "
                          f"the sampler makes {pixel_size(latent_w)}x{pixel_size(latent_h)}: give 'AR Image to Video' "
                          "the same width and height")
    return model.latent_format.process_in(raw.float())


def run_rollout(model: ARModel, schedule: ARPromptSchedule, total_frames: int, latent_h: int, latent_w: int,
                settings: RolloutSettings, host, start_noise: torch.Tensor | None = None,
                notes=()) -> RolloutOutcome:
    sched = get_schedule(settings.schedule)
    mode = resolve_mode(settings, sched.name)
    init = initial_latents(model, schedule, latent_h, latent_w)
    n_init = 0 if init is None else init.shape[2]
    generated = total_frames - n_init
    if generated < 1:
        raise FastARError(f"the video has {total_frames} latent frames and the start image fills {n_init}; "
                          "raise 'length' so that at least one frame is generated")
    prompts = schedule.to_engine()
    batch = prompts.segments[0].context.shape[0]
    if init is not None and init.shape[0] != batch:
        init = init[:1].expand(batch, -1, -1, -1, -1)

    engine = resolve_settings_for(model, settings)
    runner = model.runner()
    sampler = build_sampler(runner, engine.fastar)
    cfg = RolloutConfig(num_frames=generated, latent_height=latent_h, latent_width=latent_w,
                        frames_per_block=settings.frames_per_block, schedule=sched, seed=settings.seed,
                        cache=engine.cache, context_noise=settings.context_noise, mode=mode, batch=batch, channels=16,
                        first_chunk_schedule=settings.first_chunk_schedule)

    plan = plan_rollout(cfg, sched, n_init)
    n_chunks = len(plan.chunks)
    bar = host.progress(plan.total_forwards)
    preview = host.previewer(model.patcher)
    done = [0]

    def on_step(steps_done, steps_total):
        done[0] = steps_done
        bar.update_absolute(steps_done, steps_total)

    def on_chunk(report):
        nonlocal preview
        x0 = report.x0
        if preview is None:
            return
        try:
            image = preview(x0[:, :, -1:])  # the chunk's newest frame
        except Exception:  # a preview must never end a long run
            preview, image = None, None
        bar.update_absolute(done[0], None, image)

    log.info("FAST-AR: sampling %d latent frames in %d chunks, cache %s", generated, n_chunks,
             engine.cache.describe())
    try:
        result = sampler.generate(prompts, cfg, initial_latents=init, callback=on_chunk, cancel=host.interrupted,
                                  step_callback=on_step, output_device=host.intermediate_device(),
                                  initial_noise=start_noise)
    except GenerationCancelled:
        host.raise_interrupted()
        raise
    finally:
        host.soft_empty_cache()

    sigmas = ", ".join(f"{s:.4g}" for s in sched.sigmas)
    report = build_report(model=model, result=result, settings=settings, engine=engine, mode=mode,
                          n_init=n_init, width=pixel_size(latent_w), height=pixel_size(latent_h),
                          schedule_text=f"{sched.name} ({sched.num_steps} steps: {sigmas})",
                          prompts=schedule.describe(), notes=[*schedule.notes, *notes])
    return RolloutOutcome(result.latent, result, report)
