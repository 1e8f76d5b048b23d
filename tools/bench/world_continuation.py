"""``fastar bench world-continuation``: given the true views so far, does the world model extend a landmark it can
see into the strip the next move brings in?

A landmark is two to three patches across and the camera moves one patch a frame, so drawing a landmark means
continuing, strip after strip, a shape already begun. This bench asks for that skill alone, without the model's
own earlier inventions in the way: for every frame ``t`` of the bar's path on each map it gives the model the true
frames ``0 .. t-1`` (dense-global, so all of them are in reach) and lets it draw frame ``t``. The pixels of the
strip the move brings in are sorted by what a perfect model knows of them:

- **remembered**: an earlier view showed this place (the model's memory, scored by the bar's returning views);
- **continued**: a landmark pixel whose landmark shows in frame ``t-1``: part of its shape and its colour are known;
- **new**: a landmark pixel whose landmark frame ``t-1`` does not show: unknowable;
- **ground**: the rest.

Each kind is scored by PSNR against the truth (pooled over frames and maps, data range 2) beside two guesses that
need no model: the bare ground (what drawing no landmark scores) and the smear (the edge of what stays in view,
repeated across the strip: the colour of a landmark that touches the edge, carried on). A model that continues
landmarks scores the continued pixels well above the bare ground. ``world_continuation.json`` holds the figures,
``world_continuation.png`` shows them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from ...fastar_core.families.demo.steer_world import MOVES, STEP, VIEW_SIZE, make_map, render_track
from ..demo.world_bar import bar_track
from ..demo.world_eval import DATA_RANGE
from ..demo.world_train import landmark_pixels
from .report import machine, write_json

KINDS = ("remembered", "continued", "new", "ground")
GUESSES = ("model", "bare ground", "smear")
MAP_SEEDS = (7, 8, 9, 10)  # held-out maps: not the bar's


def strip_and_smear(frame: torch.Tensor, action: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(``[H, W]`` bool: the strip the move ``action`` brings into ``frame``; ``frame`` with that strip filled by
    the nearest row or column of what stayed in view)."""
    dx, dy = MOVES[action]
    H, W = frame.shape[-2:]
    strip = torch.zeros(H, W, dtype=torch.bool)
    smear = frame.clone()
    if dx:
        cols = slice(W - STEP, W) if dx > 0 else slice(0, STEP)
        edge = W - STEP - 1 if dx > 0 else STEP
        strip[:, cols] = True
        smear[..., cols] = frame[..., edge:edge + 1]
    if dy:
        rows = slice(H - STEP, H) if dy > 0 else slice(0, STEP)
        edge = H - STEP - 1 if dy > 0 else STEP
        strip[rows, :] = True
        smear[..., rows, :] = frame[..., edge:edge + 1, :]
    return strip, smear


def _view(position, n: int) -> tuple:
    """Index of the map pixels in view from the camera's ``position`` (in patches) on a map of ``n`` pixels."""
    x, y = (int(v) * STEP for v in position)
    return (torch.arange(y, y + VIEW_SIZE) % n)[:, None], (torch.arange(x, x + VIEW_SIZE) % n)[None]


def _alone(world, lm, track) -> torch.Tensor:
    """``[T, H, W]``: the pixels landmark ``lm`` covers along ``track``."""
    only = dataclasses.replace(world, landmarks=(lm,))
    return landmark_pixels(only, track, render_track(only, track))[:, 0]


def pixel_kinds(world, track, truth: torch.Tensor) -> list[dict]:
    """Per frame ``t >= 1``: kind -> ``[H, W]`` bool mask of the strip's pixels of that kind (``KINDS``)."""
    owners = torch.stack([_alone(world, lm, track) for lm in world.landmarks])  # [L, T, H, W]
    seen = torch.zeros(world.size, world.size, dtype=torch.bool)
    names = track.names()
    out = []
    for t in range(1, len(track)):
        seen[_view(track.positions[t - 1], world.size)] = True
        was_seen = seen[_view(track.positions[t], world.size)]
        strip, _ = strip_and_smear(truth[t], names[t])
        unseen = strip & ~was_seen
        shown_before = owners[:, t - 1].flatten(1).any(1)  # [L]
        continued = (owners[shown_before, t].any(0) if shown_before.any() else torch.zeros_like(strip)) & unseen
        landmark = owners[:, t].any(0) & unseen
        out.append({"remembered": strip & was_seen, "continued": continued, "new": landmark & ~continued,
                    "ground": unseen & ~landmark})
    return out


