"""Matrix-Game 2.0's own model and inference loop on CPU, on tiny seeded checkpoints, for the parity tests.

The reference (``zoheth/Matrix-Game`` @ ``8ed02bd6``, folder ``Matrix-Game-2/``, the upstream release) is never
part of this repository: ``tools/extract_references.py`` writes it to ``$FASTAR_REFERENCE_DIR/matrix_game/``.
Needs ``einops`` (the reference uses it throughout), ``pyyaml`` and ``safetensors``.

API (everything fp32, batch 1, on CPU):

``VARIANTS``: ``universal`` (4 keys + mouse), ``gta_drive`` (2 keys + mouse, window 4), ``templerun`` (7 keys,
no mouse, 4 steps). ``TinyShape`` is a model shape; ``TINY`` (dim 64, 2 heads, 3 layers with the action module
in the first two, 4x6 latents = 6 tokens per frame, action attention 2 heads of 32) is the default, ``TINY_B``
(dim 72, 3 heads of 24, 4 layers, action module in three, 4x4 latents, 4 action heads of 16) the second case;
``SHAPES`` holds both. Every function takes ``shape=`` (the same one for a checkpoint and its runs).

``write_checkpoint(folder, variant, seed=0, shape=TINY, dtype=torch.float32) -> Path``
    Builds the reference ``CausalWanModel`` from a tiny ``config.json`` (the release's, sizes shrunk:
    ``tiny_config``), gives it seeded weights (``randomize``), and writes it as the release ships it:
    ``folder/<release dir>/config.json`` and, beside it, a flat safetensors file whose keys are the wrapper's
    (``model.``-prefixed: ``model.blocks.0.action_model.mouse_mlp.0.weight``, ``model.img_emb.proj.1.bias``,
    ...). Returns the safetensors path; ``path.parent`` is the folder the reference's ``model_config`` names.
    Weight statistics as ``parity_models``' (self-attention heads from broad to focused, value paths scaled up,
    cross-attention sharpened), the action module's layers variance-preserving with its output projections x3
    and the mouse columns of its MLP x10, so actions move the video by 10 to 20 %; the action RMSNorm weights,
    which the reference never reads, are random (0.5 to 1.5), so a port that applies them differs. Measured on a
    24-frame rollout: a query's largest weight averages 22 to 30 % in self-attention (52 to 62 % of the keys
    carry weight), 39 % over the 257 CLIP tokens (11 % carry), 34 to 45 % over the 3 to 6 action tokens.

``make_inputs(variant, frames, seed=0, shape=TINY) -> Inputs`` (and ``random_actions(variant, frames, seed)``)
    Seeded inputs for ``frames`` latent frames: initial noise ``[1, 16, F, h, w]``, the start image's latents
    ``[1, 16, F, h, w]`` (what the VAE gives for the image followed by 4(F-1) zero frames, mid-grey in its
    [-1, 1] pixels: every latent frame non-zero), CLIP-vision features ``[1, 257, 1280]``, keyboard
    ``[1, 1 + 4(F-1), K]`` multi-hot (templerun one-hot) and mouse ``[1, 1 + 4(F-1), 2]`` deltas (None for
    templerun), piecewise constant over random runs of pixel frames, so every chunk sees different actions.

``run_reference(checkpoint, variant, inputs, *, noise_draws=None, renoise_seed=0, shape=TINY) -> Rollout``
    Runs what ``inference.py`` runs: ``WanDiffusionWrapper(**model_kwargs)`` built from the variant's inference
    yaml (``configs/inference_yaml/inference_<variant>.yaml``: its step list, warp, 3 frames per block,
    ``context_noise``, ``timestep_shift``) with ``model_config`` pointing at ``checkpoint.parent``,
    ``load_state_dict(load_file(checkpoint))`` (strict), then ``CausalInferencePipeline.inference(noise,
    conditional_dict, return_latents=True, vae=<stand-in>, mode=variant)`` with ``conditional_dict`` built as
    ``inference.py`` builds it: ``cond_concat`` = 4 mask channels (1 on latent frame 0, 0 after) + the image
    latents, ``visual_context`` = the CLIP features, ``keyboard_cond``/``mouse_cond`` the actions.
    ``Rollout.latents`` is the pipeline's output ``[1, 16, F, h, w]``; ``Rollout.passes`` every model call in
    order (``Pass``: chunk, step index or ``None`` for the clean commit pass, timestep, ``x0``); ``timesteps``
    the warped step list; ``noise_draws`` the re-noise tensors used.

``run_streaming_reference(checkpoint, variant, inputs, typed, ...) -> Rollout``
    The interactive loop (``CausalInferenceStreamingPipeline``, as ``inference_streaming.py`` drives it): before
    each chunk the reference's own ``get_current_action`` reads the keys in ``typed`` (one tuple of answers per
    chunk: universal ``("l", "w")`` = mouse key then keyboard key, gta_drive ``("w a",)``, templerun ``("z",)``)
    and writes that action over the chunk's pixel frames (``chunk_pixel_frames``: 0..8 for chunk 0, then
    12c-3 .. 12c+8); ``Rollout.keyboard``/``mouse`` hold the per-pixel-frame actions it ended with, which
    ``streamed_actions(per_chunk, n)`` rebuilds from one vector per chunk. Same bits as ``run_reference`` on those
    actions (checked).

``cond_concat(image_latents)`` is the 20 channels put after the noisy latent; ``reference(shape)`` the import
context itself (a namespace of the reference's ``causal_model``, ``wrapper`` and ``pipeline`` modules, gone on
exit), for a test that drives one of its modules directly (an ``ActionModule`` of a checkpoint, say).

Re-noising (how to give the pack's noise to the reference): after every step but the last of a chunk, the
reference calls ``torch.randn_like`` once on the chunk's x0 laid out ``[(b f), c, h, w]``. During
``run_reference`` that call is served from a list of ``reference_harness.NoiseDraw`` (``chunk``, ``step``,
``tensor`` in the pack's ``[1, 16, F, h, w]`` layout), in order: chunk 0 step 0, chunk 0 step 1, ..., the draw
for (chunk c, step i) re-noising x0 of step i to step i + 1's timestep. Pass the pack's own draws
(``reference_harness.record_pack_noise``) as ``noise_draws``; without them the harness draws them itself from
``torch.Generator().manual_seed(renoise_seed)``, one ``torch.randn([1, 16, 3, h, w])`` per draw in that order,
and returns them in ``Rollout.noise_draws`` (hand those to the pack's noise source). The number of draws must
match exactly (``NoiseTape`` checks both ways).

What the reference computes, as read in its code and checked by ``tests/test_matrix_game_reference.py`` where
marked (what a port must match):
- Keys, per pixel frame: universal ``[W, S, A, D]`` (forward, back, left, right; multi-hot), gta_drive
  ``[W, S]``, templerun one-hot ``[no move, jump, slide, turn left, turn right, left side, right side]``; mouse
  ``[pitch, yaw]`` (up and right positive; the release's keys give 0.1 per frame), none for templerun. The
  interactive keys (checked): universal mouse ``i k j l u`` = up, down, left, right, none and keyboard
  ``w s a d q``; gta_drive ``w s q`` and ``a d`` (steering on yaw); templerun ``q w s z c a d`` = indices 0, 1,
  2, 3, 4, 5, 6.
- Input of 36 channels per pass: ``cat([noisy latent (16), mask (4), image latents (16)])`` on the chunk's frames;
  the mask is 1 on latent frame 0 and 0 after. No text: the cross-attention context is ``img_emb`` (LayerNorm,
  Linear, GELU, Linear, LayerNorm) of the 257 CLIP tokens, run every pass; its keys and values are cached at
  the first pass. ``cross_attn_norm`` is on (the constructor's default; config.json does not set it).
- Action module (blocks in ``action_config.blocks``) between cross-attention and the FFN, returning
  ``x + mouse(x) + keyboard(x + mouse(x))``. Action windows (checked): latent frame f reads pixel frames
  ``4f-12 .. 4f-1`` (frame 0 repeated before the start), so a chunk (3 frames from f0) is given the actions up
  to pixel frame ``4(f0+2)`` and reads up to ``4(f0+2)-1``: a rollout's last pixel frame is never read.
  Mouse: per spatial location, ``cat(hidden, window)`` with the 12x2 window flattened frame-major ->
  ``mouse_mlp`` -> ``t_qkv`` (q, k, v outermost) -> RMSNorm of q, k without weight (eps 1e-6) -> RoPE ->
  attention over that location's cache -> ``proj_mouse``. Keyboard: ``keyboard_embed`` of every pixel frame
  (the padded ones too), the 12 embeddings of a window concatenated -> ``keyboard_attn_kv`` (k, v outermost):
  one key/value per latent frame, attended by every token (q = ``mouse_attn_q`` of ``x + mouse(x)``) ->
  ``proj_keyboard``. Action RoPE: theta 256, pairs interleaved (real, imaginary adjacent), position = absolute
  latent frame; only the first ``rope_dim_list[0]`` dims of a head turn (its h and w axes are at position 0);
  computed in float32. No causal mask inside a chunk: its 3 frames see each other's action tokens.
- Caches (three per block: self-attention ``[1, L*tpf, heads, hd]`` with keys after RoPE at absolute frames,
  keyboard ``[1, L, action heads, hd]``, mouse ``[tpf, L, action heads, hd]``), ``L = local_attn_size`` (6;
  gta_drive 4), no sink. The first pass of a chunk that does not fit evicts the oldest frames and appends; the
  chunk's later passes (steps 2.. and the clean pass) overwrite the same slots; every pass attends to the whole
  cache, current chunk included: ``L - 3`` context frames (universal, templerun 3; gta_drive 1).
- Schedule (checked): ``FlowMatchScheduler(shift=5, sigma_min=0, extra_one_step=True)`` at 1000 steps, float32;
  the yaml's list warped as ``timesteps[1000 - t]``: universal and gta_drive 1000, 908.8427, 713.9794; templerun
  1000, 937.5, 833.3333, 625. Each chunk starts from its slice of the initial noise; x0 = x_t - sigma * flow (in
  float64, cast back), re-noised to the next step as ``(1 - sigma') x0 + sigma' eps`` (float32); the last step's
  x0 is the chunk's output; then one clean pass at t = ``context_noise`` = 0 commits it to all three caches.
  The model's time input is the float32 timestep per frame.
- Batch 1 only (the keyboard cache keeps ``k[:1]``); the self-attention RoPE table has 1024 frames.

What differs from running the release (each a stand-in for a CUDA-only or IO part; none touches the math):
- ``flash_attn`` (imported unconditionally by ``action_module.py``): ``flash_attn_func`` is fp32 SDPA in the
  same [B, L, H, D] layout; ``wan.modules.attention``'s ``attention``/``flash_attention`` are fp32 SDPA
  (the published path casts to bf16 for the CUDA kernels).
- ``torch.compile`` is the identity while the reference is imported: ``causal_model.py`` and
  ``action_module.py`` compile ``flex_attention`` at import; flex attention is only on their training path.
- ``posemb_layers.py`` builds its RoPE grids on ``torch.cuda.current_device()``: rewritten to ``"cpu"``.
- geometry of the release written into the code, rewritten to the tiny model (each must occur exactly as often
  as listed, so a changed reference fails loudly): 880 tokens per frame (352x640 pixels -> 22x40 patches) in the
  pipeline (``frame_seq_length``), in ``max_attention_size`` and in two asserts of the action module; 30 blocks
  (``num_transformer_blocks``); the self-attention cache shape ``12, 128`` (heads, head size); the action caches'
  ``16, 64`` (action heads, head size). The cross-attention cache's ``257, 12, 128`` is left: it is replaced by
  the computed keys on first use.
- ``diffusers``: ``ModelMixin`` is ``nn.Module`` with ``from_config(folder)`` reading ``config.json`` and
  keeping the constructor's arguments (as diffusers does: unknown keys like ``inject_sample_info`` dropped, the
  ``_``-keys ignored) and a ``dtype`` property; ``ConfigMixin``, ``FromOriginalModelMixin``,
  ``PeftAdapterMixin`` empty; ``register_to_config`` the identity.
- package ``__init__`` files are not executed (they import the T5 encoder, VAE, image2video...); the tokenizer,
  VAE, T5 and CLIP modules are placeholders that raise if used; ``utils.visualize`` (cv2, video export) is
  inert; ``demo_utils.constant.ZERO_VAE_CACHE`` (about 1 GB of zeros for the 352x640 VAE decoder, every entry
  set to None by the pipeline before use) is a list of Nones; the VAE decoder handed to ``inference`` returns
  its input and cache (only the latents are compared).
- the interactive loop: ``input()`` answers from ``typed`` (then "" to its "Continue?"), the ``.cuda()`` of
  the action it reads is dropped (5 occurrences), its video previews (``process_video``) are inert.
- no ``.to(bfloat16)``: ``inference.py`` casts the pipeline and inputs to bf16; everything stays fp32 here.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

import reference_harness as rh
import torch

REFERENCE_NAME = "matrix_game"
TPF_RELEASE = 880  # tokens per latent frame of the release: 352x640 pixels, /8 by the VAE, /2 by the patch
CLIP_TOKENS, CLIP_DIM = 257, 1280


@dataclass(frozen=True)
class Variant:
    name: str
    keyboard_dim: int
    mouse: bool
    local_attn_size: int
    release_dir: str  # the release's folder and file name for this variant's checkpoint
    release_file: str

    @property
    def yaml(self) -> str:
        return f"configs/inference_yaml/inference_{self.name}.yaml"


VARIANTS = {
    "universal": Variant("universal", 4, True, 6, "base_distilled_model", "base_distill.safetensors"),
    "gta_drive": Variant("gta_drive", 2, True, 4, "gta_distilled_model", "gta_keyboard2dim.safetensors"),
    "templerun": Variant("templerun", 7, False, 6, "templerun_distilled_model", "templerun_7dim_onlykey.safetensors"),
}


@dataclass(frozen=True)
class TinyShape:
    dim: int = 64
    num_heads: int = 2
    num_layers: int = 3
    ffn_dim: int = 128
    freq_dim: int = 32
    latent_hw: tuple = (4, 6)
    action_blocks: tuple = (0, 1)  # the release: blocks 0 to 14 of 30
    action_heads: int = 2  # the release: 16 heads of 64
    action_hidden: int = 64  # mouse_hidden_dim = keyboard_hidden_dim (the pipeline sizes both caches alike)
    keyboard_embed: int = 16  # hidden_size (the release: 128)
    rope_dims: tuple = (8, 12, 12)  # sums to the action head size (the release: 8, 28, 28)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def action_head_dim(self) -> int:
        return self.action_hidden // self.action_heads

    @property
    def tpf(self) -> int:
        return (self.latent_hw[0] // 2) * (self.latent_hw[1] // 2)


TINY = TinyShape()
# A second shape, so a constant or an index that only happens to agree at one shape shows at the other: 3 heads of
# 24, 4 layers with the action module in three, 4x4 latents (4 tokens per frame), action attention 4 heads of 16.
TINY_B = TinyShape(dim=72, num_heads=3, num_layers=4, ffn_dim=144, latent_hw=(4, 4), action_blocks=(0, 1, 2),
                   action_heads=4, action_hidden=64, keyboard_embed=8, rope_dims=(4, 6, 6))
SHAPES = (TINY, TINY_B)

# Weight statistics (see tests/parity_models.py for why each gain is there): self-attention heads from broad to
# focused, value paths scaled so self- and cross-attention carry weight in the residual stream.
HEAD_GAINS = {2: (1.0, 1.6), 3: (0.9, 1.3, 1.8)}
SELF_VALUE_GAIN = 3.0
CROSS_QK_GAIN = 2.0
CROSS_VALUE_GAIN = 4.0
# The action module's output projections are zero at the release's init (trained away from it): scaled up so
# actions move the video as a trained model's do; the mouse deltas (about 0.1) enter the mouse MLP beside the
# 64 hidden features, so their columns are scaled up too, or a wrong mouse window would hide under 1e-5.
ACTION_OUT_GAIN = 3.0
MOUSE_INPUT_GAIN = 10.0


def tiny_config(variant: str, shape: TinyShape = TINY) -> dict:
    """The release's ``configs/distilled_model/<variant>/config.json`` with its sizes shrunk to ``shape``."""
    v = VARIANTS[variant]
    action = {
        "blocks": list(shape.action_blocks), "enable_keyboard": True, "enable_mouse": v.mouse,
        "heads_num": shape.action_heads, "hidden_size": shape.keyboard_embed, "img_hidden_size": shape.dim,
        "keyboard_dim_in": v.keyboard_dim, "keyboard_hidden_dim": shape.action_hidden, "patch_size": [1, 2, 2],
        "qk_norm": True, "qkv_bias": False, "rope_dim_list": list(shape.rope_dims), "rope_theta": 256,
        "vae_time_compression_ratio": 4, "windows_size": 3,
    }
    if v.mouse:
        action.update({"mouse_dim_in": 2, "mouse_hidden_dim": shape.action_hidden,
                       "mouse_qk_dim_list": list(shape.rope_dims)})
    return {"_class_name": "CausalWanModel", "_diffusers_version": "0.35.0.dev0", "action_config": action,
            "dim": shape.dim, "eps": 1e-06, "ffn_dim": shape.ffn_dim, "freq_dim": shape.freq_dim, "in_dim": 36,
            "inject_sample_info": False, "local_attn_size": v.local_attn_size, "model_type": "i2v",
            "num_heads": shape.num_heads, "num_layers": shape.num_layers, "out_dim": 16, "sink_size": 0,
            "text_len": 512}


