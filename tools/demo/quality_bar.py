"""The demo model's quality bar: long image-to-video rollouts with the engine's sampler, judged by
``evaluate_rollout``.

Each case continues a rendered 3-frame start chunk of a world scene for 240 latent frames with a dense cache
(``global``: every frame; ``window``: 3 sink frames + the 12 most recent) and evaluates the result against
the scene's clean background and sprite areas.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...fastar_core.caches import CacheSpec
from ...fastar_core.families.demo.model import DemoModel
from .bundled import latents_to_frames, render_start
from .evaluate import Thresholds, evaluate_rollout

BAR_FRAMES = 240
BAR_SEEDS = (1, 2, 3)
BAR_CACHES = {
    "global": CacheSpec(policy="global"),
    "window": CacheSpec(policy="window", sink_frames=3, window_frames=18),  # 3 sink + 12 recent + the chunk
}


@dataclass
class BarCase:
    seed: int
    cache: str
    frames: torch.Tensor  # [T, 3, H, W] start chunk included
    report: dict
    seconds: float


def run_case(demo: DemoModel, seed: int, cache: str = "window", num_frames: int = BAR_FRAMES,
             thresholds: Thresholds | None = None, noise_seed: int = 0) -> BarCase:
    start = render_start(demo, seed, frames=demo.frames_per_block)
    t0 = time.perf_counter()
    result = demo.generate(start, num_frames, cache=BAR_CACHES[cache], seed=noise_seed)
    seconds = time.perf_counter() - t0
    frames = latents_to_frames(result.latent).cpu()
    report = evaluate_rollout(frames, start.scene.background(), start_frames=start.latents.shape[2],
                              reference_areas=start.scene.sprite_areas(), thresholds=thresholds)
    return BarCase(seed, cache, frames, report, seconds)


def run_bar(demo: DemoModel, seeds=BAR_SEEDS, caches=tuple(BAR_CACHES), num_frames: int = BAR_FRAMES,
            log=None) -> list[BarCase]:
    cases = []
    for cache in caches:
        for seed in seeds:
            case = run_case(demo, seed, cache, num_frames)
            cases.append(case)
            if log is not None:
                log(f"bar {cache} seed {seed}: {'PASS' if case.report['passed'] else 'FAIL'} "
                    f"{case.report['summary']} ({case.seconds:.0f} s)")
    return cases