def teacher_forced_frame(demo, truth: torch.Tensor, track, t: int, seed: int) -> torch.Tensor:
    """Frame ``t`` drawn by dense-global from the true frames ``0 .. t-1``."""
    from ..demo_world_command import world_modes, world_scenario
    from .rollout import run_mode

    scenario = dataclasses.replace(world_scenario(demo, track, truth),
                                   initial_latents=truth[:t].permute(1, 0, 2, 3)[None].to(demo.device))
    result, _ = run_mode(scenario, *world_modes(demo.places_on_map)["dense-global"], frames=1, seed=seed + t)
    return result.latent[0, :, t].float().cpu()


def _psnr(sq: float, count: int) -> float | None:
    return round(10 * math.log10(DATA_RANGE**2 / (sq / count)), 2) if count and sq > 0 else None


def _zero_sums() -> dict:
    """kind -> squared error per guess, and the pixel count."""
    return {k: {g: 0.0 for g in GUESSES} | {"pixels": 0} for k in KINDS}


def _scores(sums: dict) -> dict:
    """kind -> PSNR per guess (pooled over three channels), and the pixel count."""
    return {k: {g: _psnr(v[g], 3 * v["pixels"]) for g in GUESSES} | {"pixels": v["pixels"]} for k, v in sums.items()}


def run_world_continuation(out_dir, weights=None, seeds=MAP_SEEDS, frames: int = 120, seed: int = 0,
                           log=print) -> dict:
    from ..demo.bundled import load_demo_model
    from ..demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

    if frames < 2:
        raise ValueError(f"frames must be at least 2 (one drawn from the first), got {frames}")
    demo = load_demo_model(weights if weights is not None else WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
    if not demo.is_world:
        raise ValueError(f"{weights} is not a steered-world model; world-continuation needs one")
    pooled = _zero_sums()
    per_map = {}
    for map_seed in seeds:
        world, track = make_map(map_seed), bar_track(map_seed, frames)
        truth = render_track(world, track)
        bare = render_track(dataclasses.replace(world, landmarks=()), track)
        sums = _zero_sums()
        names = track.names()
        for t, kinds in enumerate(pixel_kinds(world, track, truth), start=1):
            if not any(m.any() for m in kinds.values()):
                continue  # no move: nothing new to draw
            drawn = teacher_forced_frame(demo, truth, track, t, seed)
            guesses = {"model": drawn, "bare ground": bare[t], "smear": strip_and_smear(truth[t], names[t])[1]}
            for kind, mask in kinds.items():
                for g, frame in guesses.items():
                    sums[kind][g] += float((frame - truth[t]).square()[:, mask].sum())
                sums[kind]["pixels"] += int(mask.sum())
        per_map[str(map_seed)] = _scores(sums)
        for k in KINDS:
            for key in (*GUESSES, "pixels"):
                pooled[k][key] += sums[k][key]
        log(f"map {map_seed}: " + "; ".join(f"{k} {per_map[str(map_seed)][k]}" for k in KINDS))
    report = {"bench": "world-continuation", "machine": machine(), "weights": str(weights or "bundled"),
              "frames": frames, "map_seeds": list(seeds), "seed": seed, "mode": "dense-global, true history",
              "pooled": _scores(pooled),
              "per_map": per_map}
    for k, v in report["pooled"].items():
        log(f"pooled {k}: " + ", ".join(f"{g} {v[g]} dB" for g in GUESSES) + f" over {v['pixels']} pixels")
    out = Path(out_dir)
    write_json(out / "world_continuation.json", report)
    _plot(out / "world_continuation.png", report)
    return report


def _plot(path: Path, report: dict) -> None:
    from ..demo.report import _plt

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.26
    top = 40.0  # the bare ground guessing the ground pixels is all but exact: its bar is cut here and labelled
    for i, g in enumerate(GUESSES):
        ys = [report["pooled"][k][g] for k in KINDS]
        xs = [x + (i - 1) * width for x in range(len(KINDS))]
        ax.bar(xs, [min(top, y or 0.0) for y in ys], width, label=g)
        for x, y in zip(xs, ys):
            if y is not None and y > top:
                ax.text(x, top - 3, f"{y:.0f}", ha="center", fontsize=7, color="white")
    ax.set_ylim(0, top)
    ax.set_xticks(range(len(KINDS)), [f"{k}\n({report['pooled'][k]['pixels']} px)" for k in KINDS])
    ax.set_ylabel("PSNR against the truth (dB)")
    ax.set_title("The strip a move brings in, drawn from the true history (maps "
                 f"{', '.join(str(s) for s in report['map_seeds'])}, {report['frames']} frames)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
