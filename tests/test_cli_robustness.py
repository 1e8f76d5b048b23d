"""What the machine around a run does cannot cost the run: a closed or full stdout, an encoding that cannot print
the output path, an interrupt, a file-size limit. Each test runs `fastar` in a real process (pipes, signals and
limits are the operating system's) and asserts one clear line, or a complete run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.tools.outputs import LATENT_FILE, STATS_FILE

from helpers import tiny_model

TESTS = Path(__file__).resolve().parent
# The checkout imported as conftest does it, whatever the folder is called.
LAUNCH = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import conftest; "
          "from comfyui_fastar.tools.cli import main; sys.exit(main(sys.argv[1:]))")
RUN = ["--frames", "6", "--height", "32", "--width", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("robust") / "tiny.safetensors"
    save_checkpoint(tiny_model(), path, dtype=torch.float32)
    earlier_run(path, path.parent / "warm", 0)  # torch's lazy imports done once, before any child is forked
    return path


def fastar(*argv, env=None, **kw):
    """`fastar` in a fresh interpreter (for what only start-up decides: the I/O encoding)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-c", LAUNCH, *map(str, argv)], env=full_env, **kw)


def finished(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


class Forked:
    """`fastar` in a forked child with its own stdout and stderr descriptors (a pipe, or a file such as
    /dev/full): the operating system's pipes, signals and limits, without a fresh interpreter's start-up."""

    def __init__(self, *argv, stdout=None, fsize=None):
        out_r, out_w = (None, stdout.fileno()) if stdout is not None else os.pipe()
        err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 97
            try:
                torch.set_num_threads(1)
                # Ctrl-C as in a terminal: a shell's background job (CI under nohup, say) starts with SIGINT
                # ignored, and Python then installs no KeyboardInterrupt handler of its own.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if fsize is not None:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (out_r, err_r):
                    if fd is not None:
                        os.close(fd)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                              errors="backslashreplace", line_buffering=True)
                from comfyui_fastar.tools.cli import main

                code = main([str(a) for a in argv])
            except BaseException:
                traceback.print_exc()
                code = 98
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except BaseException:
                        pass
                os._exit(code)
        if out_r is not None:
            os.close(out_w)
        os.close(err_w)
        self.stdout = os.fdopen(out_r, "rb") if out_r is not None else None
        self.stderr = os.fdopen(err_r, "rb")

    def send_signal(self, sig):
        os.kill(self.pid, sig)

    def finish(self, timeout=120):
        err = self.stderr.read().decode(errors="replace")
        out = self.stdout.read().decode(errors="replace") if self.stdout is not None else ""
        start = time.monotonic()
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), out, err
            if time.monotonic() - start > timeout:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError("fastar did not finish")
            time.sleep(0.01)


def assert_complete(out: Path, seed: int):
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["seed"] == seed
    assert load_file(str(out / LATENT_FILE))["latent"].shape[2] == 6


def earlier_run(ckpt, out, seed):
    """A run already in the folder, made in this process (cheaper than starting another)."""

    from comfyui_fastar.tools.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["generate", "--checkpoint", str(ckpt), "--out", str(out), "--seed", str(seed), *RUN]) == 0


def test_a_closed_stdout_does_not_stop_the_run(ckpt, tmp_path):
    """`fastar generate ... | head -1`: the reader goes after one line, the run finishes anyway."""
    out = tmp_path / "piped"
    proc = Forked("generate", "--checkpoint", ckpt, "--out", out, "--seed", "4", *RUN)
    proc.stdout.readline()
    proc.stdout.close()
    proc.stdout = None
    rc, _, err = proc.finish()
    assert rc == 0 and err == "", err
    assert_complete(out, 4)


def test_a_full_stdout_does_not_stop_the_run(ckpt, tmp_path):
    out = tmp_path / "full"
    with open("/dev/full", "w") as full:
        rc, _, err = Forked("generate", "--checkpoint", ckpt, "--out", out, "--seed", "5", *RUN,
                            stdout=full).finish()
    assert rc == 0 and err == "", err
    assert_complete(out, 5)


def test_an_ascii_terminal_and_a_non_ascii_folder(ckpt, tmp_path):
    out = tmp_path / "vidéo-生成"
    rc, stdout, err = finished(fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "6", *RUN,
                                      env={"PYTHONIOENCODING": "ascii"}, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    assert rc == 0 and err == "", err
    assert "wrote " in stdout and "vid\\xe9o" in stdout
    assert_complete(out, 6)


def test_an_interrupt_ends_with_one_line_and_keeps_the_earlier_run(ckpt, tmp_path):
    out = tmp_path / "interrupted"
    earlier_run(ckpt, out, 7)
    proc = Forked("generate", "--checkpoint", ckpt, "--out", out, "--seed", "8", "--frames", "3000", "--height",
                  "32", "--width", "32", "--device", "cpu")
    while b"chunk" not in proc.stdout.readline():
        pass
    proc.send_signal(signal.SIGINT)
    rc, _, err = proc.finish()
    assert rc == 130
    assert err.count("\n") == 1 and err.startswith("fastar: error: interrupted"), err
    assert_complete(out, 7)


def test_a_file_size_limit_is_one_line_naming_the_folder(ckpt, tmp_path):
    """`ulimit -f`: the latent cannot be written; the message names the folder, the earlier run stays."""
    out = tmp_path / "limited"
    earlier_run(ckpt, out, 9)

    rc, _, err = Forked("generate", "--checkpoint", ckpt, "--out", out, "--seed", "10", *RUN, fsize=4096).finish()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("fastar: error: "), err
    assert str(out) in err and "File too large" in err and "Traceback" not in err
    assert_complete(out, 9)


def test_the_same_weights_as_pt_and_safetensors_give_the_same_latent(tmp_path, capsys):
    """A .pt has no config; its head count comes from the family's known shapes (the demo model's here), so
    both forms build the same model and the same video, bit for bit."""
    from comfyui_fastar.fastar_core.model.wan_model import random_wan
    from comfyui_fastar.tools.cli import main
    from comfyui_fastar.tools.demo.settings import MODEL_CONFIG

    model = random_wan(MODEL_CONFIG, seed=3)
    st, pt = tmp_path / "demo-size.safetensors", tmp_path / "demo-size.pt"
    save_checkpoint(model, st, dtype=torch.float32)
    torch.save({"generator_ema": {k: v.clone() for k, v in model.state_dict().items()}}, pt)
    latents = []
    for path in (st, pt):
        out = tmp_path / path.suffix[1:]
        assert main(["generate", "--checkpoint", str(path), "--out", str(out), "--frames", "3", "--device", "cpu",
                     "--seed", "2"]) == 0
        latents.append(load_file(str(out / LATENT_FILE))["latent"])
        stats = json.loads((out / STATS_FILE).read_text())
        assert stats["family"] == "FastAR-demo"
        assert stats["options"]["height"] == 192 and stats["options"]["width"] == 192  # the model's own size
    assert torch.equal(latents[0], latents[1])
    printed = capsys.readouterr().out
    assert printed.count("no --cond given") == 2  # once per run

