"""What the machine around a run does cannot cost the run: a closed or full stdout, an encoding that cannot print
the output path, an interrupt, a file-size limit. Each test runs `fastar` in a real process (pipes, signals and
limits are the operating system's) and asserts one clear line, or a complete run."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from comfyui_fastar.fastar_core.checkpoint import save_checkpoint
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
    return path


def fastar(*argv, env=None, **kw):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-c", LAUNCH, *map(str, argv)], env=full_env, **kw)


def finished(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


def assert_complete(out: Path, seed: int):
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["seed"] == seed
    assert load_file(str(out / LATENT_FILE))["latent"].shape[2] == 6


def test_a_closed_stdout_does_not_stop_the_run(ckpt, tmp_path):
    """`fastar generate ... | head -1`: the reader goes after one line, the run finishes anyway."""
    out = tmp_path / "piped"
    proc = fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "4", *RUN, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    proc.stdout = None
    rc, _, err = finished(proc)
    assert rc == 0 and err == "", err
    assert_complete(out, 4)


def test_a_full_stdout_does_not_stop_the_run(ckpt, tmp_path):
    out = tmp_path / "full"
    with open("/dev/full", "w") as full:
        rc, _, err = finished(fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "5", *RUN,
                                     stdout=full, stderr=subprocess.PIPE))
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
    assert finished(fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "7", *RUN))[0] == 0
    proc = fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "8", "--frames", "3000", "--height",
                  "32", "--width", "32", "--device", "cpu", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while b"chunk" not in proc.stdout.readline():
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    rc, _, err = finished(proc)
    assert rc == 130
    assert err.count("\n") == 1 and err.startswith("fastar: error: interrupted"), err
    assert_complete(out, 7)


def test_a_file_size_limit_is_one_line_naming_the_folder(ckpt, tmp_path):
    """`ulimit -f`: the latent cannot be written; the message names the folder, the earlier run stays."""
    out = tmp_path / "limited"
    assert finished(fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "9", *RUN))[0] == 0

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    rc, _, err = finished(fastar("generate", "--checkpoint", ckpt, "--out", out, "--seed", "10", *RUN,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit))
    assert rc == 2 and err.count("\n") == 1 and err.startswith("fastar: error: "), err
    assert str(out) in err and "File too large" in err and "Traceback" not in err
    assert_complete(out, 9)


def test_the_same_weights_as_pt_and_safetensors_give_the_same_latent(tmp_path, capsys):
    """A .pt has no config; its head count comes from the family's known shapes (the demo model's here), so
    both forms build the same model and the same video, bit for bit."""
    from comfyui_fastar.fastar_core.wan_model import random_wan
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

