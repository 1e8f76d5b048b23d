"""A world that remembers: rotary positions on the map, training paths that return, TempCache's groups as places,
and the training forward equal to the sampler's rollout through the engine's caches."""

import numpy as np
import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheShape, CacheSpec
from comfyui_fastar.fastar_core.caches.spec import TempCacheSettings
from comfyui_fastar.fastar_core.families.demo.actions import (
    ActionEncoder,
    ActionRunner,
    added_to_time_embedding,
    batch_tracks,
)
from comfyui_fastar.fastar_core.families.demo.map_rope import MapRoPE, map_cycles, map_positions
from comfyui_fastar.fastar_core.families.demo.steer_world import (
    MAP_SIZE,
    STEP,
    back_and_forth_actions,
    make_map,
    render_track,
    track_from_actions,
)
from comfyui_fastar.fastar_core.forward.attention import DenseAttention, PassInfo
from comfyui_fastar.fastar_core.model.rope import apply_rope, rope_cos_sin
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.tools.demo.world_train import MapForward, training_path, world_batch

pytestmark = pytest.mark.usefixtures("one_thread")
PATCHES = MAP_SIZE // STEP
HEAD_DIM = 32


def test_map_positions_are_the_camera_plus_the_offset_in_view_wrapping():
    cams = torch.tensor([[22, 0], [23, 5]])  # (x, y) top-left in patches
    pos = map_positions(cams, 7, (6, 6), PATCHES).view(2, 6, 6, 3)
    assert pos[..., 0].unique().tolist() == [7, 8]  # t stays the frame: the caches evict and rewind by it
    assert pos[0, 0, 0].tolist() == [7, 0, 22] and pos[0, 5, 5].tolist() == [7, 5, 3]  # column 22 + 5 wraps to 3
    assert pos[1, 0, 1].tolist() == [8, 5, 0]


def test_map_rope_is_periodic_in_the_map_ignores_time_and_scores_a_place_highest_at_itself():
    rope = MapRoPE(PATCHES, HEAD_DIM).cos_sin
    assert map_cycles(5, PATCHES) == (1, 3, 5, 7, 9)
    p = torch.tensor([[0, 3, 4], [90, 3, 4], [5, 3 + PATCHES, 4 - PATCHES]])
    cos, sin = rope(p)
    assert torch.equal(cos[0], cos[1]) and torch.equal(cos[0], cos[2]) and torch.equal(sin[0], sin[2])
    wan_cos, _ = rope_cos_sin(p, HEAD_DIM)
    assert not torch.allclose(wan_cos[0], wan_cos[1])  # the negative control: Wan's RoPE sees the time
    # A query and a key of equal content score by their wrapped distance only, highest where they coincide.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, HEAD_DIM, generator=g).abs()
    qc, qs = rope(torch.tensor([[0, 10, 10]]))
    q_rot = apply_rope(q, qc, qs)
    places = torch.tensor([[0, y, x] for y in range(PATCHES) for x in range(PATCHES)])
    kc, ks = rope(places)
    scores = (q_rot @ apply_rope(q.expand(1, 1, len(places), HEAD_DIM), kc, ks).transpose(-1, -2))[0, 0, 0]
    assert int(scores.argmax()) == 10 * PATCHES + 10
    across = rope(torch.tensor([[0, 10 + 12, 10]]))  # half a map away, the same both ways round
    back = rope(torch.tensor([[0, 10 - 12, 10]]))
    assert torch.allclose(across[0], back[0], atol=1e-6)


def _places(cameras):
    return {tuple(p) for p in map_positions(cameras, 0, (6, 6), PATCHES)[:, 1:].tolist()}


def _returns(cameras) -> int:
    """Frames whose newly shown places were in view before the frame before them."""
    count = 0
    for t in range(2, len(cameras)):
        new = _places(cameras[t:t + 1]) - _places(cameras[t - 1:t])
        count += bool(new & _places(cameras[:t - 1]))
    return count


def test_training_paths_come_back_and_long_returns_show_a_remembered_place_again():
    kinds = {}
    returns = {}
    for i in range(200):
        path = training_path(np.random.default_rng(i), 21, PATCHES)
        kinds[path.kind] = kinds.get(path.kind, 0) + 1
        assert len(path.track) == 21
        cams = path.track.positions
        returns.setdefault(path.kind, []).append(_returns(cams))
        if path.kind == "long-return":
            early, late = cams[:path.jump], cams[path.jump:]
            # The late part starts away from the remembered frames and brings their places back into view.
            assert _places(late) & _places(early) - _places(late[:1]), "the return never shows a remembered place"
    assert set(kinds) == {"random", "back-and-forth", "loop", "long-return"} and min(kinds.values()) > 25
    # Places come back into view: in most frames of a back-and-forth or a loop, in few of today's random runs.
    mean = {k: sum(v) / len(v) for k, v in returns.items()}
    assert mean["back-and-forth"] > 6 and mean["loop"] > 6 and mean["random"] < mean["loop"] / 2, mean
    batch = world_batch(0, 3, 8, 21)
    assert batch.jumps.sum() == sum(k == "long-return" for k in batch.kinds)


