"""Outputs written whole: strict JSON, one run's latent and stats together, and a run reproducible from its stats."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.tools.cli import main
from comfyui_fastar.tools.outputs import (
    LATENT_FILE,
    STATS_FILE,
    locked_folder,
    run_lock,
    strict_json,
    write_run,
)

from helpers import assert_one_run, tiny_model

SMALL = ["--frames", "6", "--height", "32", "--width", "32", "--device", "cpu"]


@pytest.fixture()
def ckpt(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(tiny_model(), path, dtype=torch.float32)
    return path


def read_pair(out):
    stats = json.loads((out / STATS_FILE).read_text())
    with safe_open(str(out / LATENT_FILE), framework="pt") as f:
        latent_run = f.metadata()["run_id"]
        latent = f.get_tensor("latent")
    return stats, latent_run, latent


def test_strict_json_writes_null_for_non_finite_numbers():
    text = strict_json({"ratio": math.inf, "list": [1.0, -math.inf, math.nan], "nested": {"x": (2, math.nan)}})
    assert json.loads(text) == {"ratio": None, "list": [1.0, None, None], "nested": {"x": [2, None]}}
    assert "Infinity" not in text and "NaN" not in text
    with pytest.raises(TypeError):
        strict_json({"tensor": torch.zeros(1)})


def test_stats_record_the_seed_and_the_command_that_reruns_the_same_video(ckpt, tmp_path, one_thread):
    out = tmp_path / "first"
    assert main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", "5", "--cache", "window",
                 "--window", "5", "--sink", "1", *SMALL]) == 0
    stats, latent_run, latent = read_pair(out)
    assert stats["seed"] == 5 and stats["run_id"] == latent_run
    assert stats["options"]["window"] == 5 and stats["cache"]["sink_frames"] == 1
    command = stats["command"]
    assert command[0] == "fastar"
    again = tmp_path / "again"
    argv = command[1:]
    argv[argv.index("--out") + 1] = str(again)
    assert main(argv) == 0
    assert torch.equal(load_file(str(again / LATENT_FILE))["latent"], latent)


def _fork(fn):
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            torch.set_num_threads(1)
            code = fn() or 0
        finally:
            os._exit(code)
    return pid


def _wait(pids, timeout=120):
    start, codes = time.monotonic(), {}
    while len(codes) < len(pids) and time.monotonic() - start < timeout:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in set(pids) - set(codes):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return [codes.get(pid) for pid in pids]


def test_concurrent_writers_never_leave_a_mixed_pair(tmp_path):
    """Two writers replace the pair 25 times each while a reader, taking the same lock, checks every pair it
    sees: the latent and the stats always come from the same run."""
    out = tmp_path / "shared"
    out.mkdir()

    def writer(tag):
        def run():
            for i in range(25):
                run_id = f"{tag}-{i}"
                write_run(out, torch.full((1, 2, 3), float(tag)), {"writer": tag, "i": i}, run_id)
        return run

    def reader():
        seen, start = 0, time.monotonic()
        while seen < 40 and time.monotonic() - start < 60:
            if not (out / STATS_FILE).exists():
                time.sleep(0.001)
                continue
            with locked_folder(out):
                stats, latent_run, latent = read_pair(out)
            if stats["run_id"] != latent_run or latent[0, 0, 0].item() != stats["writer"]:
                return 3
            seen += 1
        return 0 if seen else 4

    pids = [_fork(writer(1)), _fork(writer(2)), _fork(reader)]
    assert _wait(pids) == [0, 0, 0]
    stats, latent_run, latent = read_pair(out)
    assert stats["run_id"] == latent_run and latent[0, 0, 0].item() == stats["writer"]
    assert_one_run(out)  # no temporary file left


def test_a_second_run_into_a_busy_folder_is_refused_and_the_first_one_kept(ckpt, tmp_path, capsys, one_thread):
    out = tmp_path / "busy"
    assert main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", "1", *SMALL]) == 0
    before = read_pair(out)
    with run_lock(out):  # another run holds the folder
        capsys.readouterr()
        assert main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", "2", *SMALL]) == 2
        err = capsys.readouterr().err
    assert err.startswith("fastar: error: ") and err.count("\n") == 1
    assert str(out) in err and "in use by another" in err and f"pid {os.getpid()}" in err
    after = read_pair(out)
    assert after[0] == before[0] and torch.equal(after[2], before[2])
    assert main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", "2", *SMALL]) == 0  # freed
    assert read_pair(out)[0]["seed"] == 2


def test_a_failed_write_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "run"

    class Unwritable(dict):
        pass

    with pytest.raises(TypeError):
        write_run(out, torch.zeros(1), {"bad": Unwritable(x=object())}, "r1")
    assert not (tmp_path / "new").exists()


def test_a_refused_run_into_an_existing_folder_leaves_it_as_it_was(ckpt, tmp_path, one_thread):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    assert main(["generate", "--checkpoint", str(bad), "--out", str(out), *SMALL]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
