"""After a steered-world run: the bar over scripted paths and WORLD_MODEL_CARD.md with its figures.

The bar: on each of ``WORLD_SEEDS`` (a map and a start per seed) the true first frame is continued along the
scripted out-around-and-back path for ``WORLD_FRAMES`` frames with dense-global, the default FAST-AR preset and
TempCache alone (both at the window's memory, 21 frames), judged, and with the window of that memory, reported
beside them; the modes of a seed run chunk by chunk in turn (``demo_world_command.run_world_modes``). Each rollout
is judged by ``world_eval.evaluate_world`` against its seed's band of perfect world models (``perfect_band``). A
mode passes the bar when at least ``PASS_SEEDS`` of the seeds pass. Files next to the weights, named so that they
sit beside the sprite demo's in the bundled weights folder: ``world_eval.json``, ``world_frames.png`` (true
against generated views), ``world_loss.png`` and ``WORLD_MODEL_CARD.md``.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from ..outputs import strict_json
from .report import _parameter_count, _plt, plot_loss
from .settings import WEIGHTS_FILE
from .steer_world import make_map
from .world_bar import WORLD_FRAMES, WORLD_SEEDS, bar_track, perfect_band
from .world_eval import BAR, MIN_GAP, evaluate_world

PASS_SEEDS = 5  # of the 6
JUDGED = ("dense-global", "fastar", "tempcache")  # held to the bar; "dense-window" is reported beside them
SHEET_FRAMES = (3, 6, 12, 24, 48, 96, 160, 240)  # frames shown in world_frames.png
BAND_DRAWS = 100  # perfect world models per seed behind its no-collapse band


def run_world_bar(demo, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES, log=None, band_draws: int = BAND_DRAWS,
                  modes=None) -> tuple[list[dict], dict]:
    """Every mode on every seed; returns (cases, seed -> band)."""
    from ..demo_world_command import run_world_modes, world_modes

    modes = modes or world_modes(demo.places_on_map)
    cases, bands = [], {}
    for seed in seeds:
        track = bar_track(seed, frames)
        bands[seed] = perfect_band(seed, frames, band_draws)
        t0 = time.perf_counter()
        truth, runs = run_world_modes(demo, make_map(seed), track, modes)
        for name, run in runs.items():
            report = evaluate_world(run["video"], truth, track, demo.frames_per_block, band=bands[seed],
                                    judge_revisit=name in JUDGED)
            cases.append({"mode": name, "seed": seed, "report": report,
                          "cpu_seconds": round(sum(r["cpu_seconds"] for r in run["chunks"]), 1),
                          "live_mib_last": round(run["chunks"][-1]["cache_bytes"] / 2**20, 3),
                          "allocated_mib": round((run["allocated_bytes"] or 0) / 2**20, 3),
                          "frames": run["video"], "truth": truth})
            if log is not None:
                r = report["revisit"]
                log(f"world bar {name} seed {seed}: {'PASS' if report['passed'] else 'FAIL'} keys "
                    f"{report['action_following']:.2f}, carried {report['carried_psnr_db']:.1f} dB, returns vs own "
                    f"{r.get('psnr_vs_own_earlier_db', float('nan')):.1f} dB, checks {report['checks']}")
        if log is not None:
            log(f"seed {seed}: {time.perf_counter() - t0:.0f} s for {len(modes)} modes")
    return cases, bands


def passes(cases) -> dict:
    modes = dict.fromkeys(c["mode"] for c in cases)
    return {m: sum(c["report"]["passed"] for c in cases if c["mode"] == m) for m in modes if m in JUDGED}


def failed_checks(cases) -> dict:
    """mode -> check -> seeds failing it."""
    out: dict = {}
    for c in cases:
        if c["mode"] in JUDGED:
            for check, ok in c["report"]["checks"].items():
                if not ok:
                    out.setdefault(c["mode"], {}).setdefault(check, []).append(c["seed"])
    return out


def plot_frame_sheet(cases, path: Path, seeds=(1, 2)) -> None:
    plt = _plt()
    shown_seeds = [s for s in seeds if any(c["seed"] == s for c in cases)]
    modes = list(dict.fromkeys(c["mode"] for c in cases))
    rows = [r for s in shown_seeds for r in ([(s, "true", next(c for c in cases if c["seed"] == s)["truth"])]
                                             + [(s, m, c["frames"]) for m in modes for c in cases
                                                if c["seed"] == s and c["mode"] == m])]
    cols = [t for t in SHEET_FRAMES if t < rows[0][2].shape[0]]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(1.3 * len(cols), 1.45 * len(rows)), squeeze=False)
    for r, (seed, label, video) in enumerate(rows):
        for c, t in enumerate(cols):
            ax = axes[r][c]
            ax.imshow(((video[t].permute(1, 2, 0).clamp(-1, 1) + 1) / 2).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(f"{label}\nseed {seed}", fontsize=7)
            if r == 0:
                ax.set_title(f"frame {t}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(cases) -> str:
    rows = ["| mode | seed | verdict | keys followed | carried (dB) | vs truth (dB) | spread / HF (all) | spread / HF "
            "(last quarter) | in perfect band | returns vs own / truth (dB) | live / allocated MiB | CPU s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        r = c["report"]
        a, q, v = r["spread_ratios"]["all"], r["spread_ratios"]["last_quarter"], r["revisit"]
        rev = f"{v['psnr_vs_own_earlier_db']:.1f} / {v['psnr_vs_truth_db']:.1f}" if v["views"] else "none"
        verdict = ("PASS" if r["passed"] else "FAIL") if c["mode"] in JUDGED else "reported"
        rows.append(f"| {c['mode']} | {c['seed']} | {verdict} | {r['action_following']:.2f} | "
                    f"{r['carried_psnr_db']:.1f} | {r['psnr_vs_truth_db']:.1f} | {a['colour_spread']:.2f} / "
                    f"{a['hf_energy']:.2f} | {q['colour_spread']:.2f} / {q['hf_energy']:.2f} | "
                    f"{'yes' if r['checks']['no_collapse'] else 'no'} | {rev} | {c['live_mib_last']:.2f} / "
                    f"{c['allocated_mib']:.2f} | {c['cpu_seconds']:.0f} |")
    return "\n".join(rows)


def memory_summary(cases) -> str:
    """Returning views against the model's own earlier view, per mode: the range over seeds, and the cache."""
    lines = []
    for mode in dict.fromkeys(c["mode"] for c in cases):
        own = [c["report"]["revisit"]["psnr_vs_own_earlier_db"] for c in cases
               if c["mode"] == mode and c["report"]["revisit"]["views"]]
        truth = [c["report"]["revisit"]["psnr_vs_truth_db"] for c in cases
                 if c["mode"] == mode and c["report"]["revisit"]["views"]]
        live = [c["live_mib_last"] for c in cases if c["mode"] == mode]
        if own:
            lines.append(f"- {mode}: {min(own):.1f}-{max(own):.1f} dB against its own earlier view, "
                         f"{min(truth):.1f}-{max(truth):.1f} dB against the truth; live cache at the end "
                         f"{min(live):.2f}-{max(live):.2f} MiB")
    return "\n".join(lines)


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=113, break_on_hyphens=False)


