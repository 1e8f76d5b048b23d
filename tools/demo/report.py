"""After training: evaluate the weights on the bar and write MODEL_CARD.md with its figures.

Files written next to the weights: ``loss.png`` (training loss), ``samples.png`` (rendered vs rolled-out frames),
``eval_curves.png`` (per-frame background PSNR, sprite areas and motion), ``eval.json`` (the numbers).
"""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

import torch

from ..outputs import strict_json
from .evaluate import Thresholds
from .quality_bar import BAR_CACHES, BAR_FRAMES, BAR_SEEDS, run_bar
from .settings import WEIGHTS_FILE

SAMPLE_STRIDE = 20  # frames between the columns of samples.png


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(losses: list, path: Path, phase_starts=()) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for start in phase_starts:
        if start > 0:
            ax.axvline(start, color="k", linestyle=":", linewidth=0.8)
    steps = torch.arange(1, len(losses) + 1)
    ax.plot(steps, losses, color="0.75", linewidth=0.6, label="per step")
    window = 50
    if len(losses) >= window:
        smooth = torch.tensor(losses).unfold(0, window, 1).mean(dim=1)
        ax.plot(steps[window - 1:], smooth, color="C0", label=f"mean of {window}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching MSE")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _strip(frames: torch.Tensor, stride: int) -> torch.Tensor:
    """Every ``stride``-th frame of ``[T, 3, H, W]`` side by side, 1-pixel white gaps: ``[3, H, W']``."""
    picked = list(frames[::stride])
    gap = torch.ones(3, frames.shape[2], 1)
    return torch.cat([t for f in picked for t in (f, gap)][:-1], dim=2)


