"""TempCache's seconds per chunk over the window's at equal capacity, from one run of modes timed in turn.

Both caches hold the same number of frames; once they are full (a chunk starting at or after ``full_from``, the
capacity in frames) a TempCache chunk attends to as many entries as a window chunk, so what it costs beyond the
window is its own work: matching, merging, its view. Each chunk index of a repeat is one round in which every
mode ran that chunk in turn, so the ratio of the two chunks of one round has both under the same load; the spread
of those ratios over rounds (and repeats) says how well this machine pins it.
"""

from __future__ import annotations

import statistics

TIMES = {"cpu": "cpu_seconds", "wall": "seconds"}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio_to_window(chunks: list[dict], window_chunks: list[dict], full_from: int) -> dict:
    """``chunks``, ``window_chunks``: the two modes' per-chunk rows (``median_rows``) of one run. Per clock (CPU
    time and wall): the ratio of the totals over the full-cache chunks, and over rounds the median, 10th and 90th
    percentiles, minimum and maximum of the per-round ratios; per repeat, the ratio of that repeat's totals."""
    pairs = [(a, b) for a, b in zip(chunks, window_chunks) if a["frame_start"] >= full_from]
    out: dict = {"chunks": len(pairs), "full_from_frame": full_from}
    for clock, key in TIMES.items():
        each = f"{key}_each_round"
        if not pairs or not all(each in a and each in b for a, b in pairs):
            continue
        repeats = len(pairs[0][0][each])
        rounds = [a[each][r] / b[each][r] for a, b in pairs for r in range(repeats)]
        totals = [sum(a[each][r] for a, _ in pairs) / sum(b[each][r] for _, b in pairs) for r in range(repeats)]
        out[clock] = {
            "ratio_of_totals": round(sum(a[key] for a, _ in pairs) / sum(b[key] for _, b in pairs), 4),
            "seconds_per_chunk": round(sum(a[key] for a, _ in pairs) / len(pairs), 4),
            "window_seconds_per_chunk": round(sum(b[key] for _, b in pairs) / len(pairs), 4),
            "rounds": len(rounds),
            "round_median": round(statistics.median(rounds), 4),
            "round_p10": round(_quantile(rounds, 0.1), 4),
            "round_p90": round(_quantile(rounds, 0.9), 4),
            "round_min": round(min(rounds), 4),
            "round_max": round(max(rounds), 4),
            "per_repeat": [round(t, 4) for t in totals],
        }
    return out


def round_ratios(chunks: list[dict], window_chunks: list[dict], key: str = "cpu_seconds") -> tuple[list, list]:
    """(frame_start, median over repeats of the per-round ratio) per chunk, for the plot."""
    each = f"{key}_each_round"
    xs, ys = [], []
    for a, b in zip(chunks, window_chunks):
        if each in a and each in b:
            xs.append(a["frame_start"])
            ys.append(statistics.median(x / y for x, y in zip(a[each], b[each])))
    return xs, ys
