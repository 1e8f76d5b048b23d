"""LongLive 2.0 (Wan2.2 TI2V-5B) against its own pipeline, on CPU, with a tiny random 5B-shaped model.

Skipped unless ``FASTAR_REFERENCE_DIR`` holds ``longlive2/`` (``tools/extract_references.py`` writes it from
NVlabs/LongLive ``main``). The model has the 5B's layout at reduced widths: 48 latent channels in and out, patch
1 x 2 x 2, two heads of 128, 2 layers. It is saved as LongLive 2.0 saves a generator (a ``.pt`` dict with a
``generator`` and a different ``generator_ema``; its ``inference.py`` loads ``generator`` with ``use_ema:
false``) and run through ``pipeline/causal_diffusion_inference.py``'s ``CausalDiffusionInferencePipeline`` with
``configs/inference.yaml``'s settings (8 frames per block, local_attn_size 32, sink 8, 4 UniPC steps at shift
5, multi-shot sink and RoPE offset 8), and through the pack's ``longlive2`` schedule with a window cache of 32
frames and an 8-frame sink, on the same noise. No noise is drawn after the start: both take each chunk's slice.

Patches beside those ``reference_harness`` lists (all outside the math of a forward or of a solver step):
- ``LLV2_TRITON_ROPE=0`` and ``LLV2_TRITON_ADALN=0``: the eager RoPE (float64 complex) and adaLN paths instead of
  the Triton kernels; flash-attn absent, its SDPA fallback in fp32; ``torch.compile`` the identity;
- ``diffusers`` scheduler base classes stand-ins: ``register_to_config`` records the constructor's arguments as
  ``config`` (what the UniPC scheduler reads), ``SchedulerMixin`` is empty, ``deprecate`` a no-op, no scipy;
- ``transformers`` (an unused import of the causal model), ``omegaconf``, ``PIL`` and ``torchvision``
  (imported by modules whose constants and helpers the pipeline uses) are inert; the T5, tokenizer and VAE
  modules are placeholders; the text encoder returns given features, the VAE is never called (latents);
- ``utils.config.wan_default_config``'s 5B sizes (24 heads, 30 blocks) rewritten to the tiny model's;
- the YAML is flattened as its ``normalize_config`` does (sections to the top, ``num_frame_per_block`` and
  ``timestep_shift`` from ``model_kwargs``) without OmegaConf, and ``image_or_video_shape`` is the tiny latent.
"""

from __future__ import annotations

import os
import sys

import pytest
import reference_harness as rh
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.files.wan_checkpoint import load_wan_model
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.multishot import MultiShot
from comfyui_fastar.fastar_core.rollout.prompts import PromptSchedule, PromptSegment
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.rollout.schedule import get_schedule
from comfyui_fastar.fastar_core.rollout.unipc import UniPCSolver, unipc_steps

NAME = "longlive2"
pytestmark = pytest.mark.skipif(not rh.REFERENCE_DIR or not rh.reference_root(NAME).is_dir(),
                                reason="FASTAR_REFERENCE_DIR is not set or has no longlive2/ (see "
                                       "tools/extract_references.py)")

TINY = WanConfig(dim=256, num_heads=2, num_layers=2, ffn_dim=512, in_dim=48, out_dim=48, text_dim=32, freq_dim=32)
TINY_KWARGS = dict(model_type="ti2v", patch_size=(1, 2, 2), text_len=TINY.text_len, in_dim=48, dim=TINY.dim,
                   ffn_dim=TINY.ffn_dim, freq_dim=TINY.freq_dim, text_dim=TINY.text_dim, out_dim=48,
                   num_heads=TINY.num_heads, num_layers=TINY.num_layers)
LATENT_HW = (4, 4)
FPB, WINDOW, SINK = 8, 32, 8
FRAMES = 104  # 13 chunks: the window fills at chunk 4 and rolls over 3 more windows' worth
TOLERANCE = 1e-5
QK_GAIN = 2.5

