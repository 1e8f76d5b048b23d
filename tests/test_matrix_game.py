"""Matrix-Game 2.0 in the engine, without the reference: actions, the keyboard/mouse caches, rollouts, loading."""

from __future__ import annotations

import pytest
import torch
from matrix_game_models import (
    VARIANTS,
    conditioning,
    random_actions,
    rollout,
    tempcache_spec,
    tiny_config,
    tiny_runner,
)

from comfyui_fastar.fastar_core.errors import CheckpointError, FastARError
from comfyui_fastar.fastar_core.families.matrix_game.action import action_rope, action_windows
from comfyui_fastar.fastar_core.families.matrix_game.caches import FrameWindowCache
from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import (
    is_matrix_game,
    load_matrix_game,
    save_matrix_game,
)
from comfyui_fastar.fastar_core.families.matrix_game.config import from_reference_config
from comfyui_fastar.fastar_core.families.matrix_game.family import MatrixGameFamily
from comfyui_fastar.fastar_core.files.safetensors_reader import read_header
from comfyui_fastar.fastar_core.files.wan_checkpoint import load_checkpoint
from comfyui_fastar.fastar_core.rollout.actions import Actions, pixel_frames

# -- actions -------------------------------------------------------------------------------------------------


def test_pixel_frames_follow_the_vae():
    assert [pixel_frames(t) for t in (0, 1, 2, 3, 150)] == [0, 1, 5, 9, 597]


@pytest.mark.parametrize("keyboard, mouse, match", [
    (torch.zeros(9, 4, 2), None, "keyboard actions have shape"),
    (torch.zeros(9, 4), torch.zeros(9, 3), "mouse actions have shape"),
    (torch.zeros(9, 4), torch.zeros(8, 2), "mouse actions cover 8"),
    (torch.full((9, 4), float("nan")), None, "NaN"),
    ("wasd", None, "keyboard actions"),
])
def test_bad_actions_are_refused_naming_the_input(keyboard, mouse, match):
    with pytest.raises(FastARError, match=match):
        Actions(keyboard, mouse)


def test_actions_must_fit_the_model():
    family = MatrixGameFamily(tiny_config("templerun"))
    with pytest.raises(FastARError, match="7"):
        Actions(torch.zeros(9, 4)).check_layout(family.config.action.layout)
    with pytest.raises(FastARError, match="keyboard actions only"):
        Actions(torch.zeros(9, 7), torch.zeros(9, 2)).check_layout(family.config.action.layout)
    with pytest.raises(FastARError, match="mouse actions"):
        Actions(torch.zeros(9, 4)).check_layout(tiny_config("universal").action.layout)


def test_actions_grow_from_a_callback_or_an_iterator():
    asked = []

    def more(known, needed):
        asked.append((known, needed))
        return torch.ones(needed - known, 4), torch.zeros(needed - known, 2)

    acts = Actions(torch.zeros(1, 4), torch.zeros(1, 2), source=more)
    kb, ms = acts.upto(3, "cpu", torch.float32)
    assert kb.shape == (1, 9, 4) and ms.shape == (1, 9, 2) and asked == [(1, 9)]
    assert kb[0, 0].sum() == 0 and kb[0, 1:].eq(1).all()
    chunks = iter([(torch.ones(4, 4), None)] * 2)
    acts = Actions(torch.zeros(1, 4), source=chunks)
    acts.require(3)
    assert acts.num_frames == 9
    with pytest.raises(FastARError, match="cover 9 pixel frames; latent frame 3 needs 13"):
        acts.require(4)


# -- the pieces --------------------------------------------------------------------------------------------


