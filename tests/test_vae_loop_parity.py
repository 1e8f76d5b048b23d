"""The VAE in the loop against the references: CausVid's long-video restarts and Krea's first-frame re-encode.

Both run through the VAE inside the sampling loop, so both sides get one tiny random Wan2.1 VAE: the weights are
made once by CausVid's own ``WanVAE_`` (``dim`` 8 instead of 96, seeded), saved as ``Wan2.1_VAE.pth``, and each
reference loads that file through its own code (CausVid's ``WanVAEWrapper`` -> ``_video_vae``; Krea's server
``load_vae``: ``WanVAE`` for the encoder, its streaming ``VAEDecoderWrapper`` for the decoder). The pack is given
the same classes loaded from the same file, wrapped in its ``VideoVAE`` protocol: what is compared is the loop
(which frame is decoded, re-encoded and placed where), not a VAE of the pack's own, which it does not have.

- CausVid: its script ``minimal_inference/longvideo_autoregressive_inference.py`` runs as published (imported
  with ``sys.argv`` set), 4 rollouts of 21 latent frames, 3 overlap frames: the pack's 75 latent frames against
  the first rollout and each later one's 18 new frames. Each rollout's latents are recorded by wrapping
  ``InferencePipeline.inference`` (the return value is copied; nothing else changes).
- Krea: the server's ``GenerationSession`` with ``keep_first_frame`` off (its default), 63 latent frames: from
  the third chunk on, every context rebuild re-encodes a decoded frame.

Patches beside those of ``test_reference_parity`` (whose helpers these tests use):
- the VAE's ``dim=96`` -> 8 (CausVid's and Krea's ``_video_vae``, Krea's ``VAEDecoder3d``/``VAEEncoder3d``), its
  weight path -> the tiny file, Krea's ``WanVAE(device="cuda")`` -> cpu;
- CausVid's script: ``device="cuda"``/``bfloat16`` -> cpu/float32 (its pipeline, noise and re-encode casts), the
  noise's 60x104 latent -> the case's; ``OmegaConf.load`` returns the config dict, ``TextDataset`` one prompt,
  ``export_to_video`` keeps the video; the checkpoint folder holds the case's CausVid file as ``model.pt``;
- Krea: ``float16`` -> float32 (its VAE and ``encode_video_latent``), its re-encode's hard-coded 480x832 ->
  the case's pixel size (the bicubic resize to the frame's own size is then the identity, checked below),
  ``frames.cuda()`` -> ``frames``; ``settings.MODEL_FOLDER`` -> the folder holding the tiny VAE.
Noise: the pack's draws, as in ``test_reference_parity``; CausVid draws one 21-frame noise per rollout, whose
first chunk a restarted rollout never reads (its clean frames stand there): zeros there, the pack's noise after.
"""

from __future__ import annotations

import contextlib
import sys
import types

import parity_models as pm
import pytest
import reference_harness as rh
import test_reference_parity as trp
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.rollout.vae import CAUSVID_RESTART

pytestmark = trp.pytestmark

VAE_DIM = 8  # the Wan2.1 VAE's base width (96 released): a small random VAE of the same structure
VAE_SEED = 11
CAUSVID_ROLLOUTS = 4  # 21 + 3 x 18 = 75 latent frames
CAUSVID_PACKAGES = ("causvid", "causvid.models", "causvid.models.wan", "causvid.models.wan.wan_base",
                    "causvid.models.wan.wan_base.modules")
CAUSVID_VAE = "causvid.models.wan.wan_base.modules.vae"


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Tiny tensors: one thread."""


@pytest.fixture(scope="module", params=pm.SHAPES, ids=[s.name for s in pm.SHAPES])
def case(request, tmp_path_factory):
    return pm.build_case(request.param, tmp_path_factory.mktemp(request.param.name))


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    """``<folder>/Wan2.1-T2V-1.3B/Wan2.1_VAE.pth``: the tiny VAE's weights, made by CausVid's ``WanVAE_``."""
    folder = tmp_path_factory.mktemp("tiny_vae")
    (folder / "Wan2.1-T2V-1.3B").mkdir()
    spec = rh.ReferenceSpec("causvid", [], empty_packages=CAUSVID_PACKAGES,
                            unused_modules=tuple(f"{CAUSVID_PACKAGES[-1]}.{m}" for m in ("t5", "tokenizers", "clip")))
    with rh.reference_modules(spec, {}), torch.random.fork_rng():
        torch.manual_seed(VAE_SEED)
        vae = rh.import_module(CAUSVID_VAE).WanVAE_(dim=VAE_DIM, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                                    attn_scales=[], temperal_downsample=[False, True, True])
    torch.save(vae.state_dict(), folder / "Wan2.1-T2V-1.3B" / "Wan2.1_VAE.pth")
    return folder


def vae_file(folder) -> str:
    return str(folder / "Wan2.1-T2V-1.3B" / "Wan2.1_VAE.pth")


# -- CausVid: long video by restarts ------------------------------------------------------------------------------
class CausVidVAE:
    """CausVid's ``WanVAEWrapper`` in the pack's protocol: its decode (``[B, F, C, h, w]``, clamped to [-1, 1]) and
    its script's ``encode`` (``model.encode(u, [mean, 1 / std])`` per video)."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def decode(self, latents):
        return self.wrapper.decode_to_pixel(latents.permute(0, 2, 1, 3, 4)).permute(0, 2, 1, 3, 4)

    def encode(self, pixels):
        w = self.wrapper
        scale = [w.mean.to(pixels), 1.0 / w.std.to(pixels)]
        return torch.stack([w.model.encode(u[None], scale).float()[0] for u in pixels])


