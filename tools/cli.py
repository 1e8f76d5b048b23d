"""The ``fastar`` command line (also ``python -m comfyui_fastar``).

Subcommands: ``info`` (what a checkpoint is), ``generate`` (a long latent video from a checkpoint),
``demo`` (the bundled model, FAST-AR against dense), ``bench`` (figures as JSON and plots), ``calibrate``
(per-layer AnnSA recall), ``train-demo`` (re-train the bundled model), ``gpu-check`` (on a GPU machine: backend
correctness and the GPU benches within a deadline).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..fastar_core.errors import FastARError


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate a long latent video from a Wan2.1 AR checkpoint")
    p.add_argument("--checkpoint", required=True, help=".safetensors or .pt of the Self-Forcing family")
    p.add_argument("--frames", type=int, required=True, help="latent frames to generate (4 video frames each)")
    p.add_argument("--height", type=int, default=480, help="video height in pixels (multiple of 16)")
    p.add_argument("--width", type=int, default=832, help="video width in pixels (multiple of 16)")
    p.add_argument("--cond", help="safetensors file holding the text conditioning [1, L, text_dim]")
    p.add_argument("--out", required=True, help="output folder (latent.safetensors, stats.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedule", default="self-forcing",
                   help="self-forcing, rolling-forcing, causvid, krea, causal-forcing++-1step, "
                        "causal-forcing++-2step, or comma-separated sigmas")
    p.add_argument("--first-schedule", default=None,
                   help="the first chunk's own step list (a preset or sigmas; Causal Forcing++'s first frame takes "
                        "self-forcing, which its presets already choose)")
    from ..fastar_core.sampler import MODE_CHOICES

    p.add_argument("--mode", default="auto", choices=list(MODE_CHOICES),
                   help="rolling = Rolling Forcing window; auto: rolling for the rolling-forcing schedule, else chunk")
    p.add_argument("--frames-per-block", type=int, default=3)
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="cast the weights")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--lora", help="LongLive-style PEFT LoRA file merged into the weights")
    from .args import add_cache_arguments, add_fastar_arguments

    add_cache_arguments(p)
    add_fastar_arguments(p)


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes end as one line ``fastar: error: ...`` with exit code 2, like every other bad input."""

    def error(self, message):
        hint = f" (see {self.prog} --help)"
        self.exit(2, f"fastar: error: {message}{hint}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="fastar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="describe a Wan2.1 checkpoint")
    p.add_argument("checkpoint")
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_generate(sub)

    p = sub.add_parser("demo", help="generate with the bundled demo model, FAST-AR against dense")
    p.add_argument("--out", default="fastar-demo", help="output folder")
    p.add_argument("--frames", type=int, default=None, help="latent frames (default: the demo's length)")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("bench", help="benchmarks (JSON + PNG)")
    p.add_argument("what", choices=["rollout", "pareto", "cost-model", "attention", "kernels", "gpu-rollout",
                                   "bias-fold", "matcher", "rotated-keys"])
    p.add_argument("--out", required=True)
    p.add_argument("--frames", type=int, default=240, help="latent frames (rollout)")
    p.add_argument("--model", default="demo", choices=["demo", "wan-shapes"], help="rollout model")
    p.add_argument("--modes", default=None, help="comma-separated subset of modes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=None,
                   help="rollout: rounds of every mode, median per chunk (default 3 for demo, 1 for wan-shapes)")
    p.add_argument("--capacities", default=None, help="pareto: comma-separated capacities in frames, sink included")
    p.add_argument("--thresholds", default=None, help="pareto: comma-separated TempCache merge thresholds")
    p.add_argument("--variants", default=None,
                   help="pareto: TempCache merge rules to add (rotated, spread6, weighted, when-full)")
    p.add_argument("--budget", type=float, default=None, help="time budget in seconds (GPU scripts)")

    p = sub.add_parser("calibrate", help="measure per-layer AnnSA recall and write the layer list")
    p.add_argument("--checkpoint", default=None, help="model to calibrate (default: the demo model)")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--frames", type=int, default=24)
    p.add_argument("--min-recall", type=float, default=None)
    p.add_argument("--fraction", type=float, default=0.7, help="share of layers to sparsify")

    # Listed here for --help; its options live with the trainer (see main).
    sub.add_parser("train-demo", help="train the bundled demo model (fastar train-demo --help)")
    from .gpu_check import add_parser as add_gpu_check

    add_gpu_check(sub)
    return parser


def cmd_info(args) -> int:
    from ..fastar_core.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint, check_finite=True)
    summary = ckpt.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    cfg = summary["config"]
    print(f"file        {summary['path']}")
    print(f"family      {summary['family']} (Wan2.1 T2V architecture)")
    print(f"config      dim {cfg['dim']}, {cfg['num_heads']} heads x {summary['head_dim']}, "
          f"{cfg['num_layers']} layers, "
          f"ffn {cfg['ffn_dim']}, in/out {cfg['in_dim']}/{cfg['out_dim']} ch, text {cfg['text_dim']}, "
          f"patch {tuple(cfg['patch_size'])}")
    print(f"dtype       {summary['dtype']}" + (f" (the file mixes {_dtype_counts(summary['file_dtypes'])}; "
                                                   f"loaded as {summary['dtype']})" if ckpt.mixed_dtypes else ""))
    print(f"parameters  {summary['parameters']:,}")
    print(f"weights     from '{summary['container']}', prefix stripped: {summary['prefix_stripped']}")
    if summary["causal_ar_marker"] is not None:
        print(f"metadata    causal_ar = {summary['causal_ar_marker']}")
    return 0


def _dtype_counts(counts: dict) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train-demo"]:
        from .demo.train import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        if args.command == "info":
            return cmd_info(args)
        if args.command == "generate":
            from .generate import run_generate

            return run_generate(args)
        if args.command == "demo":
            from .demo_command import run_demo

            return run_demo(Path(args.out), frames=args.frames, seed=args.seed)
        if args.command == "gpu-check":
            from .gpu_check import run_from_args

            return run_from_args(args)
        if args.command == "bench":
            from .bench import run_bench

            return run_bench(args)
        if args.command == "calibrate":
            from .calibrate import run_calibrate

            return run_calibrate(args)
    except FastARError as e:
        print(f"fastar: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # the machine refused: a full disk, a permission, a vanished file
        print(f"fastar: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except MemoryError:
        print("fastar: error: out of memory; use fewer --frames, a smaller size or a bounded cache", file=sys.stderr)
        return 2
    return 1


def _one_line(text: str) -> str:
    return " ".join(text.split())