CFG = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=96, in_dim=7, out_dim=3, text_dim=16, freq_dim=32,
                text_len=8, patch_size=(1, 4, 4))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_training_forward_equals_the_rollout_through_the_engines_cache(seed):
    """Positions on the map, clean frames read as they are, a path that returns; the window cache shows that the
    check can fail: a frame beyond it is not the training forward's."""
    frames = 10
    model = random_wan(CFG, seed=seed)
    enc = ActionEncoder(CFG.dim, PATCHES, frames_per_block=1)
    torch.nn.init.normal_(enc.out[1].weight, std=0.5)
    track = track_from_actions(back_and_forth_actions(np.random.default_rng(seed), frames - 1), start=(20, 1))
    clean = render_track(make_map(seed), track).permute(1, 0, 2, 3)[None]
    g = torch.Generator().manual_seed(seed)
    noisy = torch.randn(clean.shape, generator=g)
    noisy_t = torch.rand(1, frames, generator=g) * 1000
    ctx = torch.randn(1, 8, CFG.text_dim, generator=g)

    tf = MapForward(model, frames, 1, (24, 24), PATCHES)
    actions, positions = batch_tracks([track])
    seq = torch.cat([torch.arange(0, frames - 1), torch.arange(1, frames)])
    embedding = enc.embed(actions, positions, seq) * (torch.arange(len(seq)) >= frames - 1)[None, :, None]
    offset = enc.frame_conditions(actions, positions, torch.arange(frames))[1]
    tf.set_clips(positions, offset, torch.zeros(1, frames, dtype=torch.bool))
    with torch.no_grad(), added_to_time_embedding(model, embedding):
        trained = tf(clean, noisy, torch.zeros(1, frames), noisy_t, tf.encode_text(ctx))

    def rollout(spec):
        runner = ActionRunner(model, enc, [track], attention=DenseAttention(rope_max_distance=0),
                              moved_reference=True, map_positions=True)
        text = runner.encode_text(ctx)
        shape = CacheShape(num_layers=CFG.num_layers, batch=1, num_heads=CFG.num_heads, head_dim=CFG.head_dim,
                           grid_hw=(6, 6))
        cache = spec.build(shape, total_frames=frames)
        out = []
        for f in range(frames):
            if f > 0:
                out.append(runner.forward(noisy[:, :, f:f + 1], noisy_t[:, f:f + 1], text, cache,
                                          PassInfo(f, 0, 1, f, 1, 36)))
            runner.forward(clean[:, :, f:f + 1], torch.zeros(1, 1), text, cache, PassInfo(f, -1, 1, f, 1, 36),
                           commit=True, need_output=False)
        return torch.cat(out, dim=2)

    torch.testing.assert_close(rollout(CacheSpec("global")), trained, atol=3e-5, rtol=1e-4)
    windowed = rollout(CacheSpec("window", sink_frames=1, window_frames=3))
    assert not torch.allclose(windowed[:, :, -1], trained[:, :, -1], atol=1e-3)


def test_tempcache_groups_are_places_a_returning_key_joins_the_group_of_its_place():
    """Same content at two places: without ``same_place`` the second place's key joins the first place's group
    (and the group moves there); with it, each place keeps a group, and a key back at the first place joins it."""
    shape = CacheShape(num_layers=1, batch=1, num_heads=1, head_dim=8, grid_hw=(1, 2))
    key = torch.randn(1, 1, 1, 8)

    def commit(cache, frame, cam_x, k):
        positions = torch.tensor([[frame, 0, cam_x], [frame, 0, cam_x + 1]])
        cache.prepare_commit(frame, 1, positions)
        cache.commit(0, k, k)
        cache.finish_commit()

    results = {}
    for same_place in (False, True):
        spec = CacheSpec("tempcache", sink_frames=0,
                         tempcache=TempCacheSettings(threshold=0.9, capacity_frames=4, same_place=same_place))
        cache = spec.build(shape, total_frames=8)
        other = torch.randn(1, 1, 1, 8)
        commit(cache, 0, 0, torch.cat([key, other], 2))  # places 0 and 1
        commit(cache, 1, 5, torch.cat([key, -other], 2))  # places 5 and 6: the same key at place 5
        commit(cache, 2, 0, torch.cat([key, other], 2))  # back at places 0 and 1
        live = cache.count[0][0, 0, :cache.high_water[0]]
        places = cache.pos[0][0, 0, :cache.high_water[0], 2]
        results[same_place] = {int(p): float(c) for p, c in zip(places, live) if c > 0}
    assert results[True] == {0: 2.0, 1: 2.0, 5: 1.0, 6: 1.0}
    assert results[False][0] == 3.0 and 5 not in results[False]  # the key of place 5 was merged away


