"""Long Video Sampler (AR): the whole autoregressive rollout in one node, LATENT + report out."""

from __future__ import annotations

import logging

from ..fastar_core.errors import FastARError
from .constants import (
    ACTIONS,
    CACHE_POLICIES,
    CATEGORY,
    CONDITIONING_OR_SCHEDULE,
    FRAMES_PER_BLOCK,
    MAX_LENGTH,
    MAX_RESOLUTION,
    MODEL_OWN,
    PIXEL_STEP,
    SAMPLER_MODES,
    SCHEDULE_PRESETS,
    SINK_FRAMES,
    WINDOW_FRAMES,
)
from .family_inputs import SamplerInputs
from .host import get_host
from .inputs import combo, float_input, int_input, link, seed_input
from .model_access import check_model_input, diffusion_model_of, geometry_of, own_schedule, resolve_model
from .prompting import core_start_latent
from .request import RolloutSettings, build_request
from .rollout import run_rollout
from .upstream import ignored_model_patches, ignored_shift
from .vae_loop import ComfyVideoVAE
from .video_size import check_sampler_size, size_of_start

log = logging.getLogger("FAST-AR")

LENGTH_TOOLTIP = ("Video length in frames. Wan's VAE turns 4k+1 frames into k+1 latent frames, so the length must be "
                  "1, 5, 9, ..., 81, ... (81 = 21 latent frames = 5 s at 16 fps; 1001 = 62.5 s). Other values are "
                  "refused with the nearest valid ones.")


