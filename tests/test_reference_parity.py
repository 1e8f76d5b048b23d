"""The pack's dense paths against each model family's own public code, on the same tiny checkpoint and noise.

Skipped unless ``FASTAR_REFERENCE_DIR`` names a folder written by ``tools/extract_references.py``; needs
``pyyaml`` (the references' configs are YAML). Each test builds a tiny seeded Wan model (dim 64, 2 layers, 2
heads, text_dim 32, 6 tokens per latent frame), saves it in the reference's checkpoint layout (a ``.pt`` with a
``generator_ema`` dict of ``model.`` keys), loads it into the reference's own wrapper with
``load_state_dict`` as its ``inference.py`` does and into the pack through ``load_wan_model``, runs both on the
same initial noise with the pack's re-noise draws handed to the reference in order, and compares the final
latents in fp32. The conditioning is 8 text tokens, shorter than ``text_len`` (512), as a bare ``--cond`` file
is: the references zero-pad it before ``text_embedding``.

Patches, all listed here (shared ones are described in ``reference_harness``):
- diffusers ``ModelMixin``/``ConfigMixin``/``register_to_config`` stand-ins; ``from_pretrained`` builds the
  tiny config;
- flash-attn absent; the SDPA fallback runs in fp32 instead of casting q/k/v to bf16; no ``.to(bfloat16)`` of
  the pipeline (the references' ``inference.py`` casts; fp32 here);
- ``torch.compile`` is the identity while importing (it wraps ``flex_attention``);
- package ``__init__`` files not executed; T5, tokenizer, VAE and CLIP modules are placeholders; the text
  encoder passed to each pipeline returns the given features and the VAE returns latents unchanged;
  ``demo_utils.memory`` (``torch.cuda`` at import) has ``gpu = cpu``; ``tqdm`` is the identity when absent;
- geometry constants rewritten per reference (``GEOMETRY`` below): 1560 tokens per frame -> 6, 32760 (21
  frames) -> 21 x 6, 30 blocks -> 2, cache shapes ``12, 128`` -> ``2, 32``; CausVid's ``device="cuda"`` in its
  re-noise -> ``"cpu"``;
- noise: ``torch.randn``/``randn_like`` return the pack's draws (``NoiseTape``); Rolling Forcing draws a
  whole-window tensor per chunk and uses one chunk's slice of it, so the pack's chunk draw fills that slice.
- Rolling Forcing's sigmas come from its float32 shifted table (two of its five warped timesteps differ from the
  pack's float64 ones by one ulp): tolerated by the 1e-5 bound, not patched.
LongLive runs its base weights only: its LoRA is applied with ``peft``, which the pack replaces by a merge
(tested in ``test_checkpoint``).
"""

from __future__ import annotations

import sys
import types

import pytest
import reference_harness as rh
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.checkpoint import load_wan_model
from comfyui_fastar.fastar_core.prompts import PromptSchedule, PromptSegment
from comfyui_fastar.fastar_core.runner import CausalRunner
from comfyui_fastar.fastar_core.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.wan_config import WanConfig
from comfyui_fastar.fastar_core.wan_model import random_wan

pytestmark = pytest.mark.skipif(not rh.REFERENCE_DIR, reason="FASTAR_REFERENCE_DIR is not set (see "
                                "tools/extract_references.py)")

