"""LingBot-World 2.0's own model and inference loop on CPU, on tiny seeded checkpoints, for the parity tests.

The reference (``robbyant/lingbot-world-v2`` @ ``2648877f``, CC BY-NC-SA 4.0) is never part of this repository:
``tools/extract_references.py`` writes it to ``$FASTAR_REFERENCE_DIR/lingbot/``. Needs ``einops`` and ``scipy``
(the reference's own imports: rearrange, and its camera interpolation) and ``safetensors``.

API (everything fp32, batch 1, on CPU):

``SHAPES``: ``TINY_14B`` (2 heads of 128, 3 layers, 4x6 latents = 6 tokens per frame) and ``TINY_1_3B`` (3 heads
of 128, 2 layers, 4x4 latents): the released head size (RoPE split 44 / 42 / 42) at two head counts.

``write_checkpoint(folder, shape, seed) -> Path``
    Builds the reference ``WanModelFast`` from a tiny ``config.json`` (the release's fields, sizes shrunk), gives it
    seeded weights (``randomize``) and writes the folder ``from_pretrained`` reads: ``transformers/config.json``
    beside shards ``diffusion_pytorch_model-0000i-of-0000n.safetensors`` and their index. Returns the checkpoint
    root (the pipeline's ``ckpt_dir``); the pack loads ``root / "transformers"``.

``turning_path(video_frames, seed) -> (poses [N, 4, 4], intrinsics [N, 4])``: float32 as the release's examples,
    a camera that walks forward at a varying speed, strafes, and turns left and right and up and down.

``run_reference(root, inputs, *, local_attn_size=18, sink_size=6, noise_draws, frame_num=None) -> Rollout``
    Runs ``WanI2VCausal.generate`` (``infer_mode="causal_fast"``: ``_generate_causal_fast``) as ``generate.py``
    does, with the camera folder written from ``inputs``' poses and intrinsics (``poses.npy``,
    ``intrinsics.npy``), the prompt's features served from the pipeline's own T5 cache, the start image's latents
    from the VAE stand-in. ``Rollout.latents`` is ``[1, 16, T, h, w]``; ``Rollout.plucker`` the camera input the
    pipeline built (``[1, 384, T, h, w]``); ``Rollout.freq_rows`` its RoPE table's length.

Noise: the pipeline draws the initial noise ``[16, T, h, w]`` first, then one ``[16, 3, h, w]`` per step after the
first of every chunk, all from one generator. ``torch.randn`` is served, in that order, the given initial noise
and then the pack's own re-noise draws (``reference_harness.record_pack_noise``); the counts must match.

Stand-ins (each for a CUDA-only or IO part; none touches the math of a forward or of the loop):
- ``flash_attn`` absent: ``wan.modules.attention``'s ``attention``/``flash_attention`` are fp32 SDPA (the published
  path casts q, k, v to bf16 for the CUDA kernels);
- ``torch.amp.autocast('cuda', ...)`` in the model and the pipeline: on a CPU-only torch it is disabled (a
  warning); everything runs in fp32 anyway;
- ``torch.device(f"cuda:{device_id}")`` in the pipeline's constructor: rewritten to the CPU;
- ``diffusers``: ``ModelMixin.from_pretrained(dir, subfolder)`` builds the class from ``<dir>/<subfolder>/
  config.json`` (unknown keys dropped, as diffusers does) and loads the safetensors shards its index lists,
  strictly, in fp32 (the pipeline asks for bf16); the scheduler's ``register_to_config`` records the
  constructor's arguments as ``config``;
- the wan ``configs`` (``easydict``) are read through a small ``EasyDict``; ``param_dtype`` set to fp32 (the
  release casts the camera input and the caches to bf16);
- the T5 encoder is a placeholder (the prompt's features are put in the pipeline's own T5 cache, keyed as it keys
  them); the VAE's ``encode`` returns the given start-image latents (checking the video it is handed: the image
  then ``F - 1`` zero frames), its ``decode`` returns the latents; ``torchvision``'s ``to_tensor`` takes a tensor
  image as it is; ``tqdm`` is the iterable where it is not installed;
- package ``__init__`` files are not executed (they import the T5 encoder, tokenizers, VAE).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import reference_harness as rh
import torch

REFERENCE_NAME = "lingbot"
RUN_FAST_CHUNK = 4  # generate.py's --chunk_size default, which run_fast.sh leaves (test_lingbot_reference checks)
SUBFOLDER = "transformers"
PROMPT = "a lakeside path at dusk"


@dataclass(frozen=True)
class TinyShape:
    name: str
    dim: int
    num_heads: int
    num_layers: int
    ffn_dim: int
    latent_hw: tuple
    freq_dim: int = 32
    text_len: int = 32
    text_dim: int = 4096  # never in config.json (ignore_for_config): the class's 4096 holds

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def tpf(self) -> int:
        return (self.latent_hw[0] // 2) * (self.latent_hw[1] // 2)

    @property
    def pixels(self) -> tuple:
        return self.latent_hw[0] * 8, self.latent_hw[1] * 8


TINY_14B = TinyShape("14B-shaped", dim=256, num_heads=2, num_layers=3, ffn_dim=512, latent_hw=(4, 6))
TINY_1_3B = TinyShape("1.3B-shaped", dim=384, num_heads=3, num_layers=2, ffn_dim=768, latent_hw=(4, 4))
SHAPES = (TINY_14B, TINY_1_3B)

# Weight statistics: self-attention heads from broad to focused, value paths scaled up so self- and
# cross-attention carry weight in the residual stream (a wrong cache shows), the camera layers variance-preserving
# so a camera one frame off moves the video.
HEAD_GAINS = {2: (1.4, 2.4), 3: (1.2, 1.8, 2.6)}
SELF_VALUE_GAIN = 3.0
CROSS_QK_GAIN = 2.0
CROSS_VALUE_GAIN = 4.0


def tiny_config(shape: TinyShape) -> dict:
    """The release's ``transformers/config.json`` fields with its sizes shrunk to ``shape``."""
    return {"_class_name": "WanModelFast", "_diffusers_version": "0.35.1", "model_type": "i2v",
            "text_len": shape.text_len, "in_dim": 36, "dim": shape.dim, "ffn_dim": shape.ffn_dim,
            "freq_dim": shape.freq_dim, "out_dim": 16, "num_heads": shape.num_heads,
            "num_layers": shape.num_layers, "local_attn_size": -1, "sink_size": 0, "eps": 1e-06}


