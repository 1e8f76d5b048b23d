"""Output files written whole: strict JSON, and a run's files replaced together under a lock.

``write_run`` puts ``latent.safetensors`` and ``stats.json`` into a folder as one unit: both are written to
temporary names first, then renamed into place while the folder is locked (``flock`` on the folder itself), so
two runs into one folder never leave one run's latent beside the other's stats. Both carry the same ``run_id``.
A reader that must not see the moment between the two renames takes the same lock (``locked_folder``).
The folder is created only here, at the end of a run; if writing fails, what was created is removed.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

LATENT_FILE = "latent.safetensors"
STATS_FILE = "stats.json"


def finite_json_value(value):
    """``value`` with every NaN/infinity replaced by None (JSON has no such numbers) and tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json_value(v) for v in value]
    return value


def strict_json(data, indent: int | None = 2) -> str:
    """JSON that every parser reads: non-finite numbers become null, and anything else non-JSON raises."""
    return json.dumps(finite_json_value(data), indent=indent, allow_nan=False)


def _write_synced(path: Path, writer) -> None:
    writer(path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_json(path, data) -> None:
    """Write strict JSON atomically (a temporary file renamed over the target)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_synced(tmp, lambda p: p.write_text(strict_json(data)))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _make_folder(out: Path) -> list:
    """Create ``out`` and missing parents; the ones created, outermost first."""
    created = []
    probe = out
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    created.reverse()
    for p in created:
        try:
            p.mkdir()
        except FileExistsError:  # another run made it meanwhile
            pass
    return created


@contextmanager
def locked_folder(out: Path):
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_run(out, latent, stats: dict, run_id: str) -> None:
    """Write one run's latent (with ``run_id`` in its metadata) and stats (with ``run_id``) into ``out``."""
    from safetensors.torch import save_file

    out = Path(out)
    created = _make_folder(out)
    tag = f".{run_id}.tmp"
    latent_tmp, stats_tmp = out / (LATENT_FILE + tag), out / (STATS_FILE + tag)
    try:
        text = strict_json(dict(stats, run_id=run_id))
        with locked_folder(out):
            _write_synced(latent_tmp, lambda p: save_file({"latent": latent.cpu().contiguous()}, str(p),
                                                          metadata={"run_id": run_id}))
            _write_synced(stats_tmp, lambda p: p.write_text(text))
            os.replace(latent_tmp, out / LATENT_FILE)
            os.replace(stats_tmp, out / STATS_FILE)
    except BaseException:
        latent_tmp.unlink(missing_ok=True)
        stats_tmp.unlink(missing_ok=True)
        for p in reversed(created):
            if p.exists() and not any(p.iterdir()):
                shutil.rmtree(p, ignore_errors=True)
        raise