def test_action_windows_read_the_frames_before_each_latent_frame():
    a = tiny_config().action  # 4 x 3 = 12 pixel frames per window
    actions = torch.arange(1, 14, dtype=torch.float32)[None, :, None]  # pixel frames 0..12 hold 1..13
    win = action_windows(actions, 1, 3, a)[0, :, :, 0]
    assert win[0].tolist() == [1] * 8 + [1, 2, 3, 4]  # frame 1: pixel frames -8..3, before 0 the first frame's
    assert win[2].tolist() == list(range(1, 13))  # frame 3: pixel frames 0..11


def test_action_rope_rotates_time_only():
    cos, sin = action_rope(5, 3, (4, 6, 6), 256, "cpu")
    assert cos.shape == (3, 16)
    assert torch.equal(cos[:, 4:], torch.ones(3, 12)) and torch.equal(sin[:, 4:], torch.zeros(3, 12))
    assert torch.allclose(cos[:, 0], torch.cos(torch.tensor([5.0, 6.0, 7.0])))  # first pair: frequency 1


def reference_roll(size, chunks):
    """The reference's rolling buffer (its global/local end indices) for chunks of frames, one list per chunk of
    the frames each chunk attends to."""
    buf, local_end, global_end, seen = [None] * size, 0, 0, []
    for start, n in chunks:
        end = start + n
        if end > global_end and n + local_end > size:
            evict = n + local_end - size
            rolled = local_end - evict
            buf[:rolled] = buf[evict:evict + rolled]
            local_end = local_end + end - global_end - evict
        else:
            local_end = local_end + end - global_end
        buf[local_end - n:local_end] = list(range(start, end))
        seen.append(buf[max(0, local_end - size):local_end])
        global_end = end
    return seen


@pytest.mark.parametrize("window, chunk", [(6, 3), (4, 3), (6, 2), (5, 1)])
def test_frame_window_cache_rolls_as_the_reference(window, chunk):
    cache = FrameWindowCache("mouse", [0], rows=1, heads=1, head_dim=1, window=window, dtype=torch.float32,
                             device="cpu")
    chunks = [(s, chunk) for s in range(0, 10 * chunk, chunk)]
    for (start, n), want in zip(chunks, reference_roll(window, chunks)):
        past = cache.view(0, start, n)
        got = ([] if past is None else past[0][0, :, 0, 0].long().tolist()) + list(range(start, start + n))
        assert got == want, (start, got, want)
        cache.commit(0, start, torch.arange(start, start + n, dtype=torch.float32).view(1, n, 1, 1),
                     torch.zeros(1, n, 1, 1))
    assert cache.live_bytes() == window * 2 * 4 and cache.allocated_bytes() == window * 2 * 4


# -- rollouts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rollout_of_each_variant_rolls_every_cache(variant):
    frames = 15
    result = rollout(tiny_runner(variant), conditioning(frames, variant=variant), frames, variant)
    assert result.latent.shape == (1, 16, frames, 4, 6) and torch.isfinite(result.latent).all()
    stats = result.cache_stats
    window = VARIANTS[variant][2]
    assert stats["evicted_frames"] > 0  # the self-attention window rolled
    assert stats["keyboard_live_bytes"] > 0 and (stats.get("mouse_live_bytes", 0) > 0) == VARIANTS[variant][1]
    sizes = [c.cache_bytes for c in result.chunks]
    assert sizes[2:] == [sizes[2]] * (len(sizes) - 2), sizes  # flat once the window is full
    assert result.schedule.num_steps == (4 if variant == "templerun" else 3)
    assert window >= 3


def test_same_seed_and_actions_give_the_same_bits_and_actions_steer():
    runner = tiny_runner()
    a = rollout(runner, conditioning(9, actions=random_actions("universal", 9, seed=1)), 9).latent
    b = rollout(runner, conditioning(9, actions=random_actions("universal", 9, seed=1)), 9).latent
    c = rollout(runner, conditioning(9, actions=random_actions("universal", 9, seed=2)), 9).latent
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3