class LongVideoSampler:
    DESCRIPTION = ("Generates a long video chunk by chunk with an autoregressive Wan model (the Self-Forcing family on "
                   "Wan2.1, LongLive 2.0 on Wan2.2 TI2V-5B, Matrix-Game 2.0 steered by an Action Script): "
                   "each chunk is denoised with the step list, then its clean keys/values go into a KV cache that the "
                   "next chunks read. The cache policy bounds memory (window, rolling, or FAST-AR's TempCache). "
                   "Outputs a LATENT for the native VAE Decode and a report.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": link("MODEL", "A Wan2.1 T2V AR model, or a Wan2.2 TI2V-5B one (LongLive 2.0); pass it through "
                                       "'FAST-AR Attention' to use FAST-AR."),
                "positive": link(CONDITIONING_OR_SCHEDULE, "The prompt: a CONDITIONING (from CLIP Text Encode with a "
                                                           "'wan' text encoder, or from AR Image to Video) or an AR "
                                                           "Prompt Schedule."),
                "width": int_input(832, PIXEL_STEP, MAX_RESOLUTION,
                                   "Video width in pixels (multiple of 16; of 32 for Wan2.2 TI2V-5B). The Wan2.1 AR "
                                   "models are trained at 832x480, LongLive 2.0 at 1280x704. With a start node (AR "
                                   "Image to Video, World Model Start), link its width here: it sets the size.",
                                   step=PIXEL_STEP),
                "height": int_input(480, PIXEL_STEP, MAX_RESOLUTION, "Video height in pixels (multiple of 16; of 32 "
                                                                     "for Wan2.2 TI2V-5B). With a start node, link its "
                                                                     "height here.", step=PIXEL_STEP),
                "length": int_input(81, 1, MAX_LENGTH, LENGTH_TOOLTIP + " With a start node, link its length here.",
                                    step=4),
                "frames_per_block": int_input(
                    FRAMES_PER_BLOCK, 1, 64, "Latent frames per chunk; must match the checkpoint's "
                                                        "training (3 for Self-Forcing, CausVid, Rolling Forcing, "
                                                        "LongLive, Krea; 1 for frame-wise Causal Forcing; 8 for "
                                                        "LongLive 2.0)."),
                "schedule": combo(SCHEDULE_PRESETS, "Denoising steps per chunk: Self-Forcing 4-step (also LongLive, "
                                                    "Causal Forcing), Rolling Forcing 5-step, CausVid 3-step, Krea "
                                                    "Realtime 5-step (its server's list, ending at timestep 0), "
                                                    "Matrix-Game 3-step (universal and gta_drive; templerun takes "
                                                    "Self-Forcing 4-step), "
                                                    "Causal Forcing++ 1- or 2-step (frame-wise; its first frame "
                                                    "takes the 4-step list), LongLive 2.0 4-step UniPC (Wan2.2 "
                                                    "TI2V-5B: no re-noising; a start image is held as frame 0 of the "
                                                    "first chunk). A connected 'sigmas' input replaces it."),
                "mode": combo(SAMPLER_MODES, "chunk: one chunk at a time. rolling: Rolling Forcing's window of chunks "
                                             "at staggered noise levels. auto: rolling for the Rolling Forcing "
                                             "schedule, chunk otherwise."),
                "seed": seed_input("Seed of every noise draw (per chunk and step); same seed, same video, with or "
                                   "without FAST-AR."),
                "cache_policy": combo(CACHE_POLICIES, "What later chunks attend to. global: every frame (memory grows "
                                                      "with length). window: the last window_frames frames with the "
                                                      "sink (LongLive). rolling: Rolling Forcing's cache. tempcache: "
                                                      "FAST-AR's merged cache (sized by FAST-AR Attention). recompute: "
                                                      "Krea Realtime's, rebuilt before every chunk from the sink and "
                                                      "the most recent frames. auto: tempcache when FAST-AR turns it "
                                                      "on, else global. A dense policy with FAST-AR's TempCache on "
                                                      "is refused."),
                "sink_frames": int_input(
                    SINK_FRAMES, 0, 64, "Latent frames at the start that stay in the cache for good "
                                                   "(attention sink; window, rolling and tempcache). recompute: the "
                                                   "first frames kept in its context (Krea's keep_first_frame: 1)."),
                "window_frames": int_input(
                    WINDOW_FRAMES, 1, 4096, "Latent frames a chunk attends to, the sink and the chunk "
                                                        "itself included (LongLive's local_attn_size: 12). window "
                                                        "and recompute (Krea: kv_cache_num_frames 3 + the chunk = 6)."),
                "context_noise": float_input(0.0, 0.0, 0.99, "Noise level of the pass that writes a finished chunk "
                                                             "into the cache (0 in every released model)."),
            },
            "optional": {
                "sigmas": link("SIGMAS", "Optional custom step list (e.g. from BasicScheduler); replaces 'schedule'. "
                                         "A trailing 0 is dropped: every chunk ends clean."),
                "first_chunk_sigmas": link("SIGMAS", "Optional step list for the first chunk alone (Causal Forcing++ "
                                                     "denoises its first frame with 4 steps); replaces the preset's."),
                "actions": link(ACTIONS, "How a world model is steered: an Action Script of keyboard and mouse "
                                         "actions for Matrix-Game 2.0 (read at the video's frame rate, for 'length' "
                                         "frames); a Camera Path or an Action Script of variant lingbot for "
                                         "LingBot-World 2.0. Other models take no actions and refuse them."),
                "batch_size": int_input(1, 1, 64, "Videos to make, one after another (the memory of one). Video i is "
                                                  "batch item i of the seed, as in ComfyUI's own batches: video 0 is "
                                                  "the batch_size 1 video. A prompt or start image of batch 1 is "
                                                  "shared; one of batch_size gives each video its own."),
                "vae": link("VAE", "The Wan2.1 VAE, for the models whose own sampler decodes and re-encodes frames "
                                   "while it runs: CausVid's long video (restart_every) and Krea Realtime with "
                                   "keep_first_frame off (recompute, sink_frames 0). Unused otherwise; those two "
                                   "refuse to run without it."),
                "restart_every": int_input(0, 0, 4096, "CausVid's long video: every this many latent frames (CausVid: "
                                                       "21) a fresh rollout starts, its cache emptied, from the VAE "
                                                       "re-encode of one decoded frame and the last restart_overlap "
                                                       "- 1 latent frames (needs 'vae', cache global or window). 0: "
                                                       "one rollout that keeps its cache.", step=3),
                "restart_overlap": int_input(3, 1, 64, "Latent frames a restarted rollout starts from (CausVid's "
                                                       "--num_overlap_frames: 3), a multiple of frames_per_block."),
            },
        }

    RETURN_TYPES = ("LATENT", "STRING")
    RETURN_NAMES = ("latent", "report")
    OUTPUT_TOOLTIPS = ("LATENT for the native VAE Decode: [batch_size, 16, frames, height/8, width/8] for Wan2.1, "
                       "[batch_size, 48, frames, height/16, width/16] for Wan2.2 TI2V-5B.",
                       "Per-chunk speed, cache memory and FAST-AR statistics.")
    FUNCTION = "sample"
    CATEGORY = CATEGORY

    def sample(self, model, positive, width, height, length, frames_per_block=FRAMES_PER_BLOCK,
               schedule="Self-Forcing 4-step", mode="auto", seed=0, cache_policy="auto", sink_frames=SINK_FRAMES,
               window_frames=WINDOW_FRAMES, context_noise=0.0, sigmas=None, first_chunk_sigmas=None, actions=None,
               batch_size=1, vae=None, restart_every=0, restart_overlap=3):
        host = get_host()
        check_sampler_size(size_of_start(positive), width, height, length, "the Long Video Sampler makes",
                           fix="link the start node's width, height and length outputs to the sampler's")
        family = check_model_input(model)
        # Wan2.1's VAE: 8 pixels per latent, 4 frames per latent frame; Wan2.2's: 16; the demo world's: 1 and 1
        geometry = geometry_of(family, diffusion_model_of(model))
        total_frames = geometry.check_length("length", length)
        latent_w, latent_h = geometry.check_pixels("width", width), geometry.check_pixels("height", height)
        if sigmas is None and schedule not in SCHEDULE_PRESETS:
            raise FastARError(f"schedule {schedule!r} is not one of {', '.join(SCHEDULE_PRESETS)}")
        notes = ignored_model_patches(model)
        preset = None
        if sigmas is None:
            preset = own_schedule(family) if schedule == MODEL_OWN else SCHEDULE_PRESETS[schedule]
            notes += ignored_shift(model, preset, schedule)
        if restart_every:
            notes.append(f"CausVid's long video: a fresh rollout every {restart_every} latent frames from "
                         f"{restart_overlap} clean ones (the first a VAE re-encode of a decoded frame); the LATENT is "
                         "the first rollout, then each later one's new frames")
        host.load_model(model)
        ar_model = resolve_model(model)
        given = SamplerInputs(positive=positive, actions=actions, latent_frames=total_frames, latent_h=latent_h,
                              latent_w=latent_w, sigmas=sigmas, schedule=schedule, frames_per_block=frames_per_block,
                              core_start=core_start_latent(getattr(model, "model_options", None)))
        settings = RolloutSettings(
            frames_per_block=frames_per_block, schedule=sigmas if sigmas is not None else preset,
            mode=mode, seed=seed, cache_policy=cache_policy, sink_frames=sink_frames, window_frames=window_frames,
            context_noise=context_noise,
            first_chunk_schedule=None if first_chunk_sigmas is None else first_chunk_sigmas.detach().float().cpu(),
            restart_every=restart_every, restart_overlap=restart_overlap,
        )
        loop_vae = None if vae is None else ComfyVideoVAE(vae, ar_model.latent_format, host, model)
        request = build_request(ar_model, given, settings, batch=batch_size, vae=loop_vae, notes=notes)
        for note in request.notes:
            log.warning("FAST-AR Long Video Sampler: %s", note)
        outcome = run_rollout(request, host)
        latent = ar_model.latent_format.process_out(outcome.latent).to(host.intermediate_device())
        return ({"samples": latent}, outcome.report)
