"""AR Prompt Schedule: up to four prompts, each from a video frame on, as one schedule."""

from __future__ import annotations

from ..fastar_core.errors import FastARError
from .constants import CATEGORY, INITIAL_LATENT_KEY, MAX_LENGTH, PROMPT_SCHEDULE
from .inputs import int_input, link
from .prompting import ARPromptSchedule, ScheduledPrompt, conditioning_entry, video_frame_to_latent
from .video_size import size_from_extras

SLOTS = 4


class ARPromptScheduleNode:
    DESCRIPTION = ("Changes the prompt during one long video: prompt 1 from the first frame, prompt 2 from "
                   "start_frame_2, and so on (unconnected prompts are skipped). Switches happen at the first chunk "
                   "that starts at or after the frame. Optional LongLive-style recache re-encodes the last frames "
                   "under the new prompt so the switch is smooth.")

    @classmethod
    def INPUT_TYPES(cls):
        required = {"conditioning_1": link("CONDITIONING", "Prompt from the first frame (a Wan text encoding; may "
                                                           "carry a start image from 'AR Image to Video').")}
        for i in range(2, SLOTS + 1):
            required[f"start_frame_{i}"] = int_input(
                40 * (i - 1) * 4 + 1, 1, MAX_LENGTH,
                f"Video frame where prompt {i} takes over (16 frames = 1 s at Wan's 16 fps). Rounded to the latent "
                f"frame (4 video frames) and applied from the next chunk. Ignored while conditioning_{i} is not "
                "connected.")
        required["recache_frames"] = int_input(
            0, 0, 64, "LongLive recache: on each switch, re-encode this many previous latent frames under the new "
                      "prompt (LongLive uses 12). When they reach back to the first frame, the sink is re-encoded "
                      "too, as LongLive does. 0 = switch without recache.")
        optional = {f"conditioning_{i}": link("CONDITIONING", f"Prompt {i} (optional).") for i in range(2, SLOTS + 1)}
        return {"required": required, "optional": optional}

    RETURN_TYPES = (PROMPT_SCHEDULE,)
    RETURN_NAMES = ("schedule",)
    OUTPUT_TOOLTIPS = ("A prompt schedule for the AR samplers' 'positive' input.",)
    FUNCTION = "build"
    CATEGORY = CATEGORY

    def build(self, conditioning_1, recache_frames=0, **kwargs):
        first, extras = conditioning_entry(conditioning_1, "conditioning_1")
        prompts = [ScheduledPrompt(0, first, 0, "prompt 1")]
        for i in range(2, SLOTS + 1):
            cond = kwargs.get(f"conditioning_{i}")
            if cond is None:
                continue
            frame = int(kwargs.get(f"start_frame_{i}", 1))
            tensor, more = conditioning_entry(cond, f"conditioning_{i}")
            if INITIAL_LATENT_KEY in more:
                raise FastARError(f"conditioning_{i} carries a start image; only conditioning_1 may (the start image "
                                  "is the first frame)")
            latent_frame = video_frame_to_latent(frame)
            if latent_frame <= prompts[-1].start_frame:
                raise FastARError(f"start_frame_{i} ({frame}) must come after the previous prompt's start "
                                  f"(latent frame {prompts[-1].start_frame}); keep the start frames increasing")
            prompts.append(ScheduledPrompt(latent_frame, tensor, int(recache_frames), f"prompt {i}"))
        return (ARPromptSchedule(prompts, extras.get(INITIAL_LATENT_KEY), video_size=size_from_extras(extras)),)
