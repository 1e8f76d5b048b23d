"""Fuzz suite for the steered world's inputs: hostile world weight files through every command that reads one
(``demo --world steer``, ``play``, ``train-demo --init-from``), training states of NaN, and action scripts with a
value of the wrong type at every place, in the CLI and in the Action Script node.

Each refusal must be exit code 2 and one ``fastar: error:`` line naming the file, with no traceback, no hang, no
runaway memory (each child's address space capped) and no folder left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fuzz_inputs import good_metadata, good_state_dict, problems_of, run_forked
from fuzz_world import (
    accepted_world_files,
    action_script_texts,
    node_widget_values,
    tiny_world_file,
    world_file_cases,
)
from test_fuzz_inputs import report

from comfyui_fastar.fastar_core.errors import FastARError

DEADLINE_S = 30.0
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def world_root(tmp_path_factory):
    # What the commands import, imported once here rather than in every forked child.
    from comfyui_fastar.fastar_core.families.demo import model, weights_file  # noqa: F401
    from comfyui_fastar.tools import command_checks, demo_world_command, play  # noqa: F401
    from comfyui_fastar.tools.demo import bundled, train_command, world_train  # noqa: F401

    root = tmp_path_factory.mktemp("world-fuzz")
    tiny_world_file(root / "good.safetensors")
    return root


@pytest.fixture(scope="module")
def world_cases(world_root):
    return world_file_cases(world_root / "files", world_root / "good.safetensors")


def commands(path: Path, out: Path) -> dict:
    """Every command that reads a world weights file, each writing (when it gets that far) under ``out``."""
    return {
        "demo": ["demo", "--world", "steer", "--weights", str(path), "--frames", "2", "--out", str(out / "demo")],
        "play": ["play", "--weights", str(path), "--port", "0"],
        "train": ["train-demo", "--world", "steer", "--init-from", str(path), "--steps", "1", "--no-report",
                  "--threads", "1", "--out", str(out / "train")],
    }


def test_hostile_world_files_are_refused_cleanly(world_root, world_cases, one_thread):
    cases = world_cases
    assert len(cases) >= 280
    out = world_root / "out"
    failures, runs = {}, 0
    for i, (name, path) in enumerate(cases.items()):
        # Every file through demo; play and train-demo take every eighth (the same checked reader serves all).
        # Damaged tensors of a file this small cannot reach train-demo's checks (its model is wider): the
        # bundled-size ones are in test_non_finite_starts_are_refused_and_nothing_is_written.
        chosen = commands(path, out)
        if i % 8:
            chosen = {"demo": chosen["demo"]}
        elif name.startswith("tensor-"):
            chosen.pop("train")
        for command, argv in chosen.items():
            outcome = run_forked(argv, timeout=DEADLINE_S)
            runs += 1
            problems = problems_of(outcome, must_name=path.name)
            if out.exists():
                problems.append("left a folder behind")
                import shutil

                shutil.rmtree(out)
            if problems:
                failures[f"{command} {name}"] = (problems, outcome.stderr.strip())
    print(f"\nworld fuzz: {len(cases)} files, {runs} runs, {len(failures)} bad refusals")
    assert not failures, report(failures, runs)


def test_world_files_that_differ_in_allowed_ways_run(world_root, one_thread, capsys):
    """The fuzz files are variants of one that runs; the allowed variants run too (no check refuses too much)."""
    from comfyui_fastar.tools.cli import main

    files = {"good": world_root / "good.safetensors",
             **accepted_world_files(world_root / "accepted", world_root / "good.safetensors")}
    for name, path in files.items():
        out = world_root / f"ran-{name}"
        assert main(["demo", "--world", "steer", "--weights", str(path), "--frames", "2", "--out", str(out)]) == 0, \
            capsys.readouterr().err
        assert (out / "stats.json").is_file()


def _training_state(path: Path, damage) -> Path:
    """A sprite trainer's ``train_state.pt`` with ``damage(state)`` applied."""
    from comfyui_fastar.tools.demo.train import Trainer, TrainRecipe

    trainer = Trainer(path.parent, TrainRecipe(steps=1, batch=1), seed=0, log=lambda *_: None)
    state = trainer.state_dict()
    damage(state)
    torch.save(state, path)
    return path


