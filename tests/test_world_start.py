"""World Model Start's encode a slice at a time (nodes/streaming_encode.py), on a causal encoder with ComfyUI's calling
convention (tests/causal_vae_stub.py): the same latents as one encode of the whole video, bit for bit, for both of
ComfyUI's cuts; as many distinct latent frames at 961 frames as at 121; Cancel inside a slice. ComfyUI's own Wan2.1
VAE is checked the same way on the hosts (tests/comfyui_world_start.py)."""

from types import SimpleNamespace

import pytest
import torch
from causal_vae_stub import full_encode, stub_vae
from matrix_game_models import CLIP_DIM, tiny_config, tiny_runner, window_spec

from comfyui_fastar.fastar_core.errors import FastARError, GenerationCancelled
from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import save_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.rollout import matrix_game_conditioning
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.actions import Actions
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes import streaming_encode
from comfyui_fastar.nodes.streaming_encode import StartVideoEncoder


class Host:
    """Cancel after ``cancel_after`` checks (never by default)."""

    def __init__(self, cancel_after=None):
        self.checks, self.cancel_after = 0, cancel_after

    def interrupted(self) -> bool:
        self.checks += 1
        return self.cancel_after is not None and self.checks > self.cancel_after

    def raise_interrupted(self):
        raise GenerationCancelled("interrupted")


def image(h=16, w=24, seed=1):
    return torch.rand(1, h, w, 3, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("flushes", [True, False], ids=["two-frame-calls", "four-frame-calls"])
@pytest.mark.parametrize("frames", [1, 5, 9, 45, 121, 241])
def test_the_streamed_start_is_the_whole_videos_encode_bit_for_bit(flushes, frames):
    vae = stub_vae(flushes)
    encoder = StartVideoEncoder(vae, Host())
    distinct, index = encoder.encode(image(), frames)
    whole = full_encode(vae, image(), frames)
    assert index.shape == (whole.shape[2],) and int(index[0]) == 0 and bool((index[1:] > 0).all())
    assert torch.equal(distinct[:, :, index], whole)
    if frames >= 121:  # past the encoder's reach: the steady state was found and slices were skipped
        assert encoder.skipped > 0 and distinct.shape[2] < whole.shape[2]


@pytest.mark.parametrize("flushes", [True, False], ids=["two-frame-calls", "four-frame-calls"])
def test_the_distinct_frames_do_not_grow_with_the_length(flushes):
    vae = stub_vae(flushes)
    sizes = {frames: StartVideoEncoder(vae, Host()).encode(image(), frames)[0].shape[2] for frames in (121, 481, 961)}
    assert len(set(sizes.values())) == 1, sizes


def test_a_wrong_steady_state_would_be_seen():
    """Negative control: repeating the first blank frame instead of the steady one differs from the whole encode."""
    vae = stub_vae(True)
    distinct, index = StartVideoEncoder(vae, Host()).encode(image(), 121)
    whole = full_encode(vae, image(), 121)
    early = index.clone()
    early[2:] = index[1]
    assert not torch.equal(distinct[:, :, early], whole)


def test_cancel_stops_the_encoder_inside_a_slice():
    vae = stub_vae(True)
    calls = []
    vae.first_stage_model.encoder.register_forward_hook(lambda *_: calls.append(1))
    host = Host(cancel_after=3)  # a few layers into the first slice
    with pytest.raises(GenerationCancelled):
        StartVideoEncoder(vae, host).encode(image(), 961)
    assert not calls, "the encoder call that was running did not finish"
    assert not any(m._forward_pre_hooks for m in vae.first_stage_model.modules()), "the checks are removed"


def test_world_model_start_gives_the_streamed_start_and_its_size(standalone_host, tmp_path, monkeypatch):
    """The node with a streaming VAE: each distinct frame once, the index, and the size it sets; the sampler runs
    the same rollout as from the whole video's latent."""
    monkeypatch.setattr(streaming_encode, "wan_vae_kind", lambda vae: "wan2.1")  # the start nodes' shared encoder
    vae = stub_vae(True)
    vae.latent_channels = 16
    vae.vae_output_dtype = lambda: torch.float32
    width, height, length = 48, 32, 121
    tokens = torch.randn(1, 257, CLIP_DIM, generator=torch.Generator().manual_seed(5))
    start = image(height, width)
    positive, w, h, n = NODES["FastAR_WorldModelStart"]().encode(
        SimpleNamespace(penultimate_hidden_states=tokens), vae, start, width, height, length)
    extras = positive[0][1]
    whole = full_encode(vae, start, length)
    assert (w, h, n) == (width, height, length) and extras["fastar_video_size"] == (48, 32, 121, "World Model Start")
    distinct, index = extras["fastar_world_start"], extras["fastar_world_start_index"]
    assert distinct.shape[2] < whole.shape[2] and torch.equal(distinct[:, :, index], whole)

    save_matrix_game(random_matrix_game(tiny_config("universal", layers=2), seed=2), tmp_path / "mg.safetensors",
                     config_in_file=True)
    model, _ = NODES["FastAR_LoadARVideoModel"]().load("mg.safetensors", "default", "none", 5.0)
    acts = NODES["FastAR_ActionScript"]().build("universal", 12.0, "0 W\n3 D\n6 - mouse 0 0.05\n")[0]
    latent, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, width, height, length,
                                                                schedule="Matrix-Game 3-step", seed=3, actions=acts)

    keyboard, mouse = acts.to_tensors(length)
    cond = matrix_game_conditioning(whole, tokens, Actions(keyboard, mouse))
    cfg = RolloutConfig(num_frames=31, latent_height=4, latent_width=6, frames_per_block=3, schedule="matrix-game",
                        seed=3, cache=window_spec("universal"), channels=16)
    direct = ARSampler(CausalRunner(model.model.diffusion_model)).generate(cond, cfg).latent
    assert torch.equal(latent["samples"], direct)


def test_the_frame_index_is_checked():
    concat = torch.zeros(1, 16, 3, 2, 2)
    clip = torch.zeros(1, 5, CLIP_DIM)
    actions = Actions(torch.zeros(9, 4), torch.zeros(9, 2))
    runner = tiny_runner()
    cfg = RolloutConfig(num_frames=3, latent_height=2, latent_width=2, frames_per_block=3, schedule="matrix-game",
                        cache=window_spec("universal"), channels=16)
    for bad in (torch.tensor([1, 1, 2]), torch.tensor([0, 0, 2]), torch.tensor([0, 1, 3]), torch.tensor([0., 1, 2])):
        with pytest.raises(FastARError, match="frame index"):
            runner.family.check_rollout(cfg, matrix_game_conditioning(concat, clip, actions, bad))
    runner.family.check_rollout(cfg, matrix_game_conditioning(concat, clip, actions, torch.tensor([0, 1, 2, 2])))
