"""An ``ARSampler`` whose chunks start from a given noise tensor (ComfyUI's NOISE) instead of seeded noise.

The engine draws every noise tensor from generators seeded per (seed, chunk, step). ComfyUI's custom sampling
hands a sampler the starting noise (from RandomNoise, already scaled to the first sigma), so each chunk's first
step takes its frames from that tensor; the re-noising between steps stays seeded from the sampler's seed.
This overrides the engine's private ``_noise`` hook; an ``initial_noise`` argument to ``generate`` would
replace it.
"""

from __future__ import annotations

import torch

from ..fastar_core.errors import FastARError
from ..fastar_core.sampler import ARSampler


class StartNoiseSampler(ARSampler):
    def __init__(self, sampler: ARSampler, start_noise: torch.Tensor, plan: list[tuple[int, int]]):
        super().__init__(sampler.runner, sampler.cache_factory)
        self.start_noise = start_noise
        self.plan = plan

    def _noise(self, cfg, chunk, step, frames):
        if step == 0 and 0 <= chunk < len(self.plan):
            frame_start, n = self.plan[chunk]
            if n != frames:
                raise FastARError(f"internal: chunk {chunk} has {frames} frames, the plan says {n}")
            x = self.start_noise[:, :, frame_start:frame_start + n]
            return x.to(device=self.runner.device, dtype=torch.float32)
        return super()._noise(cfg, chunk, step, frames)