@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Tiny tensors: one thread (OpenMP barriers dominate otherwise)."""


TINY = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
TINY_KWARGS = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=TINY.text_len, in_dim=16, dim=TINY.dim,
                   ffn_dim=TINY.ffn_dim, freq_dim=TINY.freq_dim, text_dim=TINY.text_dim, out_dim=16,
                   num_heads=TINY.num_heads, num_layers=TINY.num_layers)
LATENT_HW = (4, 6)
TPF = (LATENT_HW[0] // 2) * (LATENT_HW[1] // 2)  # tokens per latent frame
HEADS = f"{TINY.num_heads}, {TINY.head_dim}]"
TOLERANCE = 1e-5
QK_GAIN = 2.5


def geometry(pipeline_module, *, blocks=True, cache="kv_cache_size = 32760", cache_new=None, heads=4,
             model_module="wan.modules.causal_model", attention_line=None):
    """The 1.3B-at-480p constants of one reference, rewritten to the tiny model."""
    rewrites = [rh.Rewrite(pipeline_module, "self.frame_seq_length = 1560", f"self.frame_seq_length = {TPF}")]
    if blocks:
        rewrites.append(rh.Rewrite(pipeline_module, "self.num_transformer_blocks = 30",
                                   f"self.num_transformer_blocks = {TINY.num_layers}"))
    if cache:
        rewrites.append(rh.Rewrite(pipeline_module, cache, cache_new or cache.replace("32760", str(21 * TPF))))
    if heads:
        rewrites.append(rh.Rewrite(pipeline_module, "12, 128]", HEADS, heads))
    if attention_line:
        rewrites.append(rh.Rewrite(model_module, attention_line,
                                   attention_line.replace("32760", str(21 * TPF)).replace("1560", str(TPF))))
    return rewrites


SF_ATTENTION = "self.max_attention_size = 32760 if local_attn_size == -1 else local_attn_size * 1560"
GEOMETRY = {
    "self_forcing": geometry("pipeline.causal_inference", attention_line=SF_ATTENTION),
    "causal_forcing": geometry("pipeline.causal_inference", attention_line=SF_ATTENTION),
    "rolling_forcing": geometry("pipeline.rolling_forcing_inference", cache="kv_cache_size = 1560 * 24",
                                cache_new=f"kv_cache_size = {TPF} * 24")
    + [rh.Rewrite("wan.modules.causal_model", "self.frame_length = 1560", f"self.frame_length = {TPF}")],
    "longlive": geometry("pipeline.causal_inference", heads=4, cache="                kv_cache_size = 32760")
    + [rh.Rewrite("pipeline.causal_inference", "target_size = 32760", f"target_size = {21 * TPF}"),
       rh.Rewrite("wan.modules.causal_model",
                  "self.max_attention_size = 32760 if max_local == -1 else max_local * 1560",
                  f"self.max_attention_size = {21 * TPF} if max_local == -1 else max_local * {TPF}")],
    "causvid": geometry("causvid.models.wan.causal_inference", heads=4, cache=None)
    + [rh.Rewrite("causvid.models.wan.causal_inference", "[batch_size, 32760, ", f"[batch_size, {21 * TPF}, ", 2)]
    + [rh.Rewrite("causvid.models.wan.causal_inference", 'device="cuda"', 'device="cpu"')],
}


class AttrDict(dict):
    """What OmegaConf gives the references: a dict readable by attribute (``args.model_kwargs.sink_size``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def reference_args(name, *config_files, **overrides) -> AttrDict:
    import yaml

    merged = {}
    for f in config_files:
        merged.update(yaml.safe_load((rh.reference_root(name) / f).read_text()) or {})
    kwargs = dict(merged.get("model_kwargs") or {})
    kwargs.update(overrides.pop("model_kwargs", {}))
    merged.update(overrides)
    merged["model_kwargs"] = AttrDict(kwargs)
    return AttrDict(merged)


class TextFeatures(torch.nn.Module):
    """Stands in for the T5 encoder: returns the given features for each prompt string."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, text_prompts):
        return {"prompt_embeds": self.table[text_prompts[0]]}


class LatentVAE(torch.nn.Module):
    """Stands in for the VAE: parity compares latents, so decoding returns them unchanged."""

    def decode_to_pixel(self, latent, use_cache=False):
        return latent


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("parity") / "tiny_ar.pt"
    model = random_wan(TINY, seed=0)
    with torch.no_grad():  # sharper self-attention, so which frames a query sees shows in the output
        for blk in model.blocks:
            blk.self_attn.norm_q.weight.fill_(QK_GAIN)
            blk.self_attn.norm_k.weight.fill_(QK_GAIN)
    torch.save({"generator_ema": {"model." + k: v for k, v in model.state_dict().items()}}, path)
    return path


def prompt(seed=1):
    return torch.randn(1, 8, TINY.text_dim, generator=torch.Generator().manual_seed(seed))


def start_noise(frames, seed=2):
    return torch.randn(1, 16, frames, *LATENT_HW, generator=torch.Generator().manual_seed(seed))


def run_pack(checkpoint, prompts, noise, **config):
    model, _ = load_wan_model(checkpoint, config=TINY)
    sampler = ARSampler(CausalRunner(model))
    draws = rh.record_pack_noise(sampler)
    cfg = RolloutConfig(num_frames=noise.shape[2], latent_height=LATENT_HW[0], latent_width=LATENT_HW[1], seed=5,
                        **config)
    latent = sampler.generate(prompts, cfg, initial_noise=noise).latent
    return latent, draws


def load_generator(pipeline, checkpoint):
    """As the references' inference.py: ``generator.load_state_dict(torch.load(ckpt)["generator_ema"])``."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    missing, unexpected = pipeline.generator.load_state_dict(state["generator_ema"], strict=True)
    assert not missing and not unexpected


def tqdm_stub():
    try:
        import tqdm  # noqa: F401

        return {}
    except ImportError:
        stub = types.ModuleType("tqdm")
        stub.tqdm = lambda it=None, *a, **k: it
        return {"tqdm": stub}


def report(family, ours, ref, frames) -> float:
    err = rh.relative_error(ours, ref)
    first = rh.first_deviating_frame(ours, ref, TOLERANCE)
    print(f"\nPARITY {family}: {frames} latent frames, relative error {err:.2e}"
          + (f", first deviating frame {first}" if first is not None else ""))
    return err


def run_reference(name, body, rewrites=None, **spec):
    spec_obj = rh.ReferenceSpec(name, GEOMETRY[name] if rewrites is None else rewrites, **spec)
    extra = tqdm_stub()
    sys.modules.update(extra)
    try:
        with rh.reference_modules(spec_obj, TINY_KWARGS), torch.no_grad():  # as their inference.py
            return body()
    finally:
        for k in extra:
            sys.modules.pop(k, None)


def chunk_pipeline_run(name, module, cls, checkpoint, args, noise, draws, cond):
    """Self-Forcing-style ``CausalInferencePipeline.inference`` (Self-Forcing, Causal Forcing)."""

    def body():
        pipeline = getattr(rh.import_module(module), cls)(args, device="cpu", text_encoder=TextFeatures({"p": cond}),
                                                         vae=LatentVAE())
        load_generator(pipeline, checkpoint)
        with rh.NoiseTape(draws, rh.frames_first).patched():
            _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"], return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    return run_reference(name, body)


# -- Self-Forcing ---------------------------------------------------------------------------------------------
SF_CONFIGS = ("configs/default_config.yaml", "configs/self_forcing_dmd.yaml")


def test_self_forcing_global_21_frames(checkpoint):
    cond, noise = prompt(), start_noise(21)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="self-forcing", cache=CacheSpec(policy="global"))
    args = reference_args("self_forcing", *SF_CONFIGS)
    ref = chunk_pipeline_run("self_forcing", "pipeline.causal_inference", "CausalInferencePipeline", checkpoint, args,
                             noise, draws, cond)
    err = report("Self-Forcing global", ours, ref, 21)
    assert err <= TOLERANCE


