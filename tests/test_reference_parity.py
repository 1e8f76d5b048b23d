"""The pack's dense paths against each model family's own public code, on the same tiny checkpoint and noise.

Skipped unless ``FASTAR_REFERENCE_DIR`` names a folder written by ``tools/extract_references.py``; needs
``pyyaml`` (the references' configs are YAML). Every test runs on two cases (``parity_models.SHAPES``: two model
shapes, two seeds, attention of realistic sharpness), loads the same checkpoint into the reference's own wrapper
as its inference does (``generator`` or ``generator_ema``, per family) and into the pack through its loader
(which picks the entry by the family's file name), runs both on the same initial noise with the pack's re-noise
draws handed to the reference in order, and compares the final latents in fp32. The conditioning is 16 text
tokens, shorter than ``text_len`` (512), as a bare ``--cond`` file is: the references zero-pad it.

Windowed families run 63 latent frames, three or more window lengths. Every test has a negative control: the
pack run once more with one setting deliberately wrong (one frame more or less in the window, no sink, the
other weights, float64 sigmas, a recache that keeps the sink), which must FAIL the tolerance, so a test that
cannot see its own subject fails.

Patches, all listed here (shared ones are described in ``reference_harness``):
- diffusers ``ModelMixin``/``ConfigMixin``/``register_to_config`` stand-ins; ``from_pretrained`` builds the
  tiny config;
- flash-attn absent; the SDPA fallback runs in fp32 instead of casting q/k/v to bf16; no ``.to(bfloat16)`` of
  the pipeline (the references' ``inference.py`` casts; fp32 here);
- ``torch.compile`` is the identity while importing (it wraps ``flex_attention``);
- package ``__init__`` files not executed; T5, tokenizer, VAE and CLIP modules are placeholders; the text
  encoder passed to each pipeline returns the given features and the VAE returns latents unchanged;
  ``demo_utils.memory`` (``torch.cuda`` at import) has ``gpu = cpu``; ``tqdm`` is the identity when absent;
- geometry constants rewritten per reference (``parity_models.reference_geometry``): 1560 tokens per frame ->
  the case's, 32760 (21 frames) -> 21 frames of them, 30 blocks -> the case's layers, cache shapes ``12, 128``
  -> its heads and head size; CausVid's ``device="cuda"`` in its re-noise -> ``"cpu"``;
- noise: ``torch.randn``/``randn_like`` return the pack's draws (``NoiseTape``); Rolling Forcing draws a
  whole-window tensor per chunk and uses one chunk's slice of it, so the pack's chunk draw fills that slice.
LongLive runs its base weights only: its LoRA is applied with ``peft``, which the pack replaces by a merge
(tested in ``test_checkpoint``). CausVid runs one 21-frame rollout here and Krea keeps its first frame: their
loops through the VAE (CausVid's long-video restarts, Krea's re-encoded first frame with keep_first_frame off)
are compared in ``test_vae_loop_parity`` with a tiny random Wan2.1 VAE on both sides.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import parity_models as pm
import pytest
import reference_harness as rh
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.files.wan_checkpoint import load_wan_model
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.prompts import PromptSchedule, PromptSegment
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.rollout.schedule import DenoisingSchedule, get_schedule, shift_sigma, warp_steps

pytestmark = pytest.mark.skipif(not rh.REFERENCE_DIR, reason="FASTAR_REFERENCE_DIR is not set (see "
                                "tools/extract_references.py)")

TOLERANCE = 1e-5
ROLLING_TOLERANCE = 1e-6  # Rolling Forcing computes exactly what the pack does: float rounding only
LONG = 63  # latent frames for the windowed families: 21 chunks, three windows of 21 or more


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Tiny tensors: one thread (OpenMP barriers dominate otherwise)."""


@pytest.fixture(scope="module", params=pm.SHAPES, ids=[s.name for s in pm.SHAPES])
def case(request, tmp_path_factory):
    return pm.build_case(request.param, tmp_path_factory.mktemp(request.param.name))


