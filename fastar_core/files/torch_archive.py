"""A torch ``.pt`` checked before torch sees it, then read with ``weights_only`` (never running pickled code).

A zip archive (what ``torch.save`` writes) has its directory read first: the entry count, duplicate names, and the
uncompressed sizes against free memory; then every entry is read once so its CRC-32 is checked (a flipped byte in
a stored tensor is found here, torch does not check); then the pickle's shape is scanned (``pickle_scan``) and
each storage it declares must fit in the entry that holds it. A legacy (pre-zip) file's pickles are scanned the
same way and its declared storages must fit in the file.
"""

from __future__ import annotations

import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path

from ..errors import CheckpointError
from ..memory import format_bytes, free_bytes
from .pickle_scan import BoundedReader, PickleShapeError, scan_pickle

MAX_ENTRIES = 200_000  # one per tensor (and a few more); the largest Wan checkpoints hold ~1,500
_CHUNK = 1 << 20
_BOMB_BYTES, _BOMB_RATIO = 64 << 20, 200  # entries past 64 MiB that expand more than 200-fold
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"


def _entry_count(path: Path, size: int) -> int | None:
    """Entries the zip's end record declares, read before ``zipfile`` builds one object per entry."""
    with open(path, "rb") as f:
        tail_len = min(size, 65536 + 22)
        f.seek(size - tail_len)
        tail = f.read(tail_len)
        at = tail.rfind(_EOCD)
        if at < 0 or at + 22 > len(tail):
            return None
        count = struct.unpack("<H", tail[at + 10:at + 12])[0]
        if count != 0xFFFF:
            return count
        loc = tail.rfind(_EOCD64_LOCATOR, 0, at)
        if loc < 0 or loc + 20 > len(tail):
            return None
        offset = struct.unpack("<Q", tail[loc + 8:loc + 16])[0]
        if offset + 56 > size:
            return None
        f.seek(offset)
        record = f.read(56)
        return struct.unpack("<Q", record[32:40])[0] if record[:4] == b"PK\x06\x06" else None


def _fits_memory(path: Path, nbytes: int, what: str) -> None:
    free = free_bytes("cpu")
    if free is not None and nbytes > free:
        raise CheckpointError(path, f"{what} takes {format_bytes(nbytes)} in memory but the host has "
                                    f"{format_bytes(free)} free; refused before reading it")


def _check_zip(path: Path, size: int) -> None:
    count = _entry_count(path, size)
    if count is not None and count > MAX_ENTRIES:
        raise CheckpointError(path, f"its archive declares {count:,} entries; a checkpoint has one per tensor "
                                    f"(at most {MAX_ENTRIES:,} are read)")
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            names = [i.filename for i in infos]
            if len(set(names)) != len(names):
                twice = next(n for n in names if names.count(n) > 1)
                raise CheckpointError(path, f"its archive holds two entries named {twice!r}; which one torch reads "
                                            "is not defined (a tampered or badly merged file)")
            pickles = [i for i in infos if re.fullmatch(r"[^/]+/data\.pkl", i.filename)]
            if len(pickles) != 1:
                raise CheckpointError(path, "is a zip archive but not a torch checkpoint (no single "
                                            "<name>/data.pkl entry)")
            for info in infos:  # torch.save stores entries uncompressed; a huge expansion is a zip bomb
                if info.file_size > _BOMB_BYTES and info.file_size > _BOMB_RATIO * max(1, info.compress_size):
                    raise CheckpointError(path, f"its entry {info.filename} expands {info.compress_size:,} bytes "
                                                f"into {info.file_size:,} (a zip bomb?); torch.save writes entries "
                                                "uncompressed")
            _fits_memory(path, sum(i.file_size for i in infos), "its archive's content")
            for info in infos:
                with z.open(info) as member:  # zipfile raises on a CRC mismatch at the end of the entry
                    while member.read(_CHUNK):
                        pass
            prefix = pickles[0].filename[: -len("data.pkl")]
            with z.open(pickles[0]) as member:
                shape = _scan(path, BoundedReader(member, pickles[0].file_size))
            sizes = {i.filename: i.file_size for i in infos}
            for key, nbytes in shape.storages:
                record = f"{prefix}data/{key}"
                if record not in sizes:
                    raise CheckpointError(path, f"a tensor's storage {key!r} has no entry {record} in the archive "
                                                "(truncated or corrupt?)")
                if nbytes > sizes[record]:
                    raise CheckpointError(path, f"a tensor declares {nbytes:,} bytes of storage but its entry "
                                                f"{record} holds {sizes[record]:,} (corrupt?)")
            _fits_memory(path, shape.nbytes + sum(sizes.values()), "loading it")
    except zipfile.BadZipFile as e:
        raise CheckpointError(path, f"not a readable torch archive (truncated or corrupt?): {e}") from None
    except (EOFError, ValueError, OSError, NotImplementedError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(path, f"not a readable torch archive (truncated or corrupt?): {e}") from None


def _scan(path: Path, reader: BoundedReader):
    try:
        return scan_pickle(reader)
    except PickleShapeError as e:
        raise CheckpointError(path, f"refused before loading: its pickle {e}") from None


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of every legacy torch.save file
_MAGIC_PICKLES = tuple(pickle.dumps(_LEGACY_MAGIC, protocol=p) for p in range(2, pickle.HIGHEST_PROTOCOL + 1))


def _check_legacy(path: Path, size: int) -> None:
    """Magic number, protocol, system info, the object, the storage keys: five pickles, then the storages."""
    declared = objects = 0
    with open(path, "rb") as f:
        if not f.read(32).startswith(_MAGIC_PICKLES):
            raise CheckpointError(path, "is a pickle that torch.save did not write (no torch magic number); "
                                        "save the weights with torch.save or safetensors")
        f.seek(0)
        reader = BoundedReader(f, size)
        for _ in range(5):
            shape = _scan(path, reader)
            declared += sum(n for _, n in shape.storages)
            objects += shape.nbytes
    if declared > size:
        raise CheckpointError(path, f"declares {declared:,} bytes of tensor storage but the file has {size:,} "
                                    "(truncated or corrupt?)")
    _fits_memory(path, declared + objects, "loading it")


def read_torch(path: Path, kind: str, size: int):
    """The object a torch file holds, read with ``weights_only`` after the checks above."""
    import torch

    if kind == "zip":
        _check_zip(path, size)
    else:
        _check_legacy(path, size)
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
    if m and m.group(1) in ("149", "148", "147"):  # FRAME, MEMOIZE, STACK_GLOBAL: pickle protocol 4 or 5
        return ("was saved with pickle protocol 4 or 5, which torch's safe loader does not read; re-save it with "
                "torch.save's default protocol, or as .safetensors")
    if m:
        where = "its data.pkl is not a valid pickle" if kind == "zip" else "not a valid pickle"
        return f"is corrupt: {where} (unknown opcode {m.group(1)})"
    return f"is not a loadable torch checkpoint: {one_line(e)}"


def one_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not any(a in ln for a in _ADVICE)] or [type(e).__name__]
    line = re.sub(r"^(WeightsUnpickler error:|\[enforce fail at [^\]]*\]\s*\.?)\s*", "", lines[0]) or type(e).__name__
    return line[:300]
