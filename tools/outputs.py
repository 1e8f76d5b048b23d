"""Output files written whole: strict JSON, and a run's two files switched together by one rename.

A run folder holds ``latent.safetensors`` and ``stats.json`` as links into ``.fastar/current/``, and
``.fastar/current`` is itself a link to the folder of the run they belong to (``.fastar/<run_id>/``). A new run
is written beside the old one, then ``current`` is replaced by one ``rename``: whatever instant a crash stops the
writer at, a reader opening the two names finds both files of the earlier run or both of the new one, never one
of each and never half a file. What a crash leaves behind (a staged run, the earlier run not yet removed) sits
in ``.fastar/`` and is removed by the next write into the folder.

A folder that holds no run yet has no ``current`` to switch, and its two names cannot appear together by
themselves: it is built complete beside itself (``.<name>.<run_id>.fastar-tmp``, the run's files hard-linked)
and exchanged with it in one step (Linux ``renameat2``), so no crash leaves a name pointing at a missing file.
Where the filesystem cannot exchange, the names are made first and dangle until the switch.

Two locks: ``run_lock`` (``.fastar/lock``) is held by one ``fastar generate`` for its whole run, so a second run
into the same folder is refused at its start, saying so, instead of one result silently replacing the other;
the switch itself happens under ``locked_folder`` (``flock`` on the folder), which a reader that opens both
files one after the other takes too. Folders from earlier versions, which held the two files themselves, are
taken over without ever showing a mixed pair.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

from ..fastar_core.errors import FastARError

LATENT_FILE = "latent.safetensors"
STATS_FILE = "stats.json"
RUN_FILES = (LATENT_FILE, STATS_FILE)
STATE_DIR = ".fastar"
LOCK_FILE = "lock"
CURRENT = "current"
FAULT_ENV = "FASTAR_FAULT_AT"  # kill this process at the n-th step of a run's final write (crash tests)
# Temporary names in the folder itself: this layout's links being made, and earlier versions' files.
_STRAY_TMP = re.compile(r"^\.?(latent\.safetensors|stats\.json)\.[\w-]+\.tmp$")


class OutputError(FastARError):
    """An output folder that cannot be written (full disk, file-size limit, permissions), named."""


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


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path, data) -> None:
    """Write strict JSON atomically (a temporary file renamed over the target)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(strict_json(data))
        _fsync_file(tmp)
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


def _remove_created(created: list) -> None:
    """Remove the folders a failed run created, if nothing but its own bookkeeping is in them."""
    for p in reversed(created):
        state = p / STATE_DIR
        if state.is_dir() and not state.is_symlink() and set(os.listdir(state)) <= {LOCK_FILE}:
            shutil.rmtree(state, ignore_errors=True)
        if p.is_dir() and not any(p.iterdir()):
            shutil.rmtree(p, ignore_errors=True)


@contextmanager
def removed_if_failed(folder):
    """For a command that writes into ``folder`` (creating it when it writes): if the command fails, the folders
    it would have created (``folder`` and any missing parent) are removed again while they hold nothing, so a
    failed run leaves no empty folder behind. A folder that was there before is never touched."""
    folder = Path(folder)
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    missing.reverse()
    try:
        yield
    except BaseException:
        _remove_created(missing)
        raise


