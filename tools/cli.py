"""The ``fastar`` command line (also ``python -m comfyui_fastar``).

Subcommands: ``info`` (what a checkpoint is), ``generate`` (a long latent video from a checkpoint),
``demo`` (the steered world model: dense-global, the window and TempCache; ``--world sprites``: the sprite model,
FAST-AR against dense), ``play`` (steer the world model live in a browser),
``bench`` (figures as JSON and plots), ``calibrate``
(per-layer AnnSA recall), ``train-demo`` (re-train the bundled model), ``gpu-check`` (on a GPU machine: backend
correctness and the GPU benches within a deadline).

Exit codes: 0 done; 2 bad input or a refusing machine, with one ``fastar: error:`` line on stderr (usage mistakes
included); 130 interrupted (Ctrl-C, also while the command is still importing), with one line too.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Only what handles the end of a command is imported before it starts (see ``main``).
from .console import (
    HEAVY_MODULES,
    end_at_once,
    fill_closed_descriptors,
    forgiving_stdout,
    import_holding_interrupts,
    port_error,
    report_error,
)


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate a long latent video from a Wan2.1 AR checkpoint")
    p.add_argument("--checkpoint", required=True, help=".safetensors or .pt of the Self-Forcing family, a Matrix-Game "
                                                       "2.0 .safetensors, or a LingBot-World 2.0 model folder")
    p.add_argument("--frames", type=int, required=True, help="latent frames to generate (4 video frames each)")
    p.add_argument("--height", type=int, default=None,
                   help="video height in pixels (multiple of 16; default: the model's own, 480 for Wan2.1)")
    p.add_argument("--width", type=int, default=None,
                   help="video width in pixels (multiple of 16; default: the model's own, 832 for Wan2.1)")
    p.add_argument("--cond", help="safetensors file holding the text conditioning [1, L, text_dim]")
    p.add_argument("--actions", help="action script (JSON or lines: a timeline of keys and mouse moves in seconds) "
                                     "steering a Matrix-Game 2.0 checkpoint, or keys moving LingBot-World 2.0's "
                                     "camera (variant lingbot); see fastar_core/rollout/action_script.py")
    p.add_argument("--camera", help="camera path steering a LingBot-World 2.0 checkpoint: a folder holding poses.npy "
                                    "[frames, 4, 4] (camera-to-world, OpenCV) and intrinsics.npy [frames, 4] (fx fy "
                                    "cx cy at 480x832), the release's examples/ format")
    p.add_argument("--out", required=True, help="output folder (latent.safetensors, stats.json)")
    p.add_argument("--seed", type=int, default=0, help="noise seed, 0..2^63-1 (the same seed gives the same video)")
    p.add_argument("--schedule", default=None,
                   help="self-forcing (the default for Wan2.1), rolling-forcing, causvid, krea, "
                        "causal-forcing++-1step, causal-forcing++-2step, matrix-game (Matrix-Game 2.0's own is its "
                        "default), or comma-separated sigmas")
    p.add_argument("--first-schedule", default=None,
                   help="the first chunk's own step list (a preset or sigmas; Causal Forcing++'s first frame takes "
                        "self-forcing, which its presets already choose)")
    from ..fastar_core.rollout.sampler import FRAMES_PER_BLOCK, MODE_CHOICES

    p.add_argument("--mode", default="auto", choices=list(MODE_CHOICES),
                   help="rolling = Rolling Forcing window; auto: rolling for the rolling-forcing schedule, else chunk")
    p.add_argument("--frames-per-block", type=int, default=FRAMES_PER_BLOCK,
                   help=f"latent frames denoised together per chunk (default {FRAMES_PER_BLOCK}: Self-Forcing's; 1 for "
                        "Causal Forcing; left out, a LingBot-World 2.0 model takes its own 4)")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="cast the weights")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--lora", help="LongLive-style PEFT LoRA file merged into the weights")
    _add_weights_entry(p)
    from .args import add_cache_arguments, add_fastar_arguments

    add_cache_arguments(p)
    add_fastar_arguments(p)


def _add_weights_entry(p) -> None:
    from ..fastar_core.files.wan_checkpoint import WEIGHTS_ENTRY_CHOICES

    p.add_argument("--weights-entry", default="auto", choices=list(WEIGHTS_ENTRY_CHOICES),
                   help="which weights of a training .pt holding several (auto: the one the model's own inference "
                        "loads, by the family the file name says: generator for LongLive and CausVid, "
                        "generator_ema for Self-Forcing, Rolling Forcing and Causal Forcing; generator_ema when the "
                        "name says no family)")


def build_parser():
    from .parsing import OneLineParser

    parser = OneLineParser(prog="fastar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="describe a checkpoint (Wan2.1 family, Matrix-Game 2.0 and its variant, "
                                    "LingBot-World 2.0 and its size)")
    p.add_argument("checkpoint", help=".safetensors or .pt checkpoint, or a LingBot-World 2.0 model folder")
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_weights_entry(p)
    _add_generate(sub)

    p = sub.add_parser("demo", help="the steered world model: dense-global, the window and TempCache at the same "
                                    "memory along a path that comes back (--world sprites: the sprite demo)")
    p.add_argument("--out", default=None, help="output folder (default fastar-demo/world, or fastar-demo/sprites)")
    p.add_argument("--frames", type=int, default=None, help="latent frames to generate after the given start "
                                                            "(default 240; at most 2400)")
    p.add_argument("--seed", type=int, default=0, help="noise seed, 0..2^63-1")
    p.add_argument("--world", default="steer", choices=["steer", "sprites"],
                   help="steer: the keyboard-steered world model along an out-around-and-back path (the default); "
                        "sprites: the bundled text-to-video sprite demo, FAST-AR against dense")
    p.add_argument("--weights", default=None, help="--world steer: a steered-world .safetensors (default: the "
                                                    "bundled world model)")
    p.add_argument("--map-seed", type=int, default=1, help="--world steer: which map")

    p = sub.add_parser("play", help="steer the world model live in a browser page on 127.0.0.1")
    p.add_argument("--weights", default=None, help="a steered-world demo .safetensors (fastar train-demo --world "
                                                    "steer; default: the bundled world model)")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port)")
    p.add_argument("--map-seed", type=int, default=1, help="which map to explore")
    p.add_argument("--seed", type=int, default=0, help="noise seed, 0..2^63-1")
    p.add_argument("--mode", default="fastar", choices=["fastar", "dense"], help="attention and cache at the start")
    p.add_argument("--max-fps", type=float, default=30.0, help="frames shown per second at most (0: no limit)")

    p = sub.add_parser("bench", help="benchmarks (JSON + PNG)")
    p.add_argument("what", choices=["rollout", "pareto", "cost-model", "attention", "kernels", "gpu-rollout",
                                   "bias-fold", "matcher", "rotated-keys", "frame-rate", "world-ceiling", "launches",
                                   "gpu-modes", "lingbot-cap", "world-memory", "live-world", "world-continuation"],
                   help="which benchmark (kernels, gpu-rollout and gpu-modes need a GPU)")
    p.add_argument("--out", required=True, help="output folder (JSON and PNG)")
    p.add_argument("--frames", type=int, default=None,
                   help="latent frames (default 240; lingbot-cap: 3000, the claim's length; world-continuation: 120)")
    p.add_argument("--model", "--scenario", dest="model", default="demo",
                   choices=["demo", "wan-shapes", "longlive2-5b", "lingbot", "world"],
                   help="rollout model: the demo, random weights at Wan2.1-1.3B shapes, or at Wan2.2-TI2V-5B shapes "
                        "with LongLive 2.0's rollout (blocks of 8, UniPC, window 32 sink 8; rollout only), or at "
                        "LingBot-World 2.0's with its rollout (blocks of 4, window 18 sink 6, a camera path; rollout "
                        "only), or the steered world model on a revisiting path (pareto only)")
    p.add_argument("--weights", default=None, help="--model world, world-memory, world-continuation and live-world: "
                                                   "a steered-world .safetensors (default: the bundled world model)")
    p.add_argument("--modes", default=None, help="rollout: comma-separated subset of modes")
    p.add_argument("--map-seeds", default=None, help="world-memory and world-continuation: comma-separated maps "
                                                      "(default the world bar's 1,2,3,4,5,6; world-continuation: "
                                                      "the held-out 7,8,9,10)")
    p.add_argument("--seed", type=int, default=0, help="noise seed, 0..2^63-1")
    p.add_argument("--repeats", type=int, default=None,
                   help="rollout: rounds of every mode, median per chunk (default 3 for demo, 1 for wan-shapes); "
                        "frame-rate and live-world: rounds, least CPU time per chunk (default 5); lingbot-cap: rounds, "
                        "least relative cost per chunk (default 5; --frames 3000 for the claim); "
                        "world-ceiling: perfect draws per seed (default 20)")
    p.add_argument("--capacities", default=None, help="pareto: comma-separated capacities in frames, sink included")
    p.add_argument("--thresholds", default=None, help="pareto: comma-separated TempCache merge thresholds")
    p.add_argument("--variants", default=None,
                   help="pareto: TempCache merge rules to add (rotated, spread6, weighted, when-full)")
    p.add_argument("--budget", type=float, default=None, help="time budget in seconds (GPU scripts)")

    p = sub.add_parser("calibrate", help="measure per-layer AnnSA recall and write the layer list")
    p.add_argument("--checkpoint", default=None, help="model to calibrate (default: the demo model)")
    p.add_argument("--out", required=True, help="JSON file to write (read by --layers auto --calibration)")
    p.add_argument("--frames", type=int, default=24, help="latent frames of the measuring rollout")
    p.add_argument("--min-recall", type=float, default=None,
                   help="keep every layer whose mean recall reaches this (0..1) instead of --fraction")
    p.add_argument("--fraction", type=float, default=0.7, help="share of layers to sparsify (0..1]")

    # Listed here for --help; its options live with the trainer (see main).
    sub.add_parser("train-demo", help="train the bundled demo model (fastar train-demo --help)")
    from .gpu_check import add_parser as add_gpu_check

    add_gpu_check(sub)
    return parser


def cmd_info(args) -> int:
    from ..fastar_core.files.model_files import is_lingbot, is_matrix_game_file
    from ..fastar_core.files.wan_checkpoint import load_checkpoint

    if is_lingbot(args.checkpoint):
        return _info_lingbot(args)
    if is_matrix_game_file(args.checkpoint):
        return _info_matrix_game(args)
    ckpt = load_checkpoint(args.checkpoint, check_finite=True, weights_entry=args.weights_entry)
    summary = ckpt.summary()
    if args.json:
        import json

        print(json.dumps(summary, indent=2))
        return 0
    cfg = summary["config"]
    print(f"file        {summary['path']}")
    print(f"family      {summary['family']} ({summary['architecture']} architecture)")
    print(f"config      dim {cfg['dim']}, {cfg['num_heads']} heads x {summary['head_dim']}, "
          f"{cfg['num_layers']} layers, "
          f"ffn {cfg['ffn_dim']}, in/out {cfg['in_dim']}/{cfg['out_dim']} ch, text {cfg['text_dim']}, "
          f"patch {tuple(cfg['patch_size'])}")
    print(f"dtype       {summary['dtype']}" + (f" (the file mixes {_dtype_counts(summary['file_dtypes'])}; "
                                                   f"loaded as {summary['dtype']})" if ckpt.mixed_dtypes else ""))
    print(f"parameters  {summary['parameters']:,}")
    print(f"weights     from '{summary['container']}' ({summary['weights_choice']}), "
          f"prefix stripped: {summary['prefix_stripped']}")
    if summary["causal_ar_marker"] is not None:
        print(f"metadata    causal_ar = {summary['causal_ar_marker']}")
    return 0


def _info_matrix_game(args) -> int:
    """A Matrix-Game 2.0 checkpoint: its variant (from its sizes) and the keys it is steered by."""
    from ..fastar_core.families.matrix_game.checkpoint import load_matrix_game_checkpoint
    from ..fastar_core.rollout.action_script import VARIANTS

    if args.weights_entry != "auto":
        from ..fastar_core.errors import FastARError

        raise FastARError(f"--weights-entry {args.weights_entry}: a Matrix-Game 2.0 checkpoint holds one set of "
                          "weights; drop --weights-entry")
    ckpt = load_matrix_game_checkpoint(args.checkpoint)
    summary = ckpt.summary()
    cfg = ckpt.config
    summary["schedule"] = cfg.schedule_name
    spec = VARIANTS.get(cfg.variant)
    if spec is not None:
        summary["keys"] = {k.letter: k.name for k in spec.keys}
    if args.json:
        import json

        print(json.dumps(summary, indent=2))
        return 0
    a = cfg.action
    print(f"file        {summary['path']}")
    print(f"family      Matrix-Game 2.0, variant {cfg.variant} (sizes from {summary['config_from']})")
    print(f"config      dim {cfg.dim}, {cfg.num_heads} heads x {cfg.head_dim}, {cfg.num_layers} layers, ffn "
          f"{cfg.ffn_dim}, in/out {cfg.in_dim}/{cfg.out_dim} ch, CLIP context {cfg.clip_dim}, patch "
          f"{tuple(cfg.patch_size)}")
    print(f"actions     {a.keyboard_dim_in} keys{', mouse [pitch, yaw]' if a.enable_mouse else ', no mouse'}, "
          f"in layers {_ranges(summary['action_layers'])}")
    if spec is not None:
        print(f"keys        {spec.valid_keys()} (action scripts: --actions)")
    print(f"rollout     window of {cfg.local_attn_size} latent frames, no sink; schedule {cfg.schedule_name}")
    print(f"dtype       {summary['dtype']}")
    print(f"parameters  {summary['parameters']:,}")
    print(f"prefix      stripped: {summary['prefix_stripped']}")
    return 0


def _info_lingbot(args) -> int:
    """A LingBot-World 2.0 model folder: its size, its shards, and how the pack runs it by default."""
    from ..fastar_core.errors import FastARError
    from ..fastar_core.families.lingbot.checkpoint import load_lingbot_checkpoint
    from ..fastar_core.families.lingbot.rollout import FRAMES_PER_BLOCK, SCHEDULE, default_cache
    from ..fastar_core.rollout.action_script import VARIANTS
    from ..fastar_core.rollout.schedule import get_schedule

    if args.weights_entry != "auto":
        raise FastARError(f"--weights-entry {args.weights_entry}: a LingBot-World 2.0 folder holds one set of weights; "
                          "drop --weights-entry")
    ckpt = load_lingbot_checkpoint(args.checkpoint)
    summary, cfg = ckpt.summary(), ckpt.config
    cache, schedule = default_cache(cfg), get_schedule(SCHEDULE)
    summary.update({"frames_per_block": FRAMES_PER_BLOCK, "cache": cache.to_dict(), "schedule": schedule.to_dict(),
                    "keys": {k.letter: k.name for k in VARIANTS["lingbot"].keys}})
    if args.json:
        import json

        print(json.dumps(summary, indent=2))
        return 0
    print(f"file        {summary['path']} ({summary['shards']} safetensors file{'s' if summary['shards'] > 1 else ''})")
    print(f"family      LingBot-World 2.0, size {cfg.size} (image-to-video, steered by a camera path)")
    print(f"config      dim {cfg.dim}, {cfg.num_heads} heads x {cfg.head_dim}, {cfg.num_layers} layers, ffn "
          f"{cfg.ffn_dim}, in/out {cfg.in_dim}/{cfg.out_dim} ch, text {cfg.text_dim}, camera {cfg.camera_dim}, patch "
          f"{tuple(cfg.patch_size)}")
    print(f"rollout     chunks of {FRAMES_PER_BLOCK}, {cache.describe()}, schedule {SCHEDULE} "
          f"({schedule.num_steps} steps at shift {schedule.shift:g})")
    print(f"steering    --camera FOLDER (poses.npy, intrinsics.npy) or --actions FILE (variant lingbot: "
          f"{VARIANTS['lingbot'].valid_keys()})")
    print(f"dtype       {summary['dtype']}")
    print(f"parameters  {summary['parameters']:,}")
    return 0


def _ranges(layers) -> str:
    if not layers:
        return "none"
    layers = sorted(layers)
    return f"{layers[0]}..{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else \
        ", ".join(map(str, layers))


def _dtype_counts(counts: dict) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def main(argv=None) -> int:
    """Every subcommand, ``train-demo`` included, runs through here: its options are checked before any work,
    and whatever ends it (bad input, a refusing machine, an interrupt) leaves as one ``fastar: error:`` line.

    Called with no ``argv`` it is the process's own entry point (``fastar``, ``python -m comfyui_fastar``): the
    heavy imports (torch, the engine) happen in here, so a Ctrl-C while they load is one line too, and once the
    command has ended a further Ctrl-C no longer interrupts the interpreter's exit."""
    program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    fill_closed_descriptors()
    stdout = forgiving_stdout()
    try:
        if program:  # torch and the engine load here, a Ctrl-C meanwhile held until they have (see console.py)
            import_holding_interrupts(*HEAVY_MODULES, __package__.rsplit(".", 1)[0] + ".fastar_core")
        code = _dispatch(argv)
    except SystemExit:
        _ended(program)
        raise
    except BaseException as e:  # noqa: B036 - an interrupt is reported too, as one line
        _ended(program)
        code = report_error(e)
    finally:
        _ended(program)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        sys.stdout = stdout
    if program and code == 130:  # interrupted: see end_at_once for why the shutdown is skipped
        end_at_once(code)
    parallel = sys.modules.get(__package__.rsplit(".", 1)[0] + ".fastar_core.forward.parallel")
    if parallel is not None:  # a torchrun rank ends here, past a teardown race in torch.distributed
        parallel.end_rank_process(code)
    return code


