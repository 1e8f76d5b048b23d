"""`fastar gpu-check`: the whole plan as a CPU dry run, and a cut-off run that still reports."""

import json

from comfyui_fastar.tools import cli, gpu_check


def test_dry_run_of_the_whole_plan_on_cpu(tmp_path):
    from comfyui_fastar.kernels import verify

    before = verify.verification_enabled()
    report = gpu_check.run_gpu_check(tmp_path, deadline_s=600, dry_run=True, isolate=False)
    assert verify.verification_enabled() == before  # in-process steps restore the setting
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["steps"].keys() == set(gpu_check.STEPS) and saved == json.loads(json.dumps(report, default=str))
    assert {r["status"] for r in saved["steps"].values()} == {"done"}, saved
    verify = saved["steps"]["verify"]
    assert verify["families"] >= 5 and verify["failed"] == []
    correctness = saved["steps"]["correctness"]
    assert correctness["cases"] >= 4 and correctness["failed"] == []
    cases = json.loads((tmp_path / "correctness.json").read_text())["cases"]
    assert {("dense", "triton"), ("dense", "torch"), ("sparse", "triton"), ("dense", "sdpa_fold")} <= {
        (c["kind"], c["backend"]) for c in cases}
    assert (tmp_path / "kernels" / "kernels.json").exists()
    rollout = saved["steps"]["bench_rollout"]
    assert rollout["dense-global"]["frames"] == rollout["all"]["frames"] == 3


def test_a_step_past_its_deadline_is_reported_and_the_rest_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "GRACE_S", 0)
    monkeypatch.setattr(gpu_check, "SHARE", {"verify": 0.001, "correctness": 0.001, "bench_kernels": 0.001,
                                             "bench_rollout": 1.0})
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 0.5)
    report = gpu_check.run_gpu_check(tmp_path, deadline_s=1.0, dry_run=False, steps=("verify", "bench_rollout"))
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["steps"]["verify"]["status"] == "skipped"  # 1 ms of budget: not started
    assert saved["steps"]["bench_rollout"]["status"] in ("timeout", "skipped")
    assert report["steps"].keys() == saved["steps"].keys()


def test_the_command_line_runs_the_check(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(gpu_check, "run_gpu_check",
                        lambda out, deadline_s, dry_run: seen.update(out=out, deadline=deadline_s, dry=dry_run)
                        or {"steps": {"verify": {"status": "done"}}})
    assert cli.main(["gpu-check", "--out", str(tmp_path), "--deadline", "120", "--dry-run"]) == 0
    assert seen == {"out": str(tmp_path), "deadline": 120.0, "dry": True}