def run_pack(case, name, prompts, noise, weights_entry="auto", vae=None, **config):
    model, ckpt = load_wan_model(case.files[name], config=case.cfg, weights_entry=weights_entry)
    sampler = ARSampler(CausalRunner(model))
    draws = rh.record_pack_noise(sampler)
    cfg = RolloutConfig(num_frames=noise.shape[2], latent_height=case.shape.latent_hw[0],
                        latent_width=case.shape.latent_hw[1], seed=5 + case.shape.seed, **config)
    latent = sampler.generate(prompts, cfg, initial_noise=noise, vae=vae).latent
    return latent, draws


def report(family, ours, ref, frames, tol=TOLERANCE) -> float:
    err = rh.relative_error(ours, ref)
    first = rh.first_deviating_frame(ours, ref, tol)
    print(f"\nPARITY {family}: {frames} latent frames, relative error {err:.2e}"
          + (f", first deviating frame {first}" if first is not None else ""))
    return err


def assert_control_fails(family, what, wrong, ref, tol=TOLERANCE) -> None:
    """A deliberately wrong setting must miss the tolerance: the test can see what it checks."""
    err = rh.relative_error(wrong, ref)
    print(f"PARITY {family} control ({what}): relative error {err:.2e}")
    assert err > tol, f"{family}: the control '{what}' passes the tolerance too ({err:.2e}); the test is blind to it"


# -- running a reference ------------------------------------------------------------------------------------------
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


def tqdm_stub():
    try:
        import tqdm  # noqa: F401

        return {}
    except ImportError:
        stub = types.ModuleType("tqdm")
        # A spec, as an imported module has: torch._dynamo's first import looks tqdm's up.
        stub.__spec__ = importlib.machinery.ModuleSpec("tqdm", None)
        stub.tqdm = lambda it=None, *a, **k: it
        return {"tqdm": stub}


def run_reference(name, case, body, rewrites=None, **spec):
    spec_obj = rh.ReferenceSpec(name, pm.reference_geometry(name, case.shape) if rewrites is None else rewrites,
                                **spec)
    extra = tqdm_stub()
    sys.modules.update(extra)
    try:
        with rh.reference_modules(spec_obj, case.shape.kwargs), torch.no_grad():  # as their inference.py
            return body()
    finally:
        for k in extra:
            sys.modules.pop(k, None)


def chunk_pipeline_run(name, case, args, noise, draws, cond):
    """Self-Forcing-style ``CausalInferencePipeline.inference`` (Self-Forcing, Causal Forcing)."""

    def body():
        pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
            args, device="cpu", text_encoder=TextFeatures({"p": cond}), vae=LatentVAE())
        pm.load_reference_weights(pipeline.generator, case, name)
        with rh.NoiseTape(draws, rh.frames_first).patched():
            _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"], return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    return run_reference(name, case, body)


def window_spec(sink, attend):
    """A window cache attending ``attend`` frames in all, sink and current chunk included: the references'
    ``local_attn_size``, which is the pack's ``window_frames``."""
    return CacheSpec(policy="window", sink_frames=sink, window_frames=attend)


# -- Self-Forcing -----------------------------------------------------------------------------------------------
SF_CONFIGS = ("configs/default_config.yaml", "configs/self_forcing_dmd.yaml")


def test_self_forcing_global_21_frames(case):
    """Its checkpoint cache holds 21 frames, the length it was trained for."""
    cond, noise = case.prompt(), case.noise(21)
    ours, draws = run_pack(case, "self_forcing", cond, noise, schedule="self-forcing", cache=CacheSpec(policy="global"))
    ref = chunk_pipeline_run("self_forcing", case, reference_args("self_forcing", *SF_CONFIGS), noise, draws, cond)
    assert report("Self-Forcing global", ours, ref, 21) <= TOLERANCE
    wrong, _ = run_pack(case, "self_forcing", cond, noise, schedule="self-forcing", cache=window_spec(0, 20))
    assert_control_fails("Self-Forcing global", "a window one frame short of 21", wrong, ref)


# Self-Forcing rolls its cache with ``local_attn_size`` (and keeps ``sink_size`` frames): one setting per case.
SF_LOCAL = {pm.SHAPES[0].name: (15, 0), pm.SHAPES[1].name: (12, 3)}


