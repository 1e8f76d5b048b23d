"""The command line's output: progress that can never end a run, and every failure as one ``fastar: error:`` line.

Progress goes to stdout, which a user may close (``| head -1``), fill (``> /dev/full``) or give an encoding that
cannot print a path (``PYTHONIOENCODING=ascii``). None of that is the run's business: ``ForgivingStream``
prints what the encoding can say (the rest escaped), and once stdout is gone it drops further progress and
points the descriptor at ``/dev/null``, so that the interpreter's own flush at exit cannot fail either.
``error_line`` turns what ends a command (bad input, a refusing machine, an interrupt) into the one line printed.
A stream the command was started without (``fastar info >&-``) is ``None`` in Python: nothing is printed to it.

Nothing here imports torch or the engine: the command line's error handling is in place before they load, so a
Ctrl-C while they are still importing is one line too.
"""

from __future__ import annotations

import errno
import io
import os
import sys


class ForgivingStream(io.TextIOBase):
    """A text stream over ``stream`` whose writes and flushes never raise."""

    def __init__(self, stream):
        self.stream = stream
        self.closed_by_reader = stream is None  # started with the descriptor closed: print nothing

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation("stdout was closed when the command started")
        return self.stream.fileno()

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:
                encoding = self.encoding or "ascii"
                self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
        except (OSError, ValueError):
            self._gone()
        return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self._gone()

    def _gone(self) -> None:
        """stdout was closed or is full: keep running silently; the descriptor now writes to /dev/null so the
        buffered rest and the exit-time flush go nowhere instead of raising."""
        self.closed_by_reader = True
        try:
            fd = self.stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass


def fill_closed_descriptors() -> None:
    """A command started with stdin, stdout or stderr closed gets /dev/null there, so that no file it opens
    later is given descriptor 1 or 2 (where a library's own prints would then be written into it)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def forgiving_stdout():
    """Replace sys.stdout for one command; returns what to put back."""
    before = sys.stdout
    if not isinstance(before, ForgivingStream):
        sys.stdout = ForgivingStream(before)
    return before


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def os_error_line(e: OSError) -> str:
    """An OSError as 'what: why', naming the file or folder, without Python's errno prefix."""
    why = e.strerror or _one_line(e) or type(e).__name__
    where = e.filename if e.filename is not None else None
    if where is not None:
        second = f" -> {e.filename2}" if getattr(e, "filename2", None) else ""
        return f"{where}{second}: {why}"
    return why


def port_error(e: OSError, port: int, host: str = "127.0.0.1", flag: str = "--port") -> OSError | Exception:
    """A server's failed bind as one line naming the address and the option that chose it (the operating
    system's 'Address already in use' names neither); other errors are returned as they are."""
    from ..fastar_core.errors import FastARError

    if e.errno == errno.EADDRINUSE:
        return FastARError(f"{flag} {port}: {host}:{port} is already in use (another fastar play, or another "
                           f"server); pick another {flag}, or {flag} 0 for any free port")
    if e.errno in (errno.EACCES, errno.EPERM):
        return FastARError(f"{flag} {port}: not allowed to listen on {host}:{port} (ports below 1024 need "
                           f"privileges); pick a {flag} from 1024 up, or {flag} 0 for any free port")
    if e.errno == errno.EADDRNOTAVAIL:
        return FastARError(f"{flag} {port}: cannot listen on {host}:{port} ({e.strerror or e})")
    return e


def _is_engine_error(e: BaseException) -> bool:
    """A ``FastARError``; looked up only if the engine was imported (before it is, none can have been raised)."""
    errors = sys.modules.get(__package__.rsplit(".", 1)[0] + ".fastar_core.errors")
    return errors is not None and isinstance(e, errors.FastARError)


def _interrupted(e: BaseException) -> bool:
    """Ctrl-C, or what it turned into: a C extension's import interrupted by it fails with its own error (an
    ImportError "initialization failed") raised while the KeyboardInterrupt is handled."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def error_line(e: BaseException) -> tuple[str, int]:
    """(the one line, the exit code) for what ended a command. Exit codes: 2 bad input or a refusing machine,
    130 interrupted (Ctrl-C)."""
    if _interrupted(e):
        return "interrupted; nothing was written by the unfinished step (earlier outputs are kept)", 130
    if _is_engine_error(e):
        return _one_line(e), 2
    if isinstance(e, MemoryError):
        return "out of memory; use fewer --frames, a smaller size or a bounded cache", 2
    if isinstance(e, OSError):
        return os_error_line(e), 2
    if type(e).__name__ == "SafetensorError":  # raised by safetensors on a failed write; not an OSError
        return f"cannot write a safetensors file: {_one_line(e)}", 2
    raise e


def report_error(e: BaseException) -> int:
    line, code = error_line(e)
    if sys.stderr is not None:  # None: started with stderr closed (2>&-), the exit code says it
        try:
            print(f"fastar: error: {line}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
    return code


def end_at_once(code: int) -> None:
    """End the process with ``code`` now, past the interpreter's shutdown; output is flushed first.

    For an interrupted command that ran rollouts on worker threads (the benches' turns): ``join`` returns
    once a worker's Python state is gone, but its OS thread still runs torch's thread-local destructors, which
    take the GIL. The main thread, with nothing left to do after an interrupt, reaches the interpreter's
    shutdown within microseconds, and a thread taking the GIL then aborts the process (``terminate called
    without an active exception``) after the one line was printed. Nothing of an interrupted step is kept, and
    what earlier steps wrote is closed, so skipping the shutdown loses nothing."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# The libraries every command imports (torch brings numpy, its compiler's front end and sympy), held whole.
HEAVY_MODULES = ("numpy", "torch", "torch._dynamo", "safetensors.torch", "triton")


def import_holding_interrupts(*modules: str) -> None:
    """Import ``modules`` with Ctrl-C held back until they have loaded, then raise it as ``KeyboardInterrupt``.

    Torch's import runs C++ that calls back into Python: a KeyboardInterrupt raised inside such a callback cannot
    cross the C++ frame, and the process dies with ``terminate called after throwing an instance of
    'pybind11::error_already_set'`` instead of ending with one line. Off the main thread, where no signal handler
    can be set, the modules are imported plainly. Held, an interrupt can also not be swallowed inside a library's
    own import (a fallback ``except`` around an optional import) and leave it half made: numpy without
    ``matrix``, failing later with a traceback far from the Ctrl-C."""
    import importlib
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError:  # optional (triton): the command that needs it says so
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