# -- the import context -----------------------------------------------------------------------------------------

def _diffusers() -> dict:
    diffusers = types.ModuleType("diffusers")
    configuration_utils = types.ModuleType("diffusers.configuration_utils")
    loaders = types.ModuleType("diffusers.loaders")
    models = types.ModuleType("diffusers.models")
    modeling_utils = types.ModuleType("diffusers.models.modeling_utils")

    class ConfigMixin:
        pass

    class ModelMixin(torch.nn.Module):
        @classmethod
        def from_config(cls, config, **kwargs):
            if not isinstance(config, dict):
                path = Path(config)
                config = json.loads((path / "config.json" if path.is_dir() else path).read_text())
            accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
            init = {k: v for k, v in config.items() if k in accepted and not k.startswith("_")}
            model = cls(**{**init, **kwargs})
            model.config = types.SimpleNamespace(**init)
            return model

        @property
        def dtype(self):
            return next(self.parameters()).dtype

    configuration_utils.ConfigMixin = ConfigMixin
    configuration_utils.register_to_config = lambda fn: fn
    loaders.FromOriginalModelMixin = type("FromOriginalModelMixin", (), {})
    loaders.PeftAdapterMixin = type("PeftAdapterMixin", (), {})
    modeling_utils.ModelMixin = ModelMixin
    return {"diffusers": diffusers, "diffusers.configuration_utils": configuration_utils,
            "diffusers.loaders": loaders, "diffusers.models": models,
            "diffusers.models.modeling_utils": modeling_utils}


