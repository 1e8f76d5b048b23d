"""Prompts that change over a rollout: (start latent frame, conditioning, recache length) segments."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import FastARError


@dataclass
class PromptSegment:
    start_frame: int  # first latent frame that uses this prompt
    context: torch.Tensor  # [B, L, text_dim] text-encoder output (zero-padded like UMT5)
    recache_frames: int = 0  # on switching to it, re-encode this many previous clean frames (LongLive recache)
    label: str = ""
    new_shot: bool = False  # LongLive 2.0: this prompt starts a new shot (see multishot.py); else a plain switch


class PromptSchedule:
    def __init__(self, segments):
        segments = sorted(segments, key=lambda s: s.start_frame)
        if not segments:
            raise FastARError("a prompt schedule needs at least one prompt")
        if segments[0].start_frame != 0:
            raise FastARError(f"the first prompt must start at frame 0, not {segments[0].start_frame}")
        starts = [s.start_frame for s in segments]
        if len(set(starts)) != len(starts):
            raise FastARError(f"two prompts start at the same frame: {starts}")
        for s in segments:
            if not torch.is_tensor(s.context) or s.context.ndim != 3:
                shape = list(s.context.shape) if torch.is_tensor(s.context) else type(s.context).__name__
                raise FastARError(f"prompt starting at frame {s.start_frame} has conditioning {shape}; "
                                  "expected a tensor [batch, tokens, text_dim]")
            if s.recache_frames < 0:
                raise FastARError(f"recache_frames must be >= 0, got {s.recache_frames}")
        self.segments = segments

    @classmethod
    def single(cls, context: torch.Tensor) -> PromptSchedule:
        return cls([PromptSegment(0, context)])

    @classmethod
    def coerce(cls, prompts) -> PromptSchedule:
        """A schedule from a schedule, one conditioning tensor, or a list of (start_frame, tensor[, recache])."""
        if isinstance(prompts, PromptSchedule):
            return prompts
        if torch.is_tensor(prompts):
            return cls.single(prompts)
        segments = []
        for item in prompts:
            if isinstance(item, PromptSegment):
                segments.append(item)
            else:
                segments.append(PromptSegment(int(item[0]), item[1], int(item[2]) if len(item) > 2 else 0))
        return cls(segments)

    def index_at(self, frame: int) -> int:
        idx = 0
        for i, s in enumerate(self.segments):
            if s.start_frame <= frame:
                idx = i
        return idx

    def __len__(self) -> int:
        return len(self.segments)
