"""Matrix-Game 2.0: the pack's rollout against the reference pipeline (``matrix_game_reference.py``), per variant.

Each variant's tiny checkpoint is written in the release's layout (``model.``-prefixed safetensors, config.json
beside it) and loaded by the pack's own loader; both sides get the same start-image latents, CLIP features,
actions (different in every chunk) and noise (the initial noise as given, the pack's re-noise draws handed to
the reference). Rollouts of 24 latent frames (8 chunks of 3) roll the 6-frame windows (4 for gta_drive) of all
three caches several times. Each variant has negative controls that must exceed the tolerance: a window one
frame longer, and the actions shifted by one pixel frame.

Skipped unless ``FASTAR_REFERENCE_DIR`` holds ``matrix_game/`` (``tools/extract_references.py``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import reference_harness as rh
import torch

pytestmark = pytest.mark.skipif(
    not rh.REFERENCE_DIR or not (rh.reference_root("matrix_game") / "pipeline").is_dir(),
    reason="FASTAR_REFERENCE_DIR/matrix_game is not there (see tools/extract_references.py)")
pytest.importorskip("einops")
pytest.importorskip("yaml")
pytest.importorskip("safetensors")

import matrix_game_reference as mg  # noqa: E402

from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import load_matrix_game  # noqa: E402
from comfyui_fastar.fastar_core.families.matrix_game.family import MatrixGameFamily  # noqa: E402
from comfyui_fastar.fastar_core.families.matrix_game.rollout import (  # noqa: E402
    default_cache,
    matrix_game_conditioning,
    rollout_config,
)
from comfyui_fastar.fastar_core.forward.runner import CausalRunner  # noqa: E402
from comfyui_fastar.fastar_core.rollout.actions import Actions  # noqa: E402
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler  # noqa: E402

FRAMES = 24
TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def pack_rollout(checkpoint, variant, inputs, window_extra=0, actions=None):
    """(latent, the pack's re-noise draws) for the reference's inputs."""
    model, ckpt = load_matrix_game(checkpoint)
    assert ckpt.config.variant == variant
    config = replace(model.config, local_attn_size=model.config.local_attn_size + window_extra)
    runner = CausalRunner(model, family=MatrixGameFamily(config))
    sampler = ARSampler(runner)
    draws = rh.record_pack_noise(sampler)
    h, w = inputs.noise.shape[3:]
    cfg = rollout_config(config, FRAMES, h, w, cache=default_cache(config))
    if actions is None:
        mouse = None if inputs.mouse is None else inputs.mouse[0]
        actions = Actions(inputs.keyboard[0], mouse)
    cond = matrix_game_conditioning(inputs.image_latents, inputs.clip, actions)
    result = sampler.generate(cond, cfg, initial_noise=inputs.noise)
    return result, draws


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made = {}

    def get(variant):
        if variant not in made:
            checkpoint = mg.write_checkpoint(tmp_path_factory.mktemp(variant), variant, seed=11)
            inputs = mg.make_inputs(variant, FRAMES, seed=13)
            ours, draws = pack_rollout(checkpoint, variant, inputs)
            reference = mg.run_reference(checkpoint, variant, inputs, noise_draws=draws)
            made[variant] = (checkpoint, inputs, ours, reference)
        return made[variant]

    return get


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_rollout_matches_the_reference(case, variant):
    _, _, ours, reference = case(variant)
    err = rh.relative_error(ours.latent, reference.latents)
    assert err <= TOL, (variant, err, rh.first_deviating_frame(ours.latent, reference.latents))
    window = mg.VARIANTS[variant].local_attn_size
    assert FRAMES >= 4 * window and ours.cache_stats["evicted_frames"] > 0  # every window rolled several times
    assert ours.cache_stats["keyboard_live_bytes"] > 0 and ("mouse_live_bytes" in ours.cache_stats) == (
        variant != "templerun")


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_a_window_one_frame_longer_departs(case, variant):
    checkpoint, inputs, _, reference = case(variant)
    longer, _ = pack_rollout(checkpoint, variant, inputs, window_extra=1)
    assert rh.relative_error(longer.latent, reference.latents) > 100 * TOL


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_actions_one_pixel_frame_late_depart(case, variant):
    checkpoint, inputs, _, reference = case(variant)
    keyboard = torch.cat([inputs.keyboard[0, :1], inputs.keyboard[0, :-1]])
    mouse = None if inputs.mouse is None else torch.cat([inputs.mouse[0, :1], inputs.mouse[0, :-1]])
    late, _ = pack_rollout(checkpoint, variant, inputs, actions=Actions(keyboard, mouse))
    assert rh.relative_error(late.latent, reference.latents) > 100 * TOL


TYPED = {  # what a person types before each of the 8 chunks, in the reference's interactive prompts
    "universal": [("u", "w"), ("l", "w"), ("l", "q"), ("i", "a"), ("j", "d"), ("k", "s"), ("u", "q"), ("l", "d")],
    "gta_drive": [("w",), ("w a",), ("d",), ("s d",), ("q",), ("w d",), ("a",), ("s",)],
    "templerun": [("w",), ("z",), ("q",), ("c",), ("a",), ("d",), ("s",), ("w",)],
}


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_steering_chunk_by_chunk_matches_the_reference_interactive_loop(case, variant):
    """The reference's interactive loop asks for an action before each chunk and writes it over that chunk's
    pixel frames; the pack's rollout, handed each chunk's actions only when it asks for them (an ``Actions``
    source), gives the same video, and asks once per chunk for exactly the frames up to the chunk's end."""
    checkpoint, inputs, _, _ = case(variant)
    _, draws = pack_rollout(checkpoint, variant, inputs)  # the pack's noise, the same whatever the actions
    live = mg.run_streaming_reference(checkpoint, variant, inputs, TYPED[variant], noise_draws=draws)
    asked = []

    def player(known, needed):
        asked.append((known, needed))
        mouse = None if live.mouse is None else live.mouse[0, known:needed]
        return live.keyboard[0, known:needed], mouse

    keys = live.keyboard.shape[-1]
    start = Actions(torch.zeros(0, keys), None if live.mouse is None else torch.zeros(0, 2), source=player)
    ours, _ = pack_rollout(checkpoint, variant, inputs, actions=start)
    err = rh.relative_error(ours.latent, live.latents)
    assert err <= TOL, (variant, err)
    ends = [1 + 4 * (3 * c + 2) for c in range(FRAMES // 3)]
    assert asked == list(zip([0, *ends[:-1]], ends))