def _flash_attn() -> types.ModuleType:
    module = types.ModuleType("flash_attn")

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, *args, **kwargs):
        return rh._sdpa_attention(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal)

    module.flash_attn_func = flash_attn_func
    return module


def _vae_constant() -> types.ModuleType:
    module = types.ModuleType("demo_utils.constant")
    # As many entries as the release's; the pipeline sets every one to None before the first decode.
    module.ZERO_VAE_CACHE = [None] * 32
    return module


def geometry(shape: TinyShape) -> list:
    tpf, hd = shape.tpf, f"{shape.num_heads}, {shape.head_dim}]"
    pipe, model, action = "pipeline.causal_inference", "wan.modules.causal_model", "wan.modules.action_module"
    return [
        rh.Rewrite(pipe, f"self.frame_seq_length = {TPF_RELEASE}", f"self.frame_seq_length = {tpf}", 2),
        rh.Rewrite(pipe, "self.num_transformer_blocks = 30", f"self.num_transformer_blocks = {shape.num_layers}", 2),
        rh.Rewrite(pipe, "[batch_size, kv_cache_size, 12, 128]", f"[batch_size, kv_cache_size, {hd}", 4),
        rh.Rewrite(pipe, "kv_cache_size, 16, 64]", f"kv_cache_size, {shape.action_heads}, {shape.action_head_dim}]",
                   8),
        rh.Rewrite(model, "15 * 1 * 880 if local_attn_size == -1 else local_attn_size * 880",
                   f"15 * 1 * {tpf} if local_attn_size == -1 else local_attn_size * {tpf}"),
        rh.Rewrite(action, "assert S == 880", f"assert S == {tpf}"),
        rh.Rewrite(action, "assert k.shape[0] == 880", f"assert k.shape[0] == {tpf}"),
        rh.Rewrite("wan.modules.posemb_layers", "device=torch.cuda.current_device()", 'device="cpu"', 3),
    ]