# -- stand-ins ------------------------------------------------------------------------------------------------------

def _load_shards(folder: Path) -> dict:
    from safetensors.torch import load_file

    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["diffusion_pytorch_model.safetensors"]
    state: dict = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return state


def _diffusers() -> dict:
    modules = rh.diffusers_scheduler_modules()
    diffusers = types.ModuleType("diffusers")
    models = types.ModuleType("diffusers.models")
    modeling_utils = types.ModuleType("diffusers.models.modeling_utils")

    class ModelMixin(torch.nn.Module):
        @classmethod
        def from_pretrained(cls, path, subfolder=None, torch_dtype=None, **kwargs):
            folder = Path(path) / (subfolder or "")
            config = json.loads((folder / "config.json").read_text())
            accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
            init = {k: v for k, v in config.items() if k in accepted and not k.startswith("_")}
            model = cls(**{**init, **kwargs})
            model.load_state_dict(_load_shards(folder), strict=True)  # fp32 kept (torch_dtype ignored)
            model.config = types.SimpleNamespace(**{**init, **kwargs})
            return model

    modeling_utils.ModelMixin = ModelMixin
    modules.update({"diffusers": diffusers, "diffusers.models": models,
                    "diffusers.models.modeling_utils": modeling_utils})
    return modules


