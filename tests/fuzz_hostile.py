"""Hostile inputs for the fuzz suite, beyond malformed ones: files shaped to crash or exhaust the reader (a pickle
nested 200,000 deep, archives that declare terabytes, sparse files larger than memory), tampered files that
still look whole (a flipped byte, a duplicate key, a second weight set), and every subcommand's bad options.

All files are small on disk (the terabyte ones are sparse), so the set builds in well under a second.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

DEEP = 200_000


def deep_tuple_key_pickle() -> bytes:
    """{((((...),),),): 1} with the tuple nested ``DEEP`` deep: hashing the key recurses in C."""
    return b"\x80\x02}" + b")" + b"\x85" * DEEP + b"K\x01s."


def deep_list_pickle() -> bytes:
    """[[[[...]]]] ``DEEP`` deep, built bottom-up with APPEND."""
    return b"\x80\x02" + b"]" * DEEP + b"a" * (DEEP - 1) + b"."


def self_containing_pickle() -> bytes:
    """A list that holds itself."""
    return b"\x80\x02]q\x00h\x00a."


class _StorageRef:
    pass


class _HugeTensor:
    """Pickles as torch's tensor rebuild over storage '0' that claims ``numel`` floats."""

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (_StorageRef(), 0, (10**9,), (1,), False, collections.OrderedDict()))


class _StoragePickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", torch.FloatStorage, "0", "cpu", 10**9)
        return None


def huge_storage_pickle() -> bytes:
    buf = io.BytesIO()
    _StoragePickler(buf, protocol=2).dump({"generator_ema": {"head.modulation": _HugeTensor()}})
    return buf.getvalue()


def replace_member(src: Path, dst: Path, suffix: str, payload: bytes) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item, payload if item.filename.endswith(suffix) else zin.read(item.filename))
    return dst


def _declare_size(src: Path, dst: Path, suffix: str, size: int) -> Path:
    """A copy whose directory says the entry ending in ``suffix`` unpacks to ``size`` bytes (a zip bomb's lie)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        for info in zout.filelist:
            if info.filename.endswith(suffix):
                info.file_size = size
    return dst


def _flip_stored_byte(src: Path, dst: Path, suffix: str) -> Path:
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.file_size // 2] ^= 0x40
    dst.write_bytes(bytes(data))
    return dst


def _duplicate_entry(src: Path, dst: Path, suffix: str) -> Path:
    import warnings

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate name, which is the point
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        twin = next(i for i in zin.infolist() if i.filename.endswith(suffix))
        zout.writestr(twin.filename, b"\0" * twin.file_size)
    return dst


def _entry_count_claims(src: Path, dst: Path, count: int) -> Path:
    data = bytearray(src.read_bytes())
    at = data.rfind(b"PK\x05\x06")
    data[at + 8:at + 12] = struct.pack("<HH", 0xFFFF, 0xFFFF)
    locator = data.rfind(b"PK\x06\x07", 0, at)
    if locator >= 0:  # a zip64 end record: its counts are the ones read
        offset = struct.unpack("<Q", data[locator + 8:locator + 16])[0]
        data[offset + 24:offset + 40] = struct.pack("<QQ", count, count)
    else:
        data[at + 8:at + 12] = struct.pack("<HH", min(count, 0xFFFE), min(count, 0xFFFE))
    dst.write_bytes(bytes(data))
    return dst


def safetensors_with_duplicate_key(path: Path, sd: dict, metadata: dict) -> Path:
    """A valid file whose header names one tensor twice (the second copy's offsets point at another tensor)."""
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=metadata)
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    first, second = [k for k in header if k != "__metadata__"][:2]
    text = json.dumps(header)
    entry = json.dumps(header[second])
    doubled = text.replace(f'"{second}": {entry}', f'"{second}": {entry}, "{first}": {entry}', 1)
    raw = doubled.encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    return path