def reference_spec(shape: TinyShape = TINY) -> rh.ReferenceSpec:
    # The interactive loop's key reader moves each action to the GPU.
    on_cpu = rh.Rewrite("pipeline.causal_inference", ").cuda()", ")", 5)
    return rh.ReferenceSpec(
        name=REFERENCE_NAME, rewrites=[*geometry(shape), on_cpu],
        empty_packages=("wan", "wan.modules", "wan.utils", "pipeline", "utils", "demo_utils"),
        inert_modules=("utils.visualize",),
        extra_modules={**_diffusers(), "flash_attn": _flash_attn(), "demo_utils.constant": _vae_constant()})


@contextlib.contextmanager
def reference(shape: TinyShape = TINY):
    """Import context: yields a namespace with the reference's ``pipeline``, ``wrapper`` and ``causal_model``
    modules (gone again on exit)."""
    with rh.reference_modules(reference_spec(shape), {}) as _:
        ns = types.SimpleNamespace(
            causal_model=rh.import_module("wan.modules.causal_model"),
            wrapper=rh.import_module("utils.wan_wrapper"),
            pipeline=rh.import_module("pipeline.causal_inference"))
        yield ns


# -- checkpoints ------------------------------------------------------------------------------------------------

_IGNORED_NORMS = ("img_attn_q_norm.weight", "img_attn_k_norm.weight", "key_attn_q_norm.weight",
                  "key_attn_k_norm.weight")


