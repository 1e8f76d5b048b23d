"""Whether a rollout's cost per chunk stays flat, measured so the answer holds on a busy machine.

On a machine shared with other work a chunk's wall time is mostly the wait for a core, and even its CPU time moves
by a third: other processes share the caches and the memory bus, in phases minutes long, and in bursts of seconds
that slow every chunk run during them. So a rollout is timed chunk by chunk in turn (``interleave.run_in_turns``)
beside a **reference**, a fixed piece of the same work run once per round of chunks. The reference's CPU time, as a
median over the ``REFERENCE_REACH`` rounds of chunks on either side, is what the machine's phase makes of fixed
work there; a chunk's **relative cost** is its own CPU time over that. Whole rounds run one after another, so a
burst that slows one round's chunk misses the others': a chunk's relative cost is its least over the rounds (a
burst only ever adds time). A chunk's CPU time is its own thread's (``time.thread_time``) from taking its turn to
handing it on, with Python's garbage collector run between chunks, outside the timing (as ``timeit`` keeps it).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

REFERENCE = "reference"
REFERENCE_REACH = 5  # rounds of chunks on either side the reference is taken over


def reference_job(work: Callable[[], object], turns: int):
    """A job for ``run_in_turns``: ``work`` (the same every time) run ``turns`` times, each timed by its thread's
    CPU time; the job's result is ``(None, [seconds per turn])``."""

    def job(hand_on):
        rows = []
        for _ in range(turns):
            start = time.thread_time()
            work()
            rows.append(time.thread_time() - start)
            gc.collect()
            hand_on(None)
        return None, rows

    return job


def chunk_timer(hand_on) -> tuple[Callable[[], float], Callable[[], None]]:
    """(``took``, ``next_chunk``) for a rollout run in turns: ``took()`` is the CPU time of this thread since it
    took its turn; ``next_chunk()`` collects garbage, hands the turn on and starts the next chunk's clock."""
    start = [time.thread_time()]

    def took() -> float:
        return time.thread_time() - start[0]

    def next_chunk() -> None:
        gc.collect()  # between chunks: never inside a timed one
        hand_on(None)
        start[0] = time.thread_time()

    return took, next_chunk


def smoothed(values: list[float], reach: int = REFERENCE_REACH) -> list[float]:
    """Each value's median with its ``reach`` neighbours on either side."""
    return [statistics.median(values[max(0, i - reach):i + reach + 1]) for i in range(len(values))]


def deviation(values: list[float], tolerance: float) -> tuple[float, float, float]:
    """(median, largest |value / median - 1|, share within ``tolerance``)."""
    mid = statistics.median(values)
    devs = [abs(v / mid - 1) for v in values]
    return mid, max(devs), sum(d <= tolerance for d in devs) / len(devs)


def relative_rows(runs: list[list[dict]], references: list[list[float]]) -> list[dict]:
    """Per chunk of a rollout timed in ``len(runs)`` rounds (rows with ``cpu_seconds``), beside the reference's
    smoothed CPU time at each chunk of each round: the first round's row, with ``relative_cost`` the least over the
    rounds of its CPU time over the reference's there, ``cpu_seconds`` its least raw CPU time, and every round's
    figures (``*_each_round``)."""
    rows = []
    for i, row in enumerate(runs[0]):
        cpu = [run[i]["cpu_seconds"] for run in runs]
        relative = [c / ref[i] for c, ref in zip(cpu, references)]
        rows.append({**row, "relative_cost": round(min(relative), 5), "cpu_seconds": round(min(cpu), 6),
                     "relative_cost_each_round": [round(v, 5) for v in relative],
                     "cpu_seconds_each_round": [round(c, 6) for c in cpu],
                     "reference_cpu_seconds_each_round": [round(ref[i], 6) for ref in references]})
    return rows
