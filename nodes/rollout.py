"""One AR rollout as both samplers run it: settings -> engine sampler, with progress, previews and interrupts.

Everything here works in the model's latent space (ComfyUI's ``latent_format.process_in`` space); the callers
convert at the edges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..fastar_core.caches.spec import SINK_FRAMES, WINDOW_FRAMES
from ..fastar_core.engine import EngineSettings, build_sampler
from ..fastar_core.errors import FastARError, GenerationCancelled
from ..fastar_core.sampler import FRAMES_PER_BLOCK, RolloutConfig, RolloutResult, plan_rollout
from ..fastar_core.sampler import resolve_mode as engine_resolve_mode
from ..fastar_core.schedule import get_schedule
from ..fastar_core.vae import RestartSpec
from ..fastar_core.video_geometry import pixel_size
from .model_access import ARModel
from .prompting import ARPromptSchedule, ScheduledPrompt
from .report import build_report
from .world import WorldInputs

log = logging.getLogger("FAST-AR")


@dataclass
class RolloutSettings:
    frames_per_block: int = FRAMES_PER_BLOCK
    schedule: object = "self-forcing"  # engine preset name, or sigmas (ComfyUI SIGMAS accepted)
    mode: str = "auto"  # auto: rolling for the Rolling Forcing schedule, chunk otherwise
    seed: int = 0
    cache_policy: str = "auto"  # auto: tempcache when the FAST-AR patch turns TempCache on, else global
    sink_frames: int = SINK_FRAMES
    # frames a chunk attends to, sink and chunk included (window and recompute caches)
    window_frames: int = WINDOW_FRAMES
    context_noise: float = 0.0
    first_chunk_schedule: object = None  # the first chunk's own step list (preset name or sigmas); None: preset's
    # CausVid's long video: a fresh rollout every restart_every latent frames (0: never), from restart_overlap
    # clean frames (a VAE re-encode first)
    restart_every: int = 0
    restart_overlap: int = 3


@dataclass
class RolloutOutcome:
    latent: torch.Tensor  # model space, [B, C, T, h, w] (C 16 or 48), start-image frames included
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
    channels, stride = model.latent_channels, model.vae_stride
    if raw.ndim != 5 or raw.shape[1] != channels:
        vae = "a Wan2.2 VAE" if channels == 48 else "a Wan2.1 VAE"
        raise FastARError(f"the start image latent has shape {list(raw.shape)}; this MODEL needs [batch, {channels}, "
                          f"frames, h, w] from {vae}")
    if tuple(raw.shape[3:]) != (latent_h, latent_w):
        raise FastARError(f"the start image was encoded at {pixel_size(raw.shape[4], stride)}x"
                          f"{pixel_size(raw.shape[3], stride)} but the sampler makes {pixel_size(latent_w, stride)}x"
                          f"{pixel_size(latent_h, stride)}: give 'AR Image to Video' the same width and height")
    return model.latent_format.process_in(raw.float())


def image_in_first_chunk(schedule) -> bool:
    """LongLive 2.0's image-to-video (a UniPC schedule): the start image is frame 0 of the first chunk, held at
    timestep 0, not clean context committed before it (the Self-Forcing family's)."""
    return schedule.solver == "unipc"


def batch_rows(name: str, tensor: torch.Tensor, batch: int) -> None:
    if tensor.shape[0] not in (1, batch):
        raise FastARError(f"{name} has a batch of {tensor.shape[0]} but the sampler makes {batch} video(s): make "
                          f"{tensor.shape[0]} (the Long Video Sampler's batch_size, or the LATENT's batch), or give it "
                          "a batch of 1, shared by every video")


def item_of(tensor: torch.Tensor | None, r: int) -> torch.Tensor | None:
    """Row ``r`` of a per-video tensor, or its only row when it is shared by the whole batch."""
    if tensor is None:
        return None
    return tensor[r:r + 1] if tensor.shape[0] > 1 else tensor[:1]


def item_schedule(schedule: ARPromptSchedule, r: int) -> ARPromptSchedule:
    prompts = [ScheduledPrompt(p.start_frame, item_of(p.context, r), p.recache_frames, p.label)
               for p in schedule.prompts]
    return ARPromptSchedule(prompts, item_of(schedule.initial_latent, r), list(schedule.notes))


def run_rollout(model: ARModel, schedule: ARPromptSchedule, total_frames: int, latent_h: int, latent_w: int,
                settings: RolloutSettings, host, start_noise: torch.Tensor | None = None,
                notes=(), batch: int = 1, batch_index=None, world: WorldInputs | None = None,
                vae=None) -> RolloutOutcome:
    """``batch`` videos, one after another (a video's memory, not a batch's); video r takes row r of the prompt,
    start image and start noise (or their only row) and is batch item ``batch_index[r]`` (default r) of every
    noise stream, so it equals that item made alone bit for bit. ``vae``: the engine's ``VideoVAE`` (ComfyUI's
    wrapped, ``vae_loop``), for the loops that re-encode decoded frames."""
    if batch < 1:
        raise FastARError(f"batch_size must be at least 1, got {batch}")
    items = tuple(range(batch)) if batch_index is None else tuple(int(i) for i in batch_index)
    if len(items) != batch:
        raise FastARError(f"batch_index {list(items)} must name one batch item per video ({batch})")
    for p in schedule.prompts:
        batch_rows(f"the conditioning of {p.label}" if p.label else "the conditioning", p.context, batch)
    if schedule.initial_latent is not None:
        batch_rows("the start image latent", schedule.initial_latent, batch)
    if world is not None:
        batch_rows("World Model Start's latent", world.start, batch)
        batch_rows("World Model Start's CLIP tokens", world.clip, batch)
    if start_noise is not None:
        batch_rows("the initial noise", start_noise, batch)
        if start_noise.shape[0] != batch:
            start_noise = start_noise.expand(batch, *start_noise.shape[1:])
    sched = get_schedule(settings.schedule)
    mode = resolve_mode(settings, sched.name)
    first = item_schedule(schedule, 0)
    n_init = 0 if first.initial_latent is None else initial_latents(model, first, latent_h, latent_w).shape[2]
    in_chunk = n_init > 0 and image_in_first_chunk(sched)
    if in_chunk and n_init != 1:
        raise FastARError(f"the start image latent has {n_init} frames; LongLive 2.0's image-to-video holds one")
    generated = total_frames - (0 if in_chunk else n_init)
    if generated < 1:
        raise FastARError(f"the video has {total_frames} latent frames and the start image fills {n_init}; "
                          "raise 'length' so that at least one frame is generated")

    engine = resolve_settings_for(model, settings)
    runner = model.runner()
    sampler = build_sampler(runner, engine.fastar)
    cfg = RolloutConfig(num_frames=generated, latent_height=latent_h, latent_width=latent_w,
                        frames_per_block=settings.frames_per_block, schedule=sched, seed=settings.seed,
                        cache=engine.cache, context_noise=settings.context_noise, mode=mode, batch=1,
                        channels=model.latent_channels, first_chunk_schedule=settings.first_chunk_schedule,
                        image_in_first_chunk=in_chunk,
                        restart=RestartSpec(settings.restart_every, settings.restart_overlap))

    plan = plan_rollout(cfg, sched, 0 if in_chunk else n_init)
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
        x0 = report.x0
        if preview is None:
            return
        try:
            image = preview(x0[:, :, -1:])  # the chunk's newest frame
        except Exception:  # a preview must never end a long run
            preview, image = None, None
        bar.update_absolute(done[0], None, image)

    log.info("FAST-AR: sampling %d video(s) of %d latent frames in %d chunks, cache %s", batch, generated, n_chunks,
             engine.cache.describe())
    results = []
    try:
        for r in range(batch):
            offset[0] = r * per_video
            item = item_schedule(schedule, r)
            item_cfg = replace(cfg, batch_index=(items[r],))
            init = initial_latents(model, item, latent_h, latent_w)
            cond = item.to_engine() if world is None else world.conditioning(model, r, total_frames)
            results.append(sampler.generate(cond, item_cfg, initial_latents=init, callback=on_chunk,
                                            cancel=host.interrupted, step_callback=on_step,
                                            output_device=host.intermediate_device(),
                                            initial_noise=item_of(start_noise, r), vae=vae))
    except GenerationCancelled:
        host.raise_interrupted()
        raise
    finally:
        host.soft_empty_cache()

    result = results[0]
    notes = [*schedule.notes, *notes]
    if runner.pieces.compiled:
        notes.append(f"the blocks run under {runner.pieces.describe()}, as the MODEL's TorchCompileModel asks (the "
                     "first chunks of a new size include compile time)")
    if batch > 1:
        times = ", ".join(f"{r.seconds:.2f} s" for r in results)
        notes.append(f"batch of {batch} videos, made one after another (video i is batch item i of seed "
                     f"{settings.seed}; the table shows the first): {times}")
    sigmas = ", ".join(f"{s:.4g}" for s in sched.sigmas)
    report = build_report(model=model, result=result, settings=settings, engine=engine, mode=mode,
                          n_init=n_init, width=pixel_size(latent_w, model.vae_stride),
                          height=pixel_size(latent_h, model.vae_stride),
                          schedule_text=f"{sched.name} ({sched.num_steps} steps: {sigmas})",
                          prompts=schedule.describe() if world is None else world.describe(total_frames),
                          notes=notes)
    latent = torch.cat([r.latent for r in results]) if batch > 1 else result.latent
    return RolloutOutcome(latent, result, report)
