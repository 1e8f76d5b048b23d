"""Batches in both samplers: a video per batch item, each equal bit for bit to the same item made alone.

ComfyUI draws a batch's noise as successive draws from one seed (``comfy.sample.prepare_noise``); item i of a
batch is remade alone with ``batch_index`` [i]. The samplers follow that: video 0 of a batch is the batch-1 video,
video i is batch item i of every noise stream.
"""

import pytest
import torch
from test_nodes_e2e import SIZE, cond, engine_noise, fake_custom_sampling, patch, sample

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.rollout.sampler import chunk_plan
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.family_inputs import SamplerInputs
from comfyui_fastar.nodes.host import get_host
from comfyui_fastar.nodes.model_access import resolve_model
from comfyui_fastar.nodes.node_sampler_ar import sample_ar_video
from comfyui_fastar.nodes.request import RolloutSettings, build_request
from comfyui_fastar.nodes.rollout import run_rollout

SIGMAS = torch.tensor([1.0, 0.9375, 0.8333333, 0.625, 0.0])


@pytest.fixture()
def host(tiny_checkpoint_host):
    return tiny_checkpoint_host


@pytest.fixture()
def model(host):
    return NODES["FastAR_LoadARVideoModel"]().load("tiny_ar.safetensors", "default", "none", 5.0)[0]


def prepare_noise(seed, shape, batch_index=None):
    """What ComfyUI's RandomNoise gives SamplerCustomAdvanced: one generator, a draw per batch item."""
    g = torch.Generator().manual_seed(seed)  # as torch.manual_seed(seed) seeds the global one
    draws = [torch.randn((1, *shape[1:]), generator=g) for _ in range(max(batch_index or [shape[0] - 1]) + 1)]
    return torch.cat([draws[i] for i in (batch_index or range(shape[0]))])


def item_alone(model, positive, seed, item, **kw):
    """Batch item ``item`` made by itself (the rollout of one video with batch_index (item,), as ComfyUI remakes a
    batch item from a LatentFromBatch latent)."""
    given = SamplerInputs(positive, latent_frames=4, latent_h=SIZE // 8, latent_w=SIZE // 8)
    request = build_request(resolve_model(model), given, RolloutSettings(seed=seed, **kw), batch_index=(item,))
    return run_rollout(request, get_host()).latent


@pytest.mark.parametrize("fastar", [False, True])
def test_long_sampler_batch_of_two_equals_the_items_made_alone(host, model, fastar):
    m = patch(model) if fastar else model
    single, _ = sample(m, cond(), seed=3)
    batch, report = sample(m, cond(), seed=3, batch_size=2)
    done, total, _ = host.progress_log[-1]
    assert done == total == 2 * 2 * (4 + 1), "the progress bar counts both videos"
    assert batch.shape == (2, *single.shape[1:])
    assert torch.equal(batch[:1], single), "video 0 of a batch is the batch-1 video, bit for bit"
    assert torch.equal(batch[1:], item_alone(m, cond(), 3, 1)), "video 1 is batch item 1 made alone"
    assert not torch.allclose(batch[0], batch[1], atol=1e-3), "the two videos have their own noise"
    assert "batch of 2 videos" in report


def test_long_sampler_batch_takes_per_video_prompts_and_start_images(host, model):
    both = [[torch.cat([cond(1)[0][0], cond(2)[0][0]]), {}]]
    batch, _ = sample(model, both, seed=3, batch_size=2)
    assert torch.equal(batch[:1], sample(model, cond(1), seed=3)[0])
    assert torch.equal(batch[1:], item_alone(model, cond(2), 3, 1)), "video 1 takes prompt row 1"
    start = torch.rand(2, 16, 1, 4, 4)
    images = [[cond(1)[0][0], {"fastar_initial_latent": start}]]
    with_images, report = sample(model, images, seed=3, batch_size=2)
    assert torch.equal(with_images[:, :, :1], start) and "1 from the start image" in report
    one = [[cond(1)[0][0], {"fastar_initial_latent": start[1:]}]]
    assert torch.equal(with_images[1:], item_alone(model, one, 3, 1))
    with pytest.raises(FastARError, match="batch of 2 but the sampler makes 3 video.*make 2"):
        sample(model, images, seed=3, batch_size=3)


def test_ar_video_sampler_batch_of_two_equals_the_items_made_alone(host, model):
    shape = (2, 16, 4, 4, 4)
    noise = prepare_noise(6, shape)
    out = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), noise, SIGMAS, extra_args={"seed": 6})
    assert out.shape == shape
    first = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), prepare_noise(6, (1, *shape[1:])), SIGMAS,
                            extra_args={"seed": 6})
    assert torch.equal(out[:1], first), "item 0 of the batch is the batch-1 run, bit for bit"
    assert torch.equal(prepare_noise(6, shape, batch_index=[1]), noise[1:])
    # Item 1 alone: ComfyUI's noise for batch_index [1], and the engine's re-noise of batch item 1.
    sampler_model = resolve_model(model, device=noise.device)
    given = SamplerInputs([[cond()[0][0], {}]], latent_frames=4, latent_h=4, latent_w=4)
    request = build_request(sampler_model, given, RolloutSettings(schedule=SIGMAS, seed=6),
                            start_noise=prepare_noise(6, shape, batch_index=[1]), batch_index=(1,))
    alone = run_rollout(request, get_host()).latent
    assert torch.equal(out[1:], alone)
    assert not torch.allclose(out[0], out[1], atol=1e-3)


def test_engine_noise_as_batch_noise_reproduces_the_long_sampler(host, model):
    """The AR Video Sampler and the Long Video Sampler agree per batch item when given the same noise."""
    long_batch, _ = sample(model, cond(), seed=5, batch_size=2)
    plan = chunk_plan(0, 4, 3)
    noise = engine_noise(5, plan, (2, 16, 4, 4, 4))
    out = sample_ar_video(fake_custom_sampling(model, cond()[0][0]), noise, SIGMAS, extra_args={"seed": 5})
    assert torch.allclose(out, long_batch, atol=1e-5)