def randomize(model: torch.nn.Module, shape: TinyShape, seed: int) -> None:
    """Seeded weights for the reference ``CausalWanModel`` (the global RNG untouched)."""
    g = torch.Generator().manual_seed(seed)

    def randn(p):
        return torch.randn(p.shape, generator=g)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(_IGNORED_NORMS):
                # The action module's RMSNorm never reads its weight: random values, so a port that applies
                # them differs.
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(("self_attn.norm_q.weight", "self_attn.norm_k.weight")):
                p.copy_(torch.tensor(HEAD_GAINS[shape.num_heads]).repeat_interleave(shape.head_dim))
            elif name.endswith(("cross_attn.norm_q.weight", "cross_attn.norm_k.weight")):
                p.fill_(CROSS_QK_GAIN)
            elif name.endswith("bias") and p.ndim == 1:
                p.copy_(randn(p) * 0.01)
            elif p.ndim == 1:  # LayerNorm weights (norm3, img_emb, mouse_mlp)
                p.copy_(1.0 + 0.1 * randn(p))
            else:
                fan_in = p[0].numel()
                scale = 0.05 if name.endswith("modulation") else min(0.05, fan_in ** -0.5)
                if ".action_model." in name:
                    # Variance-preserving: capped at 0.05, the 2- to 7-wide action inputs would barely register.
                    scale = fan_in ** -0.5
                p.copy_(randn(p) * scale)
        for block in model.blocks:
            for lin in (block.self_attn.v, block.self_attn.o):
                lin.weight.mul_(SELF_VALUE_GAIN)
            for lin in (block.cross_attn.v, block.cross_attn.o):
                lin.weight.mul_(CROSS_VALUE_GAIN)
            am = block.action_model
            if am is None:
                continue
            am.proj_keyboard.weight.mul_(ACTION_OUT_GAIN)
            if getattr(am, "enable_mouse", False):
                am.proj_mouse.weight.mul_(ACTION_OUT_GAIN)
                am.mouse_mlp[0].weight[:, shape.dim:].mul_(MOUSE_INPUT_GAIN)  # [hidden | mouse window] input


