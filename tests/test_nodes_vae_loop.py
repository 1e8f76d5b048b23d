"""The Long Video Sampler's VAE input, on the standalone host: CausVid's restarts and Krea's recompute without its
first frame use it (through ``nodes/vae_loop.py``), and refuse to run without it."""

import pytest
import torch
import torch.nn.functional as F

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.vae_loop import ComfyVideoVAE

SIZE = 32  # pixels: a 4x4 latent


class ComfyLikeVAE:
    """ComfyUI's ``VAE`` calling convention, on a toy: ``encode`` IMAGE [T, H, W, 3] in 0..1 -> [1, 16, 1 +
    (T - 1) // 4, H / 8, W / 8]; ``decode`` [B, 16, T, h, w] -> [B, 1 + 4 (T - 1), 8h, 8w, 3] in 0..1. Records
    what it is given."""

    def __init__(self):
        self.encoded, self.decoded = [], []

    def encode(self, image):
        self.encoded.append(image.clone())
        frames = image[::4].movedim(-1, 1).mean(1, keepdim=True)  # [T', 1, H, W]: one frame per latent frame
        pooled = F.avg_pool2d(frames, 8)  # [T', 1, h, w]
        return (pooled.movedim(0, 1)[None] * torch.linspace(0.5, 2.0, 16).view(1, 16, 1, 1, 1))

    def decode(self, latent):
        self.decoded.append(latent.clone())
        per_frame = torch.sigmoid(latent.mean(1))  # [B, T, h, w]
        frames = torch.cat([per_frame[:, :1], per_frame[:, 1:].repeat_interleave(4, dim=1)], dim=1)
        up = frames.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)
        return up[..., None].expand(-1, -1, -1, -1, 3)


@pytest.fixture()
def model(tiny_checkpoint_host):
    return NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)[0]


def cond():
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(1, 6, 32, generator=g), {}]]


def sample(model, **kw):
    args = dict(width=SIZE, height=SIZE, seed=3, schedule="CausVid 3-step", cache_policy="global")
    args.update(kw)
    return NODES["FastAR_LongVideoSampler"]().sample(model, cond(), **args)


def test_causvid_restarts_use_the_vae_input_and_need_it(model):
    length = 1 + 4 * (12 - 1)  # 12 latent frames: a 6-frame rollout, then two restarted ones of 3 new frames
    with pytest.raises(FastARError, match="restart_every 6 is CausVid's long video.*'vae' input"):
        sample(model, length=length, restart_every=6)
    vae = ComfyLikeVAE()
    (latent, report) = sample(model, length=length, restart_every=6, vae=vae)
    plain = sample(model, length=length)[0]["samples"]
    assert torch.equal(latent["samples"][:, :, :6], plain[:, :, :6])
    assert not torch.allclose(latent["samples"][:, :, 6:], plain[:, :, 6:])
    # Two restarts: each decodes its rollout up to latent every - overlap (4 frames) and encodes one 0..1 frame.
    assert [d.shape[2] for d in vae.decoded] == [4, 4]
    assert [tuple(e.shape) for e in vae.encoded] == [(1, SIZE, SIZE, 3)] * 2
    assert all(0 <= e.min() and e.max() <= 1 for e in vae.encoded)
    assert "a fresh rollout every 6 latent frames from 3 clean ones" in report


def test_krea_without_its_first_frame_uses_the_vae_input_and_needs_it(model):
    krea = dict(length=1 + 4 * 11, schedule="Krea Realtime 5-step", cache_policy="recompute", sink_frames=0,
                window_frames=6)
    with pytest.raises(FastARError, match="keep_first_frame off.*'vae' input.*sink_frames 1"):
        sample(model, **krea)
    vae = ComfyLikeVAE()
    sample(model, vae=vae, **krea)
    assert len(vae.encoded) == 2  # chunks at 6 and 9 re-encode latents 3 and 6
    sample(model, **{**krea, "sink_frames": 1})  # keep_first_frame on: no VAE needed


def test_the_wrapper_converts_ranges_and_latent_space():
    class Shifted:  # a latent format that is not the identity
        def process_in(self, x):
            return x * 2.0

        def process_out(self, x):
            return x / 2.0

    class Host:
        def load_model(self, patcher):
            pass

    vae = ComfyLikeVAE()
    wrapped = ComfyVideoVAE(vae, Shifted(), Host())
    latents = torch.randn(1, 16, 3, 4, 4)
    pixels = wrapped.decode(latents)
    assert pixels.shape == (1, 3, 9, SIZE, SIZE) and pixels.min() >= -1 and pixels.max() <= 1
    assert torch.equal(vae.decoded[0], latents / 2.0)  # raw latents go to ComfyUI's VAE
    encoded = wrapped.encode(pixels[:, :, :1])
    assert torch.allclose(vae.encoded[0], (pixels[0, :, :1].movedim(0, -1) + 1) / 2)
    assert encoded.shape == (1, 16, 1, 4, 4)
    with pytest.raises(FastARError, match="'vae' is a str, not a VAE"):
        ComfyVideoVAE("vae", Shifted(), Host())
