"""AR Video Sampler (FAST-AR): the same rollout as a SAMPLER for SamplerCustomAdvanced.

ComfyUI's custom sampling calls a KSAMPLER's function as ``fn(model, noise, sigmas, extra_args, callback,
disable, **extra_options)`` where ``model`` is a ``KSamplerX0Inpaint`` around the guider: ``model.inner_model`` is
the CFGGuider (or BasicGuider), whose ``model_patcher`` is the MODEL and whose ``conds["positive"]`` holds the
processed conditioning (``cross_attn`` = the text tensor, plus the entry's extras). ``noise`` is already in the
model's latent space and scaled to the first sigma; the guider applies ``process_latent_out`` to what we return.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.rollout.schedule import SOLVERS, custom_schedule
from ..fastar_core.rollout.video_geometry import VAE_STRIDES, pixel_size, video_frames
from .constants import (
    CACHE_POLICIES,
    CATEGORY,
    FRAMES_PER_BLOCK,
    INITIAL_LATENT_KEY,
    PROMPT_SCHEDULE,
    SAMPLER_MODES,
    SINK_FRAMES,
    WINDOW_FRAMES,
)
from .family_inputs import SamplerInputs
from .host import get_host
from .inputs import combo, float_input, int_input, link
from .model_access import resolve_model
from .prompting import ARPromptSchedule, ScheduledPrompt, core_start_latent
from .request import RolloutSettings, build_request
from .rollout import run_rollout
from .upstream import ignored_conditioning, ignored_model_patches
from .video_size import check_sampler_size, size_from_extras

log = logging.getLogger("FAST-AR")
SETTING_KEYS = ("frames_per_block", "mode", "cache_policy", "sink_frames", "window_frames", "context_noise")
# How a chunk's steps go from the SIGMAS: auto is LongLive 2.0's UniPC on a Wan2.2 TI2V-5B MODEL, else the
# Self-Forcing family's x0-and-re-noise (the engine's schedule solvers).
SOLVER_CHOICES = ("auto", *SOLVERS)


def sigmas_schedule(sigmas, solver: str, latent_channels: int):
    schedule = custom_schedule(sigmas.detach().float().cpu().flatten().tolist())
    if solver not in SOLVER_CHOICES:
        raise FastARError(f"solver {solver!r} is not one of {', '.join(SOLVER_CHOICES)}")
    if solver == "auto":
        solver = "unipc" if latent_channels == 48 else "dmd"
    return replace(schedule, solver=solver)


def schedule_from_guider(guider, options: dict) -> tuple[ARPromptSchedule, list]:
    notes = []
    conds = getattr(guider, "conds", None) or {}
    positive = conds.get("positive") or []
    scheduled = options.get("prompt_schedule")
    if scheduled is not None:
        if positive:
            notes.append("the guider's positive conditioning is replaced by the sampler's prompt_schedule")
        return scheduled, notes
    if not positive or "cross_attn" not in positive[0]:
        raise FastARError("the guider has no positive text conditioning; connect CFGGuider/BasicGuider 'positive' to a "
                          "CLIP Text Encode (wan) or AR Image to Video output")
    if len(positive) > 1:
        notes.append(f"the guider's positive has {len(positive)} entries; the AR sampler uses the first")
    cfg = getattr(guider, "cfg", 1.0)
    if cfg != 1.0:
        notes.append(f"cfg {cfg} is ignored: the AR models are distilled for cfg 1 (negative prompt unused)")
    first = positive[0]
    prompt = ScheduledPrompt(0, first["cross_attn"], 0, "prompt")
    return ARPromptSchedule([prompt], first.get(INITIAL_LATENT_KEY)), notes


@torch.no_grad()
def sample_ar_video(model, noise, sigmas, extra_args=None, callback=None, disable=None, **options):
    """The SAMPLER's function: chunks start from the given noise; re-noising is seeded from the noise seed."""
    host = get_host()
    extra_args = extra_args or {}
    guider = getattr(model, "inner_model", model)
    patcher = getattr(guider, "model_patcher", None)
    if patcher is None:
        raise FastARError("the AR Video Sampler (FAST-AR) runs inside SamplerCustomAdvanced with a guider "
                          "(CFGGuider or BasicGuider) around a Wan2.1 T2V or Wan2.2 TI2V-5B MODEL")
    if noise.ndim != 5:
        raise FastARError(f"the latent has shape {list(noise.shape)}; a video latent [B, C, frames, h, w] is needed "
                          "(EmptyHunyuanLatentVideo, Wan22ImageToVideoLatent or AR Image to Video)")
    schedule, notes = schedule_from_guider(guider, options)
    upstream = ignored_model_patches(patcher)
    positive = (getattr(guider, "conds", None) or {}).get("positive") or []
    if positive and "prompt_schedule" not in options:
        upstream += ignored_conditioning(positive[0])
    if extra_args.get("denoise_mask") is not None:
        upstream.append("the LATENT's noise_mask is ignored: the AR sampler generates every frame")
    for note in upstream:
        log.warning("FAST-AR AR Video Sampler: %s", note)
    notes += upstream
    ar_model = resolve_model(patcher, device=noise.device)
    if noise.shape[1] != ar_model.latent_channels:
        source = ("Wan22ImageToVideoLatent or AR Image to Video with the Wan2.2 VAE" if ar_model.latent_channels == 48
                  else "EmptyHunyuanLatentVideo or AR Image to Video")
        raise FastARError(f"the latent has {noise.shape[1]} channels but the MODEL takes {ar_model.latent_channels}: "
                          f"make the LATENT with {source}")
    stride = VAE_STRIDES[noise.shape[1]]
    start_size = (schedule.video_size if "prompt_schedule" in options
                  else size_from_extras(positive[0]) if positive else None)
    check_sampler_size(start_size, pixel_size(noise.shape[4], stride), pixel_size(noise.shape[3], stride),
                       video_frames(noise.shape[2]), "the LATENT has",
                       fix="use its latent output, or make the LATENT at its size")
    # A start image from core's ARVideoI2V sits in the MODEL's options (core's sampler reads the sampling copy).
    core_start = core_start_latent(extra_args.get("model_options"), getattr(patcher, "model_options", None))
    given = SamplerInputs(positive=schedule, latent_frames=noise.shape[2], latent_h=noise.shape[3],
                          latent_w=noise.shape[4], sigmas=sigmas, from_guider=True, core_start=core_start)
    schedule_steps = sigmas_schedule(sigmas, options.get("solver", "auto"), ar_model.latent_channels)
    settings = RolloutSettings(schedule=schedule_steps, seed=int(extra_args.get("seed") or 0),
                               **{k: options[k] for k in SETTING_KEYS if k in options})
    # One video per batch row, as core's sampler returns; row r re-noises as batch item r of the seed.
    request = build_request(ar_model, given, settings, start_noise=noise, notes=notes, batch=noise.shape[0])
    outcome = run_rollout(request, host)
    log.info("%s", outcome.report)
    samples = outcome.latent.to(device=noise.device, dtype=noise.dtype)
    last = float(sigmas[-1])
    if last > 0:
        # The AR loop always ends clean; KSAMPLER divides by (1 - last sigma) afterwards, so undo that here.
        samples = samples * (1.0 - last)
    return samples