def _ended(program: bool) -> None:
    """The command is over: the process that runs only it ignores Ctrl-C from here on (its result is decided;
    an interrupt now would only turn the exit into a traceback)."""
    if program:
        import signal

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread
            pass


def _dispatch(argv: list) -> int:
    if argv[:1] == ["train-demo"]:
        from .demo.train_command import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    from . import command_checks

    if args.command == "info":
        return cmd_info(args)
    if args.command == "generate":
        from .generate import run_generate

        return run_generate(args)
    if args.command == "play":
        command_checks.check_play(args)
        # Said before the imports and the model load, which take many seconds on a loaded machine.
        print(f"fastar play: starting (loading {args.weights or 'the bundled world model'}, then serving on "
              f"127.0.0.1:{args.port or 'a free port'})", flush=True)
        from .play import run_play

        try:
            return run_play(args.weights, port=args.port, map_seed=args.map_seed, seed=args.seed, mode=args.mode,
                            max_fps=args.max_fps)
        except OSError as e:
            raise port_error(e, args.port) from None
    from .outputs import removed_if_failed

    # A command that fails leaves no folder it created behind (nor the parents it made for it).
    if args.command == "demo":
        if args.out is None:  # an empty --out is refused by the checks, not taken for the default
            args.out = f"fastar-demo/{'world' if args.world == 'steer' else 'sprites'}"
        command_checks.check_demo(args)
        with removed_if_failed(args.out):
            if args.world == "steer":
                from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
                from .demo_world_command import run_world_demo

                return run_world_demo(Path(args.out), args.weights or WEIGHTS_DIR / WORLD_WEIGHTS_FILE,
                                      frames=args.frames or 240, seed=args.seed, map_seed=args.map_seed)
            from .demo_command import run_demo

            return run_demo(Path(args.out), frames=args.frames, seed=args.seed)
    if args.command == "gpu-check":
        command_checks.check_gpu_check(args)
        from .gpu_check import run_from_args

        with removed_if_failed(args.out):
            return run_from_args(args)
    if args.command == "bench":
        command_checks.check_bench(args)
        from .bench import run_bench

        with removed_if_failed(args.out):
            return run_bench(args)
    if args.command == "calibrate":
        command_checks.check_calibrate(args)
        from .calibrate import run_calibrate

        with removed_if_failed(Path(args.out).parent):
            return run_calibrate(args)
    return 1
