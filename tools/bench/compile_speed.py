"""The runner's block pieces eager against ``torch.compile``: one rollout each, warm, and the output difference.

    python -m comfyui_fastar.tools.bench.compile_speed [--backend inductor] [--frames 9] [--repeats 3]

This is what a MODEL carrying ComfyUI's TorchCompileModel setting gets in the pack's samplers. The model is a
random Wan2.1-shaped one (no download); the first compiled rollout includes compile time and is shown apart.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ...fastar_core.forward.runner import CausalRunner
from ...fastar_core.model.wan_config import WanConfig
from ...fastar_core.model.wan_model import random_wan
from ...fastar_core.rollout.sampler import ARSampler, RolloutConfig

SHAPE = WanConfig(dim=512, num_heads=4, num_layers=4, ffn_dim=2048, text_dim=128, freq_dim=256)
LATENT_HW = (16, 16)  # 8x8 tokens per frame


def rollout_seconds(runner: CausalRunner, context: torch.Tensor, frames: int) -> tuple[float, torch.Tensor]:
    cfg = RolloutConfig(num_frames=frames, latent_height=LATENT_HW[0], latent_width=LATENT_HW[1], seed=0)
    start = time.perf_counter()
    latent = ARSampler(runner).generate(context, cfg).latent
    return time.perf_counter() - start, latent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="inductor", help="torch.compile backend (TorchCompileModel offers inductor)")
    p.add_argument("--frames", type=int, default=9, help="latent frames per rollout (chunks of 3)")
    p.add_argument("--repeats", type=int, default=3, help="warm rollouts of each, median shown")
    args = p.parse_args(argv)
    if args.frames < 1 or args.repeats < 1:
        p.error("--frames and --repeats must be at least 1")
    model = random_wan(SHAPE, seed=0)
    context = torch.randn(1, 32, SHAPE.text_dim, generator=torch.Generator().manual_seed(1))
    eager = CausalRunner(model)
    compiled = CausalRunner(model, compile_kwargs={"backend": args.backend})
    torch._dynamo.reset()
    first, compiled_out = rollout_seconds(compiled, context, args.frames)
    eager_times, compiled_times = [], []
    for _ in range(args.repeats):  # in turns, so a busy machine slows both alike
        seconds, eager_out = rollout_seconds(eager, context, args.frames)
        eager_times.append(seconds)
        compiled_times.append(rollout_seconds(compiled, context, args.frames)[0])
    e, c = statistics.median(eager_times), statistics.median(compiled_times)
    diff = (compiled_out - eager_out).abs().max().item()
    print(f"model      : Wan2.1 shape dim {SHAPE.dim}, {SHAPE.num_layers} layers, {LATENT_HW[0]}x{LATENT_HW[1]} "
          f"latent, {args.frames} latent frames, {torch.get_num_threads()} thread(s) on {eager.device}")
    print(f"first      : {first:.2f} s compiled ({args.backend}, compile time included)")
    print(f"eager      : {e:.3f} s per rollout (median of {args.repeats})")
    print(f"compiled   : {c:.3f} s per rollout (median of {args.repeats}), {e / c:.2f}x eager")
    print(f"max |diff| : {diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