class SamplerARVideoFastAR:
    DESCRIPTION = ("A SAMPLER for SamplerCustomAdvanced that runs the chunk-by-chunk AR loop with window, sink, "
                   "rolling and FAST-AR caches. Swap it in for ComfyUI's 'Sampler AR Video'. Uses the given SIGMAS as "
                   "the step list (BasicScheduler 'simple', 4 steps, on a shift-5 model gives Self-Forcing's), starts "
                   "each chunk from the given NOISE and re-noises between steps from the noise seed. cfg is ignored.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "frames_per_block": int_input(
                    FRAMES_PER_BLOCK, 1, 64, "Latent frames per chunk; must match the checkpoint (3 for "
                                                        "the Self-Forcing family, 1 for frame-wise Causal Forcing)."),
                "mode": combo(SAMPLER_MODES, "chunk, or rolling (Rolling Forcing's staggered window). auto = chunk "
                                             "(the step list comes from SIGMAS)."),
                "cache_policy": combo(CACHE_POLICIES, "global, window (sink + last frames), rolling, tempcache "
                                                      "(FAST-AR), or recompute (Krea Realtime: rebuilt before every "
                                                      "chunk). auto: tempcache when the MODEL's FAST-AR patch turns "
                                                      "it on, else global."),
                "sink_frames": int_input(
                    SINK_FRAMES, 0, 64, "Latent frames kept for good at the start of the cache."),
                "window_frames": int_input(
                    WINDOW_FRAMES, 1, 4096, "Latent frames a chunk attends to, the sink and the chunk "
                                                        "included (window and recompute policies; LongLive: 12)."),
                "context_noise": float_input(0.0, 0.0, 0.99, "Noise level of the cache-writing pass (0 in released "
                                                             "models)."),
            },
            "optional": {
                "prompt_schedule": link(PROMPT_SCHEDULE, "Optional AR Prompt Schedule; replaces the guider's positive "
                                                         "prompt so prompts can change over the video."),
                "solver": combo(SOLVER_CHOICES, "How each chunk steps through the SIGMAS. dmd: x0, then fresh noise "
                                                "to the next sigma (Self-Forcing family). unipc: LongLive 2.0's "
                                                "multistep UniPC, no re-noising. auto: unipc for a Wan2.2 TI2V-5B "
                                                "MODEL, dmd otherwise.", default="auto"),
            },
        }

    RETURN_TYPES = ("SAMPLER",)
    RETURN_NAMES = ("sampler",)
    OUTPUT_TOOLTIPS = ("For SamplerCustomAdvanced's 'sampler' input.",)
    FUNCTION = "get_sampler"
    CATEGORY = CATEGORY

    def get_sampler(self, frames_per_block=FRAMES_PER_BLOCK, mode="auto", cache_policy="auto", sink_frames=SINK_FRAMES,
                    window_frames=WINDOW_FRAMES, context_noise=0.0, prompt_schedule=None, solver="auto"):
        if solver not in SOLVER_CHOICES:
            raise FastARError(f"solver {solver!r} is not one of {', '.join(SOLVER_CHOICES)}")
        options = {"frames_per_block": frames_per_block, "mode": mode, "cache_policy": cache_policy,
                   "sink_frames": sink_frames, "window_frames": window_frames, "context_noise": context_noise,
                   "solver": solver}
        if prompt_schedule is not None:
            options["prompt_schedule"] = prompt_schedule
        return (get_host().ksampler(sample_ar_video, options),)
