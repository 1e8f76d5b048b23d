"""``fastar generate``'s options checked before anything is loaded, allocated or written.

Each check raises ``FastARError`` with a message that names the option and says what would be valid, or, for
options that contradict each other, which one to drop. The checks that need the model (conditioning width,
layer indices, the rollout's memory) run right after it is read, still before any output exists.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..fastar_core.caches.base import CacheShape
from ..fastar_core.caches.spec import CacheSpec
from ..fastar_core.errors import FastARError
from ..fastar_core.memory import check_fits, format_bytes
from ..fastar_core.rollout.action_script import ActionScript, read_script_file
from ..fastar_core.rollout.video_geometry import PIXEL_STEP, check_pixel_size

MAX_SIDE = 2048  # pixels per side; Wan2.1 is trained at 832x480 (1.3B) and 1280x720 (14B)
MAX_TOKENS_PER_CHUNK = 1 << 17  # beyond this one chunk's dense attention runs for hours on a CPU
MAX_FRAMES_PER_BLOCK = 64
MAX_SEED = 2**63 - 1
TEMPCACHE_OPTIONS = ("threshold", "capacity")
ANNSA_OPTIONS = ("warmup", "layers", "calibration", "annsa_min_keys")
ANN_OPTIONS = ("bits", "tables")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_device(name: str | None) -> torch.device:
    """--device as a torch device that exists on this machine (default: cuda when available)."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise FastARError(f"--device {name!r} is not a device; use cpu or cuda (cuda:N for one GPU)") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise FastARError(f"--device {name}: {device.type} is not supported; use cpu or cuda")
    if not torch.cuda.is_available():
        raise FastARError(f"--device {name}: CUDA is not available here (no GPU, or torch {torch.__version__} "
                          "built without CUDA); use --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise FastARError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 .. cuda:{count - 1}")
    return device


def check_out(out: Path) -> None:
    """--out must be a folder (or not exist yet) whose nearest existing ancestor is a writable folder."""
    if out.exists() and not out.is_dir():
        raise FastARError(f"--out {out} is an existing file; name a folder (it is created if needed)")
    probe = out
    while not probe.exists():
        if probe.is_symlink():
            raise FastARError(f"--out {out}: {probe} is a broken symbolic link")
        probe = probe.parent
    if not probe.is_dir():
        raise FastARError(f"--out {out}: {probe} is a file, not a folder")
    # A real write (a folder made and removed) finds a read-only file system, which os.access misses for root.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fastar-probe-", dir=probe))
    except OSError as e:
        raise FastARError(f"--out {out} cannot be written: {probe} does not accept new files or folders "
                          f"({e.strerror or e}); pick a folder on a writable disk") from None


def _explicit(args, names) -> list:
    return [n for n in names if getattr(args, n, None) is not None]


def uses_tempcache(args) -> bool:
    """Whether this command line's rollout has a TempCache (the engine refuses the contradictory cases)."""
    from ..fastar_core.fastar.config import get_preset

    wants = get_preset(args.fastar).tempcache is not None if args.tempcache is None else args.tempcache
    return args.cache == "tempcache" or (args.cache == "auto" and wants)


def check_contradictions(args) -> None:
    """Options that do nothing under the others are refused, saying which to drop. (Cache policy against
    TempCache is the engine's ``resolve_settings`` to refuse, as for the nodes.)"""
    from ..fastar_core.fastar.config import get_preset

    attention = get_preset(args.fastar).attention
    annsa = attention.annsa if args.annsa is None else args.annsa
    annca = attention.annca if args.annca is None else args.annca
    if args.annca_prune and args.annca is False:
        raise FastARError("--annca-prune prunes AnnCA's prompt tokens, which --no-annca turns off; drop one of them")
    if not uses_tempcache(args):
        for name in _explicit(args, TEMPCACHE_OPTIONS):
            raise FastARError(f"{_flag(name)} is a TempCache setting, but this run has no TempCache (--fastar "
                              f"{args.fastar}, --cache {args.cache}); drop it, or use a preset with TempCache "
                              "(--fastar quality, balanced, fast) or --tempcache")
    for name in _explicit(args, ANNSA_OPTIONS):
        if not annsa:
            raise FastARError(f"{_flag(name)} is an AnnSA setting, but AnnSA is off (--fastar {args.fastar}"
                              f"{', --no-annsa' if args.annsa is False else ''}); drop it or add --annsa")
    for name in _explicit(args, ANN_OPTIONS):
        if not (annsa or annca or args.annca_prune):
            raise FastARError(f"{_flag(name)} sets the hashing of AnnSA/AnnCA, which are off (--fastar "
                              f"{args.fastar}); drop it or add --annsa / --annca")
    if args.calibration is not None and args.layers != "auto":
        raise FastARError("--calibration is read only with --layers auto; add --layers auto or drop --calibration")
    policy = "tempcache" if uses_tempcache(args) else ("global" if args.cache == "auto" else args.cache)
    _check_size_option(args.window, "--window", "window_frames", policy)
    _check_size_option(args.sink, "--sink", "sink_frames", policy)


