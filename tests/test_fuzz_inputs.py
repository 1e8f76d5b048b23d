"""Fuzz suite: hundreds of malformed checkpoints and command-line mistakes, each run in a forked child.

Each must end with exit code 2 and one line ``fastar: error: ...`` that names the input, with no traceback, no
hang past the deadline, nothing written, and the code-running pickles' marker file never created.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fuzz_hostile import hostile_calibration, hostile_conditioning, subcommand_mistakes
from fuzz_inputs import (
    FUZZ_CFG,
    RunsCode,
    accepted_cases,
    calibration_files,
    checkpoint_cases,
    conditioning_files,
    good_metadata,
    good_state_dict,
    problems_of,
    run_forked,
    warm_up,
)

from helpers import assert_one_run

DEADLINE_S = 30.0
SMALL_RUN = ["--frames", "3", "--height", "32", "--width", "32", "--device", "cpu"]


def listing(root: Path) -> dict:
    """Every path under root with its size and mtime (symlinks not followed). A folder's own mtime is left out:
    checking that --out is writable makes and removes a probe in it, which is not writing anything."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[str(Path(dirpath) / name)] = "folder"
        for name in filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            found[str(p)] = (st.st_size, st.st_mtime_ns)
    return found


def report(failures: dict, total: int) -> str:
    lines = [f"{len(failures)} of {total} cases refused badly:"]
    for case, (problems, err) in sorted(failures.items()):
        lines.append(f"  {case}: {', '.join(problems)} | {err[-240:]!r}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("fuzz")
    save_file(good_state_dict(), str(root / "good.safetensors"), metadata=good_metadata())
    warm_up(root / "good.safetensors")
    return root


def test_malformed_checkpoints_are_refused_cleanly(fuzz_root, one_thread):
    marker = fuzz_root / "CODE-RAN"
    cases = checkpoint_cases(fuzz_root / "files", marker)
    assert len(cases) >= 200
    out_root = fuzz_root / "out"
    out_root.mkdir()
    before = listing(fuzz_root / "files")
    failures, runs, hangs, tracebacks = {}, 0, 0, 0
    for name, path in cases.items():
        out = out_root / name
        for argv in (["info", str(path)], ["generate", "--checkpoint", str(path), "--out", str(out), *SMALL_RUN]):
            outcome = run_forked(argv, timeout=DEADLINE_S)
            runs += 1
            problems = problems_of(outcome, must_name=str(path))
            hangs += outcome.hung
            tracebacks += "traceback" in problems
            if out.exists():
                problems.append("left --out behind")
            if problems:
                failures[f"{argv[0]} {name}"] = (problems, outcome.stderr.strip())
    print(f"\nfuzz: {len(cases)} files, {runs} runs, {hangs} hangs, {tracebacks} tracebacks, "
          f"{len(failures)} bad refusals")
    assert not marker.exists(), "a pickle ran code"
    assert listing(fuzz_root / "files") == before, "a run changed the input files"
    assert not any(out_root.iterdir())
    assert not failures, report(failures, runs)


def cli_mistakes(root: Path, ckpt: Path, out: Path) -> dict:
    """name -> (argv, a word the message must contain)."""
    cond = conditioning_files(root / "cond", FUZZ_CFG.text_dim)
    calib = calibration_files(root / "calib")
    existing_file = root / "existing-file"
    existing_file.write_text("keep me")
    lora_bad = root / "lora-random.pt"
    lora_bad.write_bytes(os.urandom(300))
    lora_empty = root / "lora-empty.safetensors"
    import torch
    from safetensors.torch import save_file

    save_file({"unrelated": torch.zeros(2)}, str(lora_empty))
    lora_shape = root / "lora-shape.safetensors"
    save_file({"blocks.0.self_attn.q.lora_A.weight": torch.zeros(4, 31),
               "blocks.0.self_attn.q.lora_B.weight": torch.zeros(32, 4)}, str(lora_shape))

    def gen(*extra, frames="3", hw=("32", "32"), device="cpu", out_path=None):
        argv = ["generate", "--checkpoint", str(ckpt), "--out", str(out if out_path is None else out_path),
                "--frames", frames,
                "--height", hw[0], "--width", hw[1]]
        if device is not None:
            argv += ["--device", device]
        return argv + list(extra)

    cases = {
        "device-bogus": (gen(device="bogus"), "--device"),
        "device-empty": (gen(device=""), "--device"),
        "device-cuda-index": (gen(device="cuda:99"), "--device"),
        "device-number": (gen(device="7"), "--device"),
        "device-mps": (gen(device="mps"), "--device"),
        "seed-huge": (gen("--seed", str(2**64)), "--seed"),
        "seed-negative": (gen("--seed", "-1"), "--seed"),
        "seed-giant": (gen("--seed", "1" + "0" * 40), "--seed"),
        "seed-text": (gen("--seed", "abc"), "--seed"),
        "frames-zero": (gen(frames="0"), "--frames"),
        "frames-negative": (gen(frames="-3"), "--frames"),
        "frames-absurd": (gen(frames="1000000000"), "--frames"),
        "frames-text": (gen(frames="many"), "--frames"),
        "height-not-16": (gen(hw=("60", "32")), "--height"),
        "width-not-16": (gen(hw=("32", "50")), "--width"),
        "height-zero": (gen(hw=("0", "32")), "--height"),
        "height-negative": (gen(hw=("-16", "32")), "--height"),
        "size-huge": (gen(hw=("4096", "4096")), "--height"),
        "width-absurd": (gen(hw=("32", "1600000")), "--width"),
        "frames-per-block-zero": (gen("--frames-per-block", "0"), "--frames-per-block"),
        "frames-per-block-huge": (gen("--frames-per-block", "100000"), "--frames-per-block"),
        "window-zero": (gen("--cache", "window", "--window", "0"), "--window"),
        "sink-negative": (gen("--sink", "-1"), "--sink"),
        "sink-huge": (gen("--cache", "window", "--sink", "100000"), "--sink"),
        "cache-bogus": (gen("--cache", "bogus"), "--cache"),
        "cache-window-fastar-quality": (gen("--cache", "window", "--fastar", "quality"), "window"),
        "cache-global-tempcache": (gen("--cache", "global", "--tempcache"), "global"),
        "cache-tempcache-no-tempcache": (gen("--cache", "tempcache", "--no-tempcache"), "tempcache"),
        "sink-with-global": (gen("--cache", "global", "--sink", "2"), "--sink"),
        "window-with-rolling": (gen("--cache", "rolling", "--window", "2"), "--window"),
        "mode-bogus": (gen("--mode", "bogus"), "--mode"),
        "dtype-fp8": (gen("--dtype", "fp8"), "--dtype"),
        "schedule-bogus": (gen("--schedule", "bogus"), "schedule"),
        "schedule-not-numbers": (gen("--schedule", "1,0.5,x"), "schedule"),
        "schedule-above-one": (gen("--schedule", "1500,10"), "schedule"),
        "schedule-increasing": (gen("--schedule", "0.5,0.8"), "schedule"),
        "schedule-empty": (gen("--schedule", ""), "schedule"),
        "cond-missing": (gen("--cond", str(root / "no-such-cond.safetensors")), "no-such-cond"),
        "out-existing-file": (gen(out_path=existing_file), "--out"),
        "out-under-a-file": (gen(out_path=existing_file / "run"), "--out"),
        "out-unwritable": (gen(out_path=Path("/proc/fastar-fuzz-out")), "--out"),
        "checkpoint-missing": (["generate", "--checkpoint", str(root / "nope.safetensors"), "--out", str(out),
                                "--frames", "3"], "nope.safetensors"),
        "checkpoint-absent-arg": (["generate", "--out", str(out), "--frames", "3"], "--checkpoint"),
        "unknown-option": (gen("--bogus-option", "1"), "--bogus-option"),
        "no-command": ([], "command"),
        "unknown-command": (["explode"], "explode"),
        "info-missing": (["info", str(root / "absent.pt")], "absent.pt"),
        "info-extra-argument": (["info", str(ckpt), "extra"], "extra"),
        "fastar-bogus": (gen("--fastar", "turbo"), "--fastar"),
        "fastar-off-threshold": (gen("--fastar", "off", "--threshold", "0.5"), "--threshold"),
        "fastar-off-capacity": (gen("--fastar", "off", "--capacity", "6"), "--capacity"),
        "annca-prune-no-annca": (gen("--annca-prune", "--no-annca"), "--annca-prune"),
        "threshold-above-one": (gen("--fastar", "quality", "--threshold", "2"), "threshold"),
        "threshold-zero": (gen("--fastar", "quality", "--threshold", "0"), "threshold"),
        "threshold-nan": (gen("--fastar", "quality", "--threshold", "nan"), "threshold"),
        "capacity-zero": (gen("--fastar", "quality", "--capacity", "0"), "capacity"),
        "capacity-below-chunk": (gen("--fastar", "quality", "--capacity", "4"), "capacity"),
        "capacity-huge": (gen("--cache", "tempcache", "--capacity", "1000000000"), "--capacity 1000000000"),
        "bits-zero": (gen("--fastar", "balanced", "--bits", "0"), "bits"),
        "bits-huge": (gen("--fastar", "balanced", "--bits", "99"), "bits"),
        "tables-zero": (gen("--fastar", "balanced", "--tables", "0"), "tables"),
        "warmup-two": (gen("--fastar", "balanced", "--warmup", "2"), "warmup"),
        "layers-out-of-range": (gen("--fastar", "balanced", "--layers", "99"), "layers"),
        "layers-text": (gen("--fastar", "balanced", "--layers", "a,b"), "layers"),
        "layers-auto-no-calibration": (gen("--fastar", "balanced", "--layers", "auto"), "calibration"),
        "annsa-min-keys-negative": (gen("--fastar", "balanced", "--annsa-min-keys", "-1"), "annsa_min_keys"),
        "backend-bogus": (gen("--backend", "cuda-magic"), "--backend"),
        "lora-missing": (gen("--lora", str(root / "no-lora.pt")), "no-lora.pt"),
        "lora-random-bytes": (gen("--lora", str(lora_bad)), "lora-random.pt"),
        "lora-no-pairs": (gen("--lora", str(lora_empty)), "lora-empty"),
        "lora-wrong-shape": (gen("--lora", str(lora_shape)), "lora-shape"),
    }
    cond.update(hostile_conditioning(root / "cond-hostile"))
    calib.update(hostile_calibration(root / "calib-hostile"))
    cases["lora-deep-pickle"] = (gen("--lora", str(cond["deep-pickle"])), cond["deep-pickle"].name)
    cases["out-empty"] = (gen(out_path=""), "--out")
    for name, path in cond.items():
        cases[f"cond-{name}"] = (gen("--cond", str(path)), path.name)
    for name, path in calib.items():
        cases[f"calibration-{name}"] = (gen("--fastar", "balanced", "--layers", "auto", "--calibration", str(path)),
                                        path.name)
    cases["calibration-missing"] = (gen("--fastar", "balanced", "--layers", "auto", "--calibration",
                                        str(root / "no-calibration.json")), "no-calibration.json")
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        cases["device-cuda-without-cuda"] = (gen(device="cuda"), "--device")
    return cases


def test_command_line_mistakes_are_refused_cleanly(fuzz_root, one_thread):
    from safetensors.torch import save_file

    root = fuzz_root / "cli"
    root.mkdir()
    ckpt = root / "good.safetensors"
    save_file(good_state_dict(), str(ckpt), metadata=good_metadata())
    out = root / "run"
    cases = cli_mistakes(root, ckpt, out)
    assert len(cases) >= 50
    before = listing(root)
    failures, hangs, tracebacks = {}, 0, 0
    for name, (argv, word) in cases.items():
        outcome = run_forked(argv, timeout=DEADLINE_S)
        problems = problems_of(outcome, must_name=word)
        hangs += outcome.hung
        tracebacks += "traceback" in problems
        if listing(root) != before:
            problems.append("wrote something")
            before = listing(root)
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    print(f"\ncli fuzz: {len(cases)} cases, {hangs} hangs, {tracebacks} tracebacks, {len(failures)} bad refusals")
    assert not failures, report(failures, len(cases))


def test_odd_but_usable_files_load_and_say_what_is_odd(fuzz_root, one_thread):
    """The fuzz cases are derived from a file that loads; the odd-but-usable ones load too, and say so."""
    ckpt = fuzz_root / "good.safetensors"
    outcome = run_forked(["info", str(ckpt)])
    assert outcome.rc == 0, outcome.stderr
    run = fuzz_root / "good-run"
    outcome = run_forked(["generate", "--checkpoint", str(ckpt), "--out", str(run), *SMALL_RUN])
    assert outcome.rc == 0, outcome.stderr
    assert_one_run(run)
    for name, path in accepted_cases(fuzz_root / "accepted").items():
        outcome = run_forked(["info", str(path), "--json"])
        assert outcome.rc == 0, (name, outcome.stderr)
        summary = json.loads(outcome.stdout)
        if name.startswith("comfy-"):
            assert summary["causal_ar_marker"] is None, name
        if name == "mixed-dtypes":
            fp32 = FUZZ_CFG.num_layers  # one norm3.weight per layer stored as fp32
            assert summary["file_dtypes"] == {"bfloat16": len(good_state_dict()) - fp32, "float32": fp32}
            assert summary["dtype"] == "bfloat16"
            assert "mixes" in run_forked(["info", str(path)]).stdout


def test_every_subcommand_refuses_bad_options_before_any_work(fuzz_root, one_thread):
    """demo, bench, calibrate, gpu-check and train-demo: one line each, nothing written, and neither a planted
    training state nor --init-from runs the code a pickle carries."""
    import torch

    # What each command imports, imported once here rather than in every forked child.
    from comfyui_fastar.tools import calibrate, command_checks, demo_command  # noqa: F401
    from comfyui_fastar.tools.bench import pareto, scenarios  # noqa: F401
    from comfyui_fastar.tools.demo import train  # noqa: F401

    root = fuzz_root / "subcommands"
    root.mkdir()
    marker = root / "CODE-RAN"
    RunsCode.marker = str(marker)
    evil = root / "evil.pt"
    torch.save({"model": {}, "x": RunsCode()}, evil)
    deep = hostile_conditioning(root / "deep")["deep-pickle"]
    cases = subcommand_mistakes(root, evil, deep)
    before = listing(root)
    failures = {}
    for name, (argv, word) in cases.items():
        outcome = run_forked(argv, timeout=DEADLINE_S)
        problems = problems_of(outcome, must_name=word)
        if listing(root) != before:
            problems.append("wrote something")
            before = listing(root)
        if problems:
            failures[name] = (problems, outcome.stderr.strip())
    print(f"\nsubcommand fuzz: {len(cases)} cases, {len(failures)} bad refusals")
    assert not marker.exists(), "a pickle ran code"
    assert not failures, report(failures, len(cases))