def test_self_forcing_local_attention_63_frames(case):
    attend, sink = SF_LOCAL[case.shape.name]
    cond, noise = case.prompt(), case.noise(LONG)
    ours, draws = run_pack(case, "self_forcing", cond, noise, schedule="self-forcing", cache=window_spec(sink, attend))
    args = reference_args("self_forcing", *SF_CONFIGS, model_kwargs={"local_attn_size": attend, "sink_size": sink})
    ref = chunk_pipeline_run("self_forcing", case, args, noise, draws, cond)
    assert report(f"Self-Forcing local {attend} sink {sink}", ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "self_forcing", cond, noise, schedule="self-forcing",
                        cache=window_spec(sink, attend + 1))
    assert_control_fails("Self-Forcing local", "one frame more in the window", wrong, ref)


# -- Causal Forcing ---------------------------------------------------------------------------------------------
CF_DEFAULT = "configs/default_config.yaml"


@pytest.mark.parametrize("variant,fpb,attend", [("chunkwise", 3, 21), ("framewise", 1, 15)])
def test_causal_forcing_63_frames(case, variant, fpb, attend):
    cond, noise = case.prompt(), case.noise(LONG)
    ours, draws = run_pack(case, "causal_forcing", cond, noise, schedule="self-forcing", frames_per_block=fpb,
                           cache=window_spec(0, attend))
    args = reference_args("causal_forcing", CF_DEFAULT, f"configs/causal_forcing_dmd_{variant}.yaml",
                          model_kwargs={"local_attn_size": attend, "sink_size": 0})
    ref = chunk_pipeline_run("causal_forcing", case, args, noise, draws, cond)
    assert report(f"Causal Forcing {variant}", ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "causal_forcing", cond, noise, schedule="self-forcing", frames_per_block=fpb,
                        cache=window_spec(0, attend - 1))
    assert_control_fails(f"Causal Forcing {variant}", "one frame less in the window", wrong, ref)


# -- Causal Forcing++ (frame-wise, 1 and 2 steps, 4-step first frame) -------------------------------------------
def warped(steps):
    return DenoisingSchedule("warped", tuple(warp_steps(steps, 5.0)), 5.0)


@pytest.mark.parametrize("steps", [1, 2])
def test_causal_forcing_plus_plus_63_frames(case, steps):
    cond, noise = case.prompt(), case.noise(LONG)
    config = f"configs/causal_forcing_dmd_framewise_{steps}step.yaml"
    args = reference_args("causal_forcing", CF_DEFAULT, config, model_kwargs={"local_attn_size": 21, "sink_size": 0})
    schedule = warped({1: [1000], 2: [1000, 500]}[steps])
    first = warped([1000, 750, 500, 250])  # its denoising_step_list_first_chunk
    ours, draws = run_pack(case, "causal_forcing", cond, noise, schedule=schedule, first_chunk_schedule=first,
                           frames_per_block=1, cache=window_spec(0, 21))
    ref = chunk_pipeline_run("causal_forcing", case, args, noise, draws, cond)
    assert report(f"Causal Forcing++ {steps}-step", ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "causal_forcing", cond, noise, schedule=schedule, first_chunk_schedule=first,
                        frames_per_block=1, cache=window_spec(0, 21), weights_entry="generator")
    assert_control_fails(f"Causal Forcing++ {steps}-step", "generator instead of generator_ema", wrong, ref)


# -- Rolling Forcing --------------------------------------------------------------------------------------------
def rolling_window_noise(num_steps, fpb=3):
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


ROLLING = CacheSpec(policy="rolling", sink_frames=3, rolling_capacity=24, rolling_attend=21)


