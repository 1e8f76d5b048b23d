"""Writing benchmark figures: JSON always, PNG plots when matplotlib is installed."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path

import torch

from ..outputs import strict_json


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_threads": torch.get_num_threads(),
            "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_json(data))
    return path


def resident_bytes() -> int:
    """Current resident memory of this process (Linux), 0 where /proc is unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def line_plots(path: Path, panels: list[dict], title: str = "") -> Path | None:
    """``panels``: [{"title", "xlabel", "ylabel", "series": {label: (xs, ys)}, "logy"?, "marker"?}] side by
    side."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping", path.name)
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys) in panel["series"].items():
            ax.plot(xs, ys, label=label, linewidth=1.4, marker=panel.get("marker"), markersize=4)
        ax.set_title(panel["title"])
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


FRAME_RATE_FROM = 60  # latent frame after which a bounded cache is full at every capacity the benches use


def frame_rate_steadiness(rows: list[dict], start: int = FRAME_RATE_FROM) -> dict | None:
    """Latent frames per second of CPU time (wall time where a row has none) per chunk from latent frame ``start``
    on: their median, the largest deviation from it, the share of chunks within 10 % of it, and the mean of the last
    10 chunks over the first 10 (below 1: the rate falls as the run goes on). None with fewer than 20 such chunks."""
    rates = [r["frames"] / r.get("cpu_seconds", r["seconds"]) for r in rows
             if r["frame_start"] >= start and r.get("cpu_seconds", r["seconds"]) > 0]
    if len(rates) < 20:
        return None
    mid = statistics.median(rates)
    return {"from_frame": start, "chunks": len(rates), "median_fps": round(mid, 3),
            "max_deviation": round(max(abs(r / mid - 1) for r in rates), 4),
            "within_10_percent": round(sum(abs(r / mid - 1) <= 0.10 for r in rates) / len(rates), 4),
            "trend_last_over_first": round(mean(rates[-10:]) / mean(rates[:10]), 4)}


def latency_growth(seconds: list[float]) -> float | None:
    """Mean seconds of the last 10 chunks over the mean of chunks 5 to 15 (flat = 1.0)."""
    if len(seconds) < 16:
        return None
    return mean(seconds[-10:]) / mean(seconds[5:16])