CAUSVID_SCRIPT = "minimal_inference.longvideo_autoregressive_inference"


def causvid_vae_rewrites(folder):
    return [rh.Rewrite(CAUSVID_VAE, "dim=96,", f"dim={VAE_DIM},"),
            rh.Rewrite("causvid.models.wan.wan_wrapper", '"wan_models/Wan2.1-T2V-1.3B/Wan2.1_VAE.pth"',
                       repr(vae_file(folder)))]


def causvid_script_rewrites(case, folder):
    h, w = case.shape.latent_hw
    script = CAUSVID_SCRIPT
    return pm.reference_geometry("causvid", case.shape) + causvid_vae_rewrites(folder) + [
        rh.Rewrite(script, 'InferencePipeline(config, device="cuda")', 'InferencePipeline(config, device="cpu")'),
        rh.Rewrite(script, 'pipeline.to(device="cuda", dtype=torch.bfloat16)',
                   'pipeline.to(device="cpu", dtype=torch.float32)'),
        rh.Rewrite(script, '[1, 21, 16, 60, 104], device="cuda", dtype=torch.bfloat16',
                   f'[1, 21, 16, {h}, {w}], device="cpu", dtype=torch.float32'),
        rh.Rewrite(script, ".to(torch.bfloat16)", ".to(torch.float32)", 2),
    ]


def causvid_script_modules(args, videos, on_prompts):
    """What the script imports for its files and settings: the config, the prompt list (``on_prompts`` runs when
    it is read: after the pipeline is built and loaded, before the first rollout), the video writer."""
    omegaconf = types.ModuleType("omegaconf")
    omegaconf.OmegaConf = types.SimpleNamespace(load=lambda path: args)
    data = types.ModuleType("causvid.data")

    def text_dataset(path):
        on_prompts()
        return ["p"]

    data.TextDataset = text_dataset
    utils = types.ModuleType("diffusers.utils")
    utils.export_to_video = lambda video, path, fps=16: videos.append(video)
    return {"omegaconf": omegaconf, "causvid.data": data, "diffusers.utils": utils}


def run_causvid_reference(case, body, rewrites, extra_modules=None):
    return trp.run_reference("causvid", case, body, rewrites=rewrites,
                             empty_packages=CAUSVID_PACKAGES + ("minimal_inference",),
                             unused_modules=tuple(f"{CAUSVID_PACKAGES[-1]}.{m}" for m in ("t5", "tokenizers", "clip")),
                             extra_modules=extra_modules or {})


def causvid_pack_vae(case, folder):
    """CausVid's own VAE wrapper, loaded from the tiny file, for the pack."""
    def body():
        return CausVidVAE(rh.import_module("causvid.models.wan.wan_wrapper").WanVAEWrapper())

    return run_causvid_reference(case, body, causvid_vae_rewrites(folder))


def causvid_tape(noise, draws, rollouts):
    """The noise CausVid's script asks for, in order: per rollout one 21-frame draw, then its re-noise draws."""
    spec, per_rollout = CAUSVID_RESTART, CAUSVID_RESTART.every // 3
    tape = []
    for r in range(rollouts):
        if r == 0:
            first, chunks = noise[:, :, :spec.every], range(per_rollout)
        else:
            start = spec.every + (r - 1) * spec.new_frames
            unread = torch.zeros_like(noise[:, :, :spec.overlap])  # the restart's clean frames stand there
            first = torch.cat([unread, noise[:, :, start:start + spec.new_frames]], dim=2)
            done = per_rollout + (r - 1) * (per_rollout - 1)
            chunks = range(done, done + per_rollout - 1)
        tape.append(rh.NoiseDraw(-1, 0, first))
        tape += [d for d in draws if d.chunk in chunks]
    return tape


