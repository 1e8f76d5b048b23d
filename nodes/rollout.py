"""One AR rollout as both samplers run it: settings -> engine sampler, with progress, previews and interrupts.

Everything here works in the model's latent space (ComfyUI's ``latent_format.process_in`` space); the callers
convert at the edges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..fastar_core.errors import FastARError, GenerationCancelled
from ..fastar_core.fastar.config import FastARConfig
from ..fastar_core.fastar.session import build_sampler
from ..fastar_core.kv_cache import CacheSpec
from ..fastar_core.sampler import RolloutConfig, RolloutResult, chunk_plan
from ..fastar_core.schedule import get_schedule
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
    window_frames: int = 12
    context_noise: float = 0.0


@dataclass
class RolloutOutcome:
    latent: torch.Tensor  # model space, [B, 16, T, h, w], start-image frames included
    result: RolloutResult
    report: str


def resolve_cache(fastar: FastARConfig, settings: RolloutSettings) -> tuple[FastARConfig, CacheSpec, str]:
    """The sampler's cache policy and the FAST-AR patch agree here: an explicit dense policy wins over the
    patch's TempCache; 'tempcache' needs FAST-AR."""
    policy = settings.cache_policy
    if policy == "auto":
        policy = "tempcache" if fastar.tempcache else "global"
    if policy == "tempcache":
        if not fastar.enabled:
            raise FastARError("cache_policy 'tempcache' needs FAST-AR: pass the model through the 'FAST-AR Attention' "
                              "node with a preset other than 'off' (or choose global, window or rolling)")
        fastar = fastar.with_overrides(tempcache=True, sink_frames=settings.sink_frames)
    elif fastar.tempcache:
        fastar = fastar.with_overrides(tempcache=False)
    spec = CacheSpec(policy=policy, sink_frames=settings.sink_frames, window_frames=settings.window_frames)
    return fastar, spec, policy


def resolve_mode(settings: RolloutSettings, schedule_name: str) -> str:
    if settings.mode != "auto":
        return settings.mode
    return "rolling" if schedule_name == "rolling-forcing" else "chunk"


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
        raise FastARError(f"the start image was encoded at {raw.shape[4] * 8}x{raw.shape[3] * 8} but the sampler "
                          f"makes {latent_w * 8}x{latent_h * 8}: give 'AR Image to Video' the same width and height")
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

    fastar, spec, policy = resolve_cache(model.fastar, settings)
    runner = model.runner()
    sampler = build_sampler(runner, fastar, spec, frames_per_block=settings.frames_per_block)
    cfg = RolloutConfig(num_frames=generated, latent_height=latent_h, latent_width=latent_w,
                        frames_per_block=settings.frames_per_block, schedule=sched, seed=settings.seed, cache=spec,
                        context_noise=settings.context_noise, mode=mode, batch=batch, channels=16)

    n_chunks = len(chunk_plan(n_init, generated, settings.frames_per_block))
    total_steps = n_chunks * (sched.num_steps + 1) if mode == "chunk" else n_chunks + sched.num_steps - 1
    bar = host.progress(total_steps)
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
             describe_policy(policy, spec, fastar))
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
    report = build_report(model=model, result=result, settings=settings, fastar=fastar,
                          tempcache=policy == "tempcache", policy=describe_policy(policy, spec, fastar), mode=mode,
                          n_init=n_init, width=latent_w * 8, height=latent_h * 8,
                          schedule_text=f"{sched.name} ({sched.num_steps} steps: {sigmas})",
                          prompts=schedule.describe(), notes=[*schedule.notes, *notes])
    return RolloutOutcome(result.latent, result, report)


def describe_policy(policy: str, spec: CacheSpec, fastar: FastARConfig) -> str:
    if policy == "window":
        return f"window (sink {spec.sink_frames} + last {spec.window_frames} frames)"
    if policy == "rolling":
        return f"rolling (sink {spec.sink_frames}, capacity {spec.rolling_capacity}, attend {spec.rolling_attend})"
    if policy == "tempcache":
        return f"tempcache (sink {fastar.sink_frames}, capacity {fastar.capacity_frames} frames)"
    return "global (every frame kept)"
