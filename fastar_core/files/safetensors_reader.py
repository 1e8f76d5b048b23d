"""Reading a safetensors file with every declared size checked against the file before a byte of data is read.

The header is parsed here rather than by the safetensors library, so that what the library lets through is
refused: a key declared twice (JSON keeps the last one silently), a tensor whose bytes overlap another's or lie
past the end, holes or trailing bytes in the data, and a header nested or numbered absurdly. Tensors are then
read with plain file reads, only the ones asked for, so a file larger than memory is never mapped and the memory
a read needs is known (and checked) before it is allocated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError

MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own limit
_MAX_INT_DIGITS = 20  # every size and offset fits in 64 bits

# Safetensors dtype names: bytes per element and the torch dtype.
DTYPES = {"F64": (8, torch.float64), "F32": (4, torch.float32), "F16": (2, torch.float16),
          "BF16": (2, torch.bfloat16), "F8_E4M3": (1, torch.float8_e4m3fn), "F8_E5M2": (1, torch.float8_e5m2),
          "I64": (8, torch.int64), "I32": (4, torch.int32), "I16": (2, torch.int16), "I8": (1, torch.int8),
          "U8": (1, torch.uint8), "BOOL": (1, torch.bool), "U16": (2, getattr(torch, "uint16", None)),
          "U32": (4, getattr(torch, "uint32", None)), "U64": (8, getattr(torch, "uint64", None)),
          "C64": (8, torch.complex64)}


@dataclass
class TensorInfo:
    """One tensor as its file declares it (names and shapes known before the data is read)."""

    dtype: str
    shape: tuple
    nbytes: int
    start: int = 0  # offset of its bytes in the file


@dataclass
class Header:
    tensors: dict  # name -> TensorInfo, in the file's order
    metadata: dict  # the __metadata__ strings


def _no_duplicates(path: Path):
    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise CheckpointError(path, f"its header declares {key!r} twice; a file must name each tensor once "
                                            "(which copy is meant is unknown)")
            seen[key] = value
        return seen
    return pairs


def _bounded_int(path: Path):
    def parse(text: str) -> int:
        if len(text.lstrip("-")) > _MAX_INT_DIGITS:
            raise CheckpointError(path, f"its header holds a {len(text)}-digit number; sizes and offsets fit in "
                                        "64 bits")
        return int(text)
    return parse


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: Path, size: int) -> Header:
    """The declared tensors and metadata of a safetensors file of ``size`` bytes, every entry checked."""
    def bad(problem):
        return CheckpointError(path, f"not a readable safetensors file: {problem}")

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, shorter than the 8-byte header length (truncated?)")
        n = int.from_bytes(head, "little")
        if n < 2 or n > min(size - 8, MAX_HEADER_BYTES):
            raise bad(f"its header claims {n:,} bytes but the file has {size:,} (truncated or not safetensors?)")
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("its header is not UTF-8 text") from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates(path), parse_int=_bounded_int(path),
                            parse_constant=lambda c: None)
    except RecursionError:
        raise bad("its header is nested too deeply to be a tensor list") from None
    except json.JSONDecodeError as e:
        raise bad(f"its header is not valid JSON ({e.msg} at byte {e.pos})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is a JSON {type(header).__name__}, not an object of tensors")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("its __metadata__ is not an object of strings")
    data_size = size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"entry {name[:80]!r} is not {{dtype, shape, data_offsets}}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad(f"{name[:80]} has unknown dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or not all(_is_count(s) for s in shape) or len(shape) > 16:
            raise bad(f"{name[:80]} has shape {str(shape)[:60]}; expected up to 16 non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1] <= data_size):
            raise bad(f"{name[:80]} has data offsets {str(offsets)[:60]}, outside the file's {data_size:,} data "
                      "bytes (truncated or corrupt?)")
        nbytes = math.prod(shape) * DTYPES[dtype][0]
        if offsets[1] - offsets[0] != nbytes:
            raise bad(f"{name[:80]} declares shape {shape} of {dtype} ({nbytes:,} bytes) but "
                      f"{offsets[1] - offsets[0]:,} bytes of data")
        tensors[name] = (offsets[0], offsets[1], TensorInfo(dtype, tuple(shape), nbytes, 8 + n + offsets[0]))
    end = 0
    for name, (begin, stop, _) in sorted(tensors.items(), key=lambda item: item[1][:2]):
        if begin != end:
            what = "overlap" if begin < end else "leave a gap"
            raise bad(f"the data of {name[:80]} and the tensor before it {what} (bytes {end:,} and {begin:,}); "
                      "the file is corrupt")
        end = stop
    if end != data_size:
        raise bad(f"{data_size - end:,} bytes follow the last tensor's data (two files joined, or corrupt?)")
    return Header({k: info for k, (_, _, info) in tensors.items()}, dict(metadata))


def read_tensors(path: Path, header: Header, names) -> dict:
    """The named tensors, read with file reads (no mapping of the file)."""
    out = {}
    with open(path, "rb", buffering=0) as f:
        for name in names:
            info = header.tensors[name]
            dtype = DTYPES[info.dtype][1]
            if dtype is None:
                raise CheckpointError(path, f"{name} is {info.dtype}, which this torch cannot hold")
            if info.nbytes == 0:
                out[name] = torch.empty(info.shape, dtype=dtype)
                continue
            buf = bytearray(info.nbytes)
            f.seek(info.start)
            view = memoryview(buf)
            got = 0
            while got < info.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise CheckpointError(path, f"ended inside the data of {name} (truncated while being read?)")
                got += n
            out[name] = torch.frombuffer(buf, dtype=dtype).reshape(info.shape)
    return out