def write_checkpoint(folder, variant: str, seed: int = 0, shape: TinyShape = TINY, dtype=torch.float32) -> Path:
    """A tiny checkpoint as the release ships it; returns the safetensors path (config.json beside it). ``dtype``
    bfloat16 writes it as the release's files are stored (the reference loads it into its fp32 model)."""
    from safetensors.torch import save_file

    v = VARIANTS[variant]
    out = Path(folder) / v.release_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(tiny_config(variant, shape), indent=2) + "\n")
    with reference(shape) as ref, torch.random.fork_rng():
        model = ref.causal_model.CausalWanModel.from_config(str(out))
        randomize(model, shape, seed)
        state = {"model." + k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    path = out / v.release_file
    save_file(state, str(path))
    return path


# -- inputs -----------------------------------------------------------------------------------------------------

@dataclass
class Inputs:
    noise: torch.Tensor  # [1, 16, F, h, w] initial noise, sliced per block by the pipeline
    image_latents: torch.Tensor  # [1, 16, F, h, w] the VAE's latents of the start image + 4(F-1) black frames
    clip: torch.Tensor  # [1, 257, 1280] CLIP-vision features of the start image
    keyboard: torch.Tensor  # [1, 1 + 4(F-1), K] per pixel frame
    mouse: torch.Tensor | None  # [1, 1 + 4(F-1), 2] per pixel frame (pitch, yaw); None for templerun

    @property
    def frames(self) -> int:
        return self.noise.shape[2]

    def with_actions(self, keyboard=None, mouse=None) -> Inputs:
        return replace(self, keyboard=self.keyboard if keyboard is None else keyboard,
                       mouse=self.mouse if mouse is None else mouse)


def random_actions(variant: str, frames: int, seed: int) -> tuple:
    """Keyboard and mouse per pixel frame, piecewise constant over runs of 1 to 8 frames."""
    v = VARIANTS[variant]
    g = torch.Generator().manual_seed(seed)
    n = 1 + 4 * (frames - 1)
    keyboard = torch.zeros(1, n, v.keyboard_dim)
    mouse = torch.zeros(1, n, 2) if v.mouse else None
    start = 0
    while start < n:
        end = min(n, start + int(torch.randint(1, 9, (1,), generator=g)))
        if variant == "templerun":  # one-hot, index 0 = no move
            keyboard[0, start:end, int(torch.randint(0, v.keyboard_dim, (1,), generator=g))] = 1.0
        else:
            keyboard[0, start:end] = (torch.rand(v.keyboard_dim, generator=g) < 0.4).float()
        if mouse is not None:
            mouse[0, start:end] = (torch.rand(2, generator=g) - 0.5) * 0.3
        start = end
    return keyboard, mouse


def make_inputs(variant: str, frames: int, seed: int = 0, shape: TinyShape = TINY) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    h, w = shape.latent_hw
    noise = torch.randn(1, 16, frames, h, w, generator=g)
    image_latents = torch.randn(1, 16, frames, h, w, generator=g)
    clip = torch.randn(1, CLIP_TOKENS, CLIP_DIM, generator=g)
    keyboard, mouse = random_actions(variant, frames, seed + 1)
    return Inputs(noise, image_latents, clip, keyboard, mouse)


def chunk_pixel_frames(chunk: int, per_block: int = 3) -> range:
    """The pixel frames a chunk's latents decode to (latent 0 -> pixel 0, latent f -> 4f-3 .. 4f): where the
    interactive loop writes the action read before that chunk."""
    f0 = chunk * per_block
    end = 1 + 4 * (f0 + per_block - 1)
    return range(end - (1 + 4 * (per_block - 1) if f0 == 0 else 4 * per_block), end)


def streamed_actions(per_chunk: list, n_pixel_frames: int, per_block: int = 3) -> torch.Tensor:
    """Per-pixel-frame actions ``[1, N, D]`` from one action vector ``[D]`` per chunk, as the interactive loop
    lays them out (``chunk_pixel_frames``)."""
    out = torch.zeros(1, n_pixel_frames, per_chunk[0].shape[-1])
    for c, action in enumerate(per_chunk):
        span = chunk_pixel_frames(c, per_block)
        out[0, span.start:span.stop] = action
    return out


def cond_concat(image_latents: torch.Tensor) -> torch.Tensor:
    """The 20 channels ``inference.py`` puts after the noisy latent: a 4-channel mask, 1 on latent frame 0 and 0
    on the others, then the image latents (36 = 16 noisy + 4 mask + 16 image)."""
    mask = torch.ones_like(image_latents)
    mask[:, :, 1:] = 0
    return torch.cat([mask[:, :4], image_latents], dim=1)


# -- the rollout ------------------------------------------------------------------------------------------------

@dataclass
class Pass:
    chunk: int
    step: int | None  # index into the step list; None for the clean pass that commits the chunk to the caches
    timestep: float
    x0: torch.Tensor  # [1, 16, frames of the chunk, h, w]


@dataclass
class Rollout:
    latents: torch.Tensor  # [1, 16, F, h, w]
    timesteps: torch.Tensor  # the warped step list the pipeline ran
    passes: list = field(default_factory=list)
    noise_draws: list = field(default_factory=list)  # reference_harness.NoiseDraw, in draw order
    keyboard: torch.Tensor | None = None  # the per-pixel-frame actions the reference ended with
    mouse: torch.Tensor | None = None

    def chunk_x0(self, chunk: int) -> list:
        """x0 of each denoising step of one chunk, in order (the last is the chunk's output)."""
        return [p.x0 for p in self.passes if p.chunk == chunk and p.step is not None]


def _load_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def _vae_stand_in(latents, *cache):
    return latents, list(cache)


def own_noise_draws(frames: int, steps: int, seed: int, shape: TinyShape = TINY, per_block: int = 3) -> list:
    g = torch.Generator().manual_seed(seed)
    h, w = shape.latent_hw
    return [rh.NoiseDraw(c, s, torch.randn(1, 16, per_block, h, w, generator=g))
            for c in range(frames // per_block) for s in range(steps - 1)]


def run_reference(checkpoint, variant: str, inputs: Inputs, *, noise_draws=None, renoise_seed: int = 0,
                  shape: TinyShape = TINY) -> Rollout:
    """The release's ``inference.py`` loop (``CausalInferencePipeline``) on ``inputs``' per-pixel-frame actions."""
    return _run(checkpoint, variant, inputs, noise_draws, renoise_seed, shape, typed=None)


def run_streaming_reference(checkpoint, variant: str, inputs: Inputs, typed, *, noise_draws=None,
                            renoise_seed: int = 0, shape: TinyShape = TINY) -> Rollout:
    """The release's interactive loop (``CausalInferenceStreamingPipeline``, ``inference_streaming.py``): before
    each chunk its ``get_current_action`` reads what a person types, mapped by the reference's own key tables,
    and writes that action over the chunk's pixel frames of ``inputs``' actions (see ``streamed_actions``).

    ``typed``: per chunk, the answers to that chunk's prompts, in order: universal ``(mouse key, keyboard key)``
    from ``i k j l u`` and ``w s a d q``; gta_drive ``("w a",)`` style (``w s q`` and ``a d``, space-separated);
    templerun ``(key,)`` from ``w s a d z c q``. ``Rollout.keyboard``/``mouse`` are the per-pixel-frame actions
    the reference ended with; a script too short, or a key the reference does not know (it would ask again
    forever), is an error."""
    return _run(checkpoint, variant, inputs, noise_draws, renoise_seed, shape, typed=list(typed))


class _Typist:
    """``input()`` for the interactive loop: the scripted answers in order, then "" to "Continue?". A prompt
    asked once the script is spent gets a valid no-op answer (the reference loops until it gets one) and the run
    is refused afterwards."""

    def __init__(self, typed):
        self.answers = [a for chunk in typed for a in (*chunk, "")]
        self.spent = False

    def __call__(self, prompt=""):
        if self.answers:
            answer = self.answers.pop(0)
            if (answer == "") != prompt.startswith("Continue?"):
                self.spent = True  # out of step with the prompts: a key the reference refused
            return answer
        self.spent = True
        return "" if prompt.startswith("Continue?") else ("u" if "mouse" in prompt else "q")


def _run(checkpoint, variant, inputs, noise_draws, renoise_seed, shape, typed):
    import builtins

    from safetensors.torch import load_file

    v = VARIANTS[variant]
    checkpoint = Path(checkpoint)
    config = _load_yaml(rh.reference_root(REFERENCE_NAME) / v.yaml)
    mode = config.pop("mode")
    config["model_kwargs"] = {**config["model_kwargs"], "model_config": str(checkpoint.parent)}
    args = types.SimpleNamespace(**config)
    per_block = args.num_frame_per_block
    if inputs.frames % per_block:
        raise ValueError(f"frames ({inputs.frames}) must be a multiple of {per_block}")
    if (inputs.mouse is None) == v.mouse:
        raise ValueError(f"{variant}: mouse actions {'required' if v.mouse else 'not used'}")
    n_raw = 1 + 4 * (inputs.frames - 1)
    if inputs.keyboard.shape != (1, n_raw, v.keyboard_dim):
        raise ValueError(f"keyboard must be [1, {n_raw}, {v.keyboard_dim}], got {list(inputs.keyboard.shape)}")
    if typed is not None and len(typed) != inputs.frames // per_block:
        raise ValueError(f"typed: one entry per chunk ({inputs.frames // per_block}), got {len(typed)}")

    with reference(shape) as ref, torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
        generator = ref.wrapper.WanDiffusionWrapper(**args.model_kwargs, is_causal=True)
        cls = ref.pipeline.CausalInferencePipeline if typed is None else ref.pipeline.CausalInferenceStreamingPipeline
        pipeline = cls(args, generator=generator)
        missing, unexpected = pipeline.generator.load_state_dict(load_file(str(checkpoint)))
        assert not missing and not unexpected
        steps = len(pipeline.denoising_step_list)
        if noise_draws is None:
            noise_draws = own_noise_draws(inputs.frames, steps, renoise_seed, shape, per_block)
        conditional = {"cond_concat": cond_concat(inputs.image_latents), "visual_context": inputs.clip,
                       "keyboard_cond": inputs.keyboard.clone()}
        if inputs.mouse is not None:
            conditional["mouse_cond"] = inputs.mouse.clone()

        passes: list = []
        step_of = {float(t): i for i, t in enumerate(pipeline.denoising_step_list)}

        def record(_module, _args, kwargs, out):
            chunk = kwargs["current_start"] // shape.tpf // per_block
            t = float(kwargs["timestep"].flatten()[0])
            # Each chunk's passes run its steps in order, then the clean pass (context_noise) once.
            seen = sum(1 for p in passes if p.chunk == chunk)
            passes.append(Pass(chunk, step_of.get(t) if seen < steps else None, t, out[1].detach().clone()))

        hook = pipeline.generator.register_forward_hook(record, with_kwargs=True)
        tape = rh.NoiseTape(noise_draws, rh.frames_first)
        typist, original_input = _Typist(typed or []), builtins.input
        try:
            with torch.no_grad(), tape.patched():
                if typed is None:
                    latents = pipeline.inference(noise=inputs.noise.clone(), conditional_dict=conditional,
                                                 return_latents=True, vae=_vae_stand_in, mode=mode)
                else:
                    builtins.input = typist
                    latents = pipeline.inference(noise=inputs.noise.clone(), conditional_dict=conditional,
                                                 return_latents=True, vae=_vae_stand_in, output_folder="",
                                                 name="tiny", mode=mode)
        finally:
            builtins.input = original_input
            hook.remove()
        if typist.spent:
            raise ValueError(f"typed: the script does not answer the reference's prompts ({typed!r})")
        timesteps = pipeline.denoising_step_list.clone()
    mouse = conditional.get("mouse_cond")
    return Rollout(latents.detach().clone(), timesteps, passes, list(noise_draws), conditional["keyboard_cond"],
                   None if mouse is None else mouse)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return rh.relative_error(a, b)
