"""After a steered-world run: the bar over scripted paths and WORLD_MODEL_CARD.md with its figures.

The bar: on each of ``WORLD_SEEDS`` (a map and a start per seed) the true first chunk is continued along the
scripted out-around-and-back path for ``WORLD_FRAMES`` frames, with the dense global cache and with the default
FAST-AR mode of the demo (``bench_modes()["all"]``), each judged by ``world_eval.evaluate_world``. Files next to
the weights, named so that they sit beside the sprite demo's in the bundled weights folder:
``world_eval.json``, ``world_frames.png`` (true against generated views), ``world_loss.png`` and
``WORLD_MODEL_CARD.md``.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from ...fastar_core.families.demo.steer_world import MAP_SIZE, STEP, make_map, scripted_path, track_from_actions
from ..outputs import strict_json
from .report import _parameter_count, _plt, plot_loss
from .settings import WEIGHTS_FILE
from .world_eval import BAR, evaluate_world, world_rollout

WORLD_SEEDS = (1, 2, 3, 4, 5, 6)
WORLD_FRAMES = 240
SHEET_FRAMES = (3, 6, 12, 24, 48, 96, 160, 240)  # frames shown in world_frames.png


def bar_modes() -> dict:
    from ...fastar_core.caches import CacheSpec
    from ..bench.scenarios import bench_modes

    cache, fastar = bench_modes()["all"]
    return {"dense-global": (CacheSpec("global"), None), "fastar": (cache, fastar)}


def bar_track(seed: int, frames: int = WORLD_FRAMES):
    patches = MAP_SIZE // STEP
    return track_from_actions(scripted_path(frames), start=((7 * seed) % patches, (11 * seed) % patches))


def run_world_bar(demo, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES, modes=None, log=None) -> list[dict]:
    cases = []
    for name, (cache, fastar) in (modes or bar_modes()).items():
        for seed in seeds:
            track = bar_track(seed, frames)
            t0 = time.perf_counter()
            generated, truth, _ = world_rollout(demo, make_map(seed), track, cache=cache, fastar=fastar)
            report = evaluate_world(generated, truth, track, demo.frames_per_block)
            cases.append({"mode": name, "seed": seed, "report": report, "seconds": round(time.perf_counter() - t0, 1),
                          "frames": generated, "truth": truth})
            if log is not None:
                log(f"world bar {name} seed {seed}: {'PASS' if report['passed'] else 'FAIL'} following "
                    f"{report['action_following']:.2f}, carried {report['carried_psnr_db']:.1f} dB, spread "
                    f"{report['spread_ratios']['all']}")
    return cases


def plot_frame_sheet(cases, path: Path, per_mode: int = 2) -> None:
    plt = _plt()
    modes = dict.fromkeys(c["mode"] for c in cases)
    shown = [c for m in modes for c in [x for x in cases if x["mode"] == m][:per_mode]]
    cols = [t for t in SHEET_FRAMES if t < shown[0]["frames"].shape[0]]
    fig, axes = plt.subplots(2 * len(shown), len(cols), figsize=(1.3 * len(cols), 1.45 * 2 * len(shown)),
                             squeeze=False)
    for r, case in enumerate(shown):
        for row, (label, video) in enumerate((("true", case["truth"]), (case["mode"], case["frames"]))):
            for c, t in enumerate(cols):
                ax = axes[2 * r + row][c]
                ax.imshow(((video[t].permute(1, 2, 0).clamp(-1, 1) + 1) / 2).numpy(), interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                if c == 0:
                    ax.set_ylabel(f"{label}\nseed {case['seed']}", fontsize=7)
                if r == 0 and row == 0:
                    ax.set_title(f"frame {t}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(cases) -> str:
    rows = ["| mode | seed | verdict | action following | carried PSNR (dB) | PSNR vs truth (dB) | spread / HF ratio "
            "(all) | spread / HF ratio (last quarter) | revisit vs truth / own earlier (dB) | s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        r = c["report"]
        a, q, v = r["spread_ratios"]["all"], r["spread_ratios"]["last_quarter"], r["revisit"]
        rev = f"{v['psnr_vs_truth_db']:.1f} / {v['psnr_vs_own_earlier_db']:.1f}" if v["views"] else "none"
        rows.append(f"| {c['mode']} | {c['seed']} | {'PASS' if r['passed'] else 'FAIL'} | "
                    f"{r['action_following']:.2f} | {r['carried_psnr_db']:.1f} | {r['psnr_vs_truth_db']:.1f} | "
                    f"{a['colour_spread']:.2f} / {a['hf_energy']:.2f} | {q['colour_spread']:.2f} / {q['hf_energy']:.2f}"
                    f" | {rev} | {c['seconds']:.0f} |")
    return "\n".join(rows)


def _conditioning(meta: dict) -> str:
    return textwrap.fill(_conditioning_text(meta), width=113, break_on_hyphens=False)


def _sampler(meta: dict) -> str:
    sampler = meta.get("sampler")
    if sampler is None:
        text = (f"The re-noising steps of its schedule, sigmas {meta['schedule']} (each step asks for x0, then adds "
                "fresh noise to the next sigma).")
    else:
        text = (f"{sampler['solver'].upper()} with {sampler['steps']} steps, shift {sampler['shift']} (the engine's "
                "ODE solver, `fastar_core/rollout/unipc.py`: no fresh noise between steps), from the file's `sampler` "
                "entry; "
                f"it was trained with noise levels weighted towards the sigmas {meta['schedule']}. Each re-noised "
                "step of those sigmas asks this undistilled model for the mean of what a new strip could hold, and "
                "four such means average the landmarks away; the solver follows its flow to a sample instead.")
    return textwrap.fill(text, width=113, break_on_hyphens=False)


def _conditioning_text(meta: dict) -> str:
    from ...fastar_core.families.demo.actions import REFERENCE_INPUT

    keys = ("Per frame, one embedding of (the key, the shift in patches since the chunk's reference frame, the map "
            "position as sines and cosines of the wrapping coordinates) is added to the frame's timestep embedding: "
            "it steers every block through the per-frame adaLN modulation and the head (`ActionRunner`, "
            "`tools/demo/actions.py`).")
    if meta["world"].get("inputs") != REFERENCE_INPUT:
        return keys + (" A whole-frame shift has to be found through RoPE from that embedding alone; this file "
                       f"runs {meta['frames_per_block']}-frame chunks.")
    return keys + (
        " Besides, the key's shift is fed directly: the patch embedding reads, beside the noisy frame, the frame's "
        "reference frame (the last clean frame before its chunk) moved by the frame's offset, zero where the move "
        "leaves the reference, and one channel saying where it is defined (7 input channels). The part of the view "
        "that stays in sight is therefore in the model's input, and what it has to make is the strip the move brings "
        f"in, and keep the rest from drifting. Chunks of {meta['frames_per_block']} frame, so every frame is one key "
        "away from a clean frame. The Wan blocks are unchanged, and the engine's sampler, caches and FAST-AR run the "
        "model as any other: the runner keeps the last committed frame for the next chunk.")


def write_world_report(out_dir, seeds=WORLD_SEEDS, frames: int = WORLD_FRAMES, notes: str = "", log=print) -> dict:
    from .bundled import load_demo_model

    out_dir = Path(out_dir)
    demo = load_demo_model(out_dir / WEIGHTS_FILE)
    cases = run_world_bar(demo, seeds, frames, log=log)
    passes = {m: sum(c["report"]["passed"] for c in cases if c["mode"] == m) for m in bar_modes()}
    evaluation = {"frames": frames, "seeds": list(seeds), "bar": BAR, "passes": passes,
                  "cases": [{k: v for k, v in c.items() if k not in ("frames", "truth")} for c in cases]}
    (out_dir / "world_eval.json").write_text(strict_json(evaluation, indent=1))
    plot_frame_sheet(cases, out_dir / "world_frames.png")
    loss_file = out_dir / "loss.json"
    losses = json.loads(loss_file.read_text())["losses"] if loss_file.is_file() else []
    if losses:
        plot_loss(losses, out_dir / "world_loss.png")
    write_world_card(out_dir, out_dir / WEIGHTS_FILE, notes)
    return {"passes": passes, "seeds": len(seeds)}


def write_world_card(out_dir, weights, notes: str = "") -> None:
    """WORLD_MODEL_CARD.md in ``out_dir`` from its ``world_eval.json`` and the metadata of ``weights``."""
    from .bundled import load_demo_model

    out_dir = Path(out_dir)
    evaluation = json.loads((out_dir / "world_eval.json").read_text())
    cases, passes, seeds, frames = (evaluation[k] for k in ("cases", "passes", "seeds", "frames"))
    meta = load_demo_model(weights).metadata
    training = meta["training"]
    recipe = training["recipe"]
    verdict = (f"**{passes['dense-global']} of {len(seeds)} seeds pass with dense-global, {passes['fastar']} of "
               f"{len(seeds)} with FAST-AR** (the bar asks for 5 of 6 with both).")
    card = f"""# FAST-AR steered-world demo model

