"""Judging a steered-world rollout against the actions it was given and the true views.

- **action following**: for each pair of consecutive frames, which of the five moves best explains the second
  frame as the first one shifted (mean squared error over the region both share); the share of frames where
  that is the commanded move (a tie between moves counts as not followed, so a flat frame scores nothing).
- **carried PSNR**: the region of each frame that was in view in the previous one, against that previous
  generated frame shifted by the commanded move, pooled over the rollout (content carried, not re-invented).
- **colour spread** (per-channel standard deviation over a frame's pixels) and **high-frequency energy**
  (mean squared difference of neighbouring pixels), generated over true, pooled over all frames and over the
  last quarter (a collapse shows late).
- **PSNR against the true views**, pooled.
- **revisits**: frames whose camera position was in view-identical position at least ``min_gap`` frames before:
  PSNR against the truth and against the model's own earlier view of that place.

The bar (``BAR``): keys followed in >= 90 % of frames, the carried region >= 28 dB, returning views >= 28 dB against
the model's own earlier view, and no collapse: each of the four spread ratios inside its seed's 5-95 % band of
perfect world models (``perfect_band``, from ``fastar bench world-ceiling``: a check a perfect model passes and a
collapse fails; the old band of 25 % around 1 is one a perfect model passes on 5 of 6 seeds 3 % of the time).

Frames are ``[T, 3, H, W]`` in [-1, 1]; PSNRs use data range 2.
"""

from __future__ import annotations

import math

import torch

from .steer_world import ACTIONS, MOVES, STEP, Track

DATA_RANGE = 2.0
BAR = {"action_following": 0.90, "carried_psnr_db": 28.0, "revisit_own_db": 28.0, "spread_tolerance": 0.25,
       "perfect_band": [5, 95]}
MIN_GAP = 22  # a returning view: its camera position was last seen more than the window's 21 frames before
RATIO_NAMES = ("all colour_spread", "all hf_energy", "last_quarter colour_spread", "last_quarter hf_energy")


def psnr(mse: float) -> float:
    return float("inf") if mse <= 0 else 10 * math.log10(DATA_RANGE**2 / mse)


def carried_pair(prev: torch.Tensor, cur: torch.Tensor, action: str):
    """(part of ``cur`` that was in view in ``prev``, the same map pixels in ``prev``) for the camera move."""
    dx, dy = MOVES[action]
    sx, sy = dx * STEP, dy * STEP
    H, W = cur.shape[-2:]
    cur_rows = slice(max(0, -sy), H - max(0, sy))
    cur_cols = slice(max(0, -sx), W - max(0, sx))
    prev_rows = slice(max(0, sy), H - max(0, -sy))
    prev_cols = slice(max(0, sx), W - max(0, -sx))
    return cur[..., cur_rows, cur_cols], prev[..., prev_rows, prev_cols]


def followed_moves(frames: torch.Tensor) -> list:
    """Per consecutive pair, the move that best explains it (None on a tie)."""
    out = []
    for t in range(1, frames.shape[0]):
        errors = sorted((float((a - b).square().mean()), name)
                        for name in ACTIONS for a, b in [carried_pair(frames[t - 1], frames[t], name)])
        best, second = errors[0], errors[1]
        out.append(None if second[0] - best[0] <= 1e-6 * max(1e-12, second[0]) + 1e-9 else best[1])
    return out


def spread_and_energy(frames: torch.Tensor) -> tuple[float, float]:
    spread = frames.flatten(2).std(dim=2).mean()
    dx = (frames[..., :, 1:] - frames[..., :, :-1]).square().mean()
    dy = (frames[..., 1:, :] - frames[..., :-1, :]).square().mean()
    return float(spread), float((dx + dy) / 2)