def _easydict() -> types.ModuleType:
    module = types.ModuleType("easydict")

    class EasyDict(dict):
        def __getattr__(self, name):
            try:
                return self[name]
            except KeyError:
                raise AttributeError(name) from None

        def __setattr__(self, name, value):
            self[name] = value

    module.EasyDict = EasyDict
    return module


class VAEStandIn:
    """``Wan2_1_VAE``: ``encode`` returns the given start-image latents (after checking the video it gets),
    ``decode`` the latents as they are."""

    latents: torch.Tensor | None = None  # [16, T, h, w], set before each run

    def __init__(self, *a, **k):
        pass

    def encode(self, videos):
        video = videos[0]
        assert video.shape[0] == 3 and bool((video[:, 1:] == 0).all()), "the image, then zero frames"
        return [VAEStandIn.latents]

    def decode(self, latents):
        return [latents[0]]


def _t5_module() -> types.ModuleType:
    module = types.ModuleType("wan.modules.t5")

    class T5EncoderModel:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            raise RuntimeError("T5 stand-in: the prompt's features are in the pipeline's T5 cache")

    module.T5EncoderModel = T5EncoderModel
    return module


def _vae_module() -> types.ModuleType:
    module = types.ModuleType("wan.modules.vae2_1")
    module.Wan2_1_VAE = VAEStandIn
    return module


def _torchvision() -> dict:
    tv = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.to_tensor = lambda image: image.clone()  # given as a [3, H, W] tensor in [0, 1]
    return {"torchvision": tv, "torchvision.transforms": transforms, "torchvision.transforms.functional": functional}


def reference_spec() -> rh.ReferenceSpec:
    extra = {**_diffusers(), "easydict": _easydict(), "wan.modules.t5": _t5_module(),
             "wan.modules.vae2_1": _vae_module(), **_torchvision()}
    tqdm = rh.tqdm_stub()
    if tqdm is not None:
        extra["tqdm"] = tqdm
    return rh.ReferenceSpec(
        name=REFERENCE_NAME,
        rewrites=[rh.Rewrite("wan.image2video", 'torch.device(f"cuda:{device_id}")', 'torch.device("cpu")')],
        empty_packages=("wan", "wan.modules", "wan.utils", "wan.configs", "wan.distributed"),
        unused_modules=("wan.modules.tokenizers",),
        extra_modules=extra)


@contextlib.contextmanager
def reference():
    """Import context: a namespace with the reference's ``model_fast``, ``image2video``, ``cam_utils`` and the
    A14B ``config`` (gone again on exit)."""
    with rh.reference_modules(reference_spec(), {}):
        yield types.SimpleNamespace(
            model_fast=rh.import_module("wan.modules.model_fast"),
            image2video=rh.import_module("wan.image2video"),
            cam_utils=rh.import_module("wan.utils.cam_utils"),
            config=rh.import_module("wan.configs.wan_i2v_A14B").i2v_A14B)


# -- checkpoints ----------------------------------------------------------------------------------------------------