def _check_size_option(value, flag: str, field: str, policy: str) -> None:
    """A size option the run's cache policy does not read is refused, naming the policies that do."""
    from ..fastar_core.caches.spec import POLICIES

    cls = POLICIES.get(policy)
    if value is None or cls is None or field in cls.size_fields:
        return
    readers = [name for name, c in POLICIES.items() if field in c.size_fields]
    raise FastARError(f"{flag} sizes the {', '.join(readers)} caches, but this run's cache is {policy}, which "
                      f"has no such size: add --cache {readers[0]} or drop {flag}")


def check_sizes(args) -> None:
    """Sizes given on the command line; a side left out is the model's own, filled in and checked once the
    model is read (``fill_model_size``)."""
    for flag, value in (("--height", args.height), ("--width", args.width)):
        if value is None:
            continue
        check_pixel_size(flag, value)
        if value > MAX_SIDE:
            raise FastARError(f"{flag} {value} is too large; at most {MAX_SIDE} pixels (Wan2.1 is trained at "
                              "832x480 and 1280x720)")
    if args.frames < 1:
        raise FastARError(f"--frames {args.frames} is invalid; generate at least 1 latent frame")
    if not 1 <= args.frames_per_block <= MAX_FRAMES_PER_BLOCK:
        raise FastARError(f"--frames-per-block {args.frames_per_block} is invalid; valid: 1..{MAX_FRAMES_PER_BLOCK} "
                          "(3 for Self-Forcing, 1 for Causal Forcing)")
    tokens = min(args.frames, args.frames_per_block) * ((args.height or PIXEL_STEP) // PIXEL_STEP) * \
        ((args.width or PIXEL_STEP) // PIXEL_STEP)
    if tokens > MAX_TOKENS_PER_CHUNK:
        raise FastARError(f"--height {args.height} x --width {args.width} makes {tokens:,} tokens per chunk "
                          f"(at most {MAX_TOKENS_PER_CHUNK:,}); use a smaller size or fewer --frames-per-block")
    if not 0 <= args.seed <= MAX_SEED:
        raise FastARError(f"--seed {args.seed} is out of range; valid: 0..{MAX_SEED}")
    if args.sink is not None and not 0 <= args.sink <= args.frames:
        raise FastARError(f"--sink {args.sink} is invalid; valid: 0..{args.frames} (the --frames generated)")
    if args.window is not None and not 1 <= args.window <= max(args.frames, args.frames_per_block):
        raise FastARError(f"--window {args.window} is invalid; valid: 1..{max(args.frames, args.frames_per_block)} "
                          "(a window longer than the video keeps everything: use --cache global)")


FILE_OPTIONS = ("cond", "lora", "calibration", "actions")


def _regular_file(flag: str, path: str) -> Path:
    if not str(path).strip():
        raise FastARError(f"{flag} is empty; name a file (or leave {flag} out)")
    p = Path(path)
    if not p.exists():
        raise FastARError(f"{flag} {path}: no such file")
    if not p.is_file():
        raise FastARError(f"{flag} {path}: not a regular file")
    return p


def random_conditioning(text_dim: int, seed: int, tokens: int = 512, used: int = 24) -> torch.Tensor:
    """UMT5-shaped stand-in: ``used`` random token rows, the rest zero-padded like a real prompt."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.zeros(1, tokens, text_dim)
    ctx[:, :used] = torch.randn(1, used, text_dim, generator=g) * 0.2
    return ctx


def read_conditioning(path: str) -> torch.Tensor:
    """--cond's tensor ``[1, L, text_dim]`` (key ``context`` or the file's only tensor), checked but for its width,
    which needs the model. Read through the checkpoints' checked loader (header, sizes against the file and
    against memory, no mapping; a .pt with weights_only and its pickle bounded)."""
    from ..fastar_core.files.raw import read_raw
    from ..fastar_core.files.wan_checkpoint import checkpoint_errors

    p = _regular_file("--cond", path)
    try:
        with checkpoint_errors(p):
            tensors, _ = read_raw(p)
    except FastARError as e:
        raise FastARError(f"--cond {e}") from None
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise FastARError(f"--cond {path}: expected a file of tensors (one, or one named 'context')")
    if "context" in tensors:
        ctx = tensors["context"]
    elif len(tensors) == 1:
        ctx = next(iter(tensors.values()))
    else:
        raise FastARError(f"--cond {path}: holds {sorted(map(str, tensors))[:4]}; expected one tensor or one named "
                          "'context'")
    if ctx.ndim == 2:
        ctx = ctx[None]
    if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[1] < 1:
        raise FastARError(f"--cond {path}: conditioning has shape {list(ctx.shape)}; expected [1, tokens, text_dim]")
    if not ctx.is_floating_point():
        raise FastARError(f"--cond {path}: conditioning is {str(ctx.dtype).replace('torch.', '')}; expected floats")
    if not bool(torch.isfinite(ctx).all()):
        raise FastARError(f"--cond {path}: conditioning contains NaN or infinite values")
    return ctx.float()


def read_calibration(path: str) -> list:
    """--calibration's layer list (from `fastar calibrate`), checked but for its range, which needs the model."""
    from ..fastar_core.files.json_files import read_json

    data = read_json(path, f"--calibration {path}")
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                for i in layers):
        raise FastARError(f"--calibration {path}: expected an object with \"layers\": [layer indices], as "
                          "`fastar calibrate` writes it")
    return layers


