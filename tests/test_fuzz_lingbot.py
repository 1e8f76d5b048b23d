"""Fuzz suite for LingBot-World 2.0's inputs: hostile model folders through ``info`` (and the ones that size an
allocation through ``generate``), hostile camera folders through ``generate --camera``, hostile options, side
files and key timelines through ``generate``, ``info`` on odd paths and ``bench lingbot-cap``'s options.

Each refusal must be exit code 2 and one ``fastar: error:`` line naming the input, with no traceback, no hang, no
runaway memory (each child's address space capped) and no output folder left behind. What a loader allows runs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time

import pytest
from fuzz_inputs import problems_of, run_forked
from fuzz_lingbot import (
    CAMERAS_THAT_RUN,
    camera_cases,
    carried_config_cases,
    command_line_cases,
    good_camera,
    good_model,
    loads,
    model_folder_cases,
)
from test_fuzz_inputs import report

DEADLINE_S = 60.0
SIZE = ["--height", "32", "--width", "48", "--device", "cpu"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    # What the commands import, imported once here rather than in every forked child.
    from comfyui_fastar.tools import cli, generate, generate_lingbot  # noqa: F401
    from comfyui_fastar.tools.bench import lingbot_cap  # noqa: F401

    root = tmp_path_factory.mktemp("lingbot-fuzz")
    good_model(root / "good")
    good_model(root / "single", sharded=False, config_in_files=True)
    good_camera(root / "camera")
    return root


def refused(argv: list, must_name: str, out) -> list:
    outcome = run_forked(argv, timeout=DEADLINE_S)
    problems = problems_of(outcome, must_name=must_name)
    if re.search(r"(\S+): \1:", outcome.stderr):
        problems.append("names the same file twice in a row")
    if out is not None and out.exists():
        problems.append("left its --out behind")
        shutil.rmtree(out)
    return problems, outcome


def test_hostile_model_folders_are_refused_cleanly(root, one_thread):
    """Every config.json field of every wrong type and size, the config, index and shards replaced by what they
    are not, tensors of other dtypes, shapes and values, headers that lie, a shard's carried config made hostile:
    one line naming the folder or file, or (what the loader allows) a correct read."""
    (root / "models").mkdir()
    cases = model_folder_cases(root / "models", root / "good")
    (root / "carried").mkdir()
    cases.update(carried_config_cases(root / "carried", root / "single"))
    assert len(cases) >= 200
    failures = {}
    for name, (path, must) in cases.items():
        if loads(name):
            outcome = run_forked(["info", str(path)], timeout=DEADLINE_S)
            if outcome.rc != 0:
                failures[name] = (["refused a folder the loader allows"], outcome.stderr.strip())
            continue
        problems, outcome = refused(["info", str(path)], must, None)
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(cases))


def test_sizes_in_a_config_are_refused_before_they_are_allocated(root, one_thread):
    """A config.json whose sizes would build a huge module tree or a huge prompt: refused by ``generate`` from
    the file, within the capped address space, with no output folder."""
    (root / "sizes").mkdir()
    sizes = ("-huge", "-1000000", "-2147483648", "-9223372036854775808", "-digits")
    cases = {name: case for name, case in model_folder_cases(root / "sizes", root / "good").items()
             if name.startswith("config-") and not loads(name) and name.endswith(sizes)}
    assert len(cases) >= 20
    failures = {}
    out = root / "sizes-out"
    for name, (path, must) in cases.items():
        problems, outcome = refused(["generate", "--checkpoint", str(path), "--camera", str(root / "camera"),
                                     "--frames", "4", "--out", str(out), *SIZE], must, out)
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(cases))


def test_hostile_camera_folders_are_refused_cleanly(root, one_thread):
    """poses.npy and intrinsics.npy of every wrong shape, dtype and value, pickled, zipped, cut short, declaring
    a billion rows, or not a file at all: one line naming the folder or the file; float16, big-endian and
    Fortran-ordered arrays run."""
    (root / "cameras").mkdir()
    cases = camera_cases(root / "cameras", root / "camera")
    assert len(cases) >= 80
    failures = {}
    out = root / "camera-out"
    for name, (path, must) in cases.items():
        argv = ["generate", "--checkpoint", str(root / "good"), "--camera", str(path), "--frames", "4",
                "--out", str(out), *SIZE]
        if name in CAMERAS_THAT_RUN:
            outcome = run_forked(argv, timeout=DEADLINE_S)
            if outcome.rc != 0:
                failures[name] = (["refused a camera that is fine"], outcome.stderr.strip())
            shutil.rmtree(out, ignore_errors=True)
            continue
        problems, outcome = refused(argv, must, out)
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(cases))


def test_command_line_mistakes_on_lingbot_are_refused_cleanly(root, one_thread):
    """Options out of range, side files (--cond, --lora, --camera, --actions) that are missing, folders, devices,
    non-finite, mis-shaped, not UTF-8, nested deep or of the wrong type; info on odd paths; bench lingbot-cap's
    options: one line naming the option or the file, before any output folder is made."""
    (root / "side").mkdir()
    cases = command_line_cases(root / "side", root / "good", root / "camera")
    assert len(cases) >= 70
    failures = {}
    for name, (argv, must) in cases.items():
        problems, outcome = refused(argv, must, root / "side" / "out")
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    assert not failures, report(failures, len(cases))


def test_what_is_fine_runs(root, one_thread, tmp_path):
    """A timeline saved with a byte-order mark or Windows line ends, and info on a file of a model folder."""
    for name, text in {"bom.txt": "\ufeffvariant lingbot\n0 W\n", "crlf.txt": "variant lingbot\r\n0 W\r\n"}.items():
        (tmp_path / name).write_text(text, newline="")
        outcome = run_forked(["generate", "--checkpoint", str(root / "good"), "--actions", str(tmp_path / name),
                              "--frames", "4", "--out", str(tmp_path / name.split(".")[0]), *SIZE],
                             timeout=DEADLINE_S)
        assert outcome.rc == 0, outcome.stderr
    index = root / "good" / "diffusion_pytorch_model.safetensors.index.json"
    outcome = run_forked(["info", str(index)], timeout=DEADLINE_S)
    assert outcome.rc == 0 and "LingBot-World 2.0" in outcome.stdout, outcome.stderr


def test_a_safetensors_header_of_pickle_like_length_is_safetensors():
    """A header 640..1535 bytes long starts with the bytes a pickle starts with (0x80, then 2..5): read by its
    suffix and its ninth byte as what it is."""
    from comfyui_fastar.fastar_core.files.raw import sniff

    for length in (0x280, 0x380, 0x480, 0x580):
        head = length.to_bytes(8, "little") + b'{"a":' + b" " * 20
        assert sniff(head, length + 8 + 100) == "safetensors", length
    assert sniff(b"\x80\x02}q\x00(X\x01\x00\x00\x00", 100) == "pickle"


def test_an_interrupted_bench_stops_and_joins_its_rollout_threads():
    """Ctrl-C while the interleaved rollouts run: every worker ends at its next turn and is joined before the
    interrupt goes on, so no thread is inside torch when the interpreter exits."""
    from comfyui_fastar.tools.bench.interleave import run_in_turns

    def endless(hand_on):
        while True:
            time.sleep(0.005)
            hand_on({})

    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_in_turns({"a": endless, "b": endless, "c": endless})
    finally:
        timer.cancel()
    # (a thread whose join the interrupt cut may stay listed, stopped: what counts is that none runs)
    assert not [t for t in threading.enumerate() if t.name.startswith("rollout ") and t.is_alive()]
