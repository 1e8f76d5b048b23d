"""How much memory a device has free, one check that a planned allocation fits, made before allocating, and host
tensors sent to a device without the host waiting."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import FastARError


def _cgroup_free() -> int | None:
    """Room left under a container's memory limit (cgroup v2 or v1), None when unlimited or unknown."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            if limit == "max" or int(limit) >= 1 << 60:
                continue
            return max(0, int(limit) - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def host_free_bytes() -> int | None:
    """Memory a new allocation on the host can use: MemAvailable, or the container's room if smaller."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    room = _cgroup_free()
    if room is not None:
        free = room if free is None else min(free, room)
    return free


def free_bytes(device) -> int | None:
    """Free memory of ``device`` in bytes, None when it cannot be known (the check then passes)."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        except (RuntimeError, AssertionError):
            return None
    if device.type == "cpu":
        return host_free_bytes()
    return None


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def check_fits(nbytes: int, device, what: str, hint: str = "") -> None:
    """Refuse, before allocating, what would not fit in ``device``'s free memory."""
    free = free_bytes(device)
    if free is not None and nbytes > free:
        raise FastARError(f"{what} needs about {format_bytes(nbytes)} but {torch.device(device)} has "
                          f"{format_bytes(free)} free" + (f"; {hint}" if hint else ""))


def send_to_device(x: torch.Tensor, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` on ``device`` (in ``dtype``), the host not waiting for it: a host tensor bound for a GPU goes through
    pinned memory with a non-blocking copy, queued behind the device's work. A plain ``.to(device)`` of pageable
    memory makes the host wait until the device has caught up (a host sync), and a CUDA graph cannot capture it."""
    device = torch.device(device)
    if x.device.type == "cpu" and device.type == "cuda":
        x = x.pin_memory().to(device, non_blocking=True)
    return x.to(device=device, dtype=dtype)
