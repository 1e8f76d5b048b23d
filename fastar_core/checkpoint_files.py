"""Reading a checkpoint file's raw contents: safetensors, or a torch ``.pt`` that is never allowed to run code.

The file's first bytes are checked before any reader sees it, so a directory, a device, a FIFO, random bytes, a
compressed or text file, or a Git LFS pointer gets a message saying what it is instead of a reader's error.
Safetensors headers are read (names, dtypes, shapes) before any tensor is, so a file's size in memory is known
before it is allocated.
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
_SNIFF_BYTES = 512


@dataclass
class TensorInfo:
    """One tensor as its file declares it (names and shapes known before the data is read)."""

    dtype: str
    shape: tuple
    nbytes: int


def check_regular_file(path: Path) -> int:
    """The file's size; refuses what is not a regular, non-empty file, saying what it is."""
    try:
        st = path.stat()
    except FileNotFoundError:
        problem = "no such file" + (" (a broken symbolic link)" if path.is_symlink() else "")
        raise CheckpointError(path, problem) from None
    except OSError as e:
        raise CheckpointError(path, f"cannot be opened: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(path, "is a directory, not a checkpoint file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a special file")
        raise CheckpointError(path, f"is {kind}, not a regular checkpoint file")
    if st.st_size == 0:
        raise CheckpointError(path, "is empty (0 bytes)")
    if not os.access(path, os.R_OK):
        raise CheckpointError(path, "is not readable (permission denied)")
    return st.st_size


def sniff(head: bytes, size: int) -> str:
    """What the first bytes say the file is."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    for magic, kind in ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"GGUF", "gguf"),
                        (b"version https://git-lfs", "lfs")):
        if head.startswith(magic):
            return kind
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "unknown"
    return "text" if text and all(c.isprintable() or c in "\r\n\t" for c in text) else "unknown"


def describe_foreign(kind: str, head: bytes) -> str:
    if kind in ("gzip", "bzip2", "xz"):
        return f"is a {kind}-compressed file, not a checkpoint; decompress it first"
    if kind == "lfs":
        return "is a Git LFS pointer, not the weights; fetch the file itself (git lfs pull, or download it)"
    if kind == "gguf":
        return "is a GGUF file; this loader reads .safetensors and .pt checkpoints"
    if kind == "text":
        start = head[:40].decode("utf-8", "replace").splitlines()[0] if head.strip() else ""
        return f"is a text file, not a checkpoint (it starts with {start!r})"
    return ("is not a checkpoint: neither safetensors, a torch archive nor a pickle "
            f"(it starts with bytes {head[:8].hex(' ')})")


def _check_kind(path: Path, size: int) -> str:
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    kind = sniff(head, size)
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        if kind == "safetensors":
            return kind
        if kind in ("zip", "pickle"):
            raise CheckpointError(path, "is a torch checkpoint (pickle), not safetensors; rename it to .pt to read "
                                        "it (only its tensors are read)")
        if len(head) >= 8 and kind == "unknown":
            return kind  # let the safetensors reader name the damage (e.g. a header cut short)
        raise CheckpointError(path, describe_foreign(kind, head))
    if suffix in TORCH_SUFFIXES:
        if kind in ("zip", "pickle"):
            return kind
        if kind == "safetensors":
            raise CheckpointError(path, "is a safetensors file with a torch suffix; rename it to .safetensors")
        raise CheckpointError(path, describe_foreign(kind, head))
    raise CheckpointError(path, f"unsupported file type '{suffix}'; expected .safetensors or .pt")


def read_raw(path: Path, before_load=None):
    """Return (tensor dict or nested dict, safetensors metadata). ``before_load(infos, metadata)`` sees a safetensors
    file's declared tensors (``{name: TensorInfo}``) before any is read, and may refuse the file."""
    size = check_regular_file(path)
    kind = _check_kind(path, size)
    if path.suffix.lower() in SAFETENSORS_SUFFIXES:
        return _read_safetensors(path, size, before_load)
    return _read_torch(path, kind), {}


def _read_safetensors(path: Path, size: int, before_load):
    from safetensors import SafetensorError, safe_open

    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
        if size < 8 or n > min(size - 8, MAX_HEADER_BYTES):
            raise CheckpointError(path, f"not a readable safetensors file: its header claims {n:,} bytes but the "
                                        f"file has {size:,} (truncated or not safetensors?)")
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = _decode_metadata(f.metadata() or {})
            infos = {}
            for k in f.keys():
                sl = f.get_slice(k)
                shape = tuple(sl.get_shape())
                dtype = str(sl.get_dtype())
                infos[k] = TensorInfo(dtype, shape, _numel(shape) * _DTYPE_BYTES.get(dtype, 1))
            if before_load is not None:
                before_load(infos, metadata)
            tensors = {k: f.get_tensor(k) for k in infos}
    except SafetensorError as e:
        raise CheckpointError(path, f"not a readable safetensors file (truncated or corrupt?): {one_line(e)}") from None
    return tensors, metadata


def _decode_metadata(raw: dict) -> dict:
    """Metadata values that hold JSON objects or lists, decoded; the rest kept as strings."""
    metadata = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str) and value.startswith(("{", "[")):
            try:
                metadata[key] = json.loads(value)
            except json.JSONDecodeError:
                pass
    return metadata


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8, "C64": 8}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _read_torch(path: Path, kind: str):
    import pickle

    import torch

    try:
        with warnings.catch_warnings():  # torch warns on stderr about pickle protocols it did not write
            warnings.simplefilter("ignore")
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(path, torch_load_problem(e, kind)) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        if "Invalid magic number" in str(e):
            raise CheckpointError(path, "is a pickle that torch.save did not write (no torch magic number); "
                                        "save the weights with torch.save or safetensors") from None
        what = "torch archive" if kind == "zip" else "torch checkpoint"
        raise CheckpointError(path, f"not a readable {what} (truncated or corrupt?): {one_line(e)}") from None


_ADVICE = ("weights_only", "trusted source", "Please file an issue", "documentation", "In PyTorch 2.6")


def torch_load_problem(e: Exception, kind: str = "pickle") -> str:
    """torch's refusal in one line, without its advice to turn the safety off."""
    text = str(e)
    m = re.search(r"GLOBAL ([\w.]+)", text)
    if m:
        return (f"holds an object of type {m.group(1)}, which would need arbitrary code to load; refused (only "
                "tensors and plain containers are read)")
    m = re.search(r"Unsupported operand (\d+)", text)
    if m:
        where = "its data.pkl is not a valid pickle" if kind == "zip" else "not a valid pickle"
        return f"is corrupt: {where} (unknown opcode {m.group(1)})"
    return f"is not a loadable torch checkpoint: {one_line(e)}"


def one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not any(a in ln for a in _ADVICE)] or [type(e).__name__]
    line = re.sub(r"^(WeightsUnpickler error:|\[enforce fail at [^\]]*\]\s*\.?)\s*", "", lines[0]) or type(e).__name__
    return line[:300]
