"""Live World (play): a world model steered by the keys of the person watching, chunk by chunk, inside ComfyUI.

The node runs the same rollout as the Long Video Sampler (one ``RolloutRequest``, ``run_rollout``) with the
MODEL family's own chunk size and step list, and its actions come from a ``LivePlay`` instead of an Action Script:
before each chunk the sampler asks the play for the next frames' actions, which are the keys the page holds then.
The page (``web/fastar_live.js``) draws each chunk's frames in the node with its frame rate and cache size, and
sends the keys while the node is selected. What was played comes out as ACTIONS and as a script: the Long Video
Sampler given the same inputs and that script makes the same latents, bit for bit.
"""

from __future__ import annotations

import logging

from ..fastar_core.errors import FastARError, GenerationCancelled
from ..fastar_core.rollout.live_actions import LivePlay
from .constants import (
    ACTIONS,
    CACHE_POLICIES,
    CATEGORY,
    MAX_LENGTH,
    MAX_RESOLUTION,
    MODEL_OWN,
    WORLD_HEIGHT,
    WORLD_WIDTH,
)
from .family_inputs import SamplerInputs
from .host import get_host
from .inputs import combo, float_input, int_input, link, seed_input
from .live import END, PLAYS, START, LiveView
from .model_access import check_model_input, diffusion_model_of, geometry_of, resolve_model
from .request import RolloutSettings, build_request
from .rollout import run_rollout

log = logging.getLogger("FAST-AR")


class LiveWorld:
    DESCRIPTION = ("Plays a world model live: while the prompt runs, this node shows each chunk's frames as they are "
                   "made, with the frame rate and the cache's size, and W A S D and the arrows (and the mouse, for "
                   "Matrix-Game's mouse variants) steer it while the node is selected. Runs Matrix-Game 2.0, "
                   "LingBot-World 2.0 (keys walk its camera) and the bundled demo world (on a CPU too) with the "
                   "model's own chunk size and steps; Cancel stops it at once. Outputs the latent, the actions played "
                   "(ACTIONS and a script), and a report: the Long Video Sampler with the same inputs, schedule "
                   "\"model's own\" and these actions makes the same latent.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": link("MODEL", "A world model: Matrix-Game 2.0, LingBot-World 2.0, or the demo world (Load AR "
                                       "Video Model's bundled entry). Through FAST-AR Attention to play it with "
                                       "FAST-AR."),
                "positive": link("CONDITIONING", "Where the world starts: World Model Start (Matrix-Game 2.0), LingBot "
                                                 "World Start (LingBot-World 2.0) or Demo World Start (the demo "
                                                 "world)."),
                "width": int_input(WORLD_WIDTH, 4, MAX_RESOLUTION, "Video width in pixels (Matrix-Game 2.0: 640; "
                                                                   "LingBot-World 2.0: 832; the demo world: 24).",
                                   step=4),
                "height": int_input(WORLD_HEIGHT, 4, MAX_RESOLUTION, "Video height in pixels (Matrix-Game 2.0: 352; "
                                                                     "LingBot-World 2.0: 480; the demo world: 24).",
                                    step=4),
                "length": int_input(241, 2, MAX_LENGTH, "Video frames to play (Matrix-Game, LingBot: 4k+1; the demo "
                                                        "world: any). Cancel ends a play early (with no output)."),
                "seed": seed_input("Seed of every noise draw; with the played actions, the same video again."),
                "cache_policy": combo(CACHE_POLICIES, "As the Long Video Sampler's: auto is TempCache when FAST-AR "
                                                      "turns it on, else the model's own cache."),
                "max_fps": float_input(16.0, 0.0, 240.0, "Video frames per second the play shows at most (it waits "
                                                         "between chunks; the frames are the same); 0: as fast as "
                                                         "the model makes them.", step=1.0),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    RETURN_TYPES = ("LATENT", ACTIONS, "STRING", "STRING")
    RETURN_NAMES = ("latent", "actions", "script", "report")
    OUTPUT_TOOLTIPS = ("The video's latent (for VAE Decode; the demo world's is its RGB frames).",
                       "The actions played, for the Long Video Sampler's 'actions' (a replay).",
                       "The actions played as an Action Script's text (save it; paste it into Action Script).",
                       "The rollout's report: frame rate and cache per chunk, and what to replay it with.")
    FUNCTION = "play"
    CATEGORY = CATEGORY
    OUTPUT_NODE = True

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")  # a play is never the same twice: run it whenever the prompt is queued

    def play(self, model, positive, width, height, length, seed, cache_policy="auto", max_fps=16.0, unique_id=None):
        host = get_host()
        family = check_model_input(model)
        variant = family.live_variant()
        if variant is None:
            raise FastARError(f"the MODEL is {family.describe()}, which is not steered: Live World plays world models "
                              "(Matrix-Game 2.0, LingBot-World 2.0, the demo world); use the Long Video Sampler")
        frames_per_block, schedule = family.own_rollout()
        geometry = geometry_of(family, diffusion_model_of(model))
        total = geometry.check_length("length", length)
        latent_w, latent_h = geometry.check_pixels("width", width), geometry.check_pixels("height", height)
        host.load_model(model)
        ar_model = resolve_model(model)
        play = LivePlay(variant)
        given = SamplerInputs(positive=positive, actions=play, latent_frames=total, latent_h=latent_h,
                              latent_w=latent_w, schedule=MODEL_OWN, frames_per_block=frames_per_block)
        settings = RolloutSettings(frames_per_block=frames_per_block, schedule=schedule, seed=seed,
                                   cache_policy=cache_policy)
        request = build_request(ar_model, given, settings, notes=[
            f"played live; replay: the Long Video Sampler with this MODEL and 'positive', width {width}, height "
            f"{height}, length {length}, frames_per_block {frames_per_block}, schedule \"{MODEL_OWN}\", seed {seed}, "
            f"cache_policy {cache_policy}, and this node's actions"])
        play_id = PLAYS.open(play)
        view = LiveView(host, ar_model, play, play_id, unique_id, geometry.temporal, max_fps)
        end = {"play": play_id, "node": unique_id, "reason": "failed"}
        try:
            host.send_live(START, {"play": play_id, "node": unique_id, "variant": variant,
                                   "keys": sorted(play.table.names), "mouse": play.variant.has_mouse,
                                   "frames": geometry.video_frames(total), "width": width, "height": height})
            outcome = run_rollout(request, host, listener=view.on_chunk)
            end["reason"] = "finished"
        except BaseException as e:  # Cancel: the engine's GenerationCancelled, ComfyUI's InterruptProcessingException
            cancelled = isinstance(e, GenerationCancelled) or type(e).__name__ == "InterruptProcessingException"
            end["reason"] = "cancelled" if cancelled else "failed"
            raise
        finally:
            PLAYS.close(play_id)
            host.send_live(END, end)
        script = play.script(geometry.video_frames(total))
        text = script.to_text()
        latent = ar_model.latent_format.process_out(outcome.latent).to(host.intermediate_device())
        return {"ui": {"text": [text]}, "result": ({"samples": latent}, script, text, outcome.report)}
