"""Reading a checkpoint file's raw contents: safetensors, or a torch ``.pt`` that is never allowed to run code.

The file's first bytes are checked before any reader sees it, so a directory, a device, a FIFO, random bytes, a
compressed or text file, or a Git LFS pointer gets a message saying what it is instead of a reader's error.
Safetensors headers are read (names, dtypes, shapes) before any tensor is, so a file's size in memory is known
before it is allocated.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..errors import CheckpointError
from .safetensors_reader import MAX_HEADER_BYTES, TensorInfo  # noqa: F401 - part of this module's API

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
_SNIFF_BYTES = 512


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
        raise CheckpointError(path, "is a directory, not a checkpoint file (a folder is read only as a LingBot-World "
                                    "2.0 model: safetensors shards holding its camera layers, with or without the "
                                    "config.json naming WanModelFast)")
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
    # Before the pickle test: a safetensors header of 640..1535 bytes starts with the bytes a pickle starts with
    # (its length's low byte 0x80, then 2..5), and a pickle's ninth byte is never the header's "{".
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
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
    """Return (tensor dict or nested dict, metadata), every user file's one way in.

    Safetensors: the header is checked entry by entry (``safetensors_reader``), ``before_load(infos, metadata)``
    sees the declared tensors (``{name: TensorInfo}``) before any is read and may refuse the file or return the
    names to read (None: all); what is read must fit in free memory. A torch file is checked as an archive and as
    a pickle before torch reads it with ``weights_only`` (``torch_archive``); the metadata of a torch file is its
    top-level ``fastar_config`` entry when it has one."""
    size = check_regular_file(path)
    kind = _check_kind(path, size)
    if path.suffix.lower() in SAFETENSORS_SUFFIXES:
        return _read_safetensors(path, size, before_load)
    from .torch_archive import read_torch

    raw = read_torch(path, kind, size)
    metadata = {}
    if isinstance(raw, dict) and isinstance(raw.get("fastar_config"), dict):
        metadata["fastar_config"] = raw["fastar_config"]
    return raw, metadata


def _read_safetensors(path: Path, size: int, before_load):
    from ..memory import format_bytes, free_bytes
    from .safetensors_reader import read_header, read_tensors

    header = read_header(path, size)
    metadata = _decode_metadata(header.metadata)
    names = list(header.tensors)
    if before_load is not None:
        chosen = before_load(header.tensors, metadata)
        if chosen is not None:
            names = list(chosen)
    need = sum(header.tensors[k].nbytes for k in names)
    free = free_bytes("cpu")
    if free is not None and need > free:
        raise CheckpointError(path, f"its tensors take {format_bytes(need)} but the host has {format_bytes(free)} "
                                    "free; refused before reading them")
    return read_tensors(path, header, names), metadata


def _decode_metadata(raw: dict) -> dict:
    """Metadata values that hold JSON objects or lists, decoded (nesting and numbers bounded); the rest kept as
    strings."""
    metadata = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str) and value.startswith(("{", "[")):
            try:
                metadata[key] = json.loads(value, parse_int=_metadata_int)
            except (json.JSONDecodeError, RecursionError, ValueError):
                pass
    return metadata


def _metadata_int(text: str) -> int:
    if len(text) > 40:
        raise ValueError("an integer too long to be a size")
    return int(text)
