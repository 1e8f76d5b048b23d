"""The world bar's ceiling: a perfect world model, drawn from the world's own generator, judged by the bar."""

from __future__ import annotations

import json
import math

import pytest
import torch

from comfyui_fastar.tools.bench.world_ceiling import at_least, flat, oracle_map, run_world_ceiling
from comfyui_fastar.tools.demo.steer_world import (
    LANDMARK_SPACING,
    STEP,
    VIEW_SIZE,
    make_map,
    render_track,
    wrapped_distance,
)
from comfyui_fastar.tools.demo.world_bar import bar_track
from comfyui_fastar.tools.demo.world_eval import no_collapse, spread_ratios

pytestmark = pytest.mark.usefixtures("one_thread")


def _origin(track):
    return int(track.positions[0][0]) * STEP, int(track.positions[0][1]) * STEP


def test_the_oracle_of_a_map_drawn_from_itself_is_the_map_and_passes():
    world, track = make_map(3), bar_track(3, 40)
    own = oracle_map(world, world, _origin(track))
    assert sorted(own.landmarks, key=lambda lm: (lm.x, lm.y)) == sorted(world.landmarks, key=lambda lm: (lm.x, lm.y))
    truth = render_track(world, track)
    ratios = spread_ratios(render_track(own, track)[1:], truth[1:])
    assert all(abs(r - 1) < 1e-5 for r in flat(ratios)) and no_collapse(ratios)


def test_another_draw_keeps_the_first_view_and_spacing_and_changes_the_rest():
    world, track = make_map(3), bar_track(3, 40)
    other = oracle_map(world, make_map(1001), _origin(track))
    truth, views = render_track(world, track), render_track(other, track)
    assert torch.equal(views[0], truth[0])  # what the model was shown, exactly
    assert not torch.equal(views, truth)  # the landmarks it was not shown are another draw's
    assert views.shape == truth.shape == (41, 3, VIEW_SIZE, VIEW_SIZE)
    lms = other.landmarks
    assert all(wrapped_distance(a.x, a.y, b.x, b.y, world.size) >= LANDMARK_SPACING
               for i, a in enumerate(lms) for b in lms[i + 1:])
    with pytest.raises(ValueError, match="draw map is 48 pixels wide"):
        oracle_map(world, make_map(1, size=48), _origin(track))


def test_at_least_k_of_n_is_the_binomial_tail_and_handles_unequal_shares():
    p = 0.4
    assert at_least(5, [p] * 6) == pytest.approx(6 * p**5 * (1 - p) + p**6)
    assert at_least(1, [0.5, 0.0]) == pytest.approx(0.5)
    assert at_least(2, [1.0, 1.0]) == pytest.approx(1.0) and at_least(0, [0.3]) == pytest.approx(1.0)


def test_the_bench_writes_its_figures_and_reads_a_model_card(tmp_path):
    card = tmp_path / "world_eval.json"
    flat = {"all": {"colour_spread": 0.1, "hf_energy": 0.1}, "last_quarter": {"colour_spread": 0.1, "hf_energy": 0.1}}
    card.write_text(json.dumps({"cases": [{"mode": "dense-global", "seed": 2, "report": {"spread_ratios": flat}}]}))
    report = run_world_ceiling(tmp_path / "out", draws=3, seeds=(2,), frames=40, model_eval=card, log=lambda _: None)
    row = report["per_seed"][0]
    assert row["draws"] == 3 and len(row["ratios"]) == 3 and 0 <= row["pass_share"] <= 1
    # A collapsed model (a tenth of the true spread) lies outside the band perfect draws span.
    assert row["bundled_within_perfect_5_95"] == {"dense-global": False}
    assert math.isclose(report["chance_at_least_0_of_1"], 1.0)
    assert (tmp_path / "out" / "world_ceiling.json").is_file() and (tmp_path / "out" / "world_ceiling.png").is_file()
    with pytest.raises(ValueError, match="draws must be at least 1"):
        run_world_ceiling(tmp_path / "none", draws=0)
