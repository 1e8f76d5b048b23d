"""Every node class declares a valid V1 schema: types, defaults within bounds, tooltips, outputs, category."""

import sys

import pytest

import comfyui_fastar
from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from comfyui_fastar.nodes.constants import ACTIONS, CATEGORY, PROMPT_SCHEDULE

SOCKET_TYPES = {"MODEL", "CONDITIONING", "LATENT", "VAE", "IMAGE", "SIGMAS", "SAMPLER", "CLIP_VISION_OUTPUT",
                PROMPT_SCHEDULE, ACTIONS}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
HIDDEN_TYPES = {"PROMPT", "EXTRA_PNGINFO", "UNIQUE_ID"}
EXPECTED_IDS = {
    "FastAR_LoadARVideoModel", "FastAR_Attention", "FastAR_PromptSchedule", "FastAR_LongVideoSampler",
    "FastAR_SamplerARVideo", "FastAR_ImageToVideo", "FastAR_SaveLongVideo", "FastAR_ActionScript",
    "FastAR_WorldModelStart", "FastAR_LiveWorld", "FastAR_DemoWorldStart", "FastAR_DemoWorldFrames",
    "FastAR_LingBotWorldStart", "FastAR_CameraPath",
}


def test_root_package_reexports_the_mappings_without_importing_comfyui():
    assert comfyui_fastar.NODE_CLASS_MAPPINGS is NODE_CLASS_MAPPINGS
    assert set(NODE_CLASS_MAPPINGS) == EXPECTED_IDS
    assert set(NODE_DISPLAY_NAME_MAPPINGS) == EXPECTED_IDS
    assert all(name.startswith("FastAR_") for name in NODE_CLASS_MAPPINGS)
    assert "comfy" not in sys.modules and "folder_paths" not in sys.modules


def check_input(node, name, spec):
    where = f"{node}.{name}"
    assert isinstance(spec, tuple) and 1 <= len(spec) <= 2, where
    kind = spec[0]
    opts = spec[1] if len(spec) > 1 else {}
    assert isinstance(opts, dict), where
    assert isinstance(opts.get("tooltip"), str) and len(opts["tooltip"]) > 10, f"{where} needs a tooltip"
    if isinstance(kind, list):  # combo
        assert all(isinstance(v, str) for v in kind), where
        if kind:
            assert opts.get("default", kind[0]) in kind, where
        return
    for piece in kind.split(","):
        assert piece in SOCKET_TYPES | WIDGET_TYPES, f"{where}: unknown type {kind}"
    if kind in ("INT", "FLOAT"):
        lo, hi, default = opts["min"], opts["max"], opts["default"]
        assert lo <= default <= hi, f"{where}: default {default} outside [{lo}, {hi}]"
        assert opts.get("step", 1) > 0, where
        if kind == "INT":
            assert all(isinstance(v, int) for v in (lo, hi, default)), where
    if kind == "STRING":
        assert isinstance(opts.get("default"), str), where


@pytest.mark.parametrize("node_id", sorted(EXPECTED_IDS))
def test_node_schema(node_id):
    cls = NODE_CLASS_MAPPINGS[node_id]
    spec = cls.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"}
    assert spec["required"], node_id
    for section in ("required", "optional"):
        for name, value in spec.get(section, {}).items():
            check_input(node_id, name, value)
    for name, value in spec.get("hidden", {}).items():
        assert value in HIDDEN_TYPES, f"{node_id}.{name}"
    assert cls.CATEGORY == CATEGORY
    assert isinstance(cls.FUNCTION, str) and callable(getattr(cls, cls.FUNCTION))
    assert isinstance(cls.RETURN_TYPES, tuple) and cls.RETURN_TYPES
    for t in cls.RETURN_TYPES:
        assert t in SOCKET_TYPES | WIDGET_TYPES, f"{node_id} returns unknown type {t}"
    assert len(cls.RETURN_NAMES) == len(cls.RETURN_TYPES) == len(cls.OUTPUT_TOOLTIPS)
    assert isinstance(cls.DESCRIPTION, str) and len(cls.DESCRIPTION) > 40
    # The node function accepts every declared input by name.
    import inspect

    params = inspect.signature(getattr(cls, cls.FUNCTION)).parameters
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for section in ("required", "optional", "hidden"):
        for name in spec.get(section, {}):
            assert name in params or has_kwargs, f"{node_id}.{cls.FUNCTION} does not take {name}"


def test_seed_widget_gets_the_editors_extra_value():
    seed = NODE_CLASS_MAPPINGS["FastAR_LongVideoSampler"].INPUT_TYPES()["required"]["seed"]
    assert seed[0] == "INT" and seed[1]["control_after_generate"] is True


def test_length_widget_steps_through_valid_wan_lengths():
    length = NODE_CLASS_MAPPINGS["FastAR_LongVideoSampler"].INPUT_TYPES()["required"]["length"][1]
    assert (length["default"] - 1) % 4 == 0 and length["min"] == 1 and length["step"] == 4


@pytest.mark.parametrize("node_id", ["FastAR_LongVideoSampler", "FastAR_SamplerARVideo"])
def test_sampler_size_defaults_are_the_engines(node_id):
    # The widgets, the CLI and a bare RolloutConfig / CacheSpec all start a user from the same sizes.
    import argparse
    import inspect

    from comfyui_fastar.fastar_core.caches.spec import CacheSpec
    from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig
    from comfyui_fastar.tools.cli import build_parser

    node = NODE_CLASS_MAPPINGS[node_id]
    required = node.INPUT_TYPES()["required"]
    signature = inspect.signature(getattr(node, node.FUNCTION)).parameters
    engine = {"frames_per_block": RolloutConfig(1, 1, 1).frames_per_block, "sink_frames": CacheSpec().sink_frames,
              "window_frames": CacheSpec().window_frames}
    for name, value in engine.items():
        assert required[name][1]["default"] == value, name
        assert signature[name].default == value, name
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert isinstance(generate, argparse.ArgumentParser)
    assert generate.get_default("frames_per_block") == engine["frames_per_block"]