REWRITES = [
    rh.Rewrite("utils.config", '"num_heads": 24,', f'"num_heads": {TINY.num_heads},'),
    rh.Rewrite("utils.config", '"num_transformer_blocks": 30,', f'"num_transformer_blocks": {TINY.num_layers},'),
]
EMPTY_PACKAGES = ("wan_5b", "wan_5b.modules", "wan_5b.utils", "pipeline", "utils", "model")
UNUSED = ("wan_5b.modules.t5", "wan_5b.modules.tokenizers", "wan_5b.modules.vae2_2", "wan_5b.modules.vae2_1")
INERT = ("transformers", "transformers.models", "transformers.models.x_clip",
         "transformers.models.x_clip.modeling_x_clip", "omegaconf", "PIL", "PIL.Image", "torchvision",
         "torchvision.transforms", "torchvision.transforms.functional")


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Tiny tensors: one thread (OpenMP barriers dominate otherwise)."""


# -- stand-ins -----------------------------------------------------------------------------------------------
class PromptTable(torch.nn.Module):
    """Stands in for the T5 encoder: the given features of each prompt string, stacked in the order asked."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, text_prompts):
        return {"prompt_embeds": torch.cat([self.table[p] for p in text_prompts])}


class NoVAE(torch.nn.Module):
    def decode_to_pixel(self, latent, use_cache=False):
        raise AssertionError("parity compares latents; the VAE is never called")


def run_reference(body, rewrites=REWRITES):
    extra = {k: v for k, v in {"tqdm": rh.tqdm_stub()}.items() if v is not None}
    sys.modules.update(extra)
    saved_env = {k: os.environ.get(k) for k in ("LLV2_TRITON_ROPE", "LLV2_TRITON_ADALN")}
    os.environ.update({"LLV2_TRITON_ROPE": "0", "LLV2_TRITON_ADALN": "0"})
    spec = rh.ReferenceSpec(NAME, rewrites, empty_packages=EMPTY_PACKAGES, unused_modules=UNUSED,
                            inert_modules=INERT, extra_modules=rh.diffusers_scheduler_modules())
    try:
        with rh.reference_modules(spec, TINY_KWARGS), torch.no_grad():
            return body()
    finally:
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        for k in extra:
            sys.modules.pop(k, None)


def reference_args(frames, config="inference.yaml", **inference) -> dict:
    """configs/inference.yaml (or inference_i2v.yaml) as its normalize_config leaves it, for the tiny latent."""
    import yaml

    raw = yaml.safe_load((rh.reference_root(NAME) / "configs" / config).read_text())
    raw.pop("adapter", None)  # the LoRA is applied by inference.py, not by the pipeline
    raw["inference"] = {**raw["inference"], **inference}
    args = AttrDict(raw)
    for section in ("data", "inference", "logging", "checkpoints"):
        args.update(raw.get(section) or {})
    args["model_kwargs"] = AttrDict(raw["model_kwargs"])
    args["num_frame_per_block"] = args.model_kwargs["num_frame_per_block"]
    args["timestep_shift"] = args.model_kwargs["timestep_shift"]
    args["image_or_video_shape"] = [1, frames, 48, *LATENT_HW]
    return args


class AttrDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


# -- the checkpoint and inputs ---------------------------------------------------------------------------------
def tiny_model(seed):
    model = random_wan(TINY, seed=seed)
    with torch.no_grad():  # sharper self-attention, so which frames a query sees shows in the output
        for blk in model.blocks:
            blk.self_attn.norm_q.weight.fill_(QK_GAIN)
            blk.self_attn.norm_k.weight.fill_(QK_GAIN)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """LongLive 2.0's layout: ``generator`` (what use_ema false loads) beside a different ``generator_ema``."""
    path = tmp_path_factory.mktemp("longlive2") / "generator.pt"
    gen, ema = tiny_model(0), tiny_model(1)
    torch.save({"generator": {"model." + k: v for k, v in gen.state_dict().items()},
                "generator_ema": {"model." + k: v for k, v in ema.state_dict().items()}}, path)
    return path