@dataclass
class Inputs:
    """What the checks read, handed to the run so nothing is read twice."""

    device: torch.device
    context: torch.Tensor | None
    calibration_layers: list | None
    actions: ActionScript | None = None
    camera: object = None  # a LingBot-World 2.0 CameraPath (--camera)


def check_generate(args) -> Inputs:
    """Every check that needs no model: run before the checkpoint is read."""
    device = parse_device(args.device)
    # Left out, the chunk is the family's own (LingBot-World 2.0: 4); the option's default is Self-Forcing's 3.
    given = getattr(args, "argv", None)
    args.frames_per_block_given = given is None or any(
        a == "--frames-per-block" or a.startswith("--frames-per-block=") for a in given)
    check_sizes(args)
    check_contradictions(args)
    from ..fastar_core.rollout.schedule import get_schedule

    # Left out, the schedule is Self-Forcing's for the Wan2.1 families and a world model's own for Matrix-Game.
    args.schedule_given = args.schedule is not None
    if args.schedule is None:
        args.schedule = "self-forcing"
    try:
        get_schedule(args.schedule)
    except FastARError as e:
        raise FastARError(f"--schedule: {e}") from None
    from .args import settings_from_arguments

    settings_from_arguments(args)  # the engine's own checks: contradictions of cache and FAST-AR, ranges
    if not args.out.strip():
        raise FastARError("--out is empty; name an output folder")
    check_out(Path(args.out))
    for name in FILE_OPTIONS:  # each named file exists, said with its option (an empty one is no file either)
        if getattr(args, name, None) is not None:
            _regular_file(_flag(name), getattr(args, name))
    context = read_conditioning(args.cond) if args.cond else None
    layers = read_calibration(args.calibration) if args.calibration else None
    actions = read_actions(args.actions) if getattr(args, "actions", None) else None
    camera = None
    if getattr(args, "camera", None):
        from ..fastar_core.families.lingbot.camera import read_camera_folder

        if actions is not None:
            raise FastARError(f"--camera {args.camera} and --actions {args.actions} both steer the camera; give one")
        camera = read_camera_folder(args.camera)
    return Inputs(device, context, layers, actions, camera)


def read_actions(path: str) -> ActionScript:
    """--actions' script, checked whole (keys of its variant, times, mouse) before anything is loaded."""
    _regular_file("--actions", path)
    return read_script_file(path, f"--actions {path}")