def randomize(model: torch.nn.Module, shape: TinyShape, seed: int) -> None:
    """Seeded weights for the reference ``WanModelFast`` (the global RNG untouched)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("self_attn.norm_q.weight", "self_attn.norm_k.weight")):
                p.copy_(torch.tensor(HEAD_GAINS[shape.num_heads]).repeat_interleave(shape.head_dim))
            elif name.endswith(("cross_attn.norm_q.weight", "cross_attn.norm_k.weight")):
                p.fill_(CROSS_QK_GAIN)
            elif name.endswith("bias") and p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
            elif p.ndim == 1:  # norm3's affine weight
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                scale = 0.05 if name.endswith("modulation") else min(0.05, fan_in ** -0.5)
                if "cam" in name or "c2ws" in name:
                    scale = fan_in ** -0.5  # variance-preserving: the camera moves the video
                p.copy_(torch.randn(p.shape, generator=g) * scale)
        for block in model.blocks:
            for lin in (block.self_attn.v, block.self_attn.o):
                lin.weight.mul_(SELF_VALUE_GAIN)
            for lin in (block.cross_attn.v, block.cross_attn.o):
                lin.weight.mul_(CROSS_VALUE_GAIN)


def write_checkpoint(folder, shape: TinyShape, seed: int = 0, shard_bytes: int = 1 << 20) -> Path:
    """The release's checkpoint root: ``transformers/config.json`` and sharded safetensors with their index."""
    from safetensors.torch import save_file

    root = Path(folder)
    out = root / SUBFOLDER
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config(shape)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with reference() as ref, torch.random.fork_rng():
        init = {k: v for k, v in config.items() if not k.startswith("_")}
        model = ref.model_fast.WanModelFast(**init)
        randomize(model, shape, seed)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    shards: list[dict] = [{}]
    size = 0
    for k, v in state.items():
        if shards[-1] and size + v.numel() * 4 > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.numel() * 4
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name))
        weight_map.update(dict.fromkeys(shard, name))
    (out / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": sum(v.numel() * 4 for v in state.values())},
                    "weight_map": weight_map}, indent=2))
    return root


# -- inputs ---------------------------------------------------------------------------------------------------------

def _rotation(yaw: float, pitch: float) -> np.ndarray:
    """Camera-to-world rotation (OpenCV axes) of a camera turned by ``yaw`` about the world's vertical (y, down)
    and then ``pitch`` about its own x axis."""
    cy, sy, cp, sp = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch)
    turn = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    tilt = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
    return turn @ tilt


