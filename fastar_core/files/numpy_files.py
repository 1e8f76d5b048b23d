"""A NumPy ``.npy`` file a user hands in (a camera path's poses), read without trusting it.

``numpy.load`` trusts the header: one that declares a billion rows allocates them before the read comes up short,
an object array asks to unpickle, and a ``.npz`` archive comes back as something else than an array. Here the
header is read first (NumPy's own parser, which evaluates no code), its dtype and shape are checked against what
the caller accepts and against the file's size, and only then is the array read, never with pickles allowed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from ..errors import CheckpointError, FastARError
from .raw import check_regular_file

MAX_BYTES = 256 << 20


def read_npy(path, what: str, kinds: str = "f", max_bytes: int = MAX_BYTES) -> np.ndarray:
    """The array in ``path``; ``what`` says what it should be (shown in every message), ``kinds`` the accepted
    ``dtype.kind`` letters (``"f"``: floating point)."""
    p = Path(path)
    if p.is_dir():
        raise FastARError(f"{p}: a directory, not a NumPy array file; {what}")
    try:
        size = check_regular_file(p)
    except CheckpointError as e:
        raise FastARError(f"{p}: {e.problem.replace('checkpoint file', 'NumPy array file')}; {what}") from None
    try:
        with open(p, "rb") as f:
            head = f.read(6)
            f.seek(0)
            if head.startswith(b"PK"):
                raise FastARError(f"{p}: a NumPy .npz archive; {what}, saved on its own with numpy.save")
            if head != b"\x93NUMPY":
                raise FastARError(f"{p}: not a NumPy .npy file (it starts with bytes {head.hex(' ')}); {what}")
            version = npy_format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npy_format.read_array_header_2_0(f)
            else:
                raise FastARError(f"{p}: a .npy file of format version {version}, which NumPy does not write")
            offset = f.tell()
    except FastARError:
        raise
    except OSError as e:
        raise FastARError(f"{p}: cannot be read ({e.strerror or e})") from None
    except (ValueError, SyntaxError, TypeError, EOFError, MemoryError, RecursionError) as e:
        raise FastARError(f"{p}: not a readable .npy file (its header: {str(e).splitlines()[0][:120]}); "
                          f"{what}") from None
    if dtype.hasobject or dtype.kind not in kinds or dtype.fields is not None:
        raise FastARError(f"{p}: holds {dtype} values; {what}"
                          + (" (object arrays are pickles and are never read)" if dtype.hasobject else ""))
    if any(n < 0 for n in shape):
        raise FastARError(f"{p}: declares shape {list(shape)}, with a negative size; {what}")
    count = math.prod(shape)
    need = count * dtype.itemsize
    if need > max_bytes:
        raise FastARError(f"{p}: declares shape {list(shape)} ({need:,} bytes); at most {max_bytes:,} bytes are "
                          f"read; {what}")
    if offset + need > size:
        raise FastARError(f"{p}: declares shape {list(shape)} ({need:,} bytes) but holds {size - offset:,} bytes "
                          "after its header (cut short?)")
    try:
        array = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError, MemoryError) as e:
        raise FastARError(f"{p}: not a readable .npy file ({str(e).splitlines()[0][:120]}); {what}") from None
    if not isinstance(array, np.ndarray):
        raise FastARError(f"{p}: not a single array; {what}")
    return array