def plot_samples(cases, path: Path) -> None:
    """Per seed: the world's true continuation, then each cache's rollout, every SAMPLE_STRIDE frames."""
    from .world import make_scene

    plt = _plt()
    seeds = sorted({c.seed for c in cases})
    rows, labels = [], []
    for seed in seeds:
        mine = [c for c in cases if c.seed == seed]
        n = mine[0].frames.shape[0]
        truth = make_scene(seed, mine[0].frames.shape[-1]).render(n)
        rows.append(_strip(truth, SAMPLE_STRIDE))
        labels.append(f"seed {seed}: rendered")
        for c in mine:
            rows.append(_strip(c.frames, SAMPLE_STRIDE))
            labels.append(f"seed {seed}: {c.cache} ({'pass' if c.report['passed'] else 'FAIL'})")
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 0.75 * len(rows) + 0.4))
    for ax, row, label in zip(axes, rows, labels):
        ax.imshow(((row.permute(1, 2, 0) + 1) / 2).clamp(0, 1).numpy(), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=7)
    axes[0].set_title(f"frames 0, {SAMPLE_STRIDE}, {2 * SAMPLE_STRIDE}, ... (first 3 rendered, the rest rolled out)",
                      fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_curves(cases, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for i, c in enumerate(cases):
        style = {"color": f"C{i % 10}", "linewidth": 0.8, "linestyle": "-" if c.cache == "global" else "--"}
        curves = c.report["curves"]
        axes[0].plot(curves["background_psnr_db"], label=f"seed {c.seed} {c.cache}", **style)
        for colour, area in curves["area_px"].items():
            ref = c.report["start_area_px"][colour]
            axes[1].plot([a / ref for a in area], **style)
        for xy in curves["centroid_xy"].values():
            xy = torch.tensor(xy)
            speed = (xy[1:] - xy[:-1]).norm(dim=1)
            speed = torch.nan_to_num(speed, nan=0.0).unfold(0, 9, 1).mean(dim=1) if len(speed) >= 9 else speed
            axes[2].plot(speed, **style)
    th = Thresholds()
    axes[0].axhline(th.background_psnr_db, color="k", linewidth=0.6)
    axes[0].set_title("background PSNR over non-sprite pixels (dB)")
    axes[1].axhspan(1 / th.area_factor, th.area_factor, color="0.9")
    axes[1].set_yscale("log")
    axes[1].set_title("sprite colour area / true sprite area")
    axes[2].set_title("centroid speed (px/frame, 9-frame mean)")
    for ax in axes:
        ax.set_xlabel("latent frame")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(cases) -> str:
    lines = ["| cache | seed | verdict | bg PSNR 5% / mean (dB) | bar (dB) | area in range | moving windows | "
             "new-colour px (p95) | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        s = c.report["summary"]
        areas = ", ".join(f"{k} {v:.2f}" for k, v in s["area_in_range_fraction"].items())
        moving = ", ".join(f"{k} {v:.2f}" for k, v in s["moving_window_fraction"].items())
        lines.append(f"| {c.cache} | {c.seed} | {'pass' if c.report['passed'] else 'FAIL'} | "
                     f"{s['background_psnr_low_quantile_db']:.1f} / {s['background_psnr_mean_db']:.1f} | "
                     f"{s['background_psnr_bar_db']:.1f} | {areas} | {moving} | {s['spurious_area_p95_px']:.0f} | "
                     f"{c.seconds:.0f} |")
    return "\n".join(lines)


def _failure_summary(cases) -> str:
    """Which checks failed in how many rollouts, e.g. 'areas failed in 5 of 6 rollouts'."""
    names = list(cases[0].report["checks"]) if cases else []
    failed = {n: sum(not c.report["checks"][n] for c in cases) for n in names}
    parts = [f"`{n}` failed in {k} of {len(cases)}" for n, k in failed.items() if k]
    return ("Failed checks: " + "; ".join(parts) + ".") if parts else "Every check passed in every rollout."


def write_model_card(out_dir: Path, meta: dict, cases, losses: list, notes: str = "") -> None:
    from .settings import MODEL_CONFIG

    training = meta["training"]
    recipe = training["recipe"]
    params = _parameter_count(out_dir / WEIGHTS_FILE)
    passed = sum(c.report["passed"] for c in cases)
    th = Thresholds()
    card = f"""# FAST-AR demo model

A small Wan2.1-architecture autoregressive video model trained from scratch by `fastar train-demo`
(`tools/demo/train.py`) on the pack's procedural sprite world. It exists so that the engine, the dense
caches and FAST-AR can be exercised and compared on a model with real temporal structure, on a CPU.

## Data
`tools/demo/world.py`: 1-3 flat sprites (circle, square, triangle, diamond; 7 saturated colours) moving at
constant speed and bouncing off the edges of a static, smooth, low-contrast textured background; 24x24 RGB
frames in [-1, 1]; a fresh random scene for every training clip. Prompts describe the sprites and their motion
("a small red circle slowly moves left , a big blue square quickly bounces"); half of them are padded with filler
words. The "latent" is the video itself: {meta['channels']} channels, one latent frame per video frame.

## Model
Wan2.1 T2V DiT layout ({MODEL_CONFIG.num_layers} layers, dim {MODEL_CONFIG.dim}, {MODEL_CONFIG.num_heads} heads of
{MODEL_CONFIG.head_dim}, FFN {MODEL_CONFIG.ffn_dim}, patch {list(MODEL_CONFIG.patch_size)} so 36 tokens per frame,
text dim {MODEL_CONFIG.text_dim}) plus a one-block text encoder over a {len(meta['vocabulary'])}-word vocabulary
whose output is zero-padded to {meta['text_len']} tokens like UMT5's. {params / 1e6:.2f} M parameters in all, stored
in fp16 ({(out_dir / WEIGHTS_FILE).stat().st_size / 1e6:.1f} MB, `model.diffusion_model.*` + `text_encoder.*`).

Recommended rollout (stored in the file's metadata, applied by `load_demo_model`): chunks of
{meta['frames_per_block']} frames, {len(meta['schedule'])} flow-matching steps at sigmas {meta['schedule']},
clean pass at context noise {meta['context_noise']}, image-to-video from a rendered start chunk
(`bundled.render_start`), temporal RoPE distances clamped to {meta['rope_max_distance']} frames
(`DenseAttention(rope_max_distance=...)`): the model was trained on {meta['trained_span_frames']}-frame clips.

## Recipe
- Teacher forcing: each {recipe['clip_frames']}-frame clip is one sequence of clean context chunks and noisy twins
  of the chunks after the first, with the sampler's block-causal visibility and RoPE positions; one SDPA per layer
  with a float block mask; the engine's own block code (the runner) computes everything else.
- Flow matching (x_t = (1-s) x0 + s n, target n - x0), one noise level per chunk: the sampler's step sigmas with
  probability {recipe['p_schedule_sigma']}, logit-normal otherwise.
- Context corruption against drift: with probability {recipe['p_context_corruption']} per chunk the clean context
  is blurred (mix up to 0.6) and noised (std up to 0.08) but still labelled clean (t = 0); with probability
  {recipe.get('p_own_context', 0.0)} per clip the context chunks after the first are replaced by the model's own
  one-step x0 predictions (from the sampler's step sigmas){_rollout_context_text(recipe)}.
- Loss weight {recipe.get('sprite_loss_weight', 1.0)}x on pixels where a sprite is or just was (its trail).
- AdamW (lr {recipe['lr']}, betas 0.9/0.99, weight decay {recipe['weight_decay']}), {recipe['warmup_steps']} warm-up
  steps then cosine decay over {recipe['steps']} steps or the wall-time budget, whichever runs out first,
  batch {recipe['batch']} clips, gradient clip
  {recipe['grad_clip']}, EMA {recipe['ema_decay']} (the saved weights), seed {training['seed']}.

## Training run
{_phases_text(training)}
On 2 CPU cores shared with other jobs ({platform.machine()}, torch {torch.__version__}). Final loss (mean of the last
50 steps, sprite-weighted) {training['final_loss']:.4f}.

![loss](loss.png)

## Evaluation: {BAR_FRAMES}-frame image-to-video rollouts
`tools/demo/quality_bar.py`: the engine's `ARSampler` continues a rendered 3-frame start for {BAR_FRAMES} latent frames
with the dense `global` cache (every frame) and the dense `window` cache (3 sink + 12 recent frames); each rollout
is judged by `evaluate_rollout` against the scene's clean background and true sprite areas. Pass means all of:
background PSNR over non-sprite pixels (the worst 1.5x sprite area + 16 pixels dropped per frame) at its 5% quantile
>= {th.background_psnr_db} dB and >= a flat frame of the background's mean colour + {th.background_margin_db} dB;
every sprite colour's pixel count within x{th.area_factor:g} of the true sprite area in >= {th.area_min_fraction:.0%}
of frames; no new colour blob (p95 <= {th.spurious_area_fraction} x the smallest sprite); every sprite's centroid
spans >= {th.motion_min_span_px} px in >= {th.motion_min_fraction:.0%} of {th.motion_window}-frame windows.
Reference videos (100 scenes): the true rendered video passes 100/100; noise, a frozen frame, a flat background,
the background alone: 0/100.

**{passed} of {len(cases)} rollouts pass.** {_failure_summary(cases)}

{notes}
{_table(cases)}

![samples](samples.png)

![curves](eval_curves.png)

Generated {time.strftime('%Y-%m-%d')} by `fastar train-demo`.
"""
    (out_dir / "MODEL_CARD.md").write_text(card)


def _rollout_context_text(recipe: dict) -> str:
    p = recipe.get("p_rollout_context", 0.0)
    if not p:
        return ""
    return (f"; with probability {p} per clip, by the EMA weights' own rollout from the clip's first chunk with "
            "the engine's sampler (every chunk conditioned on the ones it generated, detached; the targets stay the "
            "rendered clip)")


def _phases_text(training: dict) -> str:
    """One line per phase: steps, wall time and how its recipe differs from the final one."""
    final = training["recipe"]
    phases = [*training.get("earlier_phases", []), {"steps": training["steps"], "recipe": final,
                                                     "wall_seconds": training["wall_seconds"]}]
    # What a recipe without the field did.
    defaults_before = {"sprite_loss_weight": 1.0, "p_own_context": 0.0, "p_rollout_context": 0.0}
    lines = []
    for i, p in enumerate(phases, 1):
        recipe = {**defaults_before, **p["recipe"]}
        changed = {k: recipe[k] for k in final if recipe.get(k) != final[k]}
        note = f" (differs from the final recipe in: {changed})" if changed else ""
        start = "from scratch" if i == 1 else "continuing phase " + str(i - 1)
        if "weights_file" in p:  # started from a weights file, its own phases summed
            start = f"the weights file {p['weights_file']}"
        lines.append(f"- phase {i}, {start}: {p['steps']} steps, {p['wall_seconds'] / 60:.0f} min{note}")
    total = training.get("total_steps", training["steps"])
    wall = training.get("total_wall_seconds", training["wall_seconds"])
    lines.append(f"- in all: {total} steps, {wall / 60:.0f} min wall time")
    if len(phases) > 1:
        lines.append("\nThe recipe improved mid-run (see the commit history), so the bundled weights were trained in "
                     "phases with `fastar train-demo --init-from <earlier>/train_state.pt`; from scratch, "
                     "`fastar train-demo` runs the final recipe throughout.")
    return "\n".join(lines)


def _parameter_count(path: Path) -> int:
    from ...fastar_core.files.raw import check_regular_file
    from ...fastar_core.files.safetensors_reader import read_header

    path = Path(path)
    return sum(math.prod(info.shape) for info in read_header(path, check_regular_file(path)).tensors.values())


def write_report(out_dir, seeds=BAR_SEEDS, caches=tuple(BAR_CACHES), num_frames: int = BAR_FRAMES, notes: str = "",
                 log=print) -> dict:
    """``notes``: a Markdown paragraph placed under the verdict (observations on these particular weights)."""
    from .bundled import load_demo_model

    out_dir = Path(out_dir)
    demo = load_demo_model(out_dir / WEIGHTS_FILE)
    record = json.loads((out_dir / "loss.json").read_text()) if (out_dir / "loss.json").is_file() else {}
    losses = record.get("losses", [])
    plot_loss(losses, out_dir / "loss.png", record.get("phase_starts", ()))
    cases = run_bar(demo, seeds=seeds, caches=caches, num_frames=num_frames, log=log)
    plot_samples(cases, out_dir / "samples.png")
    plot_curves(cases, out_dir / "eval_curves.png")
    results = [{"seed": c.seed, "cache": c.cache, "passed": c.report["passed"], "checks": c.report["checks"],
                "summary": c.report["summary"], "seconds": round(c.seconds, 1),
                "background_psnr_db": [round(v, 2) for v in c.report["curves"]["background_psnr_db"]]}
               for c in cases]
    (out_dir / "eval.json").write_text(strict_json(results, indent=1))
    write_model_card(out_dir, demo.metadata, cases, losses, notes)
    return {"passed": sum(r["passed"] for r in results), "cases": len(results)}