def test_rolling_forcing_63_frames(case):
    """At float rounding: the clean passes of chunks ending before frame 21 read the frames so far (no empty
    slot), and the five sigmas are the float32 table's, as the reference indexes them."""
    cond, noise = case.prompt(), case.noise(LONG)
    ours, draws = run_pack(case, "rolling_forcing", cond, noise, mode="rolling", schedule="rolling-forcing",
                           cache=ROLLING)
    args = reference_args("rolling_forcing", "configs/default_config.yaml", "configs/rolling_forcing_dmd.yaml")

    def body():
        module = rh.import_module("pipeline.rolling_forcing_inference")
        pipeline = module.CausalInferencePipeline(args, device="cpu", text_encoder=TextFeatures({"p": cond}),
                                                  vae=LatentVAE())
        pm.load_reference_weights(pipeline.generator, case, "rolling_forcing")
        layout = rolling_window_noise(len(pipeline.denoising_step_list))
        with rh.NoiseTape(draws, layout).patched():
            _, latents = pipeline.inference_rolling_forcing(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"],
                                                            return_latents=True)
        scheduler = pipeline.scheduler  # the sigma its wrapper converts each step's timestep with
        sigmas = [scheduler.sigmas[torch.argmin((scheduler.timesteps - t).abs())] for t in pipeline.denoising_step_list]
        return latents.permute(0, 2, 1, 3, 4), torch.stack(sigmas)

    ref, ref_sigmas = run_reference("rolling_forcing", case, body)
    assert report("Rolling Forcing", ours, ref, LONG, ROLLING_TOLERANCE) <= ROLLING_TOLERANCE
    pack_sigmas = torch.tensor(get_schedule("rolling-forcing").sigmas, dtype=torch.float32)
    assert torch.equal(pack_sigmas, ref_sigmas), "the five sigmas are the reference's, bit for bit"
    wider = CacheSpec(policy="rolling", sink_frames=3, rolling_capacity=24, rolling_attend=22)
    wrong, _ = run_pack(case, "rolling_forcing", cond, noise, mode="rolling", schedule="rolling-forcing", cache=wider)
    assert_control_fails("Rolling Forcing", "one frame more attended", wrong, ref, ROLLING_TOLERANCE)
    # Shifted in float64, two of the five land one float32 ulp away: 4.5e-7 at 63 frames with these weights, under
    # the bound (6e-6 with others), so the sigmas themselves are compared above, and this shows that check sees it.
    float64 = torch.tensor([shift_sigma(s / 1000, 5.0) for s in (1000, 800, 600, 400, 200)], dtype=torch.float32)
    assert int((float64 != ref_sigmas).sum()) == 2


# -- LongLive 1.0 -----------------------------------------------------------------------------------------------
LL_CONFIGS = ("configs/default_config.yaml", "configs/longlive_inference.yaml")
LL_SWITCH_CONFIGS = ("configs/default_config.yaml", "configs/longlive_interactive_inference.yaml")
LONGLIVE = window_spec(3, 12)


def longlive_run(case, args, noise, draws, table, switches=()):
    def body():
        if not switches:
            pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
                args, device="cpu", text_encoder=TextFeatures(table), vae=LatentVAE())
        else:
            pipeline = rh.import_module("pipeline.interactive_causal_inference").InteractiveCausalInferencePipeline(
                args, device="cpu", text_encoder=TextFeatures(table), vae=LatentVAE())
        pm.load_reference_weights(pipeline.generator, case, "longlive")
        with rh.NoiseTape(draws, rh.frames_first).patched():
            if not switches:
                _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["a"], return_latents=True)
            else:
                _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts_list=[[k] for k in table],
                                                switch_frame_indices=list(switches), return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    return run_reference("longlive", case, body,
                         unused_modules=rh.ReferenceSpec("x").unused_modules + ("utils.debug_option",))


def test_longlive_window_sink_63_frames(case):
    cond, noise = case.prompt(), case.noise(LONG)
    ours, draws = run_pack(case, "longlive", cond, noise, schedule="longlive", cache=LONGLIVE)
    ref = longlive_run(case, reference_args("longlive", *LL_CONFIGS), noise, draws, {"a": cond})
    assert report("LongLive window", ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "longlive", cond, noise, schedule="longlive", cache=window_spec(0, 12))
    assert_control_fails("LongLive window", "no sink", wrong, ref)
    wrong, _ = run_pack(case, "longlive", cond, noise, schedule="longlive", cache=LONGLIVE,
                        weights_entry="generator_ema")
    assert_control_fails("LongLive window", "generator_ema instead of generator", wrong, ref)