def test_causvid_long_video_restarts_75_frames(case, vae_folder, tmp_path):
    spec = CAUSVID_RESTART
    frames = spec.every + (CAUSVID_ROLLOUTS - 1) * spec.new_frames
    cond, noise = case.prompt(), case.noise(frames)
    vae = causvid_pack_vae(case, vae_folder)
    run = dict(schedule="causvid", cache=CacheSpec(policy="global"))
    ours, draws = trp.run_pack(case, "causvid", cond, noise, restart=spec, vae=vae, **run)
    args = trp.reference_args("causvid", "configs/wan_causal_dmd.yaml")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").symlink_to(case.files["causvid"])
    rollouts, videos = [], []
    tape = contextlib.ExitStack()  # the noise tape, from the script's first rollout on (its model init draws too)

    def body():
        wrapper = rh.import_module("causvid.models.wan.wan_wrapper")
        models = sys.modules["causvid.models"]
        models.get_diffusion_wrapper = lambda model_name: wrapper.CausalWanDiffusionWrapper
        models.get_text_encoder_wrapper = lambda model_name: (lambda: trp.TextFeatures({"p": cond}))
        models.get_vae_wrapper = lambda model_name: wrapper.WanVAEWrapper
        pipeline_class = rh.import_module("causvid.models.wan.causal_inference").InferencePipeline
        published = pipeline_class.inference

        def recorded(self, *a, **k):
            video, latents = published(self, *a, **k)
            rollouts.append(latents.clone())
            return video, latents

        pipeline_class.inference = recorded
        argv = sys.argv
        sys.argv = ["longvideo", "--config_path", "unused", "--checkpoint_folder", str(ckpt), "--prompt_file_path",
                    "unused", "--output_folder", str(tmp_path / "out"), "--num_rollout", str(CAUSVID_ROLLOUTS),
                    "--num_overlap_frames", str(spec.overlap)]
        try:
            with tape:
                rh.import_module(CAUSVID_SCRIPT)
        finally:
            sys.argv = argv

    def start_tape():
        tape.enter_context(rh.NoiseTape(causvid_tape(noise, draws, CAUSVID_ROLLOUTS), rh.frames_first).patched())

    run_causvid_reference(case, body, causvid_script_rewrites(case, vae_folder),
                          causvid_script_modules(args, videos, start_tape))
    assert len(rollouts) == CAUSVID_ROLLOUTS and len(videos) == 1
    # Its video: each rollout's first 72 pixel frames (the last 9 are the next one's overlap).
    assert videos[0].shape[0] == CAUSVID_ROLLOUTS * 4 * spec.new_frames
    ref = torch.cat([rollouts[0]] + [r[:, spec.overlap:] for r in rollouts[1:]], dim=1).permute(0, 2, 1, 3, 4)
    family = "CausVid long video (restarts every 21 frames)"
    assert trp.report(family, ours, ref, frames) <= trp.TOLERANCE
    wrong, _ = trp.run_pack(case, "causvid", cond, noise, restart=spec, vae=trp.LatentRoundTrip(), **run)
    trp.assert_control_fails(family, "the stored latent instead of the VAE round trip", wrong, ref)
    wrong, _ = trp.run_pack(case, "causvid", cond, noise, **run)
    trp.assert_control_fails(family, "no restart: one rollout keeping its cache", wrong, ref)


# -- Krea Realtime: keep_first_frame off --------------------------------------------------------------------------
class KreaVAE:
    """Krea's server VAE (``load_vae``) in the pack's protocol: its encoder wrapper on a fresh cache, as its
    ``encode_video_latent`` calls it, and its streaming decoder (``[B, F, C, h, w]`` in, cache carried)."""

    def __init__(self, encoder, decoder):
        self.encoder, self.decoder = encoder, decoder

    def encode(self, pixels):
        return self.encoder(pixels, [None] * 55, stream=False)[0]

    def decode(self, latents):
        return self.stream().decode(latents)

    def stream(self):
        return KreaStream(self.decoder)


class KreaStream:
    def __init__(self, decoder):
        self.decoder, self.cache = decoder, [None] * 55

    def decode(self, latents):
        pixels, self.cache = self.decoder(latents.permute(0, 2, 1, 3, 4), *self.cache)
        return pixels.permute(0, 2, 1, 3, 4)


def krea_rewrites(case, folder):
    h, w = (8 * n for n in case.shape.latent_hw)
    server = trp.KREA_SERVER
    return trp.krea_rewrites(case.shape) + [
        rh.Rewrite("wan.modules.vae", "dim=96,", f"dim={VAE_DIM},"),
        rh.Rewrite("wan.modules.vae", 'device="cuda"):', 'device="cpu"):'),
        rh.Rewrite("demo_utils.vae_block3", "dim=96,", f"dim={VAE_DIM},", 2),
        rh.Rewrite(server, "torch.float16", "torch.float32", 5),
        rh.Rewrite(server, "height=480, width=832", f"height={h}, width={w}", 2),
        rh.Rewrite("v2v", "frames.cuda()", "frames"),
        rh.Rewrite("v2v", "dtype=torch.float16):", "dtype=torch.float32):"),
    ]