def _design(meta: dict) -> str:
    from .map_rope import POSITIONS

    world = meta["world"]
    if world.get("positions") != POSITIONS:
        return _wrap("Rotary positions are the engine's (t, h, w) on the screen, temporal distances clamped to "
                     f"{meta['rope_max_distance']} frames; the map position reaches the model only through its "
                     "per-frame embedding.")
    kinds = ", ".join(f"{k} {v:.0%}" for k, v in world.get("path_kinds", {}).items())
    gap = world.get("long_return_gap", [30, 150])
    return "\n\n".join(_wrap(t) for t in (
        "**Positions on the map.** Each token's rotary position is its place on the map: the camera's map position "
        "plus its offset in the view, modulo the map's 24 patches (`tools/demo/map_rope.py`). The rotary "
        "frequencies are whole cycles per map (1, 3, 5, 7 and 9 per axis: of all sets of five whole frequencies "
        "below the map's limit, odd ones leave the largest gap between a place and its nearest other place), so "
        "the wrap is seamless. Time is dropped (the time pairs stay unrotated): the world is static, a place looks "
        "the same whenever it is seen, and every key of a place, from any frame, sits at relative position 0 from "
        "a query at that place. Carrying what stays in view and reading back a place seen long ago become one "
        "mechanism, attend to your own place and copy, and a place's keys from two visits are keys at identical "
        "positions, which TempCache merges exactly when they are equal. Why not Plucker rays in every block "
        "(LingBot-World) or a camera-relative encoding (PRoPE): on a flat map with whole-patch moves the camera is "
        "a 2-D translation, and RoPE at map positions is that relative encoding, with no new parameters.",
        "**What the cache keeps.** A clean frame is read as it is: the clean pass that writes the cache gets no key "
        "embedding and no moved reference, so the keys a place leaves depend on what is there, not on how the "
        "camera came. The engine keeps (t, h, w) per cache entry as for every model: t stays the frame (the caches "
        "evict, rewind and keep their sink by it), h and w are the map row and column (`ActionRunner."
        "token_positions`), and the attention rotates by the map's tables (`DenseAttention.own_rope`).",
        "**TempCache's groups are places.** With `same_place` a key may join only a group at its own (h, w), so a "
        "group is one place and a view that returns merges into the group of that place. At 21 frames' capacity "
        "(756 slots, 108 of them the 3-frame sink) TempCache can hold every one of the map's 576 places; a window "
        "of the same memory holds what its last 21 frames saw.",
        f"**Training paths that return**: {kinds}. Back-and-forth runs reach 2-9 patches out and come back; loops "
        "are rectangles of 2-5 patches a side, either way round; a long return shows 3-6 frames of a random run, "
        f"then the camera {gap[0]}-{gap[1]} frames later (the frames between not shown: with time dropped the "
        "model cannot tell) 4-9 patches away, heading back over the remembered place. The noisy twin of the first "
        "frame after that jump has no reference frame and is not taught."))