def turning_path(video_frames: int, seed: int = 0) -> tuple:
    """Poses ``[N, 4, 4]`` and intrinsics ``[N, 4]`` (float32, 480x832 pixels): a walk at a varying speed that
    strafes, turns left and right (up to 3 degrees a frame) and looks up and down."""
    rng = np.random.default_rng(seed)
    n = video_frames
    knots = max(2, n // 24)
    at = np.linspace(0, n - 1, knots)
    yaw_rate = np.interp(np.arange(n), at, rng.uniform(-0.05, 0.05, knots))
    pitch_rate = np.interp(np.arange(n), at, rng.uniform(-0.01, 0.01, knots))
    speed = np.interp(np.arange(n), at, rng.uniform(0.0, 0.3, knots))
    strafe = np.interp(np.arange(n), at, rng.uniform(-0.1, 0.1, knots))
    yaw, pitch = np.cumsum(yaw_rate), np.clip(np.cumsum(pitch_rate), -0.6, 0.6)
    poses = np.zeros((n, 4, 4))
    position = np.array([3.0, -1.5, 2.0])
    for i in range(n):
        r = _rotation(yaw[i], pitch[i])
        position = position + r @ np.array([strafe[i], 0.0, speed[i]])
        poses[i, :3, :3], poses[i, :3, 3], poses[i, 3, 3] = r, position, 1.0
    intrinsics = np.tile([502.9, 503.1, 415.8, 239.8], (n, 1))
    return poses.astype(np.float32), intrinsics.astype(np.float32)


@dataclass
class Inputs:
    noise: torch.Tensor  # [1, 16, T, h, w] initial noise
    image_latents: torch.Tensor  # [1, 16, T, h, w] the VAE latents of the start image + 4 (T - 1) black frames
    prompt: torch.Tensor  # [1, L, 4096] UMT5 features of the prompt (unpadded)
    poses: np.ndarray  # [N, 4, 4] float32 camera-to-world per video frame
    intrinsics: np.ndarray  # [N, 4] float32 fx, fy, cx, cy at 480x832

    @property
    def frames(self) -> int:
        return self.noise.shape[2]


def make_inputs(frames: int, shape: TinyShape, seed: int = 0, video_frames: int | None = None) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    h, w = shape.latent_hw
    noise = torch.randn(1, 16, frames, h, w, generator=g)
    image_latents = torch.randn(1, 16, frames, h, w, generator=g)
    prompt = torch.randn(1, 12, shape.text_dim, generator=g)
    poses, intrinsics = turning_path(video_frames or 4 * (frames - 1) + 1, seed + 1)
    return Inputs(noise, image_latents, prompt, poses, intrinsics)


# -- the rollout ----------------------------------------------------------------------------------------------------

@dataclass
class Rollout:
    latents: torch.Tensor  # [1, 16, T, h, w]
    plucker: torch.Tensor  # [1, 384, T, h, w] the camera input the pipeline built
    freq_rows: int  # rows of the model's RoPE table
    timesteps: list = field(default_factory=list)  # the model timesteps it ran, in order


def _channels_first(draw: rh.NoiseDraw, shape):
    """A pack draw ``[1, C, F, H, W]`` as the pipeline asks for it (``[C, F, H, W]``: no batch dimension)."""
    tensor = draw.tensor[0]
    if tensor.shape != torch.Size(shape):
        raise AssertionError(f"noise for chunk {draw.chunk} step {draw.step}: the reference asked for {list(shape)}, "
                             f"the pack drew {list(tensor.shape)}")
    return tensor


def run_reference(root, inputs: Inputs, shape: TinyShape, *, noise_draws: list, local_attn_size: int = 18,
                  sink_size: int = 6, frame_num: int | None = None, folder=None) -> Rollout:
    """``generate.py``'s causal-fast run of the release on ``inputs``, its camera folder written to ``folder``."""
    root = Path(root)
    folder = Path(folder or root / "camera")
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "poses.npy", inputs.poses)
    np.save(folder / "intrinsics.npy", inputs.intrinsics)
    height, width = shape.pixels
    frame_num = 4 * (inputs.frames - 1) + 1 if frame_num is None else frame_num
    image = torch.full((3, height, width), 0.5)
    initial = rh.NoiseDraw(-1, -1, inputs.noise)
    with reference() as ref, torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
        config = ref.config
        config.param_dtype = torch.float32
        config.text_len = shape.text_len
        pipe = ref.image2video.WanI2VCausal(config, str(root), device_id=0, rank=0, t5_cpu=True,
                                            pipe_dtype=torch.float32, local_attn_size=local_attn_size,
                                            sink_size=sink_size, infer_mode="causal_fast")
        pipe._t5_cache[hashlib.sha256(PROMPT.encode("utf-8")).hexdigest()] = [inputs.prompt[0]]
        VAEStandIn.latents = inputs.image_latents[0]
        seen: dict = {"plucker": [], "t": []}

        def record(_module, _args, kwargs):
            seen["plucker"].append(kwargs["dit_cond_dict"]["c2ws_plucker_emb"][0].detach().clone())
            seen["t"].append(float(kwargs["t"].flatten()[0]))

        hook = pipe.model.register_forward_pre_hook(record, with_kwargs=True)
        tape = rh.NoiseTape([initial, *noise_draws], _channels_first)
        try:
            with torch.no_grad(), tape.patched():
                # As generate.py calls it (run_fast.sh): its --chunk_size default, the config's sample_shift, no
                # timesteps_index (generate()'s own default); the release's size and prompt length shrunk.
                latents = pipe.generate(PROMPT, image, str(folder), chunk_size=RUN_FAST_CHUNK, frame_num=frame_num,
                                        max_area=height * width, shift=config.sample_shift, seed=0,
                                        offload_model=False, max_sequence_length=shape.text_len)
        finally:
            hook.remove()
            VAEStandIn.latents = None
        rows = pipe.model.freqs.shape[0]
    # Every chunk's passes see the same camera input: the first pass of each chunk is kept.
    per_chunk = seen["plucker"][::5]
    return Rollout(latents[None].detach().clone(), torch.cat(per_chunk, dim=2), rows, seen["t"])