def test_non_finite_starts_are_refused_and_nothing_is_written(world_root, one_thread):
    """--init-from a weights file or a training state holding NaN (weights or optimizer moments), and a
    resumed run whose saved state holds NaN: refused, naming the file, before any folder is made."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

    root = world_root / "states"
    root.mkdir()

    def nan_weight(state):
        state["model"]["head.head.weight"] = torch.full_like(state["model"]["head.head.weight"], float("nan"))

    def nan_moment(state):
        state["optimizer"]["state"] = {0: {"step": torch.tensor(1.0), "exp_avg": torch.full((2,), float("inf")),
                                           "exp_avg_sq": torch.zeros(2)}}

    def moment_shape(state):
        state["optimizer"]["state"] = {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2),
                                           "exp_avg_sq": torch.zeros(2)}}

    def text_step(state):
        state["step"] = "5"

    def huge_step(state):
        state["step"] = 10**30

    def phase_not_object(state):
        state["phases"] = ["earlier"]

    states = {name: _training_state(root / f"{name}.pt", damage)
              for name, damage in (("nan-weight", nan_weight), ("inf-moment", nan_moment),
                                   ("moment-shape", moment_shape), ("step-text", text_step),
                                   ("step-huge", huge_step), ("phase-text", phase_not_object))}
    words = {"nan-weight": "NaN or infinite", "inf-moment": "NaN or infinite", "moment-shape": "exp_avg has shape",
             "step-text": "'step'",
             "step-huge": "'step'", "phase-text": "'phases[0]'"}
    resumed = root / "resume"
    resumed.mkdir()
    (resumed / "train_state.pt").write_bytes(states["nan-weight"].read_bytes())

    def train(*extra, out):
        return ["train-demo", *extra, "--steps", "1", "--batch", "1", "--no-report", "--threads", "1", "--out",
                str(out)]

    cases = {f"init-{name}": (train("--init-from", str(p), out=root / f"out-{name}"), words[name])
             for name, p in states.items()}
    bundled = WEIGHTS_DIR / WORLD_WEIGHTS_FILE  # the trainer's own sizes, so only the damage can refuse it
    for part in ("model.diffusion_model.head.head.weight", "text_encoder.position", "action_encoder.key.weight"):
        tensors = load_file(str(bundled))
        tensors[part] = tensors[part].clone()
        tensors[part].view(-1)[-1] = float("nan")
        path = root / f"world-nan-{part.split('.')[0]}.safetensors"
        with safe_open(str(bundled), "pt") as f:
            save_file(tensors, str(path), metadata=f.metadata())
        cases[f"init-world-nan-{part}"] = (train("--world", "steer", "--init-from", str(path),
                                                 out=root / f"out-{part}"), f"{part} holds 1 NaN")
    cases["resume-nan"] = (train(out=resumed), "NaN or infinite")
    failures = {}
    for name, (argv, word) in cases.items():
        before = sorted(os.listdir(resumed))
        outcome = run_forked(argv, timeout=60)
        problems = problems_of(outcome, must_name=word)
        if any(root.glob("out-*")) or sorted(os.listdir(resumed)) != before:
            problems.append("wrote something")
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(cases))


LIMITED = ["sampler-steps-size-0", "sampler-steps-size-1", "text_len-size-1", "frame_size-size-2",
           "world-map_size-size-2", "vocabulary-huge", "frames_per_block-size-1", "schedule-size-5"]
# A fresh interpreter limited to 4 GiB of address space, as `prlimit --as=4G` would, running each command.
LIMITED_RUN = """
import resource, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
import conftest
from comfyui_fastar.tools.cli import main
for path, out in zip(sys.argv[2::2], sys.argv[3::2]):
    code = main(["demo", "--world", "steer", "--weights", path, "--frames", "2", "--out", out])
    print(code, file=sys.stderr, flush=True)
"""


def test_absurd_sizes_are_refused_under_4_gib(world_root, world_cases):
    """A step count of 10,000, a text length of a billion, a million-pixel frame, a map of a billion pixels:
    refused from the metadata before they become a loop or an allocation, within 4 GiB of address space."""
    args = []
    for case in LIMITED:
        args += [str(world_cases[case]), str(world_root / f"limited-{case}")]
    proc = subprocess.run([sys.executable, "-c", LIMITED_RUN, str(TESTS), *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) == 2 * len(LIMITED), proc.stderr[-2000:]
    for case, (message, code) in zip(LIMITED, zip(lines[::2], lines[1::2])):
        assert code == "2" and message.startswith("fastar: error: ") and world_cases[case].name in message, case
        assert not (world_root / f"limited-{case}").exists(), case


# --- action scripts ---------------------------------------------------------------------------------------

def test_action_scripts_of_wrong_types_are_refused_in_the_cli(tmp_path, one_thread):
    from safetensors.torch import save_file

    ckpt = tmp_path / "good.safetensors"
    save_file(good_state_dict(), str(ckpt), metadata=good_metadata())
    failures = {}
    texts = action_script_texts()
    assert len(texts) >= 80
    for name, text in texts.items():
        script = tmp_path / f"{name}.txt"
        script.write_text(text)
        outcome = run_forked(["generate", "--checkpoint", str(ckpt), "--actions", str(script), "--frames", "3",
                              "--height", "32", "--width", "32", "--device", "cpu", "--out", str(tmp_path / "o")],
                             timeout=DEADLINE_S)
        problems = problems_of(outcome, must_name=script.name)
        if (tmp_path / "o").exists():
            problems.append("left --out behind")
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(texts))


def test_action_script_node_refuses_wrong_types_with_one_message():
    """A linked input can carry anything: every wrong type is a FastARError at run time, and when the prompt is
    queued either passes (to be refused at run time) or is one FastARError naming the node (ComfyUI shows a
    raised message once, a returned one once per input)."""
    from comfyui_fastar.nodes.node_action_script import ActionScriptNode

    def queued(**widgets):
        try:
            return ActionScriptNode.VALIDATE_INPUTS(**widgets)
        except FastARError as e:
            assert "Action Script" in str(e) and len(str(e)) < 400, widgets
            return str(e)

    node = ActionScriptNode()
    for name, (variant, fps, script) in node_widget_values().items():
        with pytest.raises(FastARError) as caught:
            node.build(variant, fps, script)
        assert "Action Script" in str(caught.value) and len(str(caught.value)) < 400, name
        verdict = queued(variant=variant, fps=fps, script=script)
        assert verdict is True or isinstance(verdict, str), name
    for name, text in action_script_texts().items():
        with pytest.raises(FastARError) as caught:
            node.build("universal", 12.0, text)
        assert "Action Script" in str(caught.value) and len(str(caught.value)) < 400, name
        assert isinstance(queued(variant="universal", fps=12.0, script=text), str), name
