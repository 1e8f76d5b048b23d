"""``fastar bench matcher``: TempCache's quantized top-1 search against the exact one, on one model.

Two measurements in one run:
- **Agreement**: one rollout with the exact matcher in which every match is also made by the quantized search on
  the same keys (the rollout follows the exact decisions): the share of new keys on which both decide alike
  (merge or not), and of keys both merge, the share merged into the same group; for each candidate count.
- **End to end**: dense-global, TempCache with the exact matcher and with the quantized one at each candidate
  count, chunk by chunk in turn (``interleave.py``): seconds per chunk, and pooled PSNR against dense-global and
  against the exact matcher's video (demo model only).
``matcher.json`` holds the figures, ``matcher.png`` the per-frame PSNR and the seconds per chunk.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from pathlib import Path

import torch

from ...fastar_core.caches.matching import quantized_top1, search_form
from ...fastar_core.caches.tempcache import COSINE_SLACK, TempCache
from ...fastar_core.fastar.metrics import video_quality
from ...fastar_core.rollout.engine import resolve_settings
from .report import line_plots, machine, write_json
from .rollout import run_mode, timed_rollouts
from .scenarios import CAPACITY_FRAMES, SINK_FRAMES, demo_scenario, wan_shapes_scenario

CANDIDATES = (4, 8, 16)
NEAR_BEST = 1e-3  # a group whose exact cosine is this close to the best one's is as good a match


def _mode(matcher: str, candidates: int = 4):
    s = resolve_settings(preset="balanced", sink_frames=SINK_FRAMES, attention_overrides={"annca": False,
                                                                                          "annsa": False},
                         tempcache_overrides={"capacity_frames": CAPACITY_FRAMES, "matcher": matcher,
                                              "matcher_candidates": candidates})
    return s.cache, s.fastar


@contextmanager
def _shadowed_matches(candidates, tally: dict):
    """While open, every exact TempCache match is also made by the quantized search (search form built from the
    same representatives and candidate mask) and the agreement tallied per candidate count."""
    exact = TempCache._top1

    def both(self, layer, new_k, reps, valid, lo, *rest):  # rest: RoPE tables, places (None: the bench's caches)
        idx, sim = exact(self, layer, new_k, reps, valid, lo, *rest)
        bar = self.settings.threshold - COSINE_SLACK
        merged = sim >= bar
        search = search_form(reps) * valid[..., None]
        for k in candidates:
            q_idx, q_sim = quantized_top1(new_k, search.to(torch.bfloat16), reps, bar, candidates=k, b_valid=valid)
            q_merged = q_sim >= bar
            t = tally.setdefault(k, {"keys": 0, "decisions_agree": 0, "both_merge": 0, "same_group": 0,
                                     "near_best": 0, "exact_merges": 0, "quantized_merges": 0})
            t["keys"] += merged.numel()
            t["decisions_agree"] += int((merged == q_merged).sum())
            both_merge = merged & q_merged
            t["both_merge"] += int(both_merge.sum())
            t["same_group"] += int((both_merge & (idx == q_idx)).sum())
            t["near_best"] += int((both_merge & (q_sim >= sim - NEAR_BEST)).sum())
            t["exact_merges"] += int(merged.sum())
            t["quantized_merges"] += int(q_merged.sum())
        return idx, sim

    TempCache._top1 = both
    try:
        yield
    finally:
        TempCache._top1 = exact


def run_matcher_bench(out_dir, frames: int = 240, model: str = "demo", seed: int = 0, repeats: int = 1,
                      candidates=CANDIDATES, device=None, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    scenario = demo_scenario(seed, device) if model == "demo" else wan_shapes_scenario(seed, device)

    tally: dict = {}
    with _shadowed_matches(candidates, tally):
        run_mode(scenario, *_mode("exact"), frames=frames, seed=seed)
    agreement = {}
    for k, t in tally.items():
        agreement[f"top{k}"] = {
            **t, "decision_agreement": round(t["decisions_agree"] / max(1, t["keys"]), 6),
            "same_group_share": round(t["same_group"] / max(1, t["both_merge"]), 6),
            "near_best_share": round(t["near_best"] / max(1, t["both_merge"]), 6),
        }

    dense = resolve_settings(cache_policy="global")
    modes = {"dense-global": (dense.cache, dense.fastar), "tempcache-exact": _mode("exact"),
             **{f"tempcache-quantized-top{k}": _mode("quantized", k) for k in candidates}}
    results, per_mode = timed_rollouts(scenario, modes, frames, seed, repeats, progress=progress)
    start = scenario.initial_latents.shape[2] if scenario.initial_latents is not None else 0
    fpb = scenario.frames_per_block
    rows = {}
    for name in modes:
        chunks = per_mode[name]["chunks"]
        full = [r["seconds"] for r in chunks if r["frame_start"] - fpb >= CAPACITY_FRAMES]
        row = {"seconds_per_chunk": round(sum(r["seconds"] for r in chunks) / len(chunks), 5),
               "seconds_per_chunk_full": round(statistics.median(full), 5) if full else None,
               "seconds_each_chunk": [round(r["seconds"], 5) for r in chunks]}
        if scenario.quality:
            vs_dense = video_quality(results[name].latent, results["dense-global"].latent, start, data_range=2.0)
            vs_exact = video_quality(results[name].latent, results["tempcache-exact"].latent, start, data_range=2.0)
            row["psnr_db_vs_dense"] = vs_dense.to_dict()["psnr_db"]
            row["psnr_db_vs_exact"] = vs_exact.to_dict()["psnr_db"]
            row["per_frame_psnr_db_vs_dense"] = vs_dense.to_dict()["per_frame_psnr_db"]
        rows[name] = row
    exact_full = rows["tempcache-exact"]["seconds_per_chunk_full"]
    for row in rows.values():
        if exact_full and row["seconds_per_chunk_full"]:
            row["full_seconds_vs_exact"] = round(row["seconds_per_chunk_full"] / exact_full, 4)
    report = {
        "benchmark": "matcher", "model": scenario.name, "frames": frames, "seed": seed, "device": str(device),
        "repeats": repeats, "capacity_frames": CAPACITY_FRAMES, "sink_frames": SINK_FRAMES,
        "agreement": agreement, "modes": rows, "scenario": scenario.notes, "machine": machine(),
        "definitions": {
            "decision_agreement": "share of new keys on which the quantized search decides as the exact one (merge "
                                  "or not), on the exact matcher's rollout",
            "same_group_share": "of the keys both merge, the share merged into the same group",
            "near_best_share": f"of the keys both merge, the share merged into a group whose exact cosine is within "
                               f"{NEAR_BEST} of the best one's",
            "seconds_per_chunk_full": "median seconds of the chunks after the cache is full",
            "psnr_db_vs_dense": "pooled PSNR against dense-global (data range 2)",
            "psnr_db_vs_exact": "pooled PSNR against TempCache with the exact matcher",
        },
    }
    write_json(out_dir / "matcher.json", report)
    panels = [{"title": "seconds per chunk", "xlabel": "chunk", "ylabel": "s",
               "series": {n: (list(range(len(r["seconds_each_chunk"]))), r["seconds_each_chunk"])
                          for n, r in rows.items()}}]
    if scenario.quality:
        panels.append({"title": "per-frame PSNR vs dense-global", "xlabel": "generated frame", "ylabel": "dB",
                       "series": {n: (list(range(len(r["per_frame_psnr_db_vs_dense"]))),
                                      [p if p is not None else float("nan") for p in r["per_frame_psnr_db_vs_dense"]])
                                  for n, r in rows.items() if n != "dense-global"}})
    line_plots(out_dir / "matcher.png", panels, title=f"TempCache matchers: {scenario.name}, {frames} latent frames")
    print_matcher_table(report)
    return report


def print_matcher_table(report: dict) -> None:
    for name, a in report["agreement"].items():
        print(f"{name}: decisions agree {a['decision_agreement']:.4%}, same group {a['same_group_share']:.4%}, "
              f"within {NEAR_BEST} of the best {a['near_best_share']:.4%} "
              f"({a['exact_merges']} exact merges, {a['quantized_merges']} quantized, {a['keys']} keys)")
    print(f"\n{'mode':28s} {'s/chunk':>8s} {'full s/ch':>9s} {'vs exact':>8s} {'PSNR dense':>10s} {'PSNR exact':>10s}")
    for name, r in report["modes"].items():
        def fmt(x, spec):
            return format(x, spec) if isinstance(x, (int, float)) else "-"

        print(f"{name:28s} {r['seconds_per_chunk']:8.4f} {fmt(r['seconds_per_chunk_full'], '9.4f')} "
              f"{fmt(r.get('full_seconds_vs_exact'), '8.3f')} {fmt(r.get('psnr_db_vs_dense'), '10.3f')} "
              f"{fmt(r.get('psnr_db_vs_exact'), '10.3f')}")
