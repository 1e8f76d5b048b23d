"""The node functions end to end on a tiny model, without ComfyUI (the standalone host fallback).

Load from a checkpoint file -> FAST-AR patch -> prompt schedule -> long video sampler -> report; the SAMPLER
function behind SamplerCustomAdvanced with a stand-in guider; image to video; interruption frees the cache.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from comfyui_fastar.fastar_core.caches import KVCache
from comfyui_fastar.fastar_core.errors import FastARError, GenerationCancelled
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.sampler import chunk_plan, noise_seed
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.constants import FASTAR_OPTIONS_KEY
from comfyui_fastar.nodes.model_access import fastar_choice_of
from comfyui_fastar.nodes.node_sampler_ar import sample_ar_video
from comfyui_fastar.nodes.standalone import NeedsComfyUI, StandaloneModel

TINY = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
SIZE = 32  # pixels: a 4x4 latent, 2x2 tokens per frame
LENGTH = 13  # video frames: 4 latent frames, chunks of 3 + 1


@pytest.fixture()
def host(tiny_checkpoint_host):
    return tiny_checkpoint_host


@pytest.fixture()
def model(host):
    loaded, info = NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)
    assert '"num_layers": 2' in info
    return loaded


def tiny_model(seed=0):
    return random_wan(TINY, seed=seed)


def cond(seed=1):
    """A text-encoder-like CONDITIONING: 6 token rows, then zero padding."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.cat([torch.randn(1, 6, TINY.text_dim, generator=g), torch.zeros(1, 10, TINY.text_dim)], dim=1)
    return [[tokens, {}]]


def sample(model, positive, **kw):
    args = dict(width=SIZE, height=SIZE, length=LENGTH, seed=3)
    args.update(kw)
    latent, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, **args)
    return latent["samples"], report


def patch(model, preset="balanced", **kw):
    return NODES["FastAR_Attention"]().patch(model, preset=preset, backend="torch", **kw)[0]


def test_loader_lists_files_and_patch_clones(host, model):
    spec = NODES["FastAR_LoadARVideoModel"].INPUT_TYPES()["required"]
    assert "tiny_ar.safetensors" in spec["model_name"][0]
    patched = patch(model)
    assert FASTAR_OPTIONS_KEY not in model.model_options["transformer_options"], "the input MODEL must be untouched"
    stored = patched.model_options["transformer_options"][FASTAR_OPTIONS_KEY]
    assert json.loads(json.dumps(stored)) == stored, "model_options is deep-copied: plain values only"
    resolved = resolved_settings(patched)
    assert resolved.cache.policy == "tempcache" and resolved.fastar.annsa and resolved.fastar.backend == "torch"
    overridden = resolved_settings(patch(model, threshold=0.7, annsa="off", capacity_frames=9))
    t = overridden.cache.tempcache
    assert (t.threshold, overridden.fastar.annsa, t.capacity_frames) == (0.7, False, 9)
    annca = {choice: resolved_settings(patch(model, annca=choice)).fastar
             for choice in ("preset", "pad merge", "pad merge + prune", "off")}
    assert (annca["preset"].annca, annca["preset"].annca_prune) == (True, False)  # balanced: exact merge
    assert (annca["pad merge + prune"].annca, annca["pad merge + prune"].annca_prune) == (True, True)
    assert annca["pad merge"].annca and not annca["pad merge"].annca_prune and not annca["off"].annca


def resolved_settings(patched, **cache):
    return fastar_choice_of(patched).resolve(**cache)


def test_loader_weights_entry_is_optional_and_picks_the_entry(host, tmp_path):
    optional = NODES["FastAR_LoadARVideoModel"].INPUT_TYPES()["optional"]
    choices, spec = optional["weights_entry"]
    assert choices == ["auto", "generator_ema", "generator"] and spec["default"] == "auto"
    assert "LongLive" in spec["tooltip"]
    ema, plain = tiny_model(1).state_dict(), tiny_model(2).state_dict()
    torch.save({"generator": {"model." + k: v for k, v in plain.items()},
                "generator_ema": {"model." + k: v for k, v in ema.items()}, "fastar_config": TINY.to_dict()},
               tmp_path / "longlive_base.pt")
    loader = NODES["FastAR_LoadARVideoModel"]()
    assert json.loads(loader.load("longlive_base.pt", "default", "none", 5.0)[1])["container"] == "generator"
    info = json.loads(loader.load("longlive_base.pt", "default", "none", 5.0, weights_entry="generator_ema")[1])
    assert info["container"] == "generator_ema" and info["weights_choice"] == "chosen by weights_entry"


