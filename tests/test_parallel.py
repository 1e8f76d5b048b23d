"""Sequence parallelism on CPU: two gloo ranks, spawned here, against one process.

The ranks run as real processes (``torchrun`` for the command line, plain environment variables where a test must
kill one), importing this checkout as ``comfyui_fastar`` through a link on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from comfyui_fastar.fastar_core.caches.spec import CacheSpec, TempCacheSettings
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.fastar_core.forward.parallel import SequenceParallel, check_settings
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.tools.bench.cost_model import ModelShape
from comfyui_fastar.tools.bench.cost_parallel import chunk_traffic_bytes
from comfyui_fastar.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
# Four heads, so each of two ranks attends with two of them (the all-to-all's head groups are not single heads).
FOUR_HEADS = WanConfig(dim=64, num_heads=4, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)
GENERATE = ["generate", "--frames", "12", "--height", "64", "--width", "64", "--seed", "5", "--device", "cpu"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """PYTHONPATH with this checkout linked as ``comfyui_fastar``, one thread per rank."""
    base = tmp_path_factory.mktemp("sp")
    (base / "comfyui_fastar").symlink_to(ROOT, target_is_directory=True)
    # faulthandler: a rank that aborts prints its Python stack, so a rare abort leaves evidence of where it was
    e = dict(os.environ, PYTHONPATH=str(base), OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    e.pop("WORLD_SIZE", None)
    return e


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp_ckpt") / "four_heads.safetensors"
    save_checkpoint(random_wan(FOUR_HEADS, seed=11), path, dtype=torch.float32)
    return path


def torchrun(env, args, ranks=2, timeout=240, module=True):
    """``args`` (a ``comfyui_fastar`` command, or with ``module=False`` a script and its arguments) on ``ranks``
    ranks. No retry: a rank that dies at teardown is a failure (``parallel.end_rank_process`` says why it
    cannot)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           *(["-m", "comfyui_fastar"] if module else []), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def ranks_said(done) -> str:
    """What the ranks printed on stderr, before the launcher's own traceback (which says only which rank died)."""
    return done.stderr.split("Traceback (most recent call last)")[0][-3000:]


def relative_error(a, b):
    return float((a - b).norm() / a.norm())


@pytest.mark.parametrize("policy", [
    ["--cache", "global"],
    ["--cache", "window", "--window", "6", "--sink", "1"],
    ["--cache", "tempcache", "--capacity", "6", "--sink", "1"],
    ["--cache", "rolling", "--mode", "rolling", "--schedule", "rolling-forcing"],
    ["--fastar", "fast", "--annca-prune"],
], ids=["global", "window", "tempcache", "rolling", "fastar-fast-annca-prune"])
def test_two_ranks_under_torchrun_give_the_one_process_latents(env, ckpt, tmp_path, policy):
    args = [*GENERATE, "--checkpoint", str(ckpt), *policy]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    done = torchrun(env, [*args, "--out", str(tmp_path / "two")])
    assert done.returncode == 0, ranks_said(done)
    one = load_file(str(tmp_path / "one" / "latent.safetensors"))["latent"]
    two = load_file(str(tmp_path / "two" / "latent.safetensors"))["latent"]
    assert relative_error(one, two) <= 1e-6
    stats_one = json.loads((tmp_path / "one" / "stats.json").read_text())
    stats_two = json.loads((tmp_path / "two" / "stats.json").read_text())
    assert stats_two["sequence_parallel"] == {"ranks": 2, "heads_per_rank": 2}
    # Each rank keeps the keys and values of its own heads: about half of one process's bytes (the positions
    # and biases of the entries are kept whole on every rank).
    for c1, c2 in zip(stats_one["chunks"], stats_two["chunks"]):
        assert 0.45 * c1["cache_bytes"] <= c2["cache_bytes"] <= 0.55 * c1["cache_bytes"]