@contextmanager
def locked_folder(out: Path):
    """The folder's switch lock: held while a run's files are switched, and by readers that must not see it.
    A new folder is exchanged in whole (``_switch_whole_folder``): a lock taken on the folder it replaced is let
    go and taken again on the one the name now holds."""
    while True:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held, now = os.fstat(fd), os.stat(out)
        except BaseException:
            os.close(fd)
            raise
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            break
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def run_lock(out: Path, what: str = "fastar generate"):
    """Hold ``out`` for one run from its start to its last write; a second holder is refused at once, naming
    the folder and the process that has it. The folder is created here; if the run fails, what was created is
    removed again."""
    out = Path(out)
    created = _make_folder(out)
    state = out / STATE_DIR
    made_state = not state.exists()
    fd = None
    try:
        state.mkdir(exist_ok=True)
        fd = os.open(state / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise OutputError(f"--out {out} is in use by another {what} ({holder}); refused so that neither run "
                              "replaces the other's result: wait for it to finish or pick another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    except BaseException:
        if fd is not None:
            os.close(fd)
            fd = None
        if made_state and set(os.listdir(state)) <= {LOCK_FILE}:  # a failed first run leaves no bookkeeping
            shutil.rmtree(state, ignore_errors=True)
        _remove_created(created)
        raise
    finally:
        if fd is not None:
            os.close(fd)


class _Faults:
    """The crash tests' hook: ``FASTAR_FAULT_AT=n`` kills the process (SIGKILL) at the n-th step."""

    def __init__(self):
        value = os.environ.get(FAULT_ENV, "")
        self.at = int(value) if value.isdigit() else 0
        self.count = 0

    def step(self) -> None:
        self.count += 1
        if self.count == self.at:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def _relink(target: str, link: Path, tag: str) -> None:
    """Point ``link`` at ``target`` with one rename (a link made beside it, then renamed over it)."""
    tmp = link.with_name(f".{link.name}.{tag}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _current_run(state: Path) -> str | None:
    try:
        return os.readlink(state / CURRENT)
    except OSError:
        return None


def _clean(out: Path, state: Path) -> None:
    """Remove what crashed writes left: staged or superseded runs, temporary links, earlier versions' .tmp, a
    whole-folder switch's folder beside this one."""
    _remove_shadows(out)
    keep = {LOCK_FILE, CURRENT, _current_run(state)}
    for entry in os.listdir(state):
        if entry not in keep:
            path = state / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    for entry in os.listdir(out):
        if _STRAY_TMP.match(entry):
            (out / entry).unlink(missing_ok=True)


def _link_target(name: str) -> str:
    return f"{STATE_DIR}/{CURRENT}/{name}"


def _adopt_plain_files(out: Path, state: Path, faults: _Faults) -> None:
    """A folder written by an earlier version holds the two files themselves: give them a run folder of their
    own and turn the names into links one at a time; each name shows the same bytes throughout."""
    plain = [n for n in RUN_FILES if not _is_our_link(out / n, n) and (out / n).exists()]
    if not plain:
        return
    earlier = state / "earlier"
    shutil.rmtree(earlier, ignore_errors=True)
    earlier.mkdir()
    for name in plain:
        try:
            os.link(out / name, earlier / name)
        except OSError:
            shutil.copy2(out / name, earlier / name)
        _fsync_file(earlier / name)
    _fsync_dir(earlier)
    _relink("earlier", state / CURRENT, "adopt")
    faults.step()
    for name in plain:
        _relink(_link_target(name), out / name, "adopt")
        faults.step()


def _is_our_link(path: Path, name: str) -> bool:
    return path.is_symlink() and os.readlink(path) == _link_target(name)


# A new folder is switched in whole: built complete beside it, then exchanged with it in one step.
_SHADOW_SUFFIX = ".fastar-tmp"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _shadow_of(out: Path, run_id: str) -> Path:
    return out.parent / f".{out.name}.{run_id}{_SHADOW_SUFFIX}"


def _remove_shadows(out: Path) -> None:
    """What a crash during a whole-folder switch left beside ``out`` (its name, a run id, the suffix)."""
    own = re.compile(rf"\.{re.escape(out.name)}\.[0-9a-f]{{32}}{re.escape(_SHADOW_SUFFIX)}")
    try:
        strays = [p for p in out.parent.iterdir() if own.fullmatch(p.name)]
    except OSError:
        return
    for path in strays:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); OSError where that is not had."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))


def _holds_no_run(out: Path, state: Path, run_id: str) -> bool:
    """``out`` is a plain folder holding nothing but this run's bookkeeping: no earlier run, no user's file."""
    if out.is_symlink() or state.is_symlink():
        return False
    return set(os.listdir(out)) <= {STATE_DIR} and set(os.listdir(state)) <= {LOCK_FILE, run_id}


def _switch_whole_folder(out: Path, state: Path, run_id: str, faults: _Faults) -> bool:
    """A folder that holds no run yet gets its two names and its run in one step: the complete folder is built
    beside it (the run's files linked, not copied; the lock file the same file, so a run holding it holds on)
    and exchanged with it, so no crash ever leaves a name pointing at a missing file. False (nothing changed)
    where the parent is not writable or the filesystem cannot exchange: the caller switches in place."""
    shadow = _shadow_of(out, run_id)
    try:
        shadow.mkdir()
    except OSError:
        return False
    # The new folder is locked before it takes the name, so a writer or reader that opens the name once it is
    # switched waits until this one is done.
    lock = os.open(shadow, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        return _build_and_exchange(out, state, shadow, run_id, faults)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)


def _build_and_exchange(out: Path, state: Path, shadow: Path, run_id: str, faults: _Faults) -> bool:
    try:
        (shadow / STATE_DIR).mkdir()
        (shadow / STATE_DIR / run_id).mkdir()
        for name in RUN_FILES:
            os.link(state / run_id / name, shadow / STATE_DIR / run_id / name)
        if (state / LOCK_FILE).exists():
            os.link(state / LOCK_FILE, shadow / STATE_DIR / LOCK_FILE)
        os.symlink(run_id, shadow / STATE_DIR / CURRENT)
        for name in RUN_FILES:
            os.symlink(_link_target(name), shadow / name)
        os.chmod(shadow, stat.S_IMODE(out.stat().st_mode))
        _fsync_dir(shadow / STATE_DIR / run_id)
        _fsync_dir(shadow / STATE_DIR)
        _fsync_dir(shadow)
        faults.step()
        _exchange(shadow, out)
    except OSError:
        shutil.rmtree(shadow, ignore_errors=True)
        return False
    _fsync_dir(out.parent)
    faults.step()
    for entry in os.listdir(shadow):  # a file a user dropped into the folder meanwhile goes back into it
        if entry != STATE_DIR and not os.path.lexists(out / entry):
            os.replace(shadow / entry, out / entry)
    shutil.rmtree(shadow, ignore_errors=True)  # the folder it replaced: bookkeeping only
    faults.step()
    return True


def write_run(out, latent, stats: dict, run_id: str) -> None:
    """Write one run's latent (with ``run_id`` in its metadata) and stats (with ``run_id``) into ``out``, and
    make them the folder's run with one rename. A failure leaves the earlier run as it was."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    out = Path(out)
    text = strict_json(dict(stats, run_id=run_id))  # before anything is created: unwritable stats raise here
    created = _make_folder(out)
    faults = _Faults()
    state = out / STATE_DIR
    staged = state / run_id
    try:
        with locked_folder(out):
            state.mkdir(exist_ok=True)
            _clean(out, state)
            faults.step()
            staged.mkdir()
            save_file({"latent": latent.cpu().contiguous()}, str(staged / LATENT_FILE), metadata={"run_id": run_id})
            _fsync_file(staged / LATENT_FILE)
            faults.step()
            (staged / STATS_FILE).write_text(text)
            _fsync_file(staged / STATS_FILE)
            _fsync_dir(staged)
            faults.step()
            if _holds_no_run(out, state, run_id) and _switch_whole_folder(out, state, run_id, faults):
                return
            _adopt_plain_files(out, state, faults)
            for name in RUN_FILES:  # links first (dangling until `current` exists): only where exchange is not had
                if not _is_our_link(out / name, name):
                    _relink(_link_target(name), out / name, run_id)
                    faults.step()
            earlier = _current_run(state)
            _relink(run_id, state / CURRENT, run_id)  # the switch: one rename
            _fsync_dir(state)
            faults.step()
            if earlier and earlier != run_id:
                shutil.rmtree(state / earlier, ignore_errors=True)
                faults.step()
            _fsync_dir(out)
    except BaseException as e:
        shutil.rmtree(_shadow_of(out, run_id), ignore_errors=True)
        if _current_run(state) != run_id:
            shutil.rmtree(staged, ignore_errors=True)
            _remove_created(created)
        if isinstance(e, (OSError, SafetensorError)):
            reason = getattr(e, "strerror", None) or str(e).strip().splitlines()[0]
            raise OutputError(f"cannot write the run into {out}: {reason}; the earlier run there is unchanged") \
                from None
        raise
