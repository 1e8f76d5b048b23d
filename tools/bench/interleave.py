"""Timing rollouts against each other on a shared machine: chunk by chunk, in turn, in rotating rounds.

Every rollout runs in its own thread, but only the one holding the turn works: after each chunk it hands the turn
to the next rollout, and the order rotates by one every round (a round is one chunk of every rollout still
running). A burst of load from other processes therefore falls on neighbouring chunks of every mode alike. The
sampler's per-chunk seconds start after the turn is taken and stop before it is handed on, so they never include
the wait, and ratios of them mean what they say. With ``repeats`` > 1 the whole set runs again and each chunk's
time is the median over repeats (and so is its CPU time, where the rows carry one).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable


class Stopped(Exception):
    """Raised in a worker at its next turn once the run is stopped."""


class Turns:
    """Whose turn it is among named workers; the order of a round rotates every round."""

    def __init__(self, names):
        self._cond = threading.Condition()
        self._queue = deque(names)
        self._in_round = 0
        self.stopped = False

    def wait(self, name: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.stopped or (self._queue and self._queue[0] == name))
        if self.stopped:
            raise Stopped

    def stop(self) -> None:
        """Every worker ends at its next turn (the caller was interrupted)."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def done(self, name: str) -> None:
        """``name`` (holding the turn) finished a chunk: the next worker's turn."""
        with self._cond:
            self._queue.rotate(-1)
            self._in_round += 1
            if self._in_round >= len(self._queue):
                self._in_round = 0
                self._queue.rotate(-1)  # next round starts one worker later
            self._cond.notify_all()

    def leave(self, name: str) -> None:
        with self._cond:
            if name in self._queue:
                self._queue.remove(name)
            self._in_round = min(self._in_round, max(0, len(self._queue) - 1))
            self._cond.notify_all()


Job = Callable[[Callable[[dict], None]], object]  # job(on_chunk) runs one rollout, calling on_chunk after chunks


def run_in_turns(jobs: dict[str, Job]) -> dict[str, object]:
    """Run ``jobs`` chunk by chunk in turn (see the module docstring); returns ``name -> job's result``."""
    turns = Turns(list(jobs))
    results, errors = {}, {}

    def work(name, job):
        try:
            turns.wait(name)

            def hand_on(_row):
                turns.done(name)
                turns.wait(name)

            results[name] = job(hand_on)
        except BaseException as e:  # re-raised in the caller's thread below
            errors[name] = e
        finally:
            turns.leave(name)

    # Not daemons: a worker still running when the interpreter exits would be inside torch, which aborts the
    # process ("terminate called without an active exception") instead of letting it end with one line.
    threads = [threading.Thread(target=work, args=item, name=f"rollout {item[0]}") for item in jobs.items()]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        # Interrupted (Ctrl-C), also while the threads were starting: each worker ends at its next turn (one that
        # starts after this ends at its first) and is joined here, so none is inside torch when the caller ends.
        turns.stop()
        for t in threads:
            if t.ident is not None:
                t.join()
        raise
    if errors:
        name, error = next(iter(errors.items()))
        raise error
    return results


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per-chunk rows of the first run with ``seconds`` (and ``cpu_seconds``) = the median over runs, each run's
    kept (``seconds_each_round``, ``cpu_seconds_each_round``)."""
    rows = [dict(r) for r in runs[0]]
    for i, row in enumerate(rows):
        each = [run[i]["seconds"] for run in runs]
        row["seconds_each_round"] = [round(s, 5) for s in each]
        row["seconds"] = statistics.median(each)
        if all("cpu_seconds" in run[i] for run in runs):
            cpu = [run[i]["cpu_seconds"] for run in runs]
            row["cpu_seconds_each_round"] = [round(s, 5) for s in cpu]
            row["cpu_seconds"] = statistics.median(cpu)
    return rows
