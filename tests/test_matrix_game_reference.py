"""The Matrix-Game 2.0 reference harness (``tests/matrix_game_reference.py``) checked on its own: it runs the
release's inference loop for the three variants, is deterministic, reads the actions the way the reference
reads them, uses the re-noise draws it is given, and writes checkpoints in the release's layout.

Skipped unless ``FASTAR_REFERENCE_DIR`` holds ``matrix_game/`` (``tools/extract_references.py``); needs
``einops``, ``pyyaml`` and ``safetensors``.
"""

from __future__ import annotations

import json

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

FRAMES = 24  # 8 blocks of 3: the 6-frame windows (4 for gta_drive) roll over many times
VARIANTS = tuple(mg.VARIANTS)


@pytest.fixture(autouse=True)
def _small_tensors_one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Per variant: checkpoint, inputs and the rollout on them, computed once."""
    cache = {}

    def get(variant, shape=mg.TINY):
        if (variant, shape) not in cache:
            folder = tmp_path_factory.mktemp(variant)
            ck = mg.write_checkpoint(folder, variant, seed=3, shape=shape)
            inputs = mg.make_inputs(variant, FRAMES, seed=5, shape=shape)
            cache[variant, shape] = (ck, inputs, mg.run_reference(ck, variant, inputs, renoise_seed=7, shape=shape))
        return cache[variant, shape]

    return get


def frames_of_chunk(latents, chunk):
    return latents[:, :, 3 * chunk:3 * chunk + 3]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rollout_is_deterministic_and_complete(base, variant):
    ck, inputs, first = base(variant)
    again = mg.run_reference(ck, variant, inputs, renoise_seed=7)
    assert torch.equal(first.latents, again.latents)
    assert first.latents.shape == (1, 16, FRAMES, *mg.TINY.latent_hw)
    assert torch.isfinite(first.latents).all()
    steps = len(first.timesteps)
    chunks = FRAMES // 3
    # steps passes and one clean (commit) pass per chunk; one re-noise draw after each step but the last
    assert len(first.passes) == chunks * (steps + 1)
    assert len(first.noise_draws) == chunks * (steps - 1)
    for c in range(chunks):
        x0 = first.chunk_x0(c)
        assert len(x0) == steps
        assert torch.equal(x0[-1], frames_of_chunk(first.latents, c))  # the chunk's output is its last x0
        commit = [p for p in first.passes if p.chunk == c and p.step is None]
        assert len(commit) == 1 and commit[0].timestep == 0.0  # context_noise 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_schedule_is_the_warped_step_list(base, variant):
    """FlowMatchScheduler(shift 5, 1000 train steps, extra_one_step): step t -> 1000 * sigma(1 - (1000 - t) /
    1000), sigma(s) = 5 s / (1 + 4 s), in float32 (the scheduler's own dtype)."""
    _, _, rollout = base(variant)
    listed = (1000, 750, 500, 250) if variant == "templerun" else (1000, 666, 333)
    s = torch.linspace(1.0, 0.0, 1001, dtype=torch.float32)[:-1][[1000 - t for t in listed]]
    expected = 1000 * (5.0 * s / (1 + 4.0 * s))
    assert torch.allclose(rollout.timesteps.float(), expected, rtol=0, atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS)
def test_actions_change_the_video(base, variant):
    ck, inputs, first = base(variant)
    keyboard, mouse = mg.random_actions(variant, FRAMES, seed=123)
    other = mg.run_reference(ck, variant, inputs.with_actions(keyboard=keyboard), renoise_seed=7)
    assert mg.relative_error(other.latents, first.latents) > 1e-2
    if mouse is not None:
        other = mg.run_reference(ck, variant, inputs.with_actions(mouse=mouse), renoise_seed=7)
        assert mg.relative_error(other.latents, first.latents) > 1e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_action_windows_are_read_as_the_reference_reads_them(base, variant):
    """Latent frame f reads the actions of pixel frames 4f-12 .. 4f-1 (frame 0 repeated before the start):
    chunk c (frames 3c..3c+2) reads pixel frames up to 12c+7. Actions changed from pixel frame 68 on leave
    chunks 0 to 5 bit-identical and change chunk 6; the last pixel frame (4(F-1)) is never read."""
    ck, inputs, first = base(variant)
    keyboard, mouse = inputs.keyboard.clone(), None if inputs.mouse is None else inputs.mouse.clone()
    keyboard[:, 68:] = 1.0 - keyboard[:, 68:]
    if mouse is not None:
        mouse[:, 68:] = -mouse[:, 68:] + 0.05
    late = mg.run_reference(ck, variant, inputs.with_actions(keyboard=keyboard, mouse=mouse), renoise_seed=7)
    assert torch.equal(late.latents[:, :, :18], first.latents[:, :, :18])
    assert mg.relative_error(frames_of_chunk(late.latents, 6), frames_of_chunk(first.latents, 6)) > 1e-3

    keyboard, mouse = inputs.keyboard.clone(), None if inputs.mouse is None else inputs.mouse.clone()
    keyboard[:, -1] = 1.0 - keyboard[:, -1]
    if mouse is not None:
        mouse[:, -1] = 0.5
    last = mg.run_reference(ck, variant, inputs.with_actions(keyboard=keyboard, mouse=mouse), renoise_seed=7)
    assert torch.equal(last.latents, first.latents)


@pytest.mark.parametrize("variant", ("universal",))
def test_given_noise_draws_are_the_ones_used(base, variant):
    ck, inputs, first = base(variant)
    replayed = mg.run_reference(ck, variant, inputs, noise_draws=first.noise_draws)
    assert torch.equal(replayed.latents, first.latents)
    other = mg.run_reference(ck, variant, inputs, renoise_seed=8)
    assert mg.relative_error(other.latents, first.latents) > 1e-2
    with pytest.raises(AssertionError, match="drew more noise"):
        mg.run_reference(ck, variant, inputs, noise_draws=first.noise_draws[:-1])


@pytest.mark.parametrize("variant", VARIANTS)
def test_checkpoint_is_in_the_release_layout(base, variant):
    from safetensors import safe_open

    ck, _, _ = base(variant)
    config = json.loads((ck.parent / "config.json").read_text())
    assert config["action_config"]["keyboard_dim_in"] == mg.VARIANTS[variant].keyboard_dim
    assert config["in_dim"] == 36 and config["model_type"] == "i2v"
    with safe_open(str(ck), "pt") as f:
        keys = set(f.keys())
        assert all(k.startswith("model.") for k in keys)
        assert f.get_tensor("model.img_emb.proj.1.weight").shape == (mg.CLIP_DIM, mg.CLIP_DIM)
        assert f.get_tensor("model.patch_embedding.weight").shape[1] == 36
    blocks = {int(k.split(".")[2]) for k in keys if ".action_model." in k}
    assert blocks == set(mg.TINY.action_blocks)
    has_mouse = any(".action_model.mouse_mlp." in k for k in keys)
    assert has_mouse == mg.VARIANTS[variant].mouse


@pytest.mark.parametrize("variant", VARIANTS)
def test_second_shape_runs_and_steers(base, variant):
    """The geometry rewrites and the action caches at another shape (3 heads, 4 tokens per frame, 4 action
    heads of 16): the rollout runs, is finite, and follows its actions."""
    shape = mg.TINY_B
    ck, inputs, first = base(variant, shape)
    assert first.latents.shape == (1, 16, FRAMES, *shape.latent_hw) and torch.isfinite(first.latents).all()
    keyboard, mouse = mg.random_actions(variant, FRAMES, seed=321)
    other = mg.run_reference(ck, variant, inputs.with_actions(keyboard=keyboard, mouse=mouse), renoise_seed=7,
                             shape=shape)
    assert mg.relative_error(other.latents, first.latents) > 1e-2


TYPED = {  # what a person types before each of 8 chunks
    "universal": [("u", "w"), ("l", "w"), ("l", "q"), ("i", "a"), ("j", "d"), ("k", "s"), ("u", "q"), ("l", "d")],
    "gta_drive": [("w",), ("w a",), ("d",), ("s d",), ("q",), ("w d",), ("a",), ("s",)],
    "templerun": [("w",), ("z",), ("q",), ("c",), ("a",), ("d",), ("s",), ("w",)],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_interactive_loop_is_the_batch_loop_on_streamed_actions(base, variant):
    """The interactive pipeline writes the action typed before a chunk over that chunk's pixel frames and then
    runs what the batch pipeline runs: the batch loop on the actions it ended with gives the same bits."""
    ck, inputs, _ = base(variant)
    live = mg.run_streaming_reference(ck, variant, inputs, TYPED[variant], renoise_seed=7)
    n = inputs.keyboard.shape[1]
    per_chunk = [live.keyboard[0, mg.chunk_pixel_frames(c)[-1]] for c in range(FRAMES // 3)]
    assert torch.equal(live.keyboard, mg.streamed_actions(per_chunk, n))
    if live.mouse is not None:
        per_chunk_mouse = [live.mouse[0, mg.chunk_pixel_frames(c)[-1]] for c in range(FRAMES // 3)]
        assert torch.equal(live.mouse, mg.streamed_actions(per_chunk_mouse, n))
    batch = mg.run_reference(ck, variant, inputs.with_actions(keyboard=live.keyboard, mouse=live.mouse),
                             renoise_seed=7)
    assert torch.equal(live.latents, batch.latents)
    # The key tables, as the harness's docstring states them.
    if variant == "universal":
        assert per_chunk[0].tolist() == [1, 0, 0, 0] and per_chunk[3].tolist() == [0, 0, 1, 0]  # w, a
        assert torch.allclose(per_chunk_mouse[1], torch.tensor([0.0, 0.1]))  # l: yaw right
        assert torch.allclose(per_chunk_mouse[3], torch.tensor([0.1, 0.0]))  # i: pitch up
    elif variant == "gta_drive":
        assert per_chunk[1].tolist() == [1, 0] and per_chunk[3].tolist() == [0, 1]  # w, s
        assert torch.allclose(per_chunk_mouse[1], torch.tensor([0.0, -0.1]))  # a: steer left
    else:
        assert [int(v.argmax()) for v in per_chunk] == [1, 3, 0, 4, 5, 6, 2, 1]


def test_interactive_script_that_the_reference_refuses_is_an_error(base):
    ck, inputs, _ = base("templerun")
    with pytest.raises(ValueError, match="does not answer"):
        mg.run_streaming_reference(ck, "templerun", inputs, [("x",)] + TYPED["templerun"][1:], renoise_seed=7)
