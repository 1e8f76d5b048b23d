"""The bundled steered-world model: it loads as a world model with the sampler its file names, its card's figures
come from these weights, it follows the keys and carries the view, and (an expected failure until its new strips
hold landmarks) its 240-frame rollout passes the whole of the world's bar."""

import json

import pytest
import torch

from comfyui_fastar.fastar_core.families.demo.steer_world import make_map
from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
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


def test_it_samples_with_the_solver_its_file_names(seed_one):
    demo, _ = seed_one
    assert demo.metadata["sampler"] == {"solver": "unipc", "steps": 6, "shift": 1.0}
    assert (demo.schedule.solver, demo.schedule.num_steps) == ("unipc", 6)


def test_a_demo_file_naming_an_unknown_solver_is_refused():
    from comfyui_fastar.fastar_core.errors import FastARError
    from comfyui_fastar.fastar_core.families.demo.model import schedule_from_metadata

    assert schedule_from_metadata({"schedule": [1.0, 0.5]}).solver == "dmd"
    with pytest.raises(FastARError, match="only the 'unipc' solver"):
        schedule_from_metadata({"schedule": [1.0, 0.5], "sampler": {"solver": "euler", "steps": 4, "shift": 1.0}})


def test_it_follows_the_keys_and_carries_what_stays_in_view(seed_one):
    _, report = seed_one
    assert report["checks"]["action_following"] and report["checks"]["carried"], \
        {k: report[k] for k in ("action_following", "carried_psnr_db")}


@pytest.mark.xfail(strict=True, reason="the bundled world model follows the keys and carries the view, but its new "
                                       "strips hold colour blobs rather than landmarks, and they thin out: colour "
                                       "spread falls below the bar over the last quarter (WORLD_MODEL_CARD.md); "
                                       "remove this mark once it passes")
def test_a_240_frame_rollout_along_the_scripted_path_passes_the_world_bar(seed_one):
    _, report = seed_one
    assert report["passed"], {k: report[k] for k in ("action_following", "carried_psnr_db", "spread_ratios")}
