"""One rollout request: the engine decides mode "auto", kernel checks are turned off per rollout, and the cache
package stands below FAST-AR's (the presets import the caches, never the reverse)."""

import ast
import pathlib

from comfyui_fastar.fastar_core.fastar.config import FastARConfig
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.engine import build_sampler
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig, resolve_mode
from comfyui_fastar.kernels import set_verification, verification_enabled
from comfyui_fastar.nodes.request import RolloutSettings
from comfyui_fastar.nodes.request import resolve_mode as node_mode
from comfyui_fastar.tools.cli import build_parser

from helpers import tiny_context, tiny_model

CACHES = pathlib.Path(__file__).resolve().parents[1] / "fastar_core" / "caches"


def test_mode_auto_is_decided_by_the_engine_for_the_cli_and_the_nodes_alike():
    args = build_parser().parse_args(["generate", "--checkpoint", "x.pt", "--frames", "3", "--out", "o",
                                      "--schedule", "rolling-forcing"])
    assert args.mode == "auto"
    assert RolloutConfig(1, 2, 2, schedule=args.schedule, mode=args.mode).sampler_mode == "rolling"
    assert node_mode(RolloutSettings(mode="auto"), "rolling-forcing") == "rolling"
    for schedule in ("self-forcing", "causvid", "0.9,0.5", "custom"):  # "custom": the name of given sigmas
        assert resolve_mode("auto", schedule) == "chunk" == node_mode(RolloutSettings(), schedule)
    assert resolve_mode("rolling", "self-forcing") == "rolling"


def test_kernel_checks_turned_off_by_a_config_stay_off_for_its_rollout_only():
    set_verification(None)
    assert verification_enabled()
    seen = []
    sampler = build_sampler(CausalRunner(tiny_model()), FastARConfig(backend="torch", verify_kernels=False))
    cfg = RolloutConfig(num_frames=3, latent_height=2, latent_width=2)
    sampler.generate(tiny_context(), cfg, callback=lambda report: seen.append(verification_enabled()))
    assert seen == [False] and verification_enabled()


def test_the_caches_never_import_fastar_attention_modules():
    for path in CACHES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert not (node.module or "").startswith("fastar"), f"{path.name} imports ..{node.module}"
