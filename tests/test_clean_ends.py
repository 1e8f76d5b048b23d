"""How a command ends when what surrounds it is odd: started with stdout or stderr closed, interrupted at any
moment (while torch is still importing, or mid-run), or told to serve on a port that is taken. Each ends with one
clear line or silence, the documented exit code, and no folder it created left behind.

The commands run as the process's own entry point (``main()`` with no arguments, as ``fastar`` and
``python -m comfyui_fastar`` call it), in a fresh interpreter that imports this checkout as the package.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuzz_inputs import problems_of, run_forked
from fuzz_world import tiny_world_file

ROOT = Path(__file__).resolve().parents[1]
INTERRUPTED = "fastar: error: interrupted"
# The checkout as the package ``comfyui_fastar``, then the command line as its own program. Importing the
# command line takes a few milliseconds and nothing heavy (torch and the engine load inside main()); "started"
# on stdout says main() is being called. A Ctrl-C before that, while the interpreter itself starts, is Python's
# to report.
PROGRAM = ("import importlib.util, sys; root = sys.argv.pop(1); "
           "spec = importlib.util.spec_from_file_location('comfyui_fastar', root + '/__init__.py', "
           "submodule_search_locations=[root]); m = importlib.util.module_from_spec(spec); "
           "sys.modules['comfyui_fastar'] = m; spec.loader.exec_module(m); "
           "from comfyui_fastar.tools.cli import main; sys.argv[0] = 'fastar'; "
           "assert 'torch' not in sys.modules, 'the command line imported torch before main()'; "
           "sys.stdout and (sys.stdout.write('started\\n'), sys.stdout.flush()); sys.exit(main())")


def program(*argv, close=(), **kw) -> subprocess.Popen:
    """``fastar argv`` in a fresh interpreter; ``close``: descriptors it starts without (1: stdout, 2: stderr)."""
    def setup():  # pragma: no cover - runs in the child
        # Ctrl-C as in a terminal (a background job starts with SIGINT ignored, and Python then takes none).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for fd in close:
            os.close(fd)

    pipes = {fd: subprocess.PIPE for fd in (1, 2) if fd not in close}
    return subprocess.Popen([sys.executable, "-c", PROGRAM, str(ROOT), *map(str, argv)], preexec_fn=setup,
                            stdout=pipes.get(1), stderr=pipes.get(2),
                            env=dict(os.environ, OMP_NUM_THREADS="1", TRITON_INTERPRET="1"), **kw)


def finished(proc, timeout=180):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_world_file(tmp_path_factory.mktemp("ends") / "world.safetensors")


def test_closed_stdout_or_stderr_at_start(world, tmp_path):
    """`fastar info X >&-`: silence and exit 0; `2>&-` on a bad file: exit 2, its line going nowhere (not into
    stdout); no traceback."""
    rc, _, err = finished(program("info", world, close=(1,)))
    assert rc == 0 and err == "", err
    rc, out, _ = finished(program("info", tmp_path / "absent.safetensors", close=(2,)))
    assert rc == 2 and out == "started\n"  # the launcher's marker only: the error went nowhere


def test_ctrl_c_at_any_moment_is_one_line(world, tmp_path):
    """SIGINT from a tenth of a second in (torch still importing) to mid-rollout: exit 130 with one line,
    or (when the command had already finished) its own result; never a traceback, never an empty folder."""
    outcomes = []
    for i, delay in enumerate((0.1, 0.4, 1.0, 2.5, 6.0)):
        out = tmp_path / f"demo-{i}"
        proc = program("demo", "--world", "steer", "--weights", world, "--frames", "40", "--out", out)
        assert proc.stdout.readline() == b"started\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        rc, _, err = finished(proc)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err)
        if rc == 130:
            assert err.count("\n") == 1 and err.startswith(INTERRUPTED), (delay, err)
            assert not out.exists() or any(out.iterdir()), f"an empty {out.name} was left after {delay} s"
        else:
            assert rc == 0, (delay, rc, err)
        outcomes.append(rc)
    assert outcomes[0] == 130 and outcomes.count(130) >= 3, outcomes


def test_a_port_in_use_is_named(world, one_thread):
    """`fastar play --port P` with P taken: one line naming the port and what to do, exit 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        outcome = run_forked(["play", "--weights", str(world), "--port", str(port)], timeout=60)
    assert not problems_of(outcome, must_name=f"--port {port}"), outcome.stderr
    assert "in use" in outcome.stderr


def test_a_failed_demo_leaves_no_folder(world, tmp_path, one_thread):
    """A demo that fails after its checks (weights of NaN) removes the folders it made, parents included."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(world))
    with safe_open(str(world), "pt") as f:
        metadata = f.metadata()
    tensors["text_encoder.position"] = torch.full_like(tensors["text_encoder.position"], float("nan"))
    damaged = tmp_path / "damaged.safetensors"
    save_file(tensors, str(damaged), metadata=metadata)
    out = tmp_path / "new" / "deeper" / "demo"
    outcome = run_forked(["demo", "--world", "steer", "--weights", str(damaged), "--frames", "2", "--out", str(out)])
    assert not problems_of(outcome, must_name=damaged.name), outcome.stderr
    assert not (tmp_path / "new").exists()


def test_an_import_that_ctrl_c_broke_is_an_interrupt():
    """Ctrl-C while a C extension initialises surfaces as that import's own error (matplotlib's "initialization
    failed"), raised while the KeyboardInterrupt is handled: still the interrupt's one line and exit 130."""
    from comfyui_fastar.tools.console import error_line

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ImportError("initialization failed") from None
    except ImportError as e:
        broken = e
    assert broken.__cause__ is None and isinstance(broken.__context__, KeyboardInterrupt)
    assert error_line(broken)[1] == 130
    with pytest.raises(ImportError):
        error_line(ImportError("no interrupt"))


def test_ctrl_c_while_torch_imports_is_one_line(tmp_path):
    """SIGINT from just after main() is called through the heavy imports (numpy, torch and its compiler front end)
    into a LingBot-World 2.0 run: an interrupt inside a library's import is held until the import is done, so it
    is the one 'interrupted' line, never a half-imported numpy failing later with a traceback."""
    from fuzz_lingbot import good_camera, good_model

    model, camera = good_model(tmp_path / "model"), good_camera(tmp_path / "camera")
    outcomes = []
    for i, delay in enumerate((0.01, 0.1, 0.3, 0.8, 1.6)):
        out = tmp_path / f"run-{i}"
        proc = program("generate", "--checkpoint", model, "--camera", camera, "--frames", "4", "--out", out,
                       "--height", "32", "--width", "48")
        assert proc.stdout.readline() == b"started\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        rc, _, err = finished(proc)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err)
        if rc == 130:
            assert err.count("\n") == 1 and err.startswith(INTERRUPTED), (delay, err)
            assert not out.exists() or any(out.iterdir()), f"an empty {out.name} was left after {delay} s"
        else:
            assert rc == 0, (delay, rc, err)
        outcomes.append(rc)
    assert outcomes[:3] == [130] * 3, outcomes
