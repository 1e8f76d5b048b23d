"""`fastar generate` killed (SIGKILL) at every step of its final write: each time the folder holds the complete
earlier run or the complete new one, read through the two names as any reader reads them, and the next run
leaves one run and nothing else."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.tools.cli import main
from comfyui_fastar.tools.outputs import FAULT_ENV, LATENT_FILE, STATE_DIR, STATS_FILE

from helpers import assert_one_run, tiny_model

RUN = ["--frames", "1", "--frames-per-block", "1", "--height", "16", "--width", "16", "--device", "cpu"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("crash") / "tiny.safetensors"
    save_checkpoint(tiny_model(), path, dtype=torch.float32)
    # One run in this process first, so each forked child finds torch's lazy imports done.
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["generate", "--checkpoint", str(path), "--out", str(path.parent / "warm"), *RUN]) == 0
    return path


def generate(ckpt, out, seed, fault=None):
    """Run generate in a forked child; 'killed' when the fault hook killed it, else its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            torch.set_num_threads(1)
            if fault is not None:
                os.environ[FAULT_ENV] = str(fault)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            code = main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", str(seed), *RUN])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return "killed"
    return os.waitstatus_to_exitcode(status)


def visible_run(out):
    """(seed, latent) of the run a reader finds through the two names, None when there is none; fails on a mixed
    or partial pair."""
    latent_path, stats_path = out / LATENT_FILE, out / STATS_FILE
    if not latent_path.exists() and not stats_path.exists():
        return None
    assert latent_path.exists() and stats_path.exists(), f"half a run: {sorted(os.listdir(out))}"
    stats = json.loads(stats_path.read_text())
    with safe_open(str(latent_path), framework="pt") as f:
        assert f.metadata()["run_id"] == stats["run_id"], "latent and stats of different runs"
        latent = f.get_tensor("latent")
    return stats["seed"], latent


def check_state(out, allowed: dict):
    """The folder shows one of ``allowed`` (seed -> latent, None for 'no run'), and nothing else but .fastar;
    neither name is ever a link to a missing file."""
    for name in (LATENT_FILE, STATS_FILE):
        assert not (os.path.islink(out / name) and not (out / name).exists()), f"{name} is a dangling link"
    found = visible_run(out) if out.exists() else None
    if found is None:
        assert None in allowed, "the earlier run is gone"
        key = None
    else:
        seed, latent = found
        assert seed in allowed and torch.equal(latent, allowed[seed]), f"seed {seed} is not a complete run"
        key = seed
    if out.exists():
        extra = set(os.listdir(out)) - {LATENT_FILE, STATS_FILE, STATE_DIR, "keep-me.txt"}
        assert not extra, f"stray files {extra}"
    return key


def reference(ckpt, tmp_path, seed):
    out = tmp_path / f"ref-{seed}"
    assert generate(ckpt, out, seed) == 0
    return visible_run(out)[1]


def crash_at_every_step(ckpt, out, old_seed, new_seed, refs, prepare):
    """Kill the run at step 1, 2, ... of its final write until one completes; return what each kill left."""
    seen = []
    for step in range(1, 40):
        prepare()
        outcome = generate(ckpt, out, new_seed, fault=step)
        state = check_state(out, {old_seed: refs.get(old_seed), new_seed: refs[new_seed]})
        if outcome != "killed":
            assert outcome == 0 and state == new_seed
            return seen
        seen.append(state)
        # The next run cleans whatever the crash left and leaves one run only.
        assert generate(ckpt, out, 3) == 0
        assert check_state(out, {3: refs[3]}) == 3
        assert_one_run(out, users=[p.name for p in out.glob("keep-me.txt")])
        assert not list(out.parent.glob(f".{out.name}.*")), "a crashed switch's folder was left beside the run"
    raise AssertionError("the write never completed")


def test_a_killed_final_write_leaves_the_old_or_the_new_run(ckpt, tmp_path, one_thread):
    refs = {seed: reference(ckpt, tmp_path, seed) for seed in (1, 2, 3)}
    template = tmp_path / "template"
    assert generate(ckpt, template, 1) == 0
    (template / "keep-me.txt").write_text("a user's own file")
    out = tmp_path / "run"

    def from_template():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(template, out, symlinks=True)

    seen = crash_at_every_step(ckpt, out, 1, 2, refs, from_template)
    assert len(seen) >= 5 and 1 in seen and 2 in seen  # the kills fell both before and after the switch
    assert (out / "keep-me.txt").read_text() == "a user's own file"

    fresh = tmp_path / "fresh" / "run"
    seen = crash_at_every_step(ckpt, fresh, None, 2, refs, lambda: shutil.rmtree(tmp_path / "fresh",
                                                                                  ignore_errors=True))
    assert None in seen and 2 in seen


def test_a_folder_of_an_earlier_version_is_taken_over_without_a_mixed_moment(ckpt, tmp_path, one_thread):
    """Earlier versions kept the two files themselves (and could leave a .tmp beside them)."""
    refs = {seed: reference(ckpt, tmp_path, seed) for seed in (1, 2, 3)}
    out = tmp_path / "old-layout"

    def old_layout():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        run_id = "0" * 32
        save_file({"latent": refs[1]}, str(out / LATENT_FILE), metadata={"run_id": run_id})
        (out / STATS_FILE).write_text(json.dumps({"seed": 1, "run_id": run_id}))
        (out / f"{LATENT_FILE}.{'a' * 32}.tmp").write_bytes(b"half a latent")

    seen = crash_at_every_step(ckpt, out, 1, 2, refs, old_layout)
    assert 1 in seen and 2 in seen
    assert_one_run(out)
