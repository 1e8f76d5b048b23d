"""The options of ``demo``, ``bench``, ``calibrate``, ``gpu-check`` and ``train-demo`` checked before any work.

(``generate``'s are in ``checks.py``.) Each check raises ``FastARError`` naming the option and what is valid, so
a mistake costs nothing: no model is read, no rollout runs and no folder is created first.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..fastar_core.errors import FastARError
from ..fastar_core.memory import check_fits
from .checks import MAX_SEED, check_out

MAX_DEMO_FRAMES = 2400  # ten times the demo's default length; dense attention over more runs for hours
MAX_BENCH_FRAMES = 100_000
LINGBOT_CAP_MIN_FRAMES = 8
MAX_CALIBRATE_FRAMES = 1000


def check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise FastARError(f"--seed {seed} is out of range; valid: 0..{MAX_SEED}")


def check_count(flag: str, value, lo: int, hi: int, why: str = "") -> None:
    if value is not None and not lo <= value <= hi:
        raise FastARError(f"{flag} {value} is invalid; valid: {lo}..{hi:,}" + (f" ({why})" if why else ""))


def check_number(flag: str, value, lo: float, hi: float, open_low: bool = False) -> None:
    """A finite float in [lo, hi] ((lo, hi] with ``open_low``)."""
    if value is None:
        return
    low_ok = value > lo if open_low else value >= lo
    if not (math.isfinite(value) and low_ok and value <= hi):
        bracket = "(" if open_low else "["
        raise FastARError(f"{flag} {value} is invalid; valid: a number in {bracket}{lo:g}, {hi:g}]")


def check_folder(flag: str, out: str) -> Path:
    """An output folder given on the command line: named, and writable (created later, by the command)."""
    if not str(out).strip():
        raise FastARError(f"{flag} is empty; name an output folder")
    path = Path(out)
    try:
        check_out(path)
    except FastARError as e:
        raise FastARError(str(e).replace("--out", flag, 1)) from None
    return path


def check_file_out(flag: str, out: str) -> Path:
    """An output file: named, not a folder, in a writable folder."""
    if not str(out).strip():
        raise FastARError(f"{flag} is empty; name the file to write")
    path = Path(out)
    if path.is_dir():
        raise FastARError(f"{flag} {out} is a folder; name the file to write (e.g. {path / 'calibration.json'})")
    check_folder(flag, str(path.parent) if str(path.parent) else ".")
    return path


def check_input_file(flag: str, value) -> Path | None:
    if value is None:
        return None
    if not str(value).strip():
        raise FastARError(f"{flag} is empty; name a file (or leave {flag} out)")
    path = Path(value)
    if not path.exists():
        raise FastARError(f"{flag} {value}: no such file")
    if not path.is_file():
        raise FastARError(f"{flag} {value}: not a regular file")
    return path


def demo_bytes(frames: int) -> int:
    """What the demo's two rollouts hold at the end: each mode's latent and the dense mode's full cache."""
    from .demo.settings import FRAME_HW, MODEL_CONFIG

    cfg = MODEL_CONFIG
    _, ph, pw = cfg.patch_size
    tokens = (FRAME_HW[0] // ph) * (FRAME_HW[1] // pw)
    latent = cfg.in_dim * frames * FRAME_HW[0] * FRAME_HW[1] * 4
    cache = cfg.num_layers * 2 * frames * tokens * cfg.dim * 4
    return 2 * (latent + cache)


def check_demo(args) -> None:
    check_seed(args.seed)
    if args.frames is not None:
        check_count("--frames", args.frames, 1, MAX_DEMO_FRAMES, "latent frames after the rendered start; "
                    "the default is 240")
        check_fits(demo_bytes(args.frames), "cpu", f"--frames {args.frames}", "use fewer --frames")
    check_folder("--out", args.out)
    if getattr(args, "world", "sprites") == "steer":
        check_input_file("--weights", args.weights)
        check_count("--map-seed", args.map_seed, 0, 2**31 - 1)
        check_world_weights(args.weights)
    elif getattr(args, "weights", None) is not None:
        raise FastARError("--weights is for --world steer; the sprite demo runs the bundled weights")


def check_play(args) -> None:
    check_seed(args.seed)
    check_count("--port", args.port, 0, 65535)
    check_count("--map-seed", args.map_seed, 0, 2**31 - 1)
    check_number("--max-fps", args.max_fps, 0, 1000)
    check_input_file("--weights", args.weights)
    check_world_weights(args.weights)


def check_world_weights(weights) -> None:
    """A steered-world weights file (``--weights``, or the bundled one), its metadata checked entry by entry
    (only the file's header is read): a bad file is refused before any folder is made or port opened."""
    from ..fastar_core.families.demo.weights_file import read_demo_metadata
    from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

    path = Path(weights) if weights is not None else WEIGHTS_DIR / WORLD_WEIGHTS_FILE
    if weights is None and not path.is_file():
        raise FastARError(f"no bundled world model at {path}; pass --weights <a fastar train-demo --world steer "
                          ".safetensors>")
    if "world" not in read_demo_metadata(path):
        raise FastARError(f"--weights {path}: not a steered-world model (a demo model without a world); train one "
                          "with `fastar train-demo --world steer`")


WORLD_BENCHES = ("world-memory", "world-continuation", "live-world")  # benches of a steered-world model (--weights)


def check_bench(args) -> None:
    check_seed(args.seed)
    check_count("--frames", args.frames, 1, MAX_BENCH_FRAMES)
    check_count("--repeats", args.repeats, 1, 1000)
    check_number("--budget", args.budget, 0, 7 * 24 * 3600, open_low=True)
    if args.what in ("kernels", "gpu-rollout", "gpu-modes"):
        import torch

        if not torch.cuda.is_available():
            raise FastARError(f"bench {args.what} needs a CUDA GPU and none is visible; on a CPU run `fastar bench "
                              "rollout`, `fastar bench attention` or the tests")
    if args.what == "lingbot-cap":
        if args.model != "demo":
            raise FastARError(f"--scenario {args.model}: bench lingbot-cap runs its own LingBot-World 2.0 scenario "
                              "(random weights at its shapes); drop --scenario")
        check_count("--frames", args.frames, LINGBOT_CAP_MIN_FRAMES, MAX_BENCH_FRAMES,
                    "a warm-up of two chunks of 4, then the timed chunks")
    # The rollout-only scenarios, and the other benches each runs.
    benches = {"longlive2-5b": ("rollout",), "lingbot": ("rollout", "launches")}.get(getattr(args, "model", None))
    if benches is not None and args.what not in benches:
        also = f" (and bench {', '.join(benches[1:])} on {args.model})" if len(benches) > 1 else ""
        raise FastARError(f"--scenario {args.model} is a rollout scenario; bench {args.what} runs on demo or "
                          f"wan-shapes{also}")
    if args.modes:
        from .bench.scenarios import bench_modes

        known = bench_modes()
        unknown = [m for m in args.modes.split(",") if m not in known]
        if unknown:
            raise FastARError(f"--modes: unknown modes {unknown}; valid: {', '.join(known)}")
    if args.capacities:
        for item in args.capacities.split(","):
            if not item.strip().isdigit() or int(item) < 1:
                raise FastARError(f"--capacities: {item!r} is not a positive whole number of frames")
    if args.thresholds:
        for item in args.thresholds.split(","):
            try:
                value = float(item)
            except ValueError:
                raise FastARError(f"--thresholds: {item!r} is not a number") from None
            check_number("--thresholds", value, 0, 1, open_low=True)
    if args.variants:
        from .bench.pareto import VARIANTS

        unknown = [n for n in args.variants.split(",") if n not in VARIANTS]
        if unknown:
            raise FastARError(f"--variants: unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    if args.model == "world" or args.what in WORLD_BENCHES:
        if args.what not in ("pareto", *WORLD_BENCHES):
            raise FastARError(f"--model world is for `fastar bench pareto` (its revisit figures), not {args.what}")
        if args.what == "world-continuation":
            check_count("--frames", args.frames, 2, MAX_BENCH_FRAMES, "a frame drawn from the true first")
        check_input_file("--weights", args.weights)
        from .demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

        if args.weights is None and not (WEIGHTS_DIR / WORLD_WEIGHTS_FILE).is_file():
            raise FastARError("--model world: no bundled world model; pass --weights <a fastar train-demo --world "
                              "steer .safetensors>")
        check_world_weights(args.weights)
    elif args.weights is not None:
        raise FastARError(f"--weights is for --model world and bench {', '.join(WORLD_BENCHES)}")
    if args.map_seeds is not None:
        if args.what not in ("world-memory", "world-continuation"):
            raise FastARError(f"--map-seeds is for bench world-memory and world-continuation, not {args.what}")
        for item in args.map_seeds.split(","):
            if not item.strip().isdigit():
                raise FastARError(f"--map-seeds: {item!r} is not a map seed; valid: whole numbers 0..2^31-1, "
                                  "comma-separated")
            check_count("--map-seeds", int(item), 0, 2**31 - 1)
    check_folder("--out", args.out)


def check_calibrate(args) -> None:
    check_count("--frames", args.frames, 1, MAX_CALIBRATE_FRAMES)
    check_number("--fraction", args.fraction, 0, 1, open_low=True)
    check_number("--min-recall", args.min_recall, 0, 1)
    check_input_file("--checkpoint", args.checkpoint)
    check_file_out("--out", args.out)


def check_gpu_check(args) -> None:
    check_number("--deadline", args.deadline, 0, 24 * 3600, open_low=True)
    check_folder("--out", args.out)


def check_train(args) -> None:
    check_seed(args.seed)
    check_count("--steps", args.steps, 1, 10_000_000)
    check_number("--minutes", args.minutes, 0, 30 * 24 * 60, open_low=True)
    check_count("--threads", args.threads, 1, 1024)
    check_count("--batch", args.batch, 1, 256)
    check_number("--checkpoint-minutes", args.checkpoint_minutes, 0, 30 * 24 * 60, open_low=True)
    init = check_input_file("--init-from", args.init_from)
    if init is not None and init.suffix.lower() not in (".pt", ".pth", ".safetensors"):
        raise FastARError(f"--init-from {args.init_from}: expected a train_state.pt or a demo .safetensors")
    if init is not None and init.suffix.lower() == ".safetensors":
        from ..fastar_core.families.demo.weights_file import read_demo_metadata

        read_demo_metadata(init)  # its header only: a bad file is refused before the models are built
    check_input_file("--notes", args.notes)
    check_number("--new-region-weight", args.new_region_weight, 0, 1000, open_low=True)
    if args.new_region_weight is not None and args.world != "steer":
        raise FastARError("--new-region-weight weighs the strip a move brings into view: it needs --world steer")
    check_number("--landmark-weight", args.landmark_weight, 0, 1000, open_low=True)
    if args.landmark_weight is not None and args.world != "steer":
        raise FastARError("--landmark-weight weighs the steered world's landmarks: it needs --world steer")
    out = check_folder("--out", args.out)
    if args.report_only:
        from .demo.settings import WEIGHTS_FILE

        if not (out / WEIGHTS_FILE).is_file():
            raise FastARError(f"--report-only evaluates {out / WEIGHTS_FILE}, which does not exist; train into "
                              "--out first")