def test_load_patch_schedule_sample_report(host, model):
    schedule = NODES["FastAR_PromptSchedule"]().build(cond(1), recache_frames=2, conditioning_2=cond(2),
                                                       start_frame_2=9, start_frame_3=1, start_frame_4=1)[0]
    latent, report = sample(patch(model), schedule)
    assert latent.shape == (1, 16, 4, 4, 4) and torch.isfinite(latent).all()
    assert "tempcache (sink 3" in report and "prompt 2 from latent frame 3 (recache 2)" in report
    assert "ca_kept" in report and "latent frames/s" in report
    assert len([line for line in report.splitlines() if line.strip().startswith(("0 ", "1 "))]) == 2
    done, total, _ = host.progress_log[-1]
    assert done == total == 2 * (4 + 1)


def test_same_seed_same_video_and_dense_policies(host, model):
    a, _ = sample(model, cond())
    b, _ = sample(model, cond())
    c, _ = sample(model, cond(), seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    window, report = sample(model, cond(), cache_policy="window", sink_frames=1, window_frames=7)
    assert "window (7 frames attended, sink 1 and the chunk included)" in report and window.shape == a.shape
    rolling, report = sample(model, cond(), schedule="Rolling Forcing 5-step")
    assert "mode rolling" in report and "rolling-forcing (5 steps" in report
    custom, report = sample(model, cond(), sigmas=torch.tensor([1.0, 0.5, 0.0]))
    assert "custom (2 steps: 1, 0.5)" in report


def test_bad_inputs_are_refused_with_valid_values(host, model):
    with pytest.raises(FastARError, match="nearest valid lengths: 77 or 81"):
        sample(model, cond(), length=80)
    with pytest.raises(FastARError, match="width 40 is not a multiple of 16.*nearest valid: 32 or 48"):
        sample(model, cond(), width=40)
    with pytest.raises(FastARError, match="cache policy 'window' contradicts FAST-AR preset 'balanced'"):
        sample(patch(model), cond(), cache_policy="window")
    with pytest.raises(FastARError, match="not a CONDITIONING"):
        sample(model, "a prompt")
    with pytest.raises(FastARError, match="must come after"):
        NODES["FastAR_PromptSchedule"]().build(cond(1), conditioning_2=cond(2), start_frame_2=13,
                                               conditioning_3=cond(3), start_frame_3=9)


def test_interrupt_mid_rollout_frees_the_cache(host, model, monkeypatch):
    caches = []
    original_free = KVCache.free

    def tracking_free(self):
        original_free(self)
        caches.append(self)

    monkeypatch.setattr(KVCache, "free", tracking_free)

    def interrupt_after_a_chunk(done, total):
        if done >= 6:
            host.interrupt_requested = True

    host.progress_listeners.append(interrupt_after_a_chunk)
    with pytest.raises(GenerationCancelled):
        sample(patch(model), cond())
    assert len(caches) == 1 and caches[0].k is None and caches[0].v is None, "the cache must be freed"
    assert host.progress_log[-1][0] < host.progress_log[-1][1], "it stopped mid-rollout"
    assert not host.interrupt_requested, "the interrupt is consumed"
    host.progress_listeners.clear()
    latent, _ = sample(model, cond())  # the next run is unaffected
    assert torch.isfinite(latent).all() and len(caches) == 2


class ScaledLatentFormat:
    """Like ComfyUI's Wan21 format: the model works on a normalised latent."""

    def process_in(self, x):
        return (x - 0.5) * 2.0

    def process_out(self, x):
        return x / 2.0 + 0.5


class FakeVAE:
    """Encodes an image [1, H, W, 3] to [1, 16, 1, H/8, W/8] (8x8 average, channels repeated)."""

    def encode(self, image):
        pooled = torch.nn.functional.avg_pool2d(image.movedim(-1, 1), 8)  # [1, 3, h, w]
        return pooled.mean(1, keepdim=True).repeat(1, 16, 1, 1)[:, :, None] + torch.arange(16.0)[None, :, None,
                                                                                                  None, None] / 16


def test_latent_space_conversion_and_image_to_video(host, model):
    raw_model = model.model.diffusion_model
    scaled = StandaloneModel(raw_model, latent_format=ScaledLatentFormat())
    plain, _ = sample(model, cond())
    converted, _ = sample(scaled, cond())
    assert torch.allclose(converted, plain / 2.0 + 0.5), "the output LATENT is process_out of the model's latent"

    image = torch.rand(1, 40, 48, 3)
    positive, empty, *_ = NODES["FastAR_ImageToVideo"]().encode(cond(), FakeVAE(), image, SIZE, SIZE, LENGTH)
    assert empty["samples"].shape == (1, 16, 4, 4, 4) and not empty["samples"].any()
    start = positive[0][1]["fastar_initial_latent"]
    assert start.shape == (1, 16, 1, 4, 4)
    latent, report = sample(scaled, positive)
    assert torch.allclose(latent[:, :, :1], start, atol=1e-5), "frame 0 is the start image, back in VAE space"
    assert "1 from the start image, 3 generated" in report
    assert not torch.allclose(latent[:, :, 1:], converted[:, :, 1:]), "later frames continue from the image"
    with pytest.raises(FastARError, match="makes width 48 but 'positive' comes from AR Image to Video, set to width "
                                          f"{SIZE}"):
        sample(scaled, positive, width=48)


def engine_noise(seed, plan, shape):
    """The noise the engine draws itself for each chunk's first step."""
    pieces = []
    for c, (_, frames) in enumerate(plan):
        g = torch.Generator().manual_seed(noise_seed(seed, c, 0))
        pieces.append(torch.randn((*shape[:2], frames, *shape[3:]), generator=g))
    return torch.cat(pieces, dim=2)


def fake_custom_sampling(model, positive_tensor, cfg=1.0):
    """What SamplerCustomAdvanced hands a sampler function: KSamplerX0Inpaint(.inner_model = guider)."""
    guider = SimpleNamespace(model_patcher=model, cfg=cfg,
                             conds={"positive": [{"cross_attn": positive_tensor, "model_conds": {}}]})
    return SimpleNamespace(inner_model=guider)


def test_sampler_function_uses_the_given_sigmas_and_noise(host, model):
    reference, _ = sample(model, cond(), seed=5)
    sigmas = torch.tensor([1.0, 0.9375, 0.8333333, 0.625, 0.0])
    noise = engine_noise(5, chunk_plan(0, 4, 3), (1, 16, 4, 4, 4))
    out = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), noise, sigmas, extra_args={"seed": 5},
                          frames_per_block=3)
    assert torch.allclose(out, reference, atol=1e-5), "the engine's own noise given as NOISE reproduces the node"
    other = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), torch.randn_like(noise), sigmas,
                            extra_args={"seed": 5})
    assert not torch.allclose(other, reference)
    short = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), noise, torch.tensor([1.0, 0.5]),
                            extra_args={"seed": 5})
    assert torch.isfinite(short).all() and short.shape == noise.shape

    start = torch.rand(1, 16, 1, 4, 4)
    with_image = fake_custom_sampling(model, cond()[0][0])
    with_image.inner_model.conds["positive"][0]["fastar_initial_latent"] = start
    continued = sample_ar_video(with_image, noise, sigmas, extra_args={"seed": 5})
    assert torch.allclose(continued[:, :, :1], start) and not torch.allclose(continued[:, :, 1:], reference[:, :, 1:])

    schedule = NODES["FastAR_PromptSchedule"]().build(cond(7))[0]
    scheduled = sample_ar_video(fake_custom_sampling(model, cond()[0][0], cfg=6.0), noise, sigmas,
                                extra_args={"seed": 5}, prompt_schedule=schedule)
    assert not torch.allclose(scheduled, reference), "the sampler's prompt_schedule replaces the guider's prompt"
    with pytest.raises(NeedsComfyUI, match="needs ComfyUI at run time"):
        NODES["FastAR_SamplerARVideo"]().get_sampler()


