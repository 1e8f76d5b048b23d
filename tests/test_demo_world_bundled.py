"""The bundled steered-world model: it loads as a world model, its card's figures come from these weights, it
follows the keys and carries the view, and (an expected failure until the new strips are generated rather than
averaged) its 240-frame rollout passes the whole of the world's bar."""

import json

import pytest
import torch

from comfyui_fastar.tools.demo.model import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
from comfyui_fastar.tools.demo.steer_world import make_map
from comfyui_fastar.tools.demo.world_eval import evaluate_world, world_rollout
from comfyui_fastar.tools.demo.world_report import WORLD_FRAMES, bar_track


@pytest.fixture(scope="module")
def seed_one():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        demo = load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
        track = bar_track(1, WORLD_FRAMES)
        frames, truth, _ = world_rollout(demo, make_map(1), track)
        return demo, evaluate_world(frames, truth, track, demo.frames_per_block)
    finally:
        torch.set_num_threads(before)


def test_the_bundled_world_model_is_small_and_its_card_reports_these_weights(seed_one):
    demo, report = seed_one
    assert demo.is_world and (WEIGHTS_DIR / WORLD_WEIGHTS_FILE).stat().st_size < 10 * 2**20
    card = json.loads((WEIGHTS_DIR / "world_eval.json").read_text())
    case = next(c for c in card["cases"] if c["mode"] == "dense-global" and c["seed"] == 1)["report"]
    assert report["action_following"] == pytest.approx(case["action_following"], abs=0.02)
    assert report["carried_psnr_db"] == pytest.approx(case["carried_psnr_db"], abs=0.2)
    passes, seeds = card["passes"], len(card["seeds"])
    assert (f"{passes['dense-global']} of {seeds} seeds pass with dense-global, {passes['fastar']} of {seeds} with "
            "FAST-AR") in (WEIGHTS_DIR / "WORLD_MODEL_CARD.md").read_text()


def test_it_follows_the_keys_and_carries_what_stays_in_view(seed_one):
    _, report = seed_one
    assert report["checks"]["action_following"] and report["checks"]["carried"], \
        {k: report[k] for k in ("action_following", "carried_psnr_db")}


@pytest.mark.xfail(strict=True, reason="the bundled world model follows the keys and carries the view, but invents "
                                       "each new strip as a bland average of the ground, so colour spread and "
                                       "high-frequency energy collapse (WORLD_MODEL_CARD.md); remove this mark once "
                                       "it passes")
def test_a_240_frame_rollout_along_the_scripted_path_passes_the_world_bar(seed_one):
    _, report = seed_one
    assert report["passed"], {k: report[k] for k in ("action_following", "carried_psnr_db", "spread_ratios")}