def test_self_forcing_local_attention_45_frames(checkpoint):
    """Its checkpoint cache holds 21 frames; longer videos roll it with ``local_attn_size`` (here 21)."""
    cond, noise = prompt(), start_noise(45)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="self-forcing", cache=window_spec(sink=0, attend=21))
    args = reference_args("self_forcing", *SF_CONFIGS, model_kwargs={"local_attn_size": 21, "sink_size": 0})
    ref = chunk_pipeline_run("self_forcing", "pipeline.causal_inference", "CausalInferencePipeline", checkpoint, args,
                             noise, draws, cond)
    err = report("Self-Forcing local 21", ours, ref, 45)
    assert err <= TOLERANCE


def window_spec(sink, attend, fpb=3):
    """A window cache attending ``attend`` frames in all, sink and current chunk included: the references'
    ``local_attn_size``, which is the pack's ``window_frames``."""
    return CacheSpec(policy="window", sink_frames=sink, window_frames=attend)


# -- Causal Forcing ---------------------------------------------------------------------------------------------
CF_DEFAULT = "configs/default_config.yaml"


@pytest.mark.parametrize("variant,fpb", [("chunkwise", 3), ("framewise", 1)])
def test_causal_forcing_45_frames(checkpoint, variant, fpb):
    cond, noise = prompt(), start_noise(45)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="self-forcing", frames_per_block=fpb,
                           cache=window_spec(sink=0, attend=21, fpb=fpb))
    args = reference_args("causal_forcing", CF_DEFAULT, f"configs/causal_forcing_dmd_{variant}.yaml",
                          model_kwargs={"local_attn_size": 21, "sink_size": 0})
    ref = chunk_pipeline_run("causal_forcing", "pipeline.causal_inference", "CausalInferencePipeline", checkpoint,
                             args, noise, draws, cond)
    err = report(f"Causal Forcing {variant}", ours, ref, 45)
    assert err <= TOLERANCE


