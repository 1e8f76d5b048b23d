"""Reading a demo weights file (the sprite model or the steered world model) without trusting it.

``weights_io.py`` writes the file: the video model under ``model.diffusion_model.``, the text encoder under
``text_encoder.``, a world model's action encoder under ``action_encoder.``, and a ``demo`` metadata entry. Here
it is read back the way the engine reads a checkpoint (``fastar_core/files``), for ``fastar demo``,
``fastar play``, ``fastar bench --model world`` and ``fastar train-demo --init-from``:

1. the ``demo`` metadata, before anything uses it, entry by entry against ``DEMO_FIELDS`` (type and range; every
   size that becomes a loop count or an allocation is bounded there). A new entry is one line in that table;
2. the entries that must agree with the video model (its channels, patch size, text width) once its layout is
   checked (``check_against_model``);
3. the text and action encoders' tensors, their declared shapes compared with the modules the metadata builds
   before a byte is read, and every weight finite (``read_encoder_states``).

A trainer's ``train_state.pt`` (``--init-from``, a resumed run) has its entries in ``STATE_FIELDS`` and its
tensors, optimizer moments included, checked finite the same way (``train_command.read_training_state``).

Every refusal is one ``CheckpointError`` naming the file and the entry.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...fastar_core.errors import CheckpointError
from ...fastar_core.files.metadata_fields import (
    Field,
    Kind,
    any_number,
    items,
    list_of,
    number,
    obj,
    one_of,
    text,
    whole,
)
from .actions import REFERENCE_INPUT
from .actions import STATE_PREFIX as ACTION_PREFIX
from .map_rope import POSITIONS
from .settings import WORLD_KIND
from .steer_world import MAP_SIZE, STEP, VIEW_SIZE
from .text import PAD, STATE_PREFIX, UNK

METADATA_KEY = "demo"
MAX_STEPS = 100  # denoising steps per chunk: Wan's samplers take at most 50; each is one forward per chunk
MAX_SIDE = 1024  # pixels of a frame side: the demo renders whole frames on the CPU


def _vocabulary() -> Kind:
    word = text(64)
    return Kind(lambda v: isinstance(v, list) and 2 <= len(v) <= 100_000 and v[:2] == [PAD, UNK]
                and all(word.fits(w) for w in v),
                f"a list of 2..100,000 words of 1..64 characters, starting with {PAD!r}, {UNK!r}")


def _sigmas() -> Kind:
    level = number(0, 1000, open_low=True)
    return Kind(lambda v: isinstance(v, list) and 1 <= len(v) <= MAX_STEPS and all(level.fits(x) for x in v)
                and all(b < a for a, b in zip(v, v[1:])),
                f"a decreasing list of 1..{MAX_STEPS} numbers in (0, 1] (or timesteps in (1, 1000])")


def _path_shares() -> Kind:
    share = number(0, 1)
    return Kind(lambda v: isinstance(v, dict) and len(v) <= 16 and all(text(64).fits(k) and share.fits(x)
                                                                       for k, x in v.items()),
                "an object of up to 16 path kinds, each a share in [0, 1]")


def _map_size() -> Kind:
    return Kind(lambda v: whole(VIEW_SIZE, 64 * MAP_SIZE).fits(v) and v % STEP == 0,
                f"a multiple of {STEP} in {VIEW_SIZE}..{64 * MAP_SIZE:,} (pixels per side of the map)")


# The ``demo`` metadata entry by entry: parents before their entries; "a.b" is checked when "a" is present.
DEMO_FIELDS = (
    Field("vocabulary", _vocabulary(), "the text encoder's words"),
    Field("text_len", whole(1, 4096), "tokens per prompt"),
    Field("frame_size", list_of(whole(1, MAX_SIDE), 2, 2), "latent frame [height, width]"),
    Field("channels", whole(1, 64), "latent channels"),
    Field("frames_per_block", whole(1, 64), "latent frames per chunk"),
    Field("schedule", _sigmas(), "re-noising sigmas per chunk"),
    Field("context_noise", number(0, 1), "noise level of the clean pass", required=False),
    Field("trained_span_frames", whole(1, 100_000), "frames per training clip"),
    Field("rope_max_distance", whole(0, 100_000), "longest temporal RoPE distance, frames (0: time dropped, a world "
                                                   "placed on its map)"),
    Field("sampler", obj(), "the solver a file asks for instead of its schedule", required=False),
    Field("sampler.solver", one_of("unipc")),
    Field("sampler.steps", whole(1, MAX_STEPS), "UniPC steps per chunk"),
    Field("sampler.shift", number(0, 100, open_low=True), "UniPC sigma shift"),
    Field("training", obj(), "what the file was trained with"),
    Field("training.seed", whole(0, 2**63 - 1)),
    Field("training.steps", whole(0, 10**9)),
    Field("training.wall_seconds", number(0, 1e10)),
    Field("training.recipe", obj()),
    Field("training.total_steps", whole(0, 10**10), required=False),
    Field("training.total_wall_seconds", number(0, 1e11), required=False),
    Field("training.final_loss", any_number(), required=False),
    Field("training.earlier_phases", items(0, 10_000), required=False),
    Field("world", obj(), "a steered-world model's map and inputs", required=False),
    Field("world.kind", one_of(WORLD_KIND)),
    Field("world.map_size", _map_size()),
    Field("world.step_pixels", whole(STEP, STEP), "pixels per move", required=False),
    Field("world.view_size", whole(VIEW_SIZE, VIEW_SIZE), "pixels per side of a view", required=False),
    Field("world.prompt", text(1000)),
    Field("world.inputs", one_of(REFERENCE_INPUT), "what the model reads beside its frame; left out: keys only",
          required=False),
    Field("world.positions", one_of(POSITIONS), "rotary positions are places on the map; left out: on the screen",
          required=False),
    Field("world.path_kinds", _path_shares(), "the training paths' kinds and shares", required=False),
    Field("world.long_return_gap", list_of(whole(1, 100_000), 2, 2), "frames before a long return, [least, most]",
          required=False),
)

# A trainer's ``train_state.pt`` (``--init-from``, a resumed run): the entries besides the state dicts.
STATE_FIELDS = (
    Field("step", whole(0, 10**9), "steps done"),
    Field("elapsed", number(0, 1e10), "seconds trained"),
    Field("losses", list_of(any_number(), 0, 10**8)),
    Field("seed", whole(0, 2**63 - 1)),
    Field("recipe", obj()),
    Field("phases", items(0, 10_000), "earlier runs it continued", required=False),
    Field("phases[]", obj()),
    Field("phases[].steps", whole(0, 10**9)),
    Field("phases[].wall_seconds", number(0, 1e10)),
    Field("phases[].losses", list_of(any_number(), 0, 10**8)),
    Field("world", one_of(WORLD_KIND), required=False),
    Field("map_size", _map_size(), required=False),
)


def read_demo_metadata(path) -> dict:
    """The file's ``demo`` metadata, every entry checked against ``DEMO_FIELDS`` (only the header is read)."""
    from ...fastar_core.files.metadata_fields import check_fields
    from ...fastar_core.files.raw import read_raw
    from ...fastar_core.files.wan_checkpoint import checkpoint_errors

    path = Path(path)
    found = {}

    def checked(_, metadata):
        meta = metadata.get(METADATA_KEY)
        if not isinstance(meta, dict):
            held = "no" if meta is None else "an unreadable"
            raise CheckpointError(path, f"not a demo weights file: its metadata has {held} '{METADATA_KEY}' "
                                        "object (train one with `fastar train-demo`)")
        check_fields(path, meta, DEMO_FIELDS, "demo metadata")
        found["meta"] = meta
        return []

    with checkpoint_errors(path):
        if path.suffix.lower() != ".safetensors":
            raise CheckpointError(path, "a demo weights file is a .safetensors (written by `fastar train-demo`)")
        read_raw(path, before_load=checked)
    return found["meta"]