# Switch frames: the sink chunk's end (3), the last switch whose recache starts at frame 0 (12), late ones.
@pytest.mark.parametrize("switches", [(3, 33), (12, 45)], ids=["at3-at33", "at12-at45"])
def test_longlive_prompt_switches_with_recache_63_frames(case, switches):
    """A switch at frame 12 or earlier recaches from frame 0, the sink included (LongLive's sink protection is
    off there); a later one keeps the sink's old keys."""
    conds = [case.prompt(1), case.prompt(7), case.prompt(9)]
    noise = case.noise(LONG)

    def prompts(*recache):
        return PromptSchedule([PromptSegment(0, conds[0])] + [PromptSegment(f, c, recache_frames=n)
                                                              for f, c, n in zip(switches, conds[1:], recache)])

    family = f"LongLive switches at {switches}"
    ours, draws = run_pack(case, "longlive", prompts(12, 12), noise, schedule="longlive", cache=LONGLIVE)
    table = dict(zip("abc", conds))
    ref = longlive_run(case, reference_args("longlive", *LL_SWITCH_CONFIGS), noise, draws, table, switches)
    assert report(family, ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "longlive", prompts(12, 0), noise, schedule="longlive", cache=LONGLIVE)
    assert_control_fails(family, "no recache at the late switch", wrong, ref)
    # A recache of the frames after the sink only (none for a switch at 3): the sink keeps the old prompt.
    wrong, _ = run_pack(case, "longlive", prompts(switches[0] - 3, 12), noise, schedule="longlive", cache=LONGLIVE)
    assert_control_fails(family, "the early recache keeps the sink", wrong, ref)


# -- CausVid ------------------------------------------------------------------------------------------------------
def test_causvid_21_frames(case):
    """CausVid's cache is a fixed 21 frames that never rolls; its long videos restart a rollout from frames
    re-encoded by the VAE, so one rollout (21 frames) is what its code can compare."""
    cond, noise = case.prompt(), case.noise(21)
    ours, draws = run_pack(case, "causvid", cond, noise, schedule="causvid", cache=CacheSpec(policy="global"))
    args = reference_args("causvid", "configs/wan_causal_dmd.yaml")

    def body():
        wrapper = rh.import_module("causvid.models.wan.wan_wrapper")
        models = sys.modules["causvid.models"]
        models.get_diffusion_wrapper = lambda model_name: wrapper.CausalWanDiffusionWrapper
        models.get_text_encoder_wrapper = lambda model_name: (lambda: TextFeatures({"p": cond}))
        models.get_vae_wrapper = lambda model_name: LatentVAE
        pipeline = rh.import_module("causvid.models.wan.causal_inference").InferencePipeline(args, device="cpu")
        pm.load_reference_weights(pipeline.generator, case, "causvid")
        with rh.NoiseTape(draws, rh.frames_first).patched():
            _, latents = pipeline.inference(noise.permute(0, 2, 1, 3, 4), text_prompts=["p"], return_latents=True)
        return latents.permute(0, 2, 1, 3, 4)

    wan_base = "causvid.models.wan.wan_base"
    ref = run_reference("causvid", case, body, empty_packages=(
        "causvid", "causvid.models", "causvid.models.wan", wan_base, f"{wan_base}.modules"),
        unused_modules=tuple(f"{wan_base}.modules.{m}" for m in ("t5", "tokenizers", "vae", "clip")))
    assert report("CausVid", ours, ref, 21) <= TOLERANCE
    wrong, _ = run_pack(case, "causvid", cond, noise, schedule="causvid", cache=CacheSpec(policy="global"),
                        weights_entry="generator_ema")
    assert_control_fails("CausVid", "generator_ema instead of generator", wrong, ref)


# -- Krea Realtime (KV recompute) --------------------------------------------------------------------------------
KREA_SERVER = "release_server"