# The pixel size each family generates at when --height/--width are left out (a demo "latent" is 24x24 RGB,
# which the 8x latent convention calls 192x192); every other family is Wan2.1's 832x480.
MODEL_SIZES = {"FastAR-demo": (192, 192)}
DEFAULT_SIZE = (480, 832)


def fill_model_size(args, cfg) -> None:
    """--height/--width left out become the model's own size; then every size check runs on the final values."""
    height, width = MODEL_SIZES.get(cfg.family, DEFAULT_SIZE)
    args.height = height if args.height is None else args.height
    args.width = width if args.width is None else args.width
    check_sizes(args)
    _, ph, pw = cfg.patch_size
    stride = cfg.vae_spatial_stride
    for flag, value, patch in (("--height", args.height, ph), ("--width", args.width, pw)):
        if value % stride or (value // stride) % patch:
            step = stride * patch
            raise FastARError(f"{flag} {value} does not fit this model's {patch}-wide patches; use a multiple of "
                              f"{step} (e.g. {max(step, value // step * step)})")


def check_against_model(args, inputs: Inputs, cfg) -> None:
    if inputs.actions is not None:
        raise FastARError(f"--actions {args.actions}: this checkpoint ({cfg.family}) takes no actions; only "
                          "Matrix-Game 2.0 checkpoints are steered by keys and mouse, LingBot-World 2.0 by keys "
                          "moving its camera; drop --actions")
    if inputs.camera is not None:
        raise FastARError(f"--camera {args.camera}: this checkpoint ({cfg.family}) takes no camera path; only "
                          "LingBot-World 2.0 is steered by one; drop --camera")
    if inputs.context is not None and inputs.context.shape[-1] != cfg.text_dim:
        raise FastARError(f"--cond {args.cond}: conditioning has width {inputs.context.shape[-1]}; this model "
                          f"takes {cfg.text_dim} (shape [1, tokens, {cfg.text_dim}])")
    if inputs.calibration_layers is not None:
        bad = [i for i in inputs.calibration_layers if i >= cfg.num_layers]
        if bad:
            raise FastARError(f"--calibration {args.calibration}: layers {bad[:5]} do not exist; this model has "
                              f"layers 0..{cfg.num_layers - 1} (calibrate this model)")


def rollout_bytes(cfg, frames: int, latent_h: int, latent_w: int, cache_bytes: int, chunk_frames: int) -> dict:
    """The rollout's memory that is sure to be allocated: the output latent, the KV cache (as its policy counts
    it), one chunk's activations (a lower bound: the attention's own buffers come on top)."""
    _, ph, pw = cfg.patch_size
    tokens_per_frame = (latent_h // ph) * (latent_w // pw)
    latent = cfg.in_dim * frames * latent_h * latent_w * 4
    chunk_tokens = chunk_frames * tokens_per_frame
    activations = chunk_tokens * (cfg.ffn_dim + 8 * cfg.dim) * 4
    return {"latent": latent, "cache": cache_bytes, "activations": activations}


def check_rollout_memory(args, cfg, device, cache_bytes: int) -> None:
    stride = cfg.vae_spatial_stride
    parts = rollout_bytes(cfg, args.frames, args.height // stride, args.width // stride, cache_bytes,
                          min(args.frames, args.frames_per_block))
    total = sum(parts.values())
    detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items())
    what = f"--frames {args.frames} at {args.width}x{args.height}"
    # a cache sized by its own option (a huge --capacity or --window) is named first: that is what to change
    sized_by = [f"--{name} {getattr(args, name)}" for name in ("capacity", "window") if getattr(args, name, None)]
    if sized_by and parts["cache"] == max(parts.values()):
        what = f"{' '.join(sized_by)} with {what}"
    check_fits(total, device, f"{what} ({detail})",
               "use fewer --frames, a smaller size or cache, or a bounded cache (--cache window, --fastar quality)")


def planned_cache_bytes(spec: CacheSpec, cfg, args, dtype: torch.dtype) -> int:
    """Bytes the rollout's cache will allocate, as its policy counts them."""
    _, ph, pw = cfg.patch_size
    stride = cfg.vae_spatial_stride
    shape = CacheShape(num_layers=cfg.num_layers, batch=1, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                       grid_hw=(args.height // stride // ph, args.width // stride // pw), dtype=dtype,
                       frames_per_block=args.frames_per_block)
    return spec.policy_class.planned_bytes(spec, shape, args.frames)
