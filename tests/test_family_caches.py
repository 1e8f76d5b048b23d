"""Presets that respect a family's own cache: a sampler left on cache 'auto' runs the family's own (LongLive 2.0's
window of 32 with sink 8, Matrix-Game's window of 6), TempCache's capacity defaults to what that cache holds, the
report says which ran and why, and FAST-AR Attention on a family it cannot patch names what to use instead."""

import pytest
import torch
from matrix_game_models import tiny_config

from comfyui_fastar.fastar_core.caches.spec import CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.families.longlive2 import LongLive2Family
from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game
from comfyui_fastar.fastar_core.forward.family import ModelFamily, family_for
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.engine import resolve_settings
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS as NODES
from comfyui_fastar.nodes.standalone import StandaloneModel

TINY_5B = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, in_dim=48, out_dim=48, text_dim=32, freq_dim=32)
LONGLIVE2 = CacheSpec("window", sink_frames=8, window_frames=32)
MATRIX_GAME = CacheSpec("window", sink_frames=0, window_frames=6)


def resolve(own, **kw):
    kw.setdefault("sink_frames", 3)
    kw.setdefault("window_frames", 12)
    return resolve_settings(own_cache=own, family="the family", **kw)


def test_tempcache_holds_what_the_familys_own_window_holds():
    # LongLive 2.0: a window of 32 with chunks of 8 reads back 24 frames, its sink 8 among them
    s = resolve(LONGLIVE2, preset="balanced", frames_per_block=8)
    assert (s.cache.policy, s.cache.tempcache.capacity_frames, s.cache.sink_frames) == ("tempcache", 24, 8)
    assert s.cache.tempcache.threshold == 0.9  # the preset's other settings stay
    assert s.notes == ("TempCache capacity 24 frames, sink 8: what the family's own cache (window (32 frames attended, "
                       "sink 8 and the chunk included)) holds with chunks of 8, in place of preset balanced's 21",)
    # Matrix-Game: a window of 6 with chunks of 3 reads back 3, no sink; no preset at all (its TempCache defaults)
    s = resolve(MATRIX_GAME, cache_policy="tempcache", frames_per_block=3, sink_frames=0)
    assert (s.cache.tempcache.capacity_frames, s.cache.sink_frames) == (3, 0)
    assert "in place of TempCache's default 21" in s.notes[0]


def test_what_the_user_set_wins():
    s = resolve(LONGLIVE2, preset="balanced", frames_per_block=8, tempcache_overrides={"capacity_frames": 16})
    assert (s.cache.tempcache.capacity_frames, s.cache.sink_frames) == (16, 8)  # 'auto': still the family's sink
    s = resolve(LONGLIVE2, preset="balanced", cache_policy="tempcache", frames_per_block=8, sink_frames=2)
    assert (s.cache.tempcache.capacity_frames, s.cache.sink_frames) == (24, 2)  # an explicit policy: the sampler's
    s = resolve(LONGLIVE2, preset="balanced", cache_policy="tempcache", frames_per_block=8,
                tempcache_overrides={"capacity_frames": 16})
    assert (s.cache.tempcache.capacity_frames, s.cache.sink_frames, s.notes) == (16, 3, ())
    s = resolve(LONGLIVE2, cache_policy="window", frames_per_block=8)
    assert (s.cache.window_frames, s.cache.sink_frames, s.notes) == (12, 3, ())


def test_auto_without_tempcache_is_the_familys_own_cache_and_none_is_global():
    s = resolve(LONGLIVE2, frames_per_block=8)
    assert s.cache == LONGLIVE2 and s.notes == ("cache 'auto' is the family's own: window (32 frames attended, sink 8 "
                                                "and the chunk included)",)
    assert resolve(None, preset="balanced").cache.tempcache.capacity_frames == 21
    assert resolve(None).cache.policy == "global"


def test_a_wan22_5b_module_tree_is_longlive2_and_brings_its_window():
    family = family_for(random_wan(TINY_5B, seed=0))
    assert isinstance(family, LongLive2Family) and family.own_cache() == LONGLIVE2
    assert type(family_for(random_wan(WanConfig(dim=64, num_heads=2, num_layers=1, ffn_dim=64, text_dim=32,
                                                freq_dim=32), seed=0))) is ModelFamily
    assert family.restartable and not family_for(random_matrix_game(tiny_config(), seed=0)).restartable


def test_the_longlive2_report_says_which_capacity_ran(monkeypatch):
    monkeypatch.setenv("FASTAR_HOST", "standalone")
    model = NODES["FastAR_Attention"]().patch(StandaloneModel(random_wan(TINY_5B, seed=0)), preset="balanced")[0]
    g = torch.Generator().manual_seed(1)
    positive = [[torch.randn(1, 6, TINY_5B.text_dim, generator=g), {}]]
    _, report = NODES["FastAR_LongVideoSampler"]().sample(model, positive, width=64, height=64, length=29,
                                                          frames_per_block=4, schedule="LongLive 2.0 4-step (UniPC)",
                                                          cache_policy="auto", sink_frames=3, window_frames=12)
    assert "cache     : tempcache (sink 8, capacity 28 frames" in report, report
    assert "threshold 0.9, matcher auto) | matcher exact on cpu | peak live" in report, report  # which search ran
    assert ("note      : TempCache capacity 28 frames, sink 8: what LongLive 2.0 (Wan2.2 TI2V-5B)'s own cache "
            "(window (32 frames attended, sink 8 and the chunk included)) holds with chunks of 4") in report, report


def test_fast_ar_attention_on_matrix_game_says_what_to_use_instead(monkeypatch):
    monkeypatch.setenv("FASTAR_HOST", "standalone")
    world = StandaloneModel(random_matrix_game(tiny_config(), seed=0))
    with pytest.raises(FastARError, match="FAST-AR Attention cannot patch Matrix-Game 2.0 universal: .* set the Long "
                                          "Video Sampler's cache_policy to tempcache"):
        NODES["FastAR_Attention"]().patch(world, preset="balanced")
