"""Rollouts timed chunk by chunk in turn: the order of work, and that outputs do not depend on it."""

import pytest
import torch

from comfyui_fastar.tools.bench.interleave import median_rows, run_in_turns


def logging_jobs(lengths, log):
    def make(name, n):
        def job(on_chunk):
            for i in range(n):
                log.append((name, i))
                on_chunk({"seconds": 0.0})
            return name

        return job

    return {name: make(name, n) for name, n in lengths.items()}


def test_jobs_take_turns_chunk_by_chunk_and_each_round_starts_one_later():
    log = []
    out = run_in_turns(logging_jobs({"a": 3, "b": 3, "c": 3}, log))
    assert out == {"a": "a", "b": "b", "c": "c"}
    assert [n for n, _ in log] == list("abc" "bca" "cab")
    log.clear()
    run_in_turns(logging_jobs({"a": 1, "b": 3}, log))  # a finished job leaves the rotation
    assert [n for n, _ in log] == list("abbb")


def test_an_error_in_one_job_reaches_the_caller_and_the_others_finish():
    log = []
    jobs = logging_jobs({"a": 2, "b": 4}, log)

    def broken(on_chunk):
        on_chunk({})
        raise RuntimeError("chunk failed")

    jobs["broken"] = broken
    with pytest.raises(RuntimeError, match="chunk failed"):
        run_in_turns(jobs)
    assert sorted(log) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("b", 3)]


def test_median_rows_keeps_every_round():
    runs = [[{"seconds": s, "index": 0}] for s in (3.0, 1.0, 2.0)]
    row = median_rows(runs)[0]
    assert row["seconds"] == 2.0 and row["seconds_each_round"] == [3.0, 1.0, 2.0] and row["index"] == 0


def test_rollouts_in_turn_give_the_same_video_as_alone(one_thread):
    from comfyui_fastar.tools.bench.rollout import run_mode, timed_rollouts
    from comfyui_fastar.tools.bench.scenarios import bench_modes, demo_scenario

    scenario = demo_scenario(0)
    modes = {n: bench_modes()[n] for n in ("dense-global", "tempcache")}
    results, per_mode = timed_rollouts(scenario, modes, frames=9, seed=0, repeats=2, progress=False)
    for name, mode in modes.items():
        alone, _ = run_mode(scenario, *mode, frames=9, seed=0)
        assert torch.equal(results[name].latent, alone.latent), name
        assert len(per_mode[name]["chunks"]) == 3
        assert all(len(r["seconds_each_round"]) == 2 for r in per_mode[name]["chunks"])


def test_attention_bench_times_its_paths_in_rotating_rounds():
    from comfyui_fastar.tools.bench.attention import _time_in_rounds

    log = []
    calls = {n: (log.append, (n,), {}) for n in "abc"}
    seconds = _time_in_rounds(3, calls)
    assert set(seconds) == set("abc") and all(s >= 0 for s in seconds.values())
    assert "".join(log) == "abc" + "abc" "bca" "cab"  # one warm-up call each, then rotating rounds


def test_an_interrupt_while_the_threads_start_stops_and_joins_those_started(monkeypatch):
    """Ctrl-C that lands while the rollout threads are still being started (after the first started, before the
    join): the started worker is stopped at its next turn and joined, so none is left inside torch when the
    interpreter exits (which aborts the process)."""
    import threading

    started = []
    original_start = threading.Thread.start

    def start_then_interrupt(self):
        original_start(self)
        started.append(self)
        if len(started) == 1:
            raise KeyboardInterrupt

    def endless(on_chunk):
        while True:
            on_chunk({"seconds": 0.0})

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_in_turns({"a": endless, "b": endless})
    assert len(started) == 1 and not started[0].is_alive()