def write_world_report(out_dir, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES, notes: str = "", log=print,
                       band_draws: int = BAND_DRAWS) -> dict:
    from .model import load_demo_model

    out_dir = Path(out_dir)
    demo = load_demo_model(out_dir / WEIGHTS_FILE)
    cases, bands = run_world_bar(demo, seeds, frames, log=log, band_draws=band_draws)
    return write_world_evaluation(out_dir, cases, bands, seeds, frames, notes)


def write_world_evaluation(out_dir, cases, bands: dict, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES,
                           notes: str = "") -> dict:
    """``world_eval.json``, the frame sheet, the loss plot and the card from the world bar's ``cases`` and
    ``bands`` (``run_world_bar``'s, possibly gathered from runs over parts of the seeds)."""
    out_dir = Path(out_dir)
    evaluation = {"frames": frames, "seeds": list(seeds), "bar": BAR, "pass_seeds": PASS_SEEDS, "judged": JUDGED,
                  "min_gap": MIN_GAP, "bands": {str(s): b for s, b in bands.items()}, "passes": passes(cases),
                  "failed_checks": failed_checks(cases),
                  "cases": [{k: v for k, v in c.items() if k not in ("frames", "truth")} for c in cases]}
    (out_dir / "world_eval.json").write_text(strict_json(evaluation, indent=1))
    plot_frame_sheet(cases, out_dir / "world_frames.png")
    loss_file = out_dir / "loss.json"
    losses = json.loads(loss_file.read_text())["losses"] if loss_file.is_file() else []
    if losses:
        plot_loss(losses, out_dir / "world_loss.png")
    write_world_card(out_dir, out_dir / WEIGHTS_FILE, notes)
    return {"passes": evaluation["passes"], "seeds": len(seeds)}


def verdict_line(evaluation: dict) -> str:
    p, n = evaluation["passes"], len(evaluation["seeds"])
    need = evaluation.get("pass_seeds", PASS_SEEDS)
    return (f"**{p['dense-global']} of {n} seeds pass with dense-global, {p['fastar']} of {n} with FAST-AR, "
            f"{p['tempcache']} of {n} with TempCache alone** (the bar asks for {need} of {n} with each).")