def spread_ratios(gen: torch.Tensor, true: torch.Tensor) -> dict:
    """Colour spread and high-frequency energy of ``gen`` over ``true``'s, over all frames and the last quarter."""
    quarter = max(1, len(gen) // 4)
    ratios = {}
    for label, g, r in (("all", gen, true), ("last_quarter", gen[-quarter:], true[-quarter:])):
        gs, ge = spread_and_energy(g)
        ts, te = spread_and_energy(r)
        ratios[label] = {"colour_spread": round(gs / ts, 4), "hf_energy": round(ge / te, 4)}
    return ratios


def no_collapse(ratios: dict) -> bool:
    """The first bar's check on ``spread_ratios``: every ratio within the tolerance of 1 (what a perfect model
    passes on 5 of 6 seeds 3 % of the time: ``fastar bench world-ceiling``)."""
    return all(abs(v - 1) <= BAR["spread_tolerance"] for r in ratios.values() for v in r.values())


def within_band(ratios: dict, band: dict) -> bool:
    """The bar's no-collapse check: each of ``spread_ratios``' four figures inside ``band`` (name ->
    [low, high], ``RATIO_NAMES``), its seed's 5-95 % band of perfect world models (``perfect_band``)."""
    return all(band[f"{label} {m}"][0] <= v <= band[f"{label} {m}"][1] for label, r in ratios.items()
               for m, v in r.items())


def evaluate_world(frames: torch.Tensor, truth: torch.Tensor, track: Track, start_frames: int,
                   min_gap: int = MIN_GAP, band: dict | None = None, judge_revisit: bool = True) -> dict:
    """Figures of a rollout ``frames`` (start chunk included) along ``track`` against ``truth``; checked against
    the bar, no collapse by ``band`` (``perfect_band``; without it, the 25 % band around 1), returning views only
    when ``judge_revisit`` (a mode reported beside the bar, the window, is not held to them)."""
    if frames.shape != truth.shape or frames.shape[0] != len(track):
        raise ValueError(f"frames {list(frames.shape)}, truth {list(truth.shape)} and a track of {len(track)} "
                         "frames must match")
    names = track.names()
    generated = range(start_frames, frames.shape[0])
    moves = followed_moves(frames[start_frames - 1:])
    commanded = names[start_frames:]
    hits = [m == c for m, c in zip(moves, commanded)]
    sq, count = 0.0, 0
    for t in generated:
        a, b = carried_pair(frames[t - 1], frames[t], names[t])
        sq += float((a - b).square().sum())
        count += a.numel()
    gen, true = frames[start_frames:], truth[start_frames:]
    ratios = spread_ratios(gen, true)
    report = {
        "frames": len(gen),
        "action_following": round(sum(hits) / max(1, len(hits)), 4),
        "missed_by_command": _misses(hits, commanded),
        "carried_psnr_db": round(psnr(sq / max(1, count)), 3),
        "psnr_vs_truth_db": round(psnr(float((gen - true).square().mean())), 3),
        "spread_ratios": ratios,
        "revisit": revisit_scores(frames, truth, track, start_frames, min_gap),
    }
    revisit = report["revisit"]
    report["checks"] = {
        "action_following": report["action_following"] >= BAR["action_following"],
        "carried": report["carried_psnr_db"] >= BAR["carried_psnr_db"],
        "no_collapse": within_band(ratios, band) if band is not None else no_collapse(ratios),
    }
    if judge_revisit and revisit["views"]:
        report["checks"]["revisit"] = revisit["psnr_vs_own_earlier_db"] >= BAR["revisit_own_db"]
    report["passed"] = all(report["checks"].values())
    return report


def _misses(hits, commanded) -> dict:
    out: dict = {}
    for hit, c in zip(hits, commanded):
        if not hit:
            out[c] = out.get(c, 0) + 1
    return out


def revisit_scores(frames, truth, track: Track, start_frames: int, min_gap: int) -> dict:
    """Generated frames at a camera position last seen (at exactly that position) ``min_gap`` or more frames
    earlier: pooled PSNR against the truth and against the model's own view from that earlier visit."""
    last_seen: dict = {}
    pairs = []
    for t in range(frames.shape[0]):
        pos = tuple(int(v) for v in track.positions[t])
        if t >= start_frames and pos in last_seen and t - last_seen[pos] >= min_gap:
            pairs.append((t, last_seen[pos]))
        last_seen[pos] = t
    if not pairs:
        return {"views": 0, "min_gap": min_gap}
    now = torch.stack([frames[t] for t, _ in pairs])
    true_now = torch.stack([truth[t] for t, _ in pairs])
    earlier = torch.stack([frames[e] for _, e in pairs])
    return {"views": len(pairs), "min_gap": min_gap,
            "psnr_vs_truth_db": round(psnr(float((now - true_now).square().mean())), 3),
            "psnr_vs_own_earlier_db": round(psnr(float((now - earlier).square().mean())), 3)}


def world_rollout(demo, world_map, track: Track, cache=None, fastar=None, seed: int = 0, callback=None):
    """Continue the true first chunk of ``track``'s views with ``demo`` (a steered-world model) to the track's
    end; dense attention unless ``fastar`` (a ``FastARConfig``) is given. Returns (frames ``[T, 3, H, W]``,
    the true views, the sampler's result)."""
    from ...fastar_core.caches import CacheSpec
    from ...fastar_core.rollout.engine import build_sampler
    from ...fastar_core.rollout.sampler import ARSampler
    from .steer_world import render_track

    truth = render_track(world_map, track)
    start = demo.frames_per_block
    runner = demo.world_runner([track])
    if fastar is not None:
        sampler = build_sampler(runner, fastar, rope_max_distance=demo.rope_max_distance)
    else:
        sampler = ARSampler(runner)
    cfg = demo.rollout_config(len(track) - start, cache or CacheSpec("global"), seed)
    initial = truth[:start].permute(1, 0, 2, 3)[None].to(demo.device)
    result = sampler.generate(demo.world_prompt(), cfg, initial_latents=initial, callback=callback)
    return result.latent[0].permute(1, 0, 2, 3).float().cpu(), truth, result