def test_a_chunk_does_not_read_later_actions_and_steering_as_it_goes_is_the_same_rollout():
    runner = tiny_runner()
    given = random_actions("universal", 9, seed=3)
    full = rollout(runner, conditioning(9, actions=given), 9).latent
    later = Actions(given.keyboard.clone(), given.mouse.clone())
    later.keyboard[9:] = 1 - later.keyboard[9:]  # pixel frames of chunk 2 and after (latent frames 3..)
    changed = rollout(runner, conditioning(9, actions=later), 9).latent
    assert torch.equal(full[:, :, :3], changed[:, :, :3]) and not torch.equal(full[:, :, 3:], changed[:, :, 3:])
    asked = []

    def steer(known, needed):  # an interactive caller: hands over each chunk's actions when asked
        asked.append(needed)
        return given.keyboard[known:needed], given.mouse[known:needed]

    live = Actions(given.keyboard[:1], given.mouse[:1], source=steer)
    assert torch.equal(rollout(runner, conditioning(9, actions=live), 9).latent, full)
    assert asked == [9, 21, 33]


def test_mouse_and_keyboard_both_steer_universal():
    runner = tiny_runner()
    base = random_actions("universal", 6, seed=4)
    ref = rollout(runner, conditioning(6, actions=base), 6).latent
    moved = Actions(base.keyboard, base.mouse + 0.3)
    pressed = Actions(1 - base.keyboard, base.mouse)
    for other in (moved, pressed):
        assert (rollout(runner, conditioning(6, actions=other), 6).latent - ref).abs().max() > 1e-3


@pytest.mark.parametrize("change, match", [
    (lambda c: setattr(c, "clip", None), "CLIP-vision features"),
    (lambda c: setattr(c, "concat", c.concat[:, :4]), "image conditioning has shape"),
    (lambda c: setattr(c, "concat", c.concat[:, :, :4]), "covers 4 latent frames"),
    (lambda c: setattr(c, "actions", None), "keyboard and mouse actions"),
    (lambda c: setattr(c, "actions", Actions(torch.zeros(5, 4), torch.zeros(5, 2))), "latent frame 2 needs 9"),
])
def test_bad_conditioning_stops_with_one_message(change, match):
    cond = conditioning(6)
    change(cond)
    with pytest.raises(FastARError, match=match):
        rollout(tiny_runner(), cond, 6)


def test_text_prompts_are_refused():
    with pytest.raises(FastARError, match="no text prompt"):
        rollout(tiny_runner(), torch.zeros(1, 4, 24), 3)


# -- checkpoints ---------------------------------------------------------------------------------------------


def test_checkpoint_round_trip_and_recognition(tmp_path):
    runner = tiny_runner("gta_drive", seed=5)
    path = tmp_path / "gta_drive" / "base_distill.safetensors"
    path.parent.mkdir()
    save_matrix_game(runner.model, path)
    model, ckpt = load_matrix_game(path)
    assert ckpt.prefix == "model." and ckpt.config.variant == "gta_drive" and ckpt.config == runner.model.config
    assert is_matrix_game(read_header(path, path.stat().st_size).tensors)
    with pytest.raises(CheckpointError, match="Matrix-Game 2.0 checkpoint"):
        load_checkpoint(path)  # the Wan loader names what the file is
    from comfyui_fastar.fastar_core.forward.runner import CausalRunner

    cond = conditioning(6, variant="gta_drive")
    assert torch.equal(rollout(CausalRunner(model), cond, 6, "gta_drive").latent,
                       rollout(runner, cond, 6, "gta_drive").latent)
    (path.parent / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_matrix_game(path)


def test_checkpoint_that_does_not_fit_its_config_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    save_matrix_game(tiny_runner("universal").model, path)
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["action_config"]["keyboard_dim_in"] = 7
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="keyboard_embed.0.weight has shape"):
        load_matrix_game(path)