def prompt(seed=1):
    return torch.randn(1, 8, TINY.text_dim, generator=torch.Generator().manual_seed(seed))


def start_noise(frames, seed=2):
    return torch.randn(1, 48, frames, *LATENT_HW, generator=torch.Generator().manual_seed(seed))


def run_pack(checkpoint, prompts, noise, window=WINDOW, sink=SINK, multishot=None, image=None, clamp=True,
             model=None, lora=None, dtype=None):
    loaded, ckpt = load_wan_model(checkpoint, lora=lora, lora_alpha=None if lora is None else LORA_ALPHA,
                                  dtype=dtype)
    model = model or loaded
    assert ckpt.container == "generator" and ckpt.config.architecture == "Wan2.2 TI2V"
    sampler = ARSampler(CausalRunner(model))
    draws = rh.record_pack_noise(sampler)
    cfg = RolloutConfig(num_frames=noise.shape[2], latent_height=LATENT_HW[0], latent_width=LATENT_HW[1],
                        frames_per_block=FPB, schedule="longlive2", channels=48, seed=5,
                        cache=CacheSpec(policy="window", sink_frames=sink, window_frames=window),
                        multishot=multishot, image_in_first_chunk=image is not None and clamp)
    if image is not None and not clamp:  # the Wan2.1 family's image-to-video: the image committed before
        noise = noise[:, :, 1:]
        cfg.num_frames -= 1
        noise = torch.cat([image, noise], dim=2)
    latent = sampler.generate(prompts, cfg, initial_latents=image, initial_noise=noise).latent
    assert not draws, "LongLive 2.0 draws no noise after each chunk's start"
    return latent


def reference_t2v(checkpoint, noise, prompts_per_chunk, table, image=None, lora=None):
    def body():
        module = rh.import_module("pipeline.causal_diffusion_inference")
        args = reference_args(noise.shape[2], config="inference.yaml" if image is None else "inference_i2v.yaml")
        pipeline = module.CausalDiffusionInferencePipeline(args, device="cpu", text_encoder=PromptTable(table),
                                                           vae=NoVAE())
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        pipeline.generator.load_state_dict(state["generator"], strict=True)  # use_ema: false
        if lora is not None:  # as inference.py: adapters on every Linear of the blocks, unmerged
            apply_lora(pipeline.generator.model, torch.load(lora, weights_only=True)["generator_lora"])
        initial = None if image is None else image.permute(0, 2, 1, 3, 4)
        latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=[prompts_per_chunk],
                                     initial_latent=initial, return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    return run_reference(body)


def report(what, ours, ref) -> float:
    err = rh.relative_error(ours, ref)
    first = rh.first_deviating_frame(ours, ref, TOLERANCE)
    print(f"\nPARITY LongLive 2.0 {what}: {ours.shape[2]} latent frames, relative error {err:.2e}"
          + (f", first deviating frame {first}" if first is not None else ""))
    return err


