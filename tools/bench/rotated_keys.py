"""``fastar bench rotated-keys``: dense-global with keys rotated once (at commit) against pre-RoPE keys rotated
again for every chunk, on one model, chunk by chunk in turn (``interleave.py``).

The first reads the cache as it is: attention writes the chunk's keys and values into the cache's free slots
after its entries and attends over one slice of each buffer. The second is what the dense caches did before they
kept keys rotated, and what they still do where attention clamps RoPE distances to each query
(``rope_max_distance``, the demo model): the cache's keys rotated again and joined to the chunk's (a copy of the
whole cache per call). Per chunk: seconds and the seconds spent on RoPE; summary: mean seconds of the last
quarter of the chunks (the longest cache), their ratio, the share of re-rotating in a late chunk, and how far
the two videos are apart (rounding only: the same attention computed in another order).
``rotated_keys.json`` holds the figures, ``rotated_keys.png`` the seconds per chunk.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ...fastar_core.caches.spec import CacheSpec
from ...fastar_core.forward.attention import DenseAttention
from ...fastar_core.forward.runner import CausalRunner
from ...fastar_core.rollout.sampler import ARSampler, RolloutConfig
from .interleave import run_in_turns
from .report import line_plots, machine, write_json
from .scenarios import demo_scenario, wan_shapes_scenario


class TimedRope(DenseAttention):
    """Dense attention that counts the wall seconds it spends on RoPE (queries, chunk keys and cache keys)."""

    rope_seconds = 0.0

    def rotate_inputs(self, *args, **kw):
        start = time.perf_counter()
        try:
            return super().rotate_inputs(*args, **kw)
        finally:
            self.rope_seconds += time.perf_counter() - start


class PreRopeKeys(TimedRope):
    """Dense attention that asks the caches for pre-RoPE keys, rotating them per chunk."""

    @property
    def wants_rotated_keys(self) -> bool:
        return False


VARIANTS = {"rotated once": TimedRope, "rotated every chunk": PreRopeKeys}


def run_rotated_keys_bench(out_dir, frames: int = 60, model: str = "wan-shapes", seed: int = 0, device=None) -> dict:
    out_dir = Path(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    scenario = demo_scenario(seed, device) if model == "demo" else wan_shapes_scenario(seed, device)
    cfg = RolloutConfig(num_frames=frames, latent_height=scenario.latent_hw[0], latent_width=scenario.latent_hw[1],
                        frames_per_block=scenario.frames_per_block, schedule=scenario.schedule, seed=seed,
                        cache=CacheSpec(policy="global"), channels=scenario.channels,
                        context_noise=scenario.context_noise)

    def job(attention_class):
        def run(hand_on):
            rows = []
            attention = attention_class(backend="torch", rope_max_distance=None, verify_kernels=False)
            sampler = ARSampler(CausalRunner(scenario.model, attention=attention))

            def record(report):
                rows.append(dict(report.to_dict(), rope_seconds=attention.rope_seconds))
                attention.rope_seconds = 0.0
                hand_on(rows[-1])

            result = sampler.generate(scenario.context, cfg, initial_latents=scenario.initial_latents,
                                      callback=record)
            return result, rows
        return run

    out = run_in_turns({name: job(cls) for name, cls in VARIANTS.items()})
    per = {}
    for name, (_, rows) in out.items():
        late = rows[-max(1, len(rows) // 4):]
        per[name] = {"seconds_each_chunk": [round(r["seconds"], 5) for r in rows],
                     "rope_seconds_each_chunk": [round(r["rope_seconds"], 5) for r in rows],
                     "late_chunks_mean_seconds": round(sum(r["seconds"] for r in late) / len(late), 5),
                     "late_chunks_mean_rope_seconds": round(sum(r["rope_seconds"] for r in late) / len(late), 5)}
    a, b = (out[n][0].latent.double() for n in VARIANTS)
    once, every = per["rotated once"], per["rotated every chunk"]
    ratio = once["late_chunks_mean_seconds"] / every["late_chunks_mean_seconds"]
    # What re-rotating the cache costs a late chunk: the RoPE seconds it adds over rotating once.
    share = (every["late_chunks_mean_rope_seconds"] - once["late_chunks_mean_rope_seconds"]) / \
        every["late_chunks_mean_seconds"]
    report = {
        "benchmark": "rotated-keys", "model": scenario.name, "frames": frames, "seed": seed, "device": str(device),
        "modes": per, "late_chunk_ratio": round(ratio, 4), "late_chunk_drop": round(1 - ratio, 4),
        "rerotation_share": round(share, 4),
        "relative_difference_of_videos": float((a - b).norm() / b.norm()),
        "scenario": scenario.notes, "machine": machine(),
        "definitions": {"late_chunks_mean_seconds": "mean seconds of the last quarter of the chunks",
                        "late_chunk_ratio": "rotated once / rotated every chunk",
                        "late_chunk_drop": "1 - late_chunk_ratio",
                        "rerotation_share": "late chunks' RoPE seconds rotated every chunk minus rotated once, over "
                                            "the late chunk seconds rotated every chunk: the drop to expect"},
    }
    write_json(out_dir / "rotated_keys.json", report)
    line_plots(out_dir / "rotated_keys.png", [
        {"title": "dense-global seconds per chunk", "xlabel": "chunk", "ylabel": "s",
         "series": {n: (list(range(len(m["seconds_each_chunk"]))), m["seconds_each_chunk"]) for n, m in per.items()}},
    ], title=f"keys rotated once vs every chunk: {scenario.name}, {frames} latent frames")
    print(f"late chunks: rotated once {once['late_chunks_mean_seconds']:.4f} s, rotated every chunk "
          f"{every['late_chunks_mean_seconds']:.4f} s (ratio {ratio:.3f}, a drop of "
          f"{1 - ratio:.1%}; re-rotating was {share:.1%} of a late chunk); videos differ by "
          f"{report['relative_difference_of_videos']:.2e} (relative)")
    return report
