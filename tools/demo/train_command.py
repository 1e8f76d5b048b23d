"""``fastar train-demo``: train (or resume) a demo model into a folder: ``train_demo(out_dir, steps=..., minutes=...)``.

``world`` picks the trainer: ``sprites`` (the bundled text-to-video demo, ``train.py``) or ``steer`` (the
keyboard-steered world model, ``world_train.py``, which builds on it).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .train import STATE_FILE, STATE_KEYS, Trainer, TrainRecipe, print_now
from .world_train import WorldTrainer, world_recipe

WORLDS = ("sprites", "steer")


def train_demo(out_dir, minutes: float | None = None, steps: int | None = None, seed: int = 0,
               threads: int | None = 2, resume: bool = True, checkpoint_minutes: float = 10.0,
               report: bool = True, batch: int | None = None, init_from=None, log=print_now,
               recipe_overrides: dict | None = None, world: str = "sprites") -> dict:
    """Train (or resume) the demo model into ``out_dir``; returns a summary dict.

    ``steps`` fixes the run (and its LR schedule); ``minutes`` caps the wall time (total over resumes).
    With ``report`` the finished weights are evaluated and MODEL_CARD.md, loss.png, samples.png written.
    ``init_from``: another run's ``train_state.pt`` to continue from as a new phase, or a demo weights file
    (``.safetensors``) to start from with a fresh optimizer (ignored when resuming).
    ``world``: ``sprites`` (the bundled text-to-video demo) or ``steer`` (the keyboard-steered world model,
    ``world_train.py``).
    """
    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out_dir)
    if world not in WORLDS:
        raise ValueError(f"unknown world {world!r}; expected one of {', '.join(WORLDS)}")
    if world == "steer":
        recipe = world_recipe(**(recipe_overrides or {}))
    else:
        recipe = TrainRecipe(**(recipe_overrides or {}))
    if steps is not None:
        recipe = TrainRecipe(**{**asdict(recipe), "steps": int(steps)})
    if batch is not None:
        recipe = TrainRecipe(**{**asdict(recipe), "batch": int(batch)})
    state_path = out_dir / STATE_FILE
    resuming = resume and state_path.is_file()
    # What the run starts from is read (and refused) before any model is built.
    state = read_training_state(state_path if resuming else init_from) \
        if resuming or (init_from is not None and not str(init_from).endswith(".safetensors")) else None
    if world == "steer":
        trainer: Trainer = WorldTrainer(out_dir, recipe, seed, log)
    else:
        trainer = Trainer(out_dir, recipe, seed, log)
    if resuming:
        _state_fits(state_path, trainer, lambda: trainer.load_state_dict(state))
        log(f"resumed at step {trainer.step} ({trainer.elapsed / 60:.1f} min so far)")
    elif init_from is not None and str(init_from).endswith(".safetensors"):
        _state_fits(init_from, trainer, lambda: trainer.warm_start_from_weights(init_from))
        log(f"initialised from the weights {init_from} ({trainer.phases[-1]['steps']} steps)")
    elif init_from is not None:
        _state_fits(init_from, trainer, lambda: trainer.warm_start(state))
        log(f"initialised from {init_from} ({trainer.phases[-1]['steps']} steps)")
    out_dir.mkdir(parents=True, exist_ok=True)  # only once what it starts from has been read and accepted
    budget = None if minutes is None else minutes * 60.0
    last_checkpoint = time.perf_counter()
    session_start, elapsed_before = time.perf_counter(), trainer.elapsed
    while trainer.step < recipe.steps and (budget is None or trainer.elapsed < budget):
        loss = trainer.train_step(0.0 if budget is None else trainer.elapsed / budget)
        trainer.losses.append(loss)
        trainer.elapsed = elapsed_before + time.perf_counter() - session_start
        if trainer.step % 25 == 0 or trainer.step == recipe.steps:
            log(f"step {trainer.step}/{recipe.steps} loss {trainer.smoothed_loss(25):.4f} "
                f"lr {trainer.optimizer.param_groups[0]['lr']:.2e} {trainer.elapsed / 60:.1f} min")
        if time.perf_counter() - last_checkpoint > checkpoint_minutes * 60:
            trainer.checkpoint()
            last_checkpoint = time.perf_counter()
    trainer.checkpoint()
    summary = {"out_dir": str(out_dir), "steps": trainer.step, "planned_steps": recipe.steps,
               "minutes": round(trainer.elapsed / 60, 2), "loss": trainer.smoothed_loss()}
    log(f"training done: {json.dumps(summary)}")
    if report and world == "steer":
        from .world_report import write_world_report

        summary["report"] = write_world_report(out_dir, log=log)
    elif report:
        from .report import write_report

        summary["report"] = write_report(out_dir, log=log)
    return summary


def read_training_state(path) -> dict:
    """A ``train_state.pt`` read through the engine's checked loader (``weights_only``, its pickle bounded before
    torch reads it), and checked to hold what a training state holds."""
    from ...fastar_core.errors import CheckpointError
    from ...fastar_core.families.demo.weights_file import STATE_FIELDS, check_finite_tensors
    from ...fastar_core.files.metadata_fields import check_fields
    from ...fastar_core.files.raw import read_raw
    from ...fastar_core.files.wan_checkpoint import checkpoint_errors

    path = Path(path)
    with checkpoint_errors(path):
        state, _ = read_raw(path)
        missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
        if missing:
            raise CheckpointError(path, f"is not a demo training state ({STATE_FILE}): it has no "
                                        f"{', '.join(missing[:4])}")
        check_fields(path, state, STATE_FIELDS, "training state")
        check_finite_tensors(path, state)  # weights or optimizer moments of NaN would train NaN
        return state


def _state_fits(path, trainer, apply) -> None:
    """Load a read state into the trainer; a state of another shape is one error naming the file. The optimizer's
    moments are checked too: torch loads them without comparing their shapes with the weights', and a moment of
    another shape would end the first step."""
    from ...fastar_core.errors import CheckpointError

    try:
        apply()
    except CheckpointError:  # already one message naming the file
        raise
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(path, f"does not fit the demo model and its trainer: {first[:300]}") from None
    for group in trainer.optimizer.param_groups:
        for param in group["params"]:
            for name, value in trainer.optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.ndim and value.shape != param.shape:
                    raise CheckpointError(path, f"its optimizer's {name} has shape {list(value.shape)} for a weight "
                                                f"of shape {list(param.shape)}; the training state is damaged")


def build_parser():
    from ..parsing import OneLineParser

    p = OneLineParser(prog="fastar train-demo", description="train the bundled demo video model")
    p.add_argument("--out", default="demo_training", help="output folder (weights, card, plots, training state)")
    p.add_argument("--steps", type=int, default=None, help=f"optimisation steps (default {TrainRecipe.steps})")
    p.add_argument("--minutes", type=float, default=None, help="stop after this much wall time (weights are kept)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of every step's clips")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--batch", type=int, default=None, help=f"clips per step (default {TrainRecipe.batch})")
    p.add_argument("--fresh", action="store_true", help="ignore a saved training state in --out")
    p.add_argument("--init-from", help="train_state.pt of an earlier run to continue from as a new phase, "
                   "or a demo .safetensors to start from")
    p.add_argument("--checkpoint-minutes", type=float, default=10.0,
                   help="minutes between saves of the weights and the training state")
    p.add_argument("--no-report", action="store_true", help="skip the evaluation and model card")
    p.add_argument("--report-only", action="store_true", help="only evaluate the weights in --out and write the card")
    p.add_argument("--notes", help="a Markdown file whose text goes into the model card under the verdict")
    p.add_argument("--world", default="sprites", choices=list(WORLDS),
                   help="sprites: the bundled text-to-video demo; steer: the keyboard-steered world model")
    p.add_argument("--new-region-weight", type=float, default=None,
                   help="--world steer: loss weight of the strip each move brings into view (default 1)")
    p.add_argument("--landmark-weight", type=float, default=None,
                   help="--world steer: loss weight of the pixels landmarks cover (default 1)")
    return p


def recipe_overrides(args) -> dict | None:
    """The steered world's loss weights the command line sets, as recipe fields."""
    given = {"new_region_loss_weight": args.new_region_weight, "landmark_loss_weight": args.landmark_weight}
    return {k: v for k, v in given.items() if v is not None} or None


def main(argv=None) -> int:
    from ..command_checks import check_train

    args = build_parser().parse_args(argv)
    check_train(args)
    if args.report_only:
        from .report import write_report

        if args.threads:
            torch.set_num_threads(args.threads)
        notes = Path(args.notes).read_text() if args.notes else ""
        if args.world == "steer":
            from .world_report import write_world_report

            write_world_report(Path(args.out), notes=notes)
        else:
            write_report(Path(args.out), notes=notes)
        return 0
    from ..outputs import removed_if_failed

    with removed_if_failed(args.out):  # a run stopped before its first save leaves no empty folder
        train_demo(args.out, minutes=args.minutes, steps=args.steps, seed=args.seed, threads=args.threads,
                   resume=not args.fresh, checkpoint_minutes=args.checkpoint_minutes, report=not args.no_report,
                   batch=args.batch, init_from=args.init_from, world=args.world,
                   recipe_overrides=recipe_overrides(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