A keyboard-steered world model in the demo family: the Wan2.1 demo architecture ({_parameter_count(weights):,}
parameters with its text and action encoders, fp16) conditioned per frame on the key pressed, the shift since the
chunk's reference frame and the camera's map position (and, in files that say so, that reference frame moved by
the key: `tools/demo/actions.py`), trained by
`fastar train-demo --world steer` (`tools/demo/world_train.py`) on the steered world (`tools/demo/steer_world.py`).

## Verdict
{verdict}

{notes}

## World (what the model must learn, and why it was made so)
A camera over a 96 x 96 map that wraps at its edges (any path can come back), seen through 24 x 24 views; keys
up, down, left, right or none move it by one 4-pixel patch per frame, so the part of a view carried over is an
exact copy of the previous frame's tokens, moved by one token. The ground is smooth, low-contrast and periodic;
16-24 landmarks (six shapes, eight saturated colours, each pair at most once per map, at least 9 pixels apart)
make a wrong shift visible. Each frame's camera position is given with its key, so a place seen before could be
recalled from memory instead of re-invented.

## Conditioning
{_conditioning(meta)}

## Sampler
{_sampler(meta)}

## Recipe
The sprite demo's recipe with the world's clips: {recipe['clip_frames']}-frame clips (a random map, start and key
sequence each), batch {recipe['batch']}, AdamW lr {recipe['lr']}, {recipe['warmup_steps']} warm-up steps then
cosine decay over {recipe['steps']} steps or the wall-time budget, context corruption p
{recipe['p_context_corruption']}, one-step own-prediction context p {recipe['p_own_context']}, EMA
{recipe['ema_decay']}, seed {training['seed']}.

## Training run
{training['steps']} steps in {training['wall_seconds'] / 60:.1f} min on a shared 2-core CPU; final loss (mean of
the last 50 steps) {training['final_loss']}.

![loss](world_loss.png)

## Evaluation: {frames}-frame rollouts along the scripted path
Out, around and back: a square loop of 8 patches a side with 2-frame pauses at the corners, repeated; each seed
its own map and start. Pass means all of: the move that best explains each consecutive pair is the commanded one
in >= {BAR['action_following']:.0%} of frames; the region carried over from the previous frame matches it shifted
at >= {BAR['carried_psnr_db']} dB pooled; colour spread and high-frequency energy within
{BAR['spread_tolerance']:.0%} of the true views' (over all frames and over the last quarter).

{_table(cases)}

![frames](world_frames.png)
"""
    (out_dir / "WORLD_MODEL_CARD.md").write_text(card)