def test_the_byte_counter_matches_the_hand_count_of_the_cost_model(env, ckpt, tmp_path):
    done = torchrun(env, [*GENERATE, "--checkpoint", str(ckpt), "--cache", "global", "--out", str(tmp_path / "r")])
    assert done.returncode == 0, ranks_said(done)
    chunks = json.loads((tmp_path / "r" / "stats.json").read_text())["chunks"]
    shape = ModelShape("four heads", dim=64, heads=4, layers=2, ffn=128, tokens_per_frame=16, text_tokens=512,
                       frames_per_block=3, steps=4)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1  # the last chunk has no clean pass
        want = chunk_traffic_bytes(shape, 3 * 16, 2, clean_pass=not last, bytes_per=4)
        assert chunk["sent_bytes"] == want, (i, chunk["sent_bytes"], want)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_killed_rank_ends_every_rank_with_one_clear_error_and_nothing_written(env, ckpt, tmp_path):
    out = tmp_path / "killed"
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        e = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
        args = ["generate", "--checkpoint", str(ckpt), "--frames", "300", "--height", "64", "--width", "64",
                "--device", "cpu", "--out", str(out)]
        procs.append(subprocess.Popen([sys.executable, "-m", "comfyui_fastar", *args], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    rank0, rank1 = procs
    deadline = time.monotonic() + 120
    first = rank0.stdout.readline()  # rank 0 reports progress; wait until the rollout is under way
    while "chunk" not in first and time.monotonic() < deadline:
        first = rank0.stdout.readline()
    assert "chunk" in first
    rank1.send_signal(signal.SIGKILL)
    rank1.wait(timeout=30)
    rank0.stdout.read()
    err = rank0.stderr.read()
    assert rank0.wait(timeout=120) == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastar: error: rank 0 of 2:"), err
    assert "another rank" in lines[0]
    assert not out.exists()


def test_uneven_splits_and_cross_head_settings_are_refused_before_any_work():
    with pytest.raises(FastARError, match="4 attention heads do not split over 3 ranks"):
        SequenceParallel(rank=0, world=3).check_geometry(4, 18)
    with pytest.raises(FastARError, match="15 tokens per latent frame do not split over 2 ranks"):
        SequenceParallel(rank=0, world=2).check_geometry(4, 15)
    shared = CacheSpec(policy="tempcache", tempcache=TempCacheSettings(merge_scope="shared"))
    with pytest.raises(FastARError, match="merge_scope 'shared'"):
        check_settings(shared, None)
    check_settings(CacheSpec(policy="tempcache"), None)


WORKER = """
import sys, torch
from safetensors.torch import save_file
from comfyui_fastar.fastar_core.files.wan_checkpoint import load_checkpoint, build_model
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.forward.parallel import end_rank_process, init_from_launcher, leave_group
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig

def rollout(parallel):
    model = build_model(load_checkpoint(sys.argv[1]), device="cpu")
    s = resolve_settings(preset="balanced", cache_policy="tempcache", attention_overrides={{"annsa_min_keys": 0,
                         "layers": "all", "annca_prune": True, "dense_warmup": 0.0}}, num_layers=2)
    if len(sys.argv) > 3:  # negative control: every rank hashes with the first heads' planes
        CausalRunner.head_range = property(lambda self: (0, self.local_heads))
    runner = CausalRunner(model, parallel=parallel)
    sampler = build_sampler(runner, s.fastar, measure=True)
    cfg = RolloutConfig(num_frames=12, latent_height=8, latent_width=8, frames_per_block=3, seed=2,
                        cache=s.cache, channels=16)
    ctx = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(4))
    result = sampler.generate(ctx, cfg)
    density = [c.extra.get("density") for c in result.chunks]
    return result.latent, density

parallel = init_from_launcher(torch.device("cpu"))
latent, density = rollout(parallel)
if parallel is None or parallel.rank == 0:
    save_file({{"latent": latent.contiguous()}}, sys.argv[2])
    print("density", density)
if parallel is not None:
    leave_group()
    end_rank_process(0)
"""


def test_annsa_buckets_and_annca_pruning_agree_across_ranks(env, ckpt, tmp_path):
    """Sparse self-attention hashes each rank's heads with those heads' planes, and a prompt token kept for a
    frame on any rank is kept on all: the sequence-parallel rollout equals one process with both engaged."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format())
    one = subprocess.run([sys.executable, str(script), str(ckpt), str(tmp_path / "one.safetensors")], env=env,
                         capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun(env, [str(script), str(ckpt), str(tmp_path / "two.safetensors")], module=False)
    assert two.returncode == 0, ranks_said(two)
    for run in (one, two):  # sparse attention engaged (rank 0 reports the density of its own heads)
        densities = [float(x) for x in run.stdout.split("[")[1].rstrip("]\n").split(",") if x.strip() != "None"]
        assert densities and min(densities) < 1.0
    a = load_file(str(tmp_path / "one.safetensors"))["latent"]
    b = load_file(str(tmp_path / "two.safetensors"))["latent"]
    assert relative_error(a, b) <= 1e-6
    wrong = torchrun(env, [str(script), str(ckpt), str(tmp_path / "wrong.safetensors"), "wrong-planes"], module=False)
    assert wrong.returncode == 0, ranks_said(wrong)
    c = load_file(str(tmp_path / "wrong.safetensors"))["latent"]
    assert relative_error(a, c) > 1e-4  # the comparison sees ranks that bucket with another head's planes