class FakeVideoVAE:
    """decode: latent [B, 16, T, h, w] -> [B, 1 + 4(T-1), 8h, 8w, 3]; each frame depends on its own latent frame."""

    def decode(self, latent):
        b, _, t, h, w = latent.shape
        per_frame = torch.sigmoid(latent.mean(1))  # [B, T, h, w]
        frames = torch.cat([per_frame[:, :1], per_frame[:, 1:].repeat_interleave(4, dim=1)], dim=1)
        up = frames.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)
        return up[..., None].expand(-1, -1, -1, -1, 3)


class RecordingWriter:
    written = []

    def __init__(self, path, fps, width, height, metadata=None):
        self.frames = 0
        RecordingWriter.written = []

    def write(self, frames):
        RecordingWriter.written.append(frames.clone())
        self.frames += frames.shape[0]

    def close(self):
        pass

    def abort(self):
        pass


def test_streaming_save_decodes_piece_by_piece(host, monkeypatch):
    from comfyui_fastar.nodes import node_streaming_save

    monkeypatch.setattr(node_streaming_save, "Mp4Writer", RecordingWriter)
    latent = torch.randn(1, 16, 7, 2, 3)
    out = NODES["FastAR_SaveLongVideo"]().save({"samples": latent}, FakeVideoVAE(), frames_per_piece=2)
    frames = torch.cat(RecordingWriter.written)
    full = (FakeVideoVAE().decode(latent)[0].clamp(0, 1) * 255).round().to(torch.uint8)
    assert frames.shape == (25, 16, 24, 3) and torch.equal(frames, full)
    assert len(RecordingWriter.written) == 4 and out["ui"]["animated"] == (True,)
    assert out["ui"]["images"][0]["filename"].endswith(".mp4")