def check_against_model(path, meta: dict, config) -> None:
    """The metadata's sizes against the video model's checked layout (``config``)."""
    patch = tuple(config.patch_size[1:])
    frame = tuple(meta["frame_size"])
    if any(side % p for side, p in zip(frame, patch)):
        raise CheckpointError(path, f"its demo metadata entry 'frame_size' is {list(frame)}, which the model's "
                                    f"{patch[0]}x{patch[1]} patches do not tile; valid: multiples of {list(patch)}")
    if meta["channels"] != config.out_dim:
        raise CheckpointError(path, f"its demo metadata entry 'channels' is {meta['channels']} but the model "
                                    f"makes {config.out_dim}; valid: {config.out_dim}")
    world = meta.get("world")
    if world is None:
        if config.in_dim != meta["channels"]:
            raise CheckpointError(path, f"its patch embedding takes {config.in_dim} channels, but a demo model "
                                        f"reads its {meta['channels']} latent channels")
        return
    inputs = world.get("inputs")
    if world.get("positions") and inputs != REFERENCE_INPUT:
        raise CheckpointError(path, f"its world entry 'positions' is {world['positions']!r} but its 'inputs' are "
                                    f"{inputs or 'keys only'!r}; a world placed on its map reads {REFERENCE_INPUT!r}")
    # Files before the moved reference frame read the noisy frame alone; the newer ones that and 2 * C + 1 more.
    want = meta["channels"] * (2 if inputs else 1) + (1 if inputs else 0)
    if config.in_dim != want:
        raise CheckpointError(path, f"its patch embedding takes {config.in_dim} channels, but a world model with "
                                    f"inputs {inputs or 'keys only'!r} reads {want}")
    if frame != (VIEW_SIZE, VIEW_SIZE):
        raise CheckpointError(path, f"its demo metadata entry 'frame_size' is {list(frame)}; a steered-world "
                                    f"model sees the world's views, valid: {[VIEW_SIZE, VIEW_SIZE]}")


