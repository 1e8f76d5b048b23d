"""The world bar's fixed choices, and the perfect world models its no-collapse band comes from.

The bar's path (``bar_track``: out, around and back, a 40-frame square loop repeated) on ``WORLD_SEEDS`` maps for
``WORLD_FRAMES`` frames. A perfect world model of a bar map (``oracle_map``) knows the map's ground exactly, shows
the true first view, draws every landmark it has not been shown from the world's own generator (another map's
landmarks), renders them exactly and remembers them when it comes back; ``seed_ceiling`` judges many such draws by
the bar's spread ratios and ``perfect_band`` gives the 5-95 % band of each ratio that the bar's no-collapse check
asks a model to lie in (``fastar bench world-ceiling`` reports them all).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .steer_world import (
    LANDMARK_SPACING,
    MAP_SIZE,
    STEP,
    VIEW_SIZE,
    WorldMap,
    make_map,
    render_track,
    scripted_path,
    track_from_actions,
    wrapped_distance,
)
from .world_eval import BAR, RATIO_NAMES, no_collapse, spread_ratios

WORLD_SEEDS = (1, 2, 3, 4, 5, 6)
WORLD_FRAMES = 240


def bar_track(seed: int, frames: int = WORLD_FRAMES):
    patches = MAP_SIZE // STEP
    return track_from_actions(scripted_path(frames), start=((7 * seed) % patches, (11 * seed) % patches))


RATIOS = (("all", "colour_spread"), ("all", "hf_energy"), ("last_quarter", "colour_spread"),
          ("last_quarter", "hf_energy"))
FIRST_DRAW = 1000  # draw seeds start here, away from the bar's seeds and the held-out maps


def _gap(c: float, lo: int, n: int) -> float:
    """Distance on a circle of ``n`` pixels from ``c`` to the view's span ``[lo, lo + VIEW_SIZE)``."""
    d = (c - lo) % n
    return 0.0 if d < VIEW_SIZE else min(d - VIEW_SIZE, n - d)


def _touches_view(lm, x0: int, y0: int, n: int) -> bool:
    # Every shape lies inside its radius (make_map's shapes); one pixel more covers the anti-aliased edge.
    return max(_gap(lm.x, x0, n), _gap(lm.y, y0, n)) < lm.radius + 1


def oracle_map(world: WorldMap, draw: WorldMap, view_origin: tuple) -> WorldMap:
    """``world``'s ground and the landmarks touching its view at pixel ``view_origin``, plus ``draw``'s landmarks
    that touch neither that view nor come within the generator's spacing of a kept landmark."""
    if draw.size != world.size:
        raise ValueError(f"the draw map is {draw.size} pixels wide and the bar map {world.size}; they must match")
    x0, y0 = view_origin
    seen = [lm for lm in world.landmarks if _touches_view(lm, x0, y0, world.size)]
    drawn = [lm for lm in draw.landmarks if not _touches_view(lm, x0, y0, world.size)
             and all(wrapped_distance(lm.x, lm.y, s.x, s.y, world.size) >= LANDMARK_SPACING for s in seen)]
    return dataclasses.replace(world, landmarks=tuple(seen + drawn))


def flat(ratios: dict) -> list[float]:
    """``spread_ratios``' four figures in the order of ``RATIOS``."""
    return [ratios[label][m] for label, m in RATIOS]


def seed_ceiling(seed: int, draws, frames: int = WORLD_FRAMES, start_frames: int = 1) -> dict:
    track = bar_track(seed, frames)
    world = make_map(seed)
    truth = render_track(world, track)
    origin = (int(track.positions[0][0]) * STEP, int(track.positions[0][1]) * STEP)
    rows = []
    for d in draws:
        views = render_track(oracle_map(world, make_map(d), origin), track)
        if not bool((views[:start_frames] == truth[:start_frames]).all()):
            raise AssertionError(f"the oracle of map {seed}, draw {d} does not show the true first view")
        rows.append(spread_ratios(views[start_frames:], truth[start_frames:]))
    return {"seed": seed, "draws": len(rows), "pass_share": sum(no_collapse(r) for r in rows) / len(rows),
            "ratios": [flat(r) for r in rows]}


def perfect_band(seed: int, frames: int = WORLD_FRAMES, draws: int = 100) -> dict:
    """name (``world_eval.RATIO_NAMES``) -> [5th, 95th percentile] of each spread ratio over ``draws`` perfect world
    models of bar seed ``seed``: the bar's no-collapse band."""
    rows = np.array(seed_ceiling(seed, range(FIRST_DRAW, FIRST_DRAW + draws), frames)["ratios"])
    lo, hi = BAR["perfect_band"]
    return {n: [round(float(np.percentile(rows[:, i], lo)), 4), round(float(np.percentile(rows[:, i], hi)), 4)]
            for i, n in enumerate(RATIO_NAMES)}