def write_world_card(out_dir, weights, notes: str = "") -> None:
    """WORLD_MODEL_CARD.md in ``out_dir`` from its ``world_eval.json`` and the metadata of ``weights``."""
    from .model import load_demo_model

    out_dir = Path(out_dir)
    evaluation = json.loads((out_dir / "world_eval.json").read_text())
    cases, frames = evaluation["cases"], evaluation["frames"]
    meta = load_demo_model(weights).metadata
    training = meta["training"]
    recipe = training["recipe"]
    fails = "; ".join(f"{mode}: " + ", ".join(f"{check} on seeds {seeds}" for check, seeds in checks.items())
                      for mode, checks in evaluation["failed_checks"].items()) or "none"
    card = f"""# FAST-AR steered-world demo model

A keyboard-steered world model in the demo family: the Wan2.1 demo architecture ({_parameter_count(weights):,}
parameters with its text and action encoders, fp16), whose rotary positions are places on its map, conditioned per
frame on the key pressed and the shift since the frame before (`tools/demo/actions.py`, `tools/demo/map_rope.py`),
trained by `fastar train-demo --world steer` (`tools/demo/world_train.py`) on the steered world
(`tools/demo/steer_world.py`).

## Verdict
{verdict_line(evaluation)} Failed checks: {fails}.

{notes}

### Returning views, per mode (the window reported beside the bar)
{memory_summary(cases)}

## World
{_wrap("A camera over a 96 x 96 map that wraps at its edges (any path can come back), seen through 24 x 24 views; "
       "keys up, down, left, right or none move it by one 4-pixel patch per frame, so the part of a view carried "
       "over is an exact copy of the previous frame's tokens, moved by one token. The ground is smooth, "
       "low-contrast and periodic; 16-24 landmarks (six shapes, eight saturated colours, each pair at most once per "
       "map, at least 9 pixels apart) make a wrong shift visible.")}

## Design
{_design(meta)}

## Conditioning
{_wrap("Per noisy frame, one embedding of (the key, the shift in patches since the frame before, the map position as "
       "sines and cosines) is added to the frame's timestep embedding: it steers every block through the per-frame "
       "adaLN modulation and the head. The patch embedding reads, beside the noisy frame, the frame before moved by "
       "the key, zero where the move leaves it, and one channel saying where it is defined (7 input channels): what "
       "stays in view is in the input, and what the model has to make is the strip the move brings in. Chunks of "
       f"{meta['frames_per_block']} frame. The Wan blocks are unchanged; the engine's sampler, caches and FAST-AR run "
       "the model as any other.")}

## Sampler
{_wrap(f"{meta['sampler']['solver'].upper()} with {meta['sampler']['steps']} steps, shift {meta['sampler']['shift']} "
       "(the engine's ODE solver: no fresh noise between steps), from the file's `sampler` entry; trained with noise "
       f"levels weighted towards the sigmas {meta['schedule']}.") if meta.get("sampler") else ""}

## Recipe
{_wrap(f"The sprite demo's recipe with the world's clips: {recipe['clip_frames']}-frame clips (a random map, start "
       f"and path each), batch {recipe['batch']}, AdamW lr {recipe['lr']}, {recipe['warmup_steps']} warm-up steps then "
       f"cosine decay over {recipe['steps']} steps, context corruption p {recipe['p_context_corruption']}, one-step "
       f"own-prediction context p {recipe['p_own_context']}, EMA {recipe['ema_decay']}, seed {training['seed']}.")}

## Training run
{training['steps']} steps in {training['wall_seconds'] / 60:.1f} min on a shared 2-core CPU at one thread; final loss
(mean of the last 50 steps) {training['final_loss']}.

![loss](world_loss.png)

## Evaluation: {frames}-frame rollouts along the scripted path
{_wrap("Out, around and back: a square loop of 8 patches a side with 2-frame pauses at the corners (40 frames), "
       "repeated; each seed its own map and start; the modes of a seed chunk by chunk in turn. Pass means all of: "
       f"the move that best explains each consecutive pair is the commanded one in >= {BAR['action_following']:.0%} "
       f"of frames; the region carried over from the previous frame matches it shifted at >= "
       f"{BAR['carried_psnr_db']} dB pooled; the returning views (camera position last seen more than "
       f"{evaluation['min_gap'] - 1} frames before) match the model's own earlier view at >= {BAR['revisit_own_db']} "
       "dB pooled; and no collapse: each of the four colour-spread and high-frequency-energy ratios (over all frames "
       "and the last quarter) inside its seed's 5-95 % band of perfect world models (`fastar bench world-ceiling`, "
       "100 draws). Held to the bar: dense-global, FAST-AR (the default preset) and TempCache alone, both at 21 "
       "frames; the window of 21 frames is reported beside them.")}

{_table(cases)}

![frames](world_frames.png)
"""
    (out_dir / "WORLD_MODEL_CARD.md").write_text(card)