# -- Rolling Forcing --------------------------------------------------------------------------------------------
def rolling_window_noise(num_blocks, num_steps, fpb=3):
    """Rolling Forcing asks, for each chunk it re-noises, for noise shaped like the whole window and takes that
    chunk's slice: the pack's draw for (chunk, step) goes in the slice, the rest is never read (zeros)."""

    def layout(draw, shape):
        window = draw.chunk + draw.step - 1  # the call in which the chunk was at step - 1
        first = max(0, window - num_steps + 1)
        out = torch.zeros(shape)
        tensor = draw.tensor.permute(0, 2, 1, 3, 4).flatten(0, 1)
        offset = (draw.chunk - first) * fpb
        out[offset:offset + tensor.shape[0]] = tensor
        return out

    return layout


def test_rolling_forcing_45_frames(checkpoint):
    cond, noise = prompt(), start_noise(45)
    ours, draws = run_pack(checkpoint, cond, noise, mode="rolling", schedule="rolling-forcing",
                           cache=CacheSpec(policy="rolling", sink_frames=3, rolling_capacity=24, rolling_attend=21))
    args = reference_args("rolling_forcing", "configs/default_config.yaml", "configs/rolling_forcing_dmd.yaml")

    def body():
        module = rh.import_module("pipeline.rolling_forcing_inference")
        pipeline = module.CausalInferencePipeline(args, device="cpu", text_encoder=TextFeatures({"p": cond}),
                                                  vae=LatentVAE())
        load_generator(pipeline, checkpoint)
        layout = rolling_window_noise(15, len(pipeline.denoising_step_list))
        with rh.NoiseTape(draws, layout).patched():
            _, latents = pipeline.inference_rolling_forcing(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"],
                                                            return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    ref = run_reference("rolling_forcing", body)
    err = report("Rolling Forcing", ours, ref, 45)
    assert err <= TOLERANCE


# -- LongLive 1.0 -----------------------------------------------------------------------------------------------
LL_CONFIGS = ("configs/default_config.yaml", "configs/longlive_inference.yaml")


def longlive_run(checkpoint, args, noise, draws, table, switch=None):
    def body():
        if switch is None:
            pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
                args, device="cpu", text_encoder=TextFeatures(table), vae=LatentVAE())
        else:
            pipeline = rh.import_module("pipeline.interactive_causal_inference").InteractiveCausalInferencePipeline(
                args, device="cpu", text_encoder=TextFeatures(table), vae=LatentVAE())
        load_generator(pipeline, checkpoint)
        with rh.NoiseTape(draws, rh.frames_first).patched():
            if switch is None:
                _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["a"], return_latents=True)
            else:
                _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts_list=[["a"], ["b"]],
                                                switch_frame_indices=[switch], return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    return run_reference("longlive", body, empty_packages=rh.ReferenceSpec("x").empty_packages,
                         unused_modules=rh.ReferenceSpec("x").unused_modules + ("utils.debug_option",))


def test_longlive_window_sink_45_frames(checkpoint):
    cond, noise = prompt(), start_noise(45)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="longlive", cache=window_spec(sink=3, attend=12))
    args = reference_args("longlive", *LL_CONFIGS)
    ref = longlive_run(checkpoint, args, noise, draws, {"a": cond})
    err = report("LongLive window", ours, ref, 45)
    assert err <= TOLERANCE


def test_longlive_prompt_switch_recache_45_frames(checkpoint):
    a, b = prompt(1), prompt(7)
    noise = start_noise(45)
    switch = 24
    prompts = PromptSchedule([PromptSegment(0, a), PromptSegment(switch, b, recache_frames=12)])
    ours, draws = run_pack(checkpoint, prompts, noise, schedule="longlive", cache=window_spec(sink=3, attend=12))
    args = reference_args("longlive", "configs/default_config.yaml", "configs/longlive_interactive_inference.yaml")
    ref = longlive_run(checkpoint, args, noise, draws, {"a": a, "b": b}, switch=switch)
    err = report("LongLive switch+recache", ours, ref, 45)
    assert err <= TOLERANCE