def run_krea_reference(case, folder, body):
    settings = trp.settings_stand_in()
    settings.MODEL_FOLDER = str(folder)
    inert = ("fastapi", "fastapi.middleware", "fastapi.middleware.cors", "fastapi.responses", "msgpack", "cv2",
             "requests", "PIL", "PIL.Image", "torchvision", "torchvision.transforms",
             "torchvision.transforms.functional", "omegaconf", "dotenv")
    return trp.run_reference("krea_realtime", case, body, rewrites=krea_rewrites(case, folder), inert_modules=inert,
                             extra_modules={"pydantic": trp.pydantic_stand_in(), "settings": settings,
                                            "sageattention": None},
                             unused_modules=("wan.modules.t5", "wan.modules.tokenizers", "wan.modules.clip"))


def krea_load_vae(folder, alone=False):
    """The server's own ``load_vae``, checked to have loaded every decoder weight of the file (it loads with
    ``strict=False``). ``alone``: imports the modules the session would import too (every rewrite is used)."""
    server = rh.import_module(trp.KREA_SERVER)
    if alone:
        rh.import_module("utils.wan_wrapper")
        rh.import_module("pipeline.causal_inference")
    encoder, decoder = server.load_vae()
    saved = torch.load(vae_file(folder), weights_only=True)
    for name, value in decoder.state_dict().items():
        if name not in ("mean", "std"):
            assert torch.equal(value, saved[name]), name
    return server, encoder, decoder


def test_krea_reencoded_first_frame_63_frames(case, vae_folder):
    """keep_first_frame off: from the third chunk on, the oldest of the 3 context frames is the VAE re-encode of
    its last decoded pixel frame; the video is decoded block by block as the server streams it."""
    long = trp.LONG
    cond, noise = case.prompt(), case.noise(long)
    vae = KreaVAE(*run_krea_reference(case, vae_folder, lambda: krea_load_vae(vae_folder, alone=True))[1:])
    ours, draws = trp.run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=trp.krea_cache(False),
                               vae=vae)
    args = trp.reference_args("krea_realtime", "configs/default_config.yaml", "configs/self_forcing_server_14b.yaml")
    hw = case.shape.latent_hw

    def body():
        server, encoder, decoder = krea_load_vae(vae_folder)
        server.log.setLevel("WARNING")
        frame = torch.rand(1, 3, 8 * hw[0], 8 * hw[1]) * 2 - 1  # its resize to the frame's own size: the identity
        assert torch.equal(torch.nn.functional.interpolate(frame, size=tuple(frame.shape[2:]), mode="bicubic"), frame)
        wrapper = rh.import_module("utils.wan_wrapper")
        transformer = wrapper.WanDiffusionWrapper(model_name="Wan2.1-T2V-14B", timestep_shift=5.0, is_causal=True)
        pm.load_reference_weights(transformer, case, "krea_realtime")
        pipeline = rh.import_module("pipeline.causal_inference").CausalInferencePipeline(
            args, device="cpu", generator=transformer, text_encoder=trp.TextFeatures({"p": cond}), vae=decoder)
        models = server.Models(pipeline.text_encoder, transformer, pipeline, encoder, decoder)
        params = server.GenerateParams(prompt="p", width=hw[1] * 8, height=hw[0] * 8, seed=0,
                                       kv_cache_num_frames=3, num_blocks=long // 3, num_denoising_steps=5,
                                       keep_first_frame=False)
        with rh.NoiseTape([rh.NoiseDraw(-1, 0, noise)] + draws, rh.frames_first).patched():
            session = server.GenerationSession(params, args, frame_callback=lambda *a: None, models=models)
            for _ in range(long // 3):
                session.generate_block_internal(models)
        return session.all_latents.permute(0, 2, 1, 3, 4)

    ref = run_krea_reference(case, vae_folder, body)
    family = "Krea recompute keep_first_frame=False, VAE re-encode"
    assert trp.report(family, ours, ref, long) <= trp.TOLERANCE
    wrong, _ = trp.run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=trp.krea_cache(False),
                            vae=trp.LatentRoundTrip())
    trp.assert_control_fails(family, "the stored latent instead of the VAE round trip", wrong, ref)
    wrong, _ = trp.run_pack(case, "krea_realtime", cond, noise, schedule="krea", cache=trp.krea_cache(True))
    trp.assert_control_fails(family, "keep_first_frame on", wrong, ref)