@pytest.fixture(scope="module")
def t2v_reference(checkpoint):
    cond, noise = prompt(), start_noise(FRAMES)
    ref = reference_t2v(checkpoint, noise, ["a"] * (FRAMES // FPB), {"a": cond})
    return cond, noise, ref


# -- the solver ------------------------------------------------------------------------------------------------
def test_unipc_solver_matches_wan_scheduler():
    """The pack's UniPC against Wan's ``FlowUniPCMultistepScheduler`` as the pipeline builds it per chunk, on
    flows that depend on the sample, for 4 steps (and 6, where the order-2 corrector runs more than once): the
    same integer timesteps and bit-identical samples."""
    for steps in (4, 6):
        g = torch.Generator().manual_seed(steps)
        x0 = torch.randn(1, 8, 48, 4, 4, generator=g)
        weights = torch.randn(48, generator=g)[None, None, :, None, None]

        def flow(x, weights=weights):
            return torch.tanh(x * weights) + 0.1 * x

        def body(steps=steps, x0=x0, flow=flow):
            module = rh.import_module("wan_5b.utils.fm_solvers_unipc")
            scheduler = module.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
                                                           use_dynamic_shifting=False)
            scheduler.set_timesteps(steps, device="cpu", shift=5.0)
            x, seen = x0, []
            for t in scheduler.timesteps:
                seen.append(int(t))
                x = scheduler.step(flow(x), t, x, return_dict=False)[0]
            return x, seen

        ref, timesteps = run_reference(body, rewrites=[])
        sigmas, ours_t = unipc_steps(steps, 5.0)
        assert [int(t) for t in ours_t] == timesteps
        solver, x = UniPCSolver(sigmas), x0
        for _ in range(steps):
            x = solver.step(flow(x), x)
        assert torch.equal(x, ref), f"{steps} steps: max difference {(x - ref).abs().max():.3e}"
    schedule = get_schedule("longlive2")
    assert schedule.timesteps == [999.0, 937.0, 833.0, 624.0] and schedule.sigmas == unipc_steps(4, 5.0)[0]


# -- text to video ---------------------------------------------------------------------------------------------
def test_longlive2_t2v_window_sink(checkpoint, t2v_reference):
    cond, noise, ref = t2v_reference
    ours = run_pack(checkpoint, cond, noise)
    err = report("t2v window 32 sink 8", ours, ref)
    assert err <= TOLERANCE


@pytest.mark.parametrize("window,sink", [(WINDOW + 1, SINK), (WINDOW, SINK // 2)])
def test_longlive2_t2v_wrong_window_fails(checkpoint, t2v_reference, window, sink):
    """Negative control: one frame more in the window, or half the sink, must not pass."""
    cond, noise, ref = t2v_reference
    ours = run_pack(checkpoint, cond, noise, window=window, sink=sink)
    err = report(f"t2v window {window} sink {sink} (must differ)", ours, ref)
    assert err > 100 * TOLERANCE
    first = rh.first_deviating_frame(ours, ref, TOLERANCE)
    assert first is not None and first >= WINDOW - FPB, f"deviates at frame {first}, before the window fills"


# -- multi-shot prompts ----------------------------------------------------------------------------------------
CUT = "The scene transitions. "  # LongLive 2.0's scene-cut prefix (utils/dataset.py)
SHOTS = ((0, "a"), (48, "b"), (80, "c"))  # (first frame, caption): a cut after the window has rolled, then another


@pytest.fixture(scope="module")
def multishot_inputs(checkpoint):
    """Per chunk, as its datasets write them: a shot's first chunk gets the cut prefix, the rest the caption."""
    table, per_chunk, segments = {}, [], []
    for i, (start, caption) in enumerate(SHOTS):
        end = SHOTS[i + 1][0] if i + 1 < len(SHOTS) else FRAMES
        first = caption if i == 0 else CUT + caption
        table[first], table[caption] = prompt(10 + 2 * i), prompt(11 + 2 * i)
        per_chunk += [first] + [caption] * ((end - start) // FPB - 1)
        segments.append(PromptSegment(start, table[first], new_shot=i > 0))
        if i > 0:
            segments.append(PromptSegment(start + FPB, table[caption]))
    noise = start_noise(FRAMES, seed=3)
    ref = reference_t2v(checkpoint, noise, per_chunk, table)
    return PromptSchedule(segments), noise, ref


def test_longlive2_multishot_switch(checkpoint, multishot_inputs):
    """Two cuts: each shot's temporal RoPE shifted by 8 more frames, its first chunk pinned beside the sink."""
    prompts, noise, ref = multishot_inputs
    ours = run_pack(checkpoint, prompts, noise, multishot=MultiShot(rope_offset=8, pin_shot_sink=True))
    err = report("multi-shot (2 cuts, RoPE offset 8, shot sink)", ours, ref)
    assert err <= TOLERANCE


@pytest.mark.parametrize("multishot", [None, MultiShot(rope_offset=8, pin_shot_sink=False),
                                       MultiShot(rope_offset=0, pin_shot_sink=True)],
                         ids=["plain-switch", "no-shot-sink", "no-rope-offset"])
def test_longlive2_multishot_without_either_part_fails(checkpoint, multishot_inputs, multishot):
    """Negative controls: a plain prompt switch, or the shot sink or the RoPE offset alone, must not pass; and
    every one agrees until the first cut."""
    prompts, noise, ref = multishot_inputs
    ours = run_pack(checkpoint, prompts, noise, multishot=multishot)
    err = report(f"multi-shot with {multishot} (must differ)", ours, ref)
    assert err > 100 * TOLERANCE
    first = rh.first_deviating_frame(ours, ref, TOLERANCE)
    assert first is not None and first >= SHOTS[1][0]


# -- image to video --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def i2v_reference(checkpoint):
    cond, noise = prompt(4), start_noise(FRAMES, seed=5)
    image = torch.randn(1, 48, 1, *LATENT_HW, generator=torch.Generator().manual_seed(6))
    ref = reference_t2v(checkpoint, noise, ["a"] * (FRAMES // FPB), {"a": cond}, image=image)
    return cond, noise, image, ref


def test_longlive2_i2v_first_frame_clamped(checkpoint, i2v_reference):
    """inference_i2v.yaml: frame 0 of the first chunk is the image latent, fed at timestep 0 at every step."""
    cond, noise, image, ref = i2v_reference
    ours = run_pack(checkpoint, cond, noise, image=image)
    assert torch.equal(ours[:, :, :1], image) and torch.equal(ref[:, :, :1], image)
    err = report("i2v (frame 0 clamped)", ours, ref)
    assert err <= TOLERANCE


def test_longlive2_i2v_as_committed_context_fails(checkpoint, i2v_reference):
    """Negative control: the Wan2.1 family's image-to-video (the image committed as a clean frame before the
    rollout, the chunks after it) is not LongLive 2.0's."""
    cond, noise, image, ref = i2v_reference
    ours = run_pack(checkpoint, cond, noise, image=image, clamp=False)
    err = report("i2v as committed context (must differ)", ours, ref)
    assert err > 100 * TOLERANCE


# -- LoRA ------------------------------------------------------------------------------------------------------
LORA_RANK, LORA_ALPHA = 128, 128  # configs/inference.yaml's adapter
LORA_PREFIX = "base_model.model."  # PEFT's keys, relative to the CausalWanModel it wraps


class LoraLinear(torch.nn.Module):
    """Stands in for PEFT's LoRA ``Linear`` (peft is not installed here), with its forward at dropout 0:
    ``base(x) + lora_B(lora_A(x)) * alpha / rank``, the adapters kept apart from the base weight (unmerged)."""

    def __init__(self, base: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, scaling: float):
        super().__init__()
        self.base_layer = base
        self.lora_A = torch.nn.Linear(a.shape[1], a.shape[0], bias=False, dtype=base.weight.dtype)
        self.lora_B = torch.nn.Linear(b.shape[1], b.shape[0], bias=False, dtype=base.weight.dtype)
        with torch.no_grad():
            self.lora_A.weight.copy_(a)
            self.lora_B.weight.copy_(b)
        self.scaling = scaling

    @property
    def weight(self):  # what the pack's runner reads its dtype and device from
        return self.base_layer.weight

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


def apply_lora(model, state: dict) -> int:
    """Every Linear of every block gets its adapter, as ``utils/lora_utils.configure_lora_for_model`` targets."""
    wrapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, torch.nn.Linear) and full.startswith("blocks."):
                a, b = state[f"{LORA_PREFIX}{full}.lora_A.weight"], state[f"{LORA_PREFIX}{full}.lora_B.weight"]
                setattr(module, child_name, LoraLinear(child, a, b, LORA_ALPHA / LORA_RANK))
                wrapped += 1
    assert wrapped == 10 * TINY.num_layers  # q, k, v, o of both attentions and the two FFN layers
    return wrapped


@pytest.fixture(scope="module")
def lora_file(tmp_path_factory):
    """A trained-looking rank-128 adapter on every Linear of the blocks (B non-zero), in LongLive 2.0's
    ``generator_lora`` layout."""
    g = torch.Generator().manual_seed(9)
    shapes = {}
    for i in range(TINY.num_layers):
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                shapes[f"blocks.{i}.{attn}.{proj}"] = (TINY.dim, TINY.dim)
        shapes[f"blocks.{i}.ffn.0"] = (TINY.ffn_dim, TINY.dim)
        shapes[f"blocks.{i}.ffn.2"] = (TINY.dim, TINY.ffn_dim)
    state = {}
    for name, (out_f, in_f) in shapes.items():
        state[f"{LORA_PREFIX}{name}.lora_A.weight"] = torch.randn(LORA_RANK, in_f, generator=g) * in_f ** -0.5
        state[f"{LORA_PREFIX}{name}.lora_B.weight"] = torch.randn(out_f, LORA_RANK, generator=g) * 0.01
    path = tmp_path_factory.mktemp("longlive2_lora") / "lora.pt"
    torch.save({"generator_lora": state}, path)
    return path


@pytest.fixture(scope="module")
def lora_reference(checkpoint, lora_file):
    cond, noise = prompt(7), start_noise(FRAMES, seed=8)
    return cond, noise, reference_t2v(checkpoint, noise, ["a"] * (FRAMES // FPB), {"a": cond}, lora=lora_file)


def test_longlive2_lora_merged_matches_unmerged_fp32(checkpoint, lora_file, lora_reference):
    """The pack merges the adapter into the weights (W + B A alpha / rank, in fp32); the reference keeps it
    apart. In fp32 the two agree within the parity bound; without the adapter they do not."""
    cond, noise, ref = lora_reference
    ours = run_pack(checkpoint, cond, noise, lora=lora_file)
    err = report("LoRA rank 128 merged (pack) vs unmerged (reference), fp32", ours, ref)
    assert err <= TOLERANCE
    base = run_pack(checkpoint, cond, noise)
    assert report("without the LoRA (must differ)", base, ref) > 100 * TOLERANCE


def test_longlive2_lora_merged_vs_unmerged_bf16(checkpoint, lora_file, lora_reference):
    """LongLive 2.0 runs in bf16: there a merged weight is rounded once, W + B A, where the unmerged path
    rounds W, A, B and both products. Measured on the pack's runner, both against the fp32 result: the merge
    is no further from it than the unmerged bf16 path is."""
    cond, noise, ref = lora_reference
    merged = run_pack(checkpoint, cond, noise, lora=lora_file, dtype="bf16")
    model, _ = load_wan_model(checkpoint, dtype="bf16")
    apply_lora(model, {k: v.to(torch.bfloat16) for k, v in torch.load(lora_file, weights_only=True)[
        "generator_lora"].items()})
    unmerged = run_pack(checkpoint, cond, noise, model=model)
    between = rh.relative_error(merged, unmerged)
    merged_err, unmerged_err = rh.relative_error(merged, ref), rh.relative_error(unmerged, ref)
    print(f"\nLoRA bf16: merged vs unmerged {between:.2e}; against fp32 unmerged: merged {merged_err:.2e}, "
          f"unmerged {unmerged_err:.2e}")
    assert 0 < between < 0.1 and merged_err <= 1.5 * unmerged_err