# -- CausVid ------------------------------------------------------------------------------------------------------
def test_causvid_21_frames(checkpoint):
    """CausVid's cache is a fixed 21 frames that never rolls; its long videos restart a rollout from frames
    re-encoded by the VAE, so one rollout (21 frames) is what its code can compare."""
    cond, noise = prompt(), start_noise(21)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="causvid", cache=CacheSpec(policy="global"))
    args = reference_args("causvid", "configs/wan_causal_dmd.yaml")

    def body():
        wrapper = rh.import_module("causvid.models.wan.wan_wrapper")
        models = sys.modules["causvid.models"]
        models.get_diffusion_wrapper = lambda model_name: wrapper.CausalWanDiffusionWrapper
        models.get_text_encoder_wrapper = lambda model_name: (lambda: TextFeatures({"p": cond}))
        models.get_vae_wrapper = lambda model_name: LatentVAE
        pipeline = rh.import_module("causvid.models.wan.causal_inference").InferencePipeline(args, device="cpu")
        load_generator(pipeline, checkpoint)
        with rh.NoiseTape(draws, rh.frames_first).patched():
            _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"], return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    wan_base = "causvid.models.wan.wan_base"
    ref = run_reference("causvid", body, empty_packages=(
        "causvid", "causvid.models", "causvid.models.wan", wan_base, f"{wan_base}.modules"),
        unused_modules=tuple(f"{wan_base}.modules.{m}" for m in ("t5", "tokenizers", "vae", "clip")))
    err = report("CausVid", ours, ref, 21)
    assert err <= TOLERANCE


# -- Causal Forcing++ (frame-wise, 1 and 2 steps, 4-step first frame) -------------------------------------------
@pytest.mark.parametrize("steps", [1, 2])
def test_causal_forcing_plus_plus_45_frames(checkpoint, steps):
    cond, noise = prompt(), start_noise(45)
    config = f"configs/causal_forcing_dmd_framewise_{steps}step.yaml"
    args = reference_args("causal_forcing", CF_DEFAULT, config, model_kwargs={"local_attn_size": 21, "sink_size": 0})
    schedule = {1: [1000], 2: [1000, 500]}[steps]
    ours, draws = run_pack(checkpoint, cond, noise, schedule=warped(schedule),
                           **first_chunk(warped([1000, 750, 500, 250])), frames_per_block=1,
                           cache=window_spec(sink=0, attend=21, fpb=1))
    ref = chunk_pipeline_run("causal_forcing", "pipeline.causal_inference", "CausalInferencePipeline", checkpoint,
                             args, noise, draws, cond)
    err = report(f"Causal Forcing++ {steps}-step", ours, ref, 45)
    assert err <= TOLERANCE


def warped(steps):
    from comfyui_fastar.fastar_core.schedule import DenoisingSchedule, warp_steps

    return DenoisingSchedule("warped", tuple(warp_steps(steps, 5.0)), 5.0)


def first_chunk(schedule):
    """CF++ denoises its first frame with the 4-step list (its ``denoising_step_list_first_chunk``)."""
    return {"first_chunk_schedule": schedule}


# -- Krea Realtime (KV recompute) --------------------------------------------------------------------------------
KREA_SERVER = "release_server"


def krea_rewrites():
    return [
        *geometry("pipeline.causal_inference", blocks=False, heads=0),
        rh.Rewrite("wan.modules.causal_model", "            frame_seqlen = 1560",
                   f"            frame_seqlen = {TPF}"),
        rh.Rewrite("wan.modules.causal_model", SF_ATTENTION, SF_ATTENTION.replace("32760", str(21 * TPF))
                   .replace("1560", str(TPF))),
        rh.Rewrite("wan.modules.model", "device=torch.cuda.current_device(), dtype=torch.float64",
                   "device=position.device, dtype=torch.float64"),
        rh.Rewrite("wan.modules.model", "            dtype = torch.bfloat16", "            dtype = q.dtype", 2,
                   why="its cross-attention's inline SDPA fallback casts to bf16"),
        # CUDA-only pieces of the server module: the device, its streams and events, bf16/fp16 casts.
        rh.Rewrite(KREA_SERVER, "torch.cuda.current_device()", '"cpu"', 7),
        rh.Rewrite(KREA_SERVER, "upload_stream = torch.cuda.Stream(device=gpu)", "upload_stream = None"),
        rh.Rewrite(KREA_SERVER, "download_stream = torch.cuda.Stream(device=gpu)", "download_stream = None"),
        rh.Rewrite(KREA_SERVER, "torch.bfloat16", "torch.float32", 11),
        rh.Rewrite(KREA_SERVER, ".half()", ".float()", 2),
        rh.Rewrite(KREA_SERVER, "        event = torch.cuda.Event()\n        event.record()", "        event = None"),
    ]


