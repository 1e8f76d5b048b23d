"""The nodes on Matrix-Game 2.0, without ComfyUI: the loader recognises the checkpoint, World Model Start and an
Action Script feed the Long Video Sampler, whose rollout is the engine's own for the same inputs, bit for bit."""

import json
from types import SimpleNamespace

import pytest
import torch
from matrix_game_models import CLIP_DIM, tiny_config, window_spec

from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import save_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.fastar_core.families.matrix_game.rollout import matrix_game_conditioning
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.actions import Actions
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES

WIDTH, HEIGHT, LENGTH = 48, 32, 25  # a 4x6 latent, 7 latent frames: chunks 3 + 3 + 1
WALK = "0 W\n0.5 W L\n1 - mouse 0.05 0\n"


class SeededVAE:
    """Wan2.1's VAE arithmetic on the frames it is given; the latent is a seeded function of nothing else."""

    def encode(self, pixels):
        n, h, w, _ = pixels.shape
        g = torch.Generator().manual_seed(n)
        return torch.randn(1, 16, (n - 1) // 4 + 1, h // 8, w // 8, generator=g)


@pytest.fixture()
def world_host(standalone_host, tmp_path):
    for variant in ("universal", "templerun"):
        folder = tmp_path / f"matrix_game_{variant}"
        folder.mkdir()
        save_matrix_game(random_matrix_game(tiny_config(variant), seed=2), folder / "model.safetensors")
    return standalone_host


def load(variant="universal"):
    return NODES["FastAR_LoadARVideoModel"]().load(f"matrix_game_{variant}/model.safetensors", "default", "none", 5.0)


def start(tokens=None):
    tokens = torch.randn(1, 257, CLIP_DIM, generator=torch.Generator().manual_seed(5)) if tokens is None else tokens
    image = torch.rand(1, HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(6))
    return NODES["FastAR_WorldModelStart"]().encode(SimpleNamespace(penultimate_hidden_states=tokens), SeededVAE(),
                                                    image, WIDTH, HEIGHT, LENGTH)[0]


def actions(script=WALK, variant="universal"):
    return NODES["FastAR_ActionScript"]().build(variant, 12.0, script)[0]


def sample(model, positive, acts, **kw):
    args = dict(width=WIDTH, height=HEIGHT, length=LENGTH, schedule="Matrix-Game 3-step", seed=3, actions=acts)
    args.update(kw)
    latent, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, **args)
    return latent["samples"], report


def test_the_loader_recognises_a_matrix_game_checkpoint_and_says_its_variant(world_host):
    model, info = load()
    summary = json.loads(info)
    assert (summary["family"], summary["variant"], summary["schedule"]) == ("Matrix-Game 2.0", "universal",
                                                                             "matrix-game")
    assert summary["keys"].startswith("W (forward), S (back)") and summary["dtype"] == "float32"
    with pytest.raises(FastARError, match="LoRAs are for the Wan2.1 text models"):
        NODES["FastAR_LoadARVideoModel"]().load("matrix_game_universal/model.safetensors", "default", "x.safetensors",
                                                5.0)


def test_the_sampler_runs_the_engines_rollout_of_the_same_inputs(world_host):
    model, _ = load()
    positive, acts = start(), actions()
    latent, report = sample(model, positive, acts)
    assert latent.shape == (1, 16, 7, 4, 6) and bool(latent.isfinite().all())
    assert "actions universal at 12 fps: 0 s (frame 0): W(forward); 0.5 s (frame 6)" in report
    assert "cache 'auto' is Matrix-Game 2.0 universal's own: window (6 frames attended, sink 0" in report

    dm = model.model.diffusion_model
    keyboard, mouse = acts.to_tensors(LENGTH)
    cond = matrix_game_conditioning(positive[0][1]["fastar_world_start"], positive[0][0], Actions(keyboard, mouse))
    cfg = RolloutConfig(num_frames=7, latent_height=4, latent_width=6, frames_per_block=3, schedule="matrix-game",
                        seed=3, cache=window_spec("universal"), channels=16)
    direct = ARSampler(CausalRunner(dm)).generate(cond, cfg).latent
    assert torch.equal(latent, direct)

    assert torch.equal(sample(model, positive, actions())[0], latent)  # same seed and actions: same bits
    other = sample(model, positive, actions("0 S\n0.5 J\n"))[0]
    assert (other[:, :, 1:] - latent[:, :, 1:]).abs().max() > 1e-3


def test_the_sampler_refuses_what_does_not_fit_a_world_model(world_host):
    model, _ = load()
    positive = start()
    with pytest.raises(FastARError, match="steered by keyboard and mouse: connect an Action Script to 'actions'"):
        sample(model, positive, None)
    with pytest.raises(FastARError, match="the Action Script is for templerun, but this MODEL is Matrix-Game 2.0 "
                                          "universal"):
        sample(model, positive, actions("0 W", "templerun"))
    with pytest.raises(FastARError, match="which takes no text: connect World Model Start"):
        sample(model, [[torch.zeros(1, 8, CLIP_DIM), {}]], actions())
    # Size and length come from World Model Start; another value is refused before the model is even loaded.
    loaded = []
    world_host.load_model = lambda patcher: loaded.append(patcher)
    with pytest.raises(FastARError, match="the Long Video Sampler makes length 29 but 'positive' comes from World "
                                          "Model Start, set to length 25: the start node sets the video's size"):
        sample(model, positive, actions(), length=29)
    with pytest.raises(FastARError, match="makes width 64, length 29 but 'positive' comes from World Model Start, "
                                          "set to width 48, length 25"):
        sample(model, positive, actions(), width=64, length=29)
    assert not loaded
    del world_host.load_model
    # A start without its recorded size (made by other code) is still checked against the sampler's.
    unsized = [[positive[0][0], {k: v for k, v in positive[0][1].items() if k != "fastar_video_size"}]]
    with pytest.raises(FastARError, match="World Model Start encoded 48x32 for 25 frames, but the sampler makes "
                                          "48x32 for 29"):
        sample(model, unsized, actions(), length=29)
    with pytest.raises(FastARError, match="CLIP tokens are 1280 wide; this model reads 24"):
        sample(model, start(torch.zeros(1, 257, 1280)), actions())


def test_templerun_takes_its_own_four_steps_and_a_note_says_when_another_list_is_chosen(world_host):
    model, _ = load("templerun")
    latent, report = sample(model, start(), actions("0 -\n0.5 W\n1 Z\n", "templerun"), schedule="Self-Forcing 4-step")
    assert latent.shape == (1, 16, 7, 4, 6) and "not Matrix-Game" not in report
    _, report = sample(model, start(), actions("0 W", "templerun"), schedule="Matrix-Game 3-step")
    assert "schedule 'Matrix-Game 3-step' is not Matrix-Game 2.0 templerun's own ('Self-Forcing 4-step')" in report


def test_the_custom_sampling_sampler_refuses_a_world_model(world_host):
    from comfyui_fastar.nodes.node_sampler_ar import sample_ar_video

    model, _ = load()
    guider = SimpleNamespace(model_patcher=model, cfg=1.0,
                             conds={"positive": [{"cross_attn": torch.zeros(1, 8, CLIP_DIM), "model_conds": {}}]})
    with pytest.raises(FastARError, match="the MODEL is Matrix-Game 2.0 universal, which this SAMPLER does not run"):
        sample_ar_video(SimpleNamespace(inner_model=guider), torch.zeros(1, 16, 7, 4, 6), torch.tensor([1.0, 0.0]))