def krea_rewrites(shape):
    tpf = shape.tpf
    return [
        *pm.geometry(shape, "pipeline.causal_inference", blocks=False, heads=0),
        rh.Rewrite("wan.modules.causal_model", "            frame_seqlen = 1560", f"            frame_seqlen = {tpf}"),
        rh.Rewrite("wan.modules.causal_model", pm.SF_ATTENTION, pm.SF_ATTENTION.replace("32760", str(21 * tpf))
                   .replace("1560", str(tpf))),
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


class LatentRoundTrip:
    """A stand-in VAE (the pack's protocol) whose round trip is exact: a latent frame "decodes" to copies of
    itself (1 for the first, 4 after) and a frame encodes to itself, so a re-encode gives back the stored
    latent. A negative control: the loop with the VAE's round trip left out."""

    def decode(self, latents):
        repeats = torch.tensor([1] + [4] * (latents.shape[2] - 1))
        return torch.repeat_interleave(latents, repeats, dim=2)

    def encode(self, pixels):
        return pixels[:, :, :1]


class KreaLatentDecoder(torch.nn.Module):
    """Stands in for Krea's streaming VAE decoder (keep_first_frame on never re-encodes what it decodes): each
    latent frame becomes as many "pixel" frames as the Wan VAE gives it (1 for the video's first, 4 after), each
    a copy of the latent."""

    def __init__(self):
        super().__init__()
        self.first = True

    def forward(self, latents, *cache):
        repeats = [1 if (self.first and i == 0) else 4 for i in range(latents.shape[1])]
        self.first = False
        return torch.repeat_interleave(latents, torch.tensor(repeats), dim=1), list(cache)


def krea_cache(keep_first_frame, context=3):
    """Krea's server settings as the pack's recompute cache: kv_cache_num_frames 3 + a 3-frame chunk attended;
    keep_first_frame is one anchor frame."""
    return CacheSpec(policy="recompute", sink_frames=int(keep_first_frame), window_frames=context + 3)


def test_krea_recompute_63_frames(case):
    """keep_first_frame on: the context is frame 0 and the last two frames; nothing goes through the VAE."""
    keep_first_frame = True
    cond, noise = case.prompt(), case.noise(LONG)
    ours, draws = run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=krea_cache(keep_first_frame))
    args = reference_args("krea_realtime", "configs/default_config.yaml", "configs/self_forcing_server_14b.yaml")
    hw = case.shape.latent_hw

    def body():
        server = rh.import_module(KREA_SERVER)
        server.log.setLevel("WARNING")
        wrapper = rh.import_module("utils.wan_wrapper")
        transformer = wrapper.WanDiffusionWrapper(model_name="Wan2.1-T2V-14B", timestep_shift=5.0, is_causal=True)
        pm.load_reference_weights(transformer, case, "krea_realtime")
        decoder = KreaLatentDecoder()
        pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
            args, device="cpu", generator=transformer, text_encoder=TextFeatures({"p": cond}), vae=decoder)
        models = server.Models(pipeline.text_encoder, transformer, pipeline, None, decoder)
        params = server.GenerateParams(prompt="p", width=hw[1] * 8, height=hw[0] * 8, seed=0,
                                       kv_cache_num_frames=3, num_blocks=LONG // 3, num_denoising_steps=5,
                                       keep_first_frame=keep_first_frame)
        initial = rh.NoiseDraw(-1, 0, noise)
        with rh.NoiseTape([initial] + draws, rh.frames_first).patched():
            session = server.GenerationSession(params, args, frame_callback=lambda *a: None, models=models)
            for _ in range(LONG // 3):
                session.generate_block_internal(models)
        return session.all_latents.permute(0, 2, 1, 3, 4)

    inert = ("fastapi", "fastapi.middleware", "fastapi.middleware.cors", "fastapi.responses", "msgpack", "cv2",
             "requests", "PIL", "PIL.Image", "torchvision", "torchvision.transforms",
             "torchvision.transforms.functional", "omegaconf", "dotenv")
    ref = run_reference("krea_realtime", case, body, rewrites=krea_rewrites(case.shape), inert_modules=inert,
                        extra_modules={"pydantic": pydantic_stand_in(), "settings": settings_stand_in(),
                                       "sageattention": None},
                        unused_modules=rh.ReferenceSpec("x").unused_modules + ("demo_utils.vae_block3",))
    family = f"Krea recompute keep_first_frame={keep_first_frame}"
    assert report(family, ours, ref, LONG) <= TOLERANCE
    wrong, _ = run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=krea_cache(keep_first_frame, 4))
    assert_control_fails(family, "one context frame more", wrong, ref)
    wrong, _ = run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=krea_cache(not keep_first_frame),
                        vae=LatentRoundTrip())
    assert_control_fails(family, "keep_first_frame off", wrong, ref)


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