class KreaLatentDecoder(torch.nn.Module):
    """Stands in for Krea's streaming VAE decoder: each latent frame becomes as many "pixel" frames as the Wan
    VAE gives it (1 for the video's first, 4 after), each a copy of the latent, so the frame the server later
    re-encodes is a known latent frame."""

    def __init__(self):
        super().__init__()
        self.first = True

    def forward(self, latents, *cache):
        repeats = [1 if (self.first and i == 0) else 4 for i in range(latents.shape[1])]
        self.first = False
        return torch.repeat_interleave(latents, torch.tensor(repeats), dim=1), list(cache)


def krea_encode_stand_in(vae, cache, resample_to=16, max_frames=81, video_path_or_url=None, frames=None,
                         height=None, width=None, stream=False, dtype=None):
    """Stands in for ``v2v.encode_video_latent`` of one decoded frame: the latent it was decoded from, as is."""
    return frames.float().permute(1, 0, 2, 3), cache


@pytest.mark.parametrize("keep_first_frame", [True, False])
def test_krea_recompute_45_frames(checkpoint, keep_first_frame):
    cond, noise = prompt(), start_noise(45)
    ours, draws = run_pack(checkpoint, cond, noise, schedule="krea", **krea_cache(keep_first_frame))
    args = reference_args("krea_realtime", "configs/default_config.yaml", "configs/self_forcing_server_14b.yaml")

    def body():
        server = rh.import_module(KREA_SERVER)
        server.encode_video_latent = krea_encode_stand_in
        server.log.setLevel("WARNING")
        wrapper = rh.import_module("utils.wan_wrapper")
        transformer = wrapper.WanDiffusionWrapper(model_name="Wan2.1-T2V-14B", timestep_shift=5.0, is_causal=True)
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)["generator_ema"]
        transformer.load_state_dict(state)
        decoder = KreaLatentDecoder()
        pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
            args, device="cpu", generator=transformer, text_encoder=TextFeatures({"p": cond}), vae=decoder)
        models = server.Models(pipeline.text_encoder, transformer, pipeline, None, decoder)
        params = server.GenerateParams(prompt="p", width=LATENT_HW[1] * 8, height=LATENT_HW[0] * 8, seed=0,
                                       kv_cache_num_frames=3, num_blocks=15, num_denoising_steps=5,
                                       keep_first_frame=keep_first_frame)
        initial = rh.NoiseDraw(-1, 0, noise)
        with rh.NoiseTape([initial] + draws, rh.frames_first).patched():
            session = server.GenerationSession(params, args, frame_callback=lambda *a: None,
                                               models=models)
            for _ in range(15):
                session.generate_block_internal(models)
        return session.all_latents.permute(0, 2, 1, 3, 4)

    inert = ("fastapi", "fastapi.middleware", "fastapi.middleware.cors", "fastapi.responses", "msgpack", "cv2",
             "requests", "PIL", "PIL.Image", "torchvision", "torchvision.transforms",
             "torchvision.transforms.functional", "omegaconf", "dotenv")
    ref = run_reference("krea_realtime", body, rewrites=krea_rewrites(), inert_modules=inert,
                        extra_modules={"pydantic": pydantic_stand_in(), "settings": settings_stand_in(),
                                       "sageattention": None},
                        unused_modules=rh.ReferenceSpec("x").unused_modules + ("demo_utils.vae_block3",))
    err = report(f"Krea recompute keep_first_frame={keep_first_frame}", ours, ref, 45)
    assert err <= TOLERANCE


def krea_cache(keep_first_frame):
    """Krea's server settings as the pack's recompute cache: kv_cache_num_frames 3 + a 3-frame chunk attended;
    keep_first_frame is one anchor frame."""
    return {"cache": CacheSpec(policy="recompute", sink_frames=int(keep_first_frame), window_frames=6)}


def pydantic_stand_in():
    module = types.ModuleType("pydantic")

    class BaseModel:
        """Keyword construction with class defaults: all GenerateParams needs of pydantic."""

        def __init__(self, **values):
            for name in getattr(type(self), "__annotations__", {}):
                setattr(self, name, values.pop(name, getattr(type(self), name, None)))
            for name, value in values.items():
                setattr(self, name, value)

    module.BaseModel = BaseModel
    module.ValidationError = type("ValidationError", (Exception,), {})
    return module


def settings_stand_in():
    module = types.ModuleType("settings")
    module.MODEL_FOLDER = "unused"
    module.COMPILE_SHAPES = []
    return module