def sparse_safetensors(path: Path, key: str, shape: list) -> Path:
    """A header declaring one F32 tensor of ``shape``, the file extended (sparse) to hold it."""
    nbytes = 4
    for s in shape:
        nbytes *= s
    header = json.dumps({key: {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
    os.truncate(path, 8 + len(header) + nbytes)
    return path


def hostile_checkpoint_cases(root: Path, sd: dict, metadata: dict, good_pt: Path) -> dict:
    """name -> a file every loader must refuse with one line, without crashing or running out of memory."""
    root.mkdir(parents=True, exist_ok=True)
    cases = {}

    def raw(name, data: bytes, suffix=".pt"):
        cases[name] = root / f"{name}{suffix}"
        cases[name].write_bytes(data)

    cases["hostile-deep-tuple-key"] = replace_member(good_pt, root / "hostile-deep-tuple-key.pt", "data.pkl",
                                                     deep_tuple_key_pickle())
    cases["hostile-deep-list"] = replace_member(good_pt, root / "hostile-deep-list.pt", "data.pkl",
                                                deep_list_pickle())
    cases["hostile-self-containing"] = replace_member(good_pt, root / "hostile-self-containing.pt", "data.pkl",
                                                      self_containing_pickle())
    cases["hostile-storage-claims-4gb"] = replace_member(good_pt, root / "hostile-storage-claims-4gb.pt", "data.pkl",
                                                         huge_storage_pickle())
    cases["hostile-zip-declares-1pib"] = _declare_size(good_pt, root / "hostile-zip-declares-1pib.pt", "data/0",
                                                       2**50)
    cases["hostile-flipped-byte"] = _flip_stored_byte(good_pt, root / "hostile-flipped-byte.pt", "data/3")
    cases["hostile-duplicate-entry"] = _duplicate_entry(good_pt, root / "hostile-duplicate-entry.pt", "data/0")
    cases["hostile-entry-count"] = _entry_count_claims(good_pt, root / "hostile-entry-count.pt", 10**9)
    bomb = root / "hostile-zip-bomb.pt"  # 80 MiB of zeros deflated to about 80 KB
    with zipfile.ZipFile(good_pt) as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            if item.filename.endswith("data/0"):
                zout.writestr(item.filename, bytes(80 << 20), compress_type=zipfile.ZIP_DEFLATED)
            else:
                zout.writestr(item, zin.read(item.filename))
    cases["hostile-zip-bomb"] = bomb
    raw("hostile-legacy-deep", pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + deep_list_pickle())
    cases["hostile-st-duplicate-key"] = safetensors_with_duplicate_key(root / "hostile-st-duplicate-key.safetensors",
                                                                       sd, metadata)
    nan = {k: torch.full_like(v, float("nan")) for k, v in sd.items()}
    both = {**{"model.diffusion_model." + k: v for k, v in sd.items()}, **nan}
    cases["hostile-st-second-set-flat"] = root / "hostile-st-second-set-flat.safetensors"
    save_file(both, str(cases["hostile-st-second-set-flat"]), metadata=metadata)
    prefixed = {**{"model.diffusion_model." + k: v for k, v in sd.items()},
                **{"diffusion_model." + k: v for k, v in nan.items()}}
    cases["hostile-st-second-set-prefixed"] = root / "hostile-st-second-set-prefixed.safetensors"
    save_file(prefixed, str(cases["hostile-st-second-set-prefixed"]), metadata=metadata)
    cases["hostile-st-sparse-1tib"] = sparse_safetensors(root / "hostile-st-sparse-1tib.safetensors",
                                                         "head.modulation", [1, 2, 2**38])
    cases["hostile-pt-custom-size-no-config"] = root / "hostile-pt-custom-size-no-config.pt"
    torch.save({"generator_ema": sd}, cases["hostile-pt-custom-size-no-config"])
    return cases


def hostile_conditioning(root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    good_pt = root / "cond-good.pt"
    torch.save({"context": torch.zeros(1, 4, 16)}, good_pt)
    return {"sparse-1tib": sparse_safetensors(root / "cond-1tib.safetensors", "context", [1, 2**20, 2**18]),
            "deep-pickle": replace_member(good_pt, root / "cond-deep.pt", "data.pkl", deep_tuple_key_pickle())}


def hostile_calibration(root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, text in (("deep", '{"layers": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                       ("huge-int", '{"layers": [1' + "0" * 5000 + "]}"),
                       ("huge-file", '{"layers": [0], "pad": "' + "x" * (2 << 20) + '"}')):
        files[name] = root / f"calibration-{name}.json"
        files[name].write_text(text)
    return files


def subcommand_mistakes(root: Path, evil_pt: Path, deep_pt: Path) -> dict:
    """name -> (argv, a word the message must contain) for demo, bench, calibrate, gpu-check and train-demo.
    Every one must be refused before any work, writing nothing."""
    train_out = root / "train"
    planted = root / "planted"
    planted.mkdir(parents=True, exist_ok=True)
    (planted / "train_state.pt").write_bytes(evil_pt.read_bytes())
    deep_state = root / "planted-deep"
    deep_state.mkdir(parents=True, exist_ok=True)
    (deep_state / "train_state.pt").write_bytes(deep_pt.read_bytes())
    demo_out = str(root / "demo")

    def train(*extra, out=train_out):
        return ["train-demo", "--out", str(out), "--steps", "1", "--no-report", *extra]

    return {
        "demo-seed-negative": (["demo", "--out", demo_out, "--seed", "-1"], "--seed"),
        "demo-frames-zero": (["demo", "--out", demo_out, "--frames", "0"], "--frames"),
        "demo-frames-negative": (["demo", "--out", demo_out, "--frames", "-5"], "--frames"),
        "demo-frames-huge": (["demo", "--out", demo_out, "--frames", "100000"], "--frames"),
        "demo-out-proc": (["demo", "--out", "/proc/fastar-fuzz-demo"], "--out"),
        "demo-out-empty": (["demo", "--out", ""], "--out"),
        "bench-frames-zero": (["bench", "rollout", "--out", demo_out, "--frames", "0"], "--frames"),
        "bench-repeats-zero": (["bench", "rollout", "--out", demo_out, "--repeats", "0"], "--repeats"),
        "bench-modes-bogus": (["bench", "rollout", "--out", demo_out, "--modes", "bogus"], "--modes"),
        "bench-thresholds-text": (["bench", "pareto", "--out", demo_out, "--thresholds", "x"], "--thresholds"),
        "bench-capacities-negative": (["bench", "pareto", "--out", demo_out, "--capacities", "-1"], "--capacities"),
        "bench-variants-bogus": (["bench", "pareto", "--out", demo_out, "--variants", "bogus"], "--variants"),
        "bench-budget-zero": (["bench", "rollout", "--out", demo_out, "--budget", "0"], "--budget"),
        "bench-out-proc": (["bench", "rollout", "--out", "/proc/fastar-fuzz-bench"], "--out"),
        "calibrate-frames-zero": (["calibrate", "--out", str(root / "c.json"), "--frames", "0"], "--frames"),
        "calibrate-fraction-two": (["calibrate", "--out", str(root / "c.json"), "--fraction", "2"], "--fraction"),
        "calibrate-min-recall-nan": (["calibrate", "--out", str(root / "c.json"), "--min-recall", "nan"],
                                     "--min-recall"),
        "calibrate-out-folder": (["calibrate", "--out", str(root)], "--out"),
        "calibrate-out-empty": (["calibrate", "--out", ""], "--out"),
        "calibrate-checkpoint-missing": (["calibrate", "--out", str(root / "c.json"), "--checkpoint",
                                          str(root / "none.pt")], "none.pt"),
        "calibrate-checkpoint-evil": (["calibrate", "--out", str(root / "c.json"), "--checkpoint", str(evil_pt)],
                                      evil_pt.name),
        "gpu-check-deadline-zero": (["gpu-check", "--out", demo_out, "--deadline", "0"], "--deadline"),
        "train-steps-zero": (train("--steps", "0"), "--steps"),
        "train-minutes-negative": (train("--minutes", "-1"), "--minutes"),
        "train-batch-zero": (train("--batch", "0"), "--batch"),
        "train-threads-zero": (train("--threads", "0"), "--threads"),
        "train-seed-negative": (train("--seed", "-1"), "--seed"),
        "train-checkpoint-minutes-nan": (train("--checkpoint-minutes", "nan"), "--checkpoint-minutes"),
        "train-init-missing": (train("--init-from", str(root / "absent.pt")), "--init-from"),
        "train-init-evil": (train("--init-from", str(evil_pt)), evil_pt.name),
        "train-init-deep": (train("--init-from", str(deep_pt)), deep_pt.name),
        "train-resume-planted-evil": (train(out=planted), "train_state.pt"),
        "train-resume-planted-deep": (train(out=deep_state), "train_state.pt"),
        "train-notes-missing": (train("--notes", str(root / "absent.md")), "--notes"),
        "train-report-only-nothing": (train("--report-only"), "--report-only"),
        "train-new-region-weight-sprites": (train("--new-region-weight", "4"), "--world steer"),
        "train-new-region-weight-zero": (train("--world", "steer", "--new-region-weight", "0"), "--new-region-weight"),
        "train-landmark-weight-sprites": (train("--landmark-weight", "2"), "--world steer"),
        "train-landmark-weight-nan": (train("--world", "steer", "--landmark-weight", "nan"), "--landmark-weight"),
        "train-out-empty": (["train-demo", "--out", "", "--steps", "1"], "--out"),
        "train-out-proc": (train(out=Path("/proc/fastar-fuzz-train")), "--out"),
        "train-unknown-option": (train("--bogus"), "--bogus"),
    }
