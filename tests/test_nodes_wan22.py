"""The nodes on a Wan2.2 TI2V-5B-shaped model (48 latent channels, the Wan2.2 VAE's 16x16 pixels per latent), without
ComfyUI: the Long Video Sampler with LongLive 2.0's UniPC preset gives the engine's own rollout, the SAMPLER picks
UniPC for the 5B from plain SIGMAS, a start image is held as frame 0 of the first chunk as LongLive 2.0 does, and
sizes, latents and start images of the wrong geometry are refused naming what fits."""

from types import SimpleNamespace

import pytest
import torch

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.rollout.schedule import DenoisingSchedule, get_schedule
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.node_sampler_ar import sample_ar_video
from comfyui_fastar.nodes.standalone import StandaloneModel
from comfyui_fastar.nodes.streaming_decode import spatial_upscale

TINY_5B = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, in_dim=48, out_dim=48, text_dim=32, freq_dim=32)
SIZE = 64  # pixels: a 4x4 latent at the Wan2.2 VAE's 16 pixels per latent, 2x2 tokens per frame
LENGTH = 45  # video frames: 12 latent frames, chunks of 4
LONGLIVE2 = "LongLive 2.0 4-step (UniPC)"


@pytest.fixture(autouse=True)
def standalone(monkeypatch):
    monkeypatch.setenv("FASTAR_HOST", "standalone")


@pytest.fixture()
def model():
    return StandaloneModel(random_wan(TINY_5B, seed=0))


def cond(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.cat([torch.randn(1, 6, TINY_5B.text_dim, generator=g), torch.zeros(1, 10, TINY_5B.text_dim)], 1),
             {}]]


def long_sample(model, positive, **kw):
    args = dict(width=SIZE, height=SIZE, length=LENGTH, frames_per_block=4, schedule=LONGLIVE2, seed=3,
                cache_policy="window", sink_frames=2, window_frames=8)
    args.update(kw)
    latent, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, **args)
    return latent["samples"], report


def engine_rollout(model, positive, **kw):
    cfg = RolloutConfig(num_frames=12, latent_height=4, latent_width=4, frames_per_block=4, schedule="longlive2",
                        seed=3, channels=48, cache=CacheSpec("window", sink_frames=2, window_frames=8), **kw)
    return cfg, ARSampler(CausalRunner(model.model.diffusion_model))


def test_long_video_sampler_runs_longlive2_on_a_5b_model_as_the_engine_does(model):
    latent, report = long_sample(model, cond())
    assert latent.shape == (1, 48, 12, 4, 4) and torch.isfinite(latent).all()
    cfg, sampler = engine_rollout(model, cond())
    expected = sampler.generate(cond()[0][0], cfg).latent
    assert torch.equal(latent, expected)
    assert "Wan2.2 TI2V dim 64" in report and "64x64" in report and "longlive2 (4 steps" in report
    # a window of 8 over 12 frames: the window rolled; a different prompt gives a different video
    other, _ = long_sample(model, cond(2))
    assert (other - latent).abs().max() > 1e-3


def test_5b_sizes_step_by_32_pixels(model):
    with pytest.raises(FastARError, match="width 48 is not a multiple of 32.*nearest valid: 32 or 64"):
        long_sample(model, cond(), width=48)


def test_custom_sampling_picks_unipc_for_the_5b_and_refuses_a_wan21_latent(model):
    """Plain SIGMAS on a 48-channel MODEL step as LongLive 2.0's UniPC ('auto'); 'dmd' re-noises and differs."""
    schedule = get_schedule("longlive2")
    sigmas = torch.tensor([*schedule.sigmas, 0.0])
    cfg, sampler = engine_rollout(model, cond())
    custom = RolloutConfig(**{**cfg.__dict__, "schedule": get_schedule([*schedule.sigmas])})
    assert custom.validate().solver == "dmd"  # a custom list alone is the Self-Forcing family's
    noise = torch.randn(1, 48, 12, 4, 4, generator=torch.Generator().manual_seed(4))
    guider = SimpleNamespace(model_patcher=model, cfg=1.0, conds={"positive": [{"cross_attn": cond()[0][0]}]})
    options = dict(frames_per_block=4, cache_policy="window", sink_frames=2, window_frames=8)
    auto = sample_ar_video(SimpleNamespace(inner_model=guider), noise, sigmas, extra_args={"seed": 3}, **options)
    unipc_cfg = RolloutConfig(**{**cfg.__dict__, "schedule": DenoisingSchedule("custom", schedule.sigmas,
                                                                                solver="unipc")})
    expected = sampler.generate(cond()[0][0], unipc_cfg, initial_noise=noise).latent
    assert torch.allclose(auto, expected, atol=1e-6)
    dmd = sample_ar_video(SimpleNamespace(inner_model=guider), noise, sigmas, extra_args={"seed": 3}, solver="dmd",
                          **options)
    assert (dmd - auto).abs().max() > 1e-3
    with pytest.raises(FastARError, match="16 channels but the MODEL takes 48.*Wan22ImageToVideoLatent"):
        sample_ar_video(SimpleNamespace(inner_model=guider), torch.randn(1, 16, 12, 4, 4), sigmas, **options)


def test_a_start_image_is_frame_0_of_the_first_chunk_as_longlive2_holds_it(model):
    start = torch.randn(1, 48, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    positive = [[cond()[0][0], {"fastar_initial_latent": start}]]
    latent, report = long_sample(model, positive)
    assert latent.shape == (1, 48, 12, 4, 4)  # the image is inside the first chunk, not before it
    assert torch.equal(latent[:, :, :1], start)
    cfg, sampler = engine_rollout(model, cond(), image_in_first_chunk=True)
    assert torch.equal(latent, sampler.generate(cond()[0][0], cfg, initial_latents=start).latent)
    assert "1 from the start image, 11 generated" in report
    with pytest.raises(FastARError, match=r"this MODEL needs \[batch, 48, frames, h, w\] from a Wan2.2 VAE"):
        long_sample(model, [[cond()[0][0], {"fastar_initial_latent": torch.randn(1, 16, 1, 8, 8)}]])


def test_image_to_video_sizes_its_latent_by_the_vae(model):
    """AR Image to Video makes a 48-channel latent at 16 pixels per latent from a Wan2.2-like VAE."""

    class Wan22LikeVAE:
        latent_channels = 48

        def encode(self, image):
            b, h, w, _ = image.shape
            return image.mean(-1)[:, None, None, ::16, ::16].expand(b, 48, 1, h // 16, w // 16)

    positive, latent, *_ = NODES["FastAR_ImageToVideo"]().encode(cond(), Wan22LikeVAE(), torch.rand(1, 64, 96, 3), 96,
                                                             64, LENGTH)
    assert latent["samples"].shape == (1, 48, 12, 4, 6)
    assert positive[0][1]["fastar_initial_latent"].shape == (1, 48, 1, 4, 6)
    with pytest.raises(FastARError, match="width 80 is not a multiple of 32"):
        NODES["FastAR_ImageToVideo"]().encode(cond(), Wan22LikeVAE(), torch.rand(1, 64, 96, 3), 80, 64, LENGTH)


def test_save_long_video_sizes_pixels_by_the_vae():
    assert spatial_upscale(SimpleNamespace(upscale_ratio=(lambda a: a, 16, 16)), 48) == 16
    assert spatial_upscale(SimpleNamespace(), 48) == 16 and spatial_upscale(SimpleNamespace(), 16) == 8
