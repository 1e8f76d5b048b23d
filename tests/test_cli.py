"""The command line: ``fastar info`` and ``fastar generate`` on a tiny checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from comfyui_fastar.fastar_core.files.wan_checkpoint import save_checkpoint
from comfyui_fastar.tools.cli import main

from helpers import TINY, tiny_model


@pytest.fixture()
def ckpt(tmp_path):
    path = tmp_path / "tiny_ar.safetensors"
    save_checkpoint(tiny_model(), path, dtype=torch.float32)
    return path


def test_info_prints_family_config_dtype_parameters_prefix(ckpt, capsys):
    assert main(["info", str(ckpt)]) == 0
    out = capsys.readouterr().out
    for phrase in ("custom", "dim 64", "2 heads x 32", "float32", "parameters", "prefix stripped: (none)"):
        assert phrase in out
    assert main(["info", str(ckpt), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["num_layers"] == 2 and summary["parameters"] > 0


def test_info_says_which_weights_entry_it_takes_and_follows_the_override(tmp_path, capsys):
    ema, plain = tiny_model(1).state_dict(), tiny_model(2).state_dict()
    path = tmp_path / "longlive_base.pt"
    torch.save({"generator": {"model." + k: v for k, v in plain.items()},
                "generator_ema": {"model." + k: v for k, v in ema.items()}, "fastar_config": TINY.to_dict()}, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "from 'generator' (auto: longlive loads generator (its inference configs set use_ema: false))" in out
    assert main(["info", str(path), "--weights-entry", "generator_ema", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["container"] == "generator_ema" and summary["weights_choice"] == "chosen by weights_entry"
    with pytest.raises(SystemExit) as stop:
        main(["info", str(path), "--weights-entry", "ema"])
    assert stop.value.code == 2 and "--weights-entry: invalid choice: 'ema'" in capsys.readouterr().err


def test_info_refuses_a_bad_file_with_one_line(tmp_path, capsys):
    bad = tmp_path / "vae.safetensors"
    save_file({"decoder.weight": torch.zeros(2)}, str(bad))
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastar: error:") and "not a Wan2.1" in err and len(err.splitlines()) == 1


def test_generate_writes_latent_and_chunk_stats(ckpt, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["generate", "--checkpoint", str(ckpt), "--frames", "9", "--height", "64", "--width", "64",
            "--out", str(out), "--cache", "window", "--window", "9", "--seed", "3", "--device", "cpu"]
    assert main(args) == 0
    assert "seeded random stand-in" in capsys.readouterr().out
    latent = load_file(str(out / "latent.safetensors"))["latent"]
    assert latent.shape == (1, 16, 9, 8, 8)
    stats = json.loads((out / "stats.json").read_text())
    assert [c["index"] for c in stats["chunks"]] == [0, 1, 2]
    for chunk in stats["chunks"]:
        assert {"index", "frames", "seconds", "cache_bytes"} <= set(chunk)
    assert stats["conditioning"].startswith("seeded random")


def test_generate_with_krea_recompute_and_a_first_chunk_schedule(ckpt, tmp_path):
    out = tmp_path / "krea"
    args = ["generate", "--checkpoint", str(ckpt), "--frames", "9", "--height", "64", "--width", "64",
            "--out", str(out), "--cache", "recompute", "--sink", "1", "--window", "6", "--schedule", "krea",
            "--first-schedule", "self-forcing", "--device", "cpu"]
    assert main(args) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["cache"]["policy"] == "recompute" and stats["schedule"]["timesteps"][-1] == 0.0
    assert max(c["cache_bytes"] for c in stats["chunks"]) == stats["chunks"][-1]["cache_bytes"] > 0


def test_generate_with_fastar_reports_groups_density_and_recall(ckpt, tmp_path):
    cond = tmp_path / "cond.safetensors"
    save_file({"context": torch.cat([torch.randn(1, 5, 32), torch.zeros(1, 11, 32)], dim=1)}, str(cond))
    out = tmp_path / "fastar"
    args = ["generate", "--checkpoint", str(ckpt), "--frames", "12", "--height", "64", "--width", "64",
            "--cond", str(cond), "--out", str(out), "--fastar", "balanced", "--capacity", "6", "--measure",
            "--annsa-min-keys", "0", "--annca-prune",
            "--device", "cpu"]
    assert main(args) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["cache"]["policy"] == "tempcache" and stats["cache"]["tempcache"]["capacity_frames"] == 6
    assert stats["fastar"]["annca"] and stats["fastar"]["annca_prune"]
    late = stats["chunks"][-1]
    assert len(late["groups"]) == 2
    assert 0 < late["density"] <= 1 and 0 < late["recall"] <= 1


def test_generate_refuses_krea_without_its_first_frame_and_notes_causvid_past_one_rollout(ckpt, tmp_path, capsys):
    """The command line loads no VAE: Krea's keep_first_frame off (recompute, sink 0) re-encodes decoded frames, so
    it is refused; CausVid past 21 frames runs as one rollout, and says that its own long video restarts."""
    base = ["generate", "--checkpoint", str(ckpt), "--height", "32", "--width", "32", "--device", "cpu"]
    krea = base + ["--frames", "9", "--out", str(tmp_path / "k"), "--cache", "recompute", "--sink", "0",
                   "--window", "6", "--schedule", "krea"]
    assert main(krea) == 2
    err = capsys.readouterr().err
    assert "--cache recompute --sink 0" in err and "loads no VAE: use --sink 1" in err
    assert not (tmp_path / "k").exists()
    assert main(base + ["--frames", "24", "--out", str(tmp_path / "c"), "--schedule", "causvid"]) == 0
    assert "CausVid's own long video restarts every 21 latent frames" in capsys.readouterr().out


def test_generate_rejects_bad_sizes(ckpt, tmp_path, capsys):
    args = ["generate", "--checkpoint", str(ckpt), "--frames", "3", "--height", "60", "--width", "64",
            "--out", str(tmp_path / "x"), "--device", "cpu"]
    assert main(args) == 2
    assert "--height 60 is not a multiple of 16" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_generates_on_cpu(tmp_path, dtype, one_thread):
    """Released checkpoints are bf16: they run on a CPU with their weights kept in half precision, and the
    video follows the fp32 run of the same weights."""
    outs = {}
    for name, dt in (("half", dtype), ("fp32", torch.float32)):
        path = tmp_path / f"{name}.safetensors"
        save_checkpoint(tiny_model(), path, dtype=dt)
        out = tmp_path / f"run-{name}"
        args = ["generate", "--checkpoint", str(path), "--frames", "6", "--height", "32", "--width", "32",
                "--out", str(out), "--device", "cpu"]
        assert main(args) == 0
        outs[name] = load_file(str(out / "latent.safetensors"))["latent"]
    assert torch.isfinite(outs["half"]).all()
    err = (outs["half"] - outs["fp32"]).pow(2).mean() / outs["fp32"].pow(2).mean()
    assert err < 1e-2, err


def test_generate_checks_the_action_script_before_reading_the_checkpoint(tmp_path, capsys):
    script = tmp_path / "walk.txt"
    script.write_text("variant universal\n0 W\n1 W X\n")
    out = tmp_path / "run"
    args = ["generate", "--checkpoint", str(tmp_path / "absent.safetensors"), "--frames", "3", "--height", "32",
            "--width", "32", "--out", str(out), "--device", "cpu", "--actions", str(script)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fastar: error: --actions {script}: line 3 (at 1 s): unknown key 'X' for universal; valid: "
                   "W (forward), S (back), A (left), D (right), I (camera_up), K (camera_down), J (camera_l), "
                   "L (camera_r)")
    assert not out.exists()
    assert main(args[:-1] + [str(tmp_path / "none.json")]) == 2
    assert f"--actions {tmp_path / 'none.json'}: no such file" in capsys.readouterr().err


def test_generate_refuses_actions_for_a_checkpoint_that_takes_none(ckpt, tmp_path, capsys):
    script = tmp_path / "walk.json"
    script.write_text(json.dumps({"variant": "universal", "timeline": [{"at": 0, "keys": ["W"]}]}))
    out = tmp_path / "run"
    assert main(["generate", "--checkpoint", str(ckpt), "--frames", "3", "--height", "32", "--width", "32",
                 "--out", str(out), "--device", "cpu", "--actions", str(script)]) == 2
    err = capsys.readouterr().err
    assert "--actions" in err and "this checkpoint (custom) takes no actions; only Matrix-Game 2.0" in err
    assert not out.exists()