def encoders(meta: dict, config) -> dict:
    """prefix -> the module its tensors load into (on the meta device: shapes only), as the metadata builds it."""
    from .actions import ActionEncoder
    from .text import TextEncoder

    with torch.device("meta"):
        modules = {STATE_PREFIX: TextEncoder(len(meta["vocabulary"]), config.text_dim, meta["text_len"])}
        if "world" in meta:
            modules[ACTION_PREFIX] = ActionEncoder(config.dim, meta["world"]["map_size"] // STEP,
                                                   meta["frames_per_block"])
    return modules


def check_encoder_shapes(path, infos: dict, meta: dict, config) -> list:
    """The encoders' tensor names, each declared (``infos``: name -> TensorInfo) with the shape the metadata's
    module has; refused before a byte of them is read."""
    want = {prefix + k: tuple(v.shape) for prefix, module in encoders(meta, config).items()
            for k, v in module.state_dict().items()}
    for name, shape in want.items():
        info = infos.get(name)
        if info is None:
            raise CheckpointError(path, f"has no tensor {name}, which its demo metadata implies")
        if tuple(info.shape) != shape:
            raise CheckpointError(path, f"{name} has shape {list(info.shape)} but its demo metadata (vocabulary, "
                                        f"text_len, map_size, frames_per_block) and the model's widths imply "
                                        f"{list(shape)}")
    return list(want)


def read_encoder_states(path, meta: dict, config) -> dict:
    """prefix -> the state dict (float32) of the text encoder and, for a world model, the action encoder: their
    declared shapes checked (``check_encoder_shapes``) before any is read, every value finite."""
    from ...fastar_core.files.raw import read_raw
    from ...fastar_core.files.wan_checkpoint import checkpoint_errors

    path = Path(path)
    with checkpoint_errors(path):
        tensors, _ = read_raw(path, before_load=lambda infos, _: check_encoder_shapes(path, infos, meta, config))
        check_finite_tensors(path, tensors)
    states = {}
    for prefix in encoders(meta, config):
        states[prefix] = {k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)}
    return states


def check_finite_tensors(path, tensors) -> None:
    """Refuse a file whose floating-point tensors (anywhere in nested dicts and lists) hold NaN or infinity: it
    would start training or sampling from them."""
    stack = [("", tensors)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise CheckpointError(path, f"{where or 'a tensor'} holds {bad:,} NaN or infinite values; the weights "
                                            "are damaged")
        elif isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