def test_released_configs_read_as_their_variants():
    base = {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30, "in_dim": 36, "model_type": "i2v"}
    action = {"blocks": list(range(15)), "heads_num": 16, "hidden_size": 128, "img_hidden_size": 1536,
              "keyboard_hidden_dim": 1024, "mouse_hidden_dim": 1024, "rope_theta": 256}
    universal = from_reference_config({**base, "local_attn_size": 6,
                                       "action_config": {**action, "keyboard_dim_in": 4}})
    gta = from_reference_config({**base, "local_attn_size": 4, "action_config": {**action, "keyboard_dim_in": 2}})
    temple = from_reference_config({**base, "local_attn_size": 6,
                                    "action_config": {**action, "keyboard_dim_in": 7, "enable_mouse": False}})
    assert [c.variant for c in (universal, gta, temple)] == ["universal", "gta_drive", "templerun"]
    assert [c.schedule_name for c in (universal, gta, temple)] == ["matrix-game", "matrix-game", "self-forcing"]
    with pytest.raises(ValueError, match="local_attn_size -1"):
        from_reference_config({**base, "local_attn_size": -1})


# -- FAST-AR on it -------------------------------------------------------------------------------------------


def test_long_tempcache_rollout_keeps_cache_bytes_flat_and_is_steered_and_repeatable():
    runner = tiny_runner(layers=2, action_blocks=(0,))
    frames = 150
    spec = tempcache_spec(capacity_frames=6)
    result = rollout(runner, conditioning(frames, actions=random_actions("universal", frames, seed=8)), frames,
                     cache=spec)
    sizes = [c.cache_bytes for c in result.chunks]
    assert len(sizes) == 50 and max(sizes) <= result.cache_stats["allocated_bytes"]
    assert sizes[5:] == [sizes[5]] * (len(sizes) - 5), sizes[:8]
    assert torch.isfinite(result.latent).all()
    again = rollout(runner, conditioning(frames, actions=random_actions("universal", frames, seed=8)), frames,
                    cache=spec)
    assert torch.equal(again.latent, result.latent)
    other = rollout(runner, conditioning(frames, actions=random_actions("universal", frames, seed=9)), frames,
                    cache=spec)
    late = (other.latent - result.latent)[:, :, -30:]
    assert late.abs().max() > 1e-3  # the actions still steer 120 frames in


def test_a_batch_item_is_the_same_rollout_alone():
    runner = tiny_runner()
    steer = random_actions("universal", 6, seed=1)  # actions steer every batch item alike
    one, two = conditioning(6, seed=1, actions=steer), conditioning(6, seed=2, actions=steer)
    both = conditioning(6, seed=1, actions=steer)
    both.concat = torch.cat([one.concat, two.concat])
    both.clip = torch.cat([one.clip, two.clip])
    batch = rollout(runner, both, 6, batch=2).latent
    alone = rollout(runner, two, 6, batch=1, batch_index=(1,)).latent
    assert torch.allclose(batch[1:], alone, rtol=0, atol=1e-5), (batch[1:] - alone).abs().max()
    assert (batch[0] - batch[1]).abs().max() > 1e-3


@pytest.mark.parametrize("field, value, match", [
    ("local_attn_size", "6", "local_attn_size"),
    ("dim", 0, "dim"),
    ("action_config.blocks", "0-14", "blocks"),
    ("action_config.patch_size", 2, "patch_size"),
    ("action_config.enable_mouse", "yes", "enable_mouse"),
    ("action_config.rope_dim_list", [8, 8, 8], "rope_dim_list"),
    ("action_config.heads_num", 0, "heads_num"),
])
def test_a_bad_config_json_is_refused_naming_its_field(tmp_path, field, value, match):
    import json

    path = tmp_path / "m.safetensors"
    save_matrix_game(tiny_runner().model, path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    target, key = (cfg["action_config"], field.split(".")[1]) if "." in field else (cfg, field)
    target[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match) as err:
        load_matrix_game(path)
    assert "config.json" in str(err.value)