def test_whatever_attention_the_sampler_builder_gives_the_world_runner_rotates_by_the_map():
    from comfyui_fastar.fastar_core.fastar.config import get_preset
    from comfyui_fastar.fastar_core.rollout.engine import build_sampler

    model = random_wan(CFG, seed=0)
    enc = ActionEncoder(CFG.dim, PATCHES, frames_per_block=1)
    runner = ActionRunner(model, enc, [track_from_actions(["right"] * 3)], moved_reference=True, map_positions=True)
    build_sampler(runner, get_preset("balanced").attention, rope_max_distance=0)
    assert type(runner.attention).__name__ == "FastARAttention" and runner.attention.own_rope is runner.map_rope
    assert not runner.attention.wants_rotated_keys  # the caches keep keys before RoPE: they rotate by Wan's
    screen = ActionRunner(model, enc, [track_from_actions(["right"] * 3)], moved_reference=True)
    assert screen.attention.own_rope is None and screen.token_positions(1, 1, 6, 6)[0].tolist() == [1, 0, 0]
    placed = runner.token_positions(1, 1, 6, 6)
    assert placed[0].tolist() == [1, 0, 1] and placed[-1].tolist() == [1, 5, 6]  # camera (1, 0) after one move right
    with pytest.raises(ValueError, match="frame 4 has no camera yet"):
        runner.token_positions(3, 2, 6, 6)


def test_the_demo_labels_its_panes_and_finds_where_the_live_cache_stops_growing():
    from comfyui_fastar.tools.demo_command import labelled_side_by_side
    from comfyui_fastar.tools.demo_world_command import live_plateau

    videos = {"true": torch.zeros(5, 3, 24, 24), "TempCache": torch.ones(5, 3, 24, 24)}
    side = labelled_side_by_side(videos)
    assert side.shape == (5, 14 + 96, 2 * 96 + 2, 3) and side.dtype == torch.uint8
    assert (side[:, :14] > 200).any() and not torch.equal(side[:, :14, :96], side[:, :14, 98:])  # two names
    assert (side[:, 14:, :96] == 128).all() and (side[:, 14:, 98:] == 255).all()

    def rows(sizes):
        return [{"frame_start": i + 1, "cache_bytes": b} for i, b in enumerate(sizes)]

    assert live_plateau(rows([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10]))["plateau_from_frame"] is None  # still growing
    flat = live_plateau(rows([1, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4]))
    assert flat["plateau_from_frame"] == 3 and flat["live_mib_max"] == round(4 / 2**20, 3)


def test_the_world_memory_bench_compares_merging_and_dropping_at_the_same_memory_on_returning_views(tmp_path):
    import json

    from comfyui_fastar.tools.bench.world_memory import MODES, run_world_memory

    # 48 frames: the bar's 40-frame loop comes back from frame 41 on, further back than the 21-frame window reaches.
    report = run_world_memory(tmp_path, frames=48, seeds=[1], log=lambda _: None)
    assert json.loads((tmp_path / "world_memory.json").read_text())["summary"].keys() == set(MODES)
    assert (tmp_path / "world_memory.png").stat().st_size > 0
    rows = {name: report["per_seed"][name][0] for name in MODES}
    assert all(r["returns"]["views"] > 0 and r["returns"]["min_gap"] >= 22 for r in rows.values())
    assert rows["dense-global"]["plateau_from_frame"] is None  # it keeps every frame
    assert "groups are places" in report["modes"]["tempcache"] and "places" not in report["modes"]["tempcache-content"]
    # The bounded modes hold the same 21 frames: TempCache's groups never outnumber the window's slots.
    assert rows["tempcache"]["live_mib_max"] <= rows["dense-window"]["live_mib_max"] * 1.01
    assert 0 <= report["tempcache_over_window_seeds"] <= 1


def test_fastar_play_says_it_is_starting_before_it_loads_anything(monkeypatch, capsys):
    import comfyui_fastar.tools.play as play
    from comfyui_fastar.tools.cli import main as fastar_main

    said = []

    def fake_run_play(weights, **kw):
        said.append(capsys.readouterr().out)  # what was printed before the model load began
        return 0

    monkeypatch.setattr(play, "run_play", fake_run_play)
    assert fastar_main(["play", "--port", "0"]) == 0
    assert said and said[0].startswith("fastar play: starting (loading the bundled world model, then serving on "
                                       "127.0.0.1:a free port)")


def test_bench_world_memory_refuses_a_bad_map_seed_list_and_map_seeds_elsewhere(tmp_path, capsys):
    from comfyui_fastar.tools.cli import main as fastar_main

    assert fastar_main(["bench", "world-memory", "--out", str(tmp_path / "a"), "--map-seeds", "1,x"]) != 0
    assert "--map-seeds: 'x' is not a map seed" in capsys.readouterr().err
    assert fastar_main(["bench", "rollout", "--out", str(tmp_path / "b"), "--map-seeds", "1"]) != 0
    assert "--map-seeds is for bench world-memory and world-continuation, not rollout" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
