"""LongLive 2.0's multi-shot prompts: a prompt segment can start a new shot.

At the first chunk of a new shot two things change, as its pipeline does them (``multi_shot_sink`` and
``multi_shot_rope_offset`` in ``configs/inference.yaml``):

- the temporal RoPE of that chunk and of every later one is shifted by ``rope_offset`` frames per shot so far
  (its keys keep the shift they were written with), so a shot starts a little "later" than the frames before it;
- with ``pin_shot_sink`` the shot's first chunk is pinned in the window cache: never evicted while it is the
  latest shot's, beside the global sink (the first ``sink_frames`` frames). LongLive 2.0 pins it in its rolling
  buffer, where it drifts towards the sink with each roll and then joins the protected prefix; which frames the
  buffer holds, and so which a chunk attends to, is the same as never evicting the pinned frames.

The rollout then runs in "RoPE time": a chunk at latent frame ``f`` of shot ``s`` sits at position
``f + s * rope_offset``, which is also the frame number its keys are cached under (the window cache only orders
frames, so the gap a shot leaves changes nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FastARError


@dataclass(frozen=True)
class MultiShot:
    rope_offset: int = 8  # temporal RoPE frames added per shot (LongLive 2.0: multi_shot_rope_offset 8)
    pin_shot_sink: bool = True  # keep each new shot's first chunk in the window (its multi_shot_sink)

    def validate(self, cache_policy: str) -> MultiShot:
        if isinstance(self.rope_offset, bool) or not isinstance(self.rope_offset, int) or self.rope_offset < 0:
            raise FastARError(f"multi-shot rope_offset must be a whole number of frames >= 0, got "
                              f"{self.rope_offset!r} (positions are integer frames)")
        if self.pin_shot_sink and cache_policy != "window":
            raise FastARError(f"a multi-shot sink pins frames in the window cache; the {cache_policy} cache has no "
                              "pinned frames (use cache policy 'window' or pin_shot_sink=False)")
        return self


def starts_shot(prompts, frame_start: int) -> bool:
    """Whether the chunk starting at ``frame_start`` is a new shot's first: a segment marked ``new_shot``
    starts exactly there (the first prompt is shot 0, never a new one)."""
    return any(s.new_shot and s.start_frame == frame_start and frame_start > 0 for s in prompts.segments)
