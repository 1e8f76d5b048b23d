"""One place decides the cache: the CLI's, the nodes' and the benches' settings resolve to the same objects."""

import argparse

import pytest

from comfyui_fastar.fastar_core.caches import POLICIES, CacheShape, CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.rollout.engine import resolve_settings
from comfyui_fastar.nodes.constants import CACHE_POLICIES as NODE_CACHE_POLICIES
from comfyui_fastar.nodes.model_access import FastARChoice
from comfyui_fastar.tools.args import add_cache_arguments, add_fastar_arguments, settings_from_arguments
from comfyui_fastar.tools.bench.scenarios import CAPACITY_FRAMES, bench_modes

SHAPE = CacheShape(num_layers=2, batch=1, num_heads=2, head_dim=8, grid_hw=(2, 2))


def _parser():
    p = argparse.ArgumentParser()
    add_cache_arguments(p)
    add_fastar_arguments(p)
    return p


def cli(*argv):
    return settings_from_arguments(_parser().parse_args(list(argv)))


def node(preset="off", tempcache=None, threshold=None, capacity=None, cache_policy="auto", sink=3, window=12):
    choice = FastARChoice(preset=preset, tempcache=tempcache,
                          tempcache_overrides={"threshold": threshold, "capacity_frames": capacity})
    # What the FAST-AR Attention node stores on the MODEL travels as a plain dict.
    choice = FastARChoice.from_dict(choice.to_dict())
    return choice.resolve(cache_policy=cache_policy, sink_frames=sink, window_frames=window)


def test_every_policy_is_the_same_object_from_the_cli_the_nodes_and_the_benches():
    window = CAPACITY_FRAMES + 3  # frames a 3-frame chunk attends to: the bench window's 21 and itself
    modes = bench_modes()
    cases = {
        "global": (cli("--cache", "global"), node(cache_policy="global"), modes["dense-global"]),
        "window": (cli("--cache", "window", "--window", str(window)),
                   node(cache_policy="window", window=window), modes["dense-window"]),
        "tempcache": (cli("--fastar", "balanced", "--capacity", str(CAPACITY_FRAMES), "--no-annca", "--no-annsa"),
                      node(preset="balanced", capacity=CAPACITY_FRAMES), modes["tempcache"]),
    }
    for policy, (from_cli, from_node, (bench_spec, _)) in cases.items():
        assert from_cli.cache == from_node.cache == bench_spec, policy
        built = {type(s.build(SHAPE, total_frames=30)) for s in (from_cli.cache, from_node.cache, bench_spec)}
        assert built == {POLICIES[policy]}
    rolling = cli("--cache", "rolling").cache
    assert rolling == node(cache_policy="rolling").cache and type(rolling.build(SHAPE, 30)) is POLICIES["rolling"]


def test_every_registered_policy_is_offered_by_the_cli_and_the_nodes():
    cli_choices = next(a.choices for a in _parser()._actions if a.dest == "cache")
    assert set(POLICIES) < set(cli_choices) and set(POLICIES) < set(NODE_CACHE_POLICIES)


def test_auto_follows_the_preset_and_the_sink_is_one_setting():
    assert cli().cache.policy == "global"
    assert cli("--fastar", "quality").cache.policy == "tempcache"
    spec = cli("--fastar", "quality", "--sink", "0").cache
    assert spec.sink_frames == 0 and spec.tempcache.threshold == 0.95
    assert cli("--tempcache").cache.policy == "tempcache"
    assert cli("--fastar", "fast", "--no-tempcache").cache.policy == "global"
    assert node(preset="fast").cache.tempcache.capacity_frames == 15


@pytest.mark.parametrize("argv, match", [
    (["--cache", "window", "--fastar", "quality"], "contradicts"),
    (["--cache", "tempcache", "--no-tempcache"], "contradicts"),
    (["--threshold", "0.5"], "threshold only apply to TempCache"),
    (["--cache", "rolling", "--capacity", "9"], "capacity_frames only apply to TempCache"),
    (["--annca-prune", "--no-annca"], "pruning contradicts"),
    (["--fastar", "quality", "--threshold", "1.5"], "threshold"),
])
def test_contradictions_and_bad_values_are_refused_with_what_to_change(argv, match):
    with pytest.raises(FastARError, match=match):
        cli(*argv)


def test_a_spec_refuses_sizes_its_policy_cannot_hold():
    with pytest.raises(FastARError, match="window_frames"):
        CacheSpec(policy="window", window_frames=2).validate(frames_per_block=3)
    with pytest.raises(FastARError, match="not one of"):
        CacheSpec(policy="lru").validate(frames_per_block=3)
    with pytest.raises(FastARError, match="not one of"):
        resolve_settings(cache_policy="lru")
