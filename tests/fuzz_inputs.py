"""Malformed inputs for the fuzz suite: checkpoint files of every kind of wrong, command-line mistakes, and a
runner that executes each case in a forked child with a deadline, as a server would.

Every file is tiny (a 3-layer, dim-32 model is ~60 KB), so the whole set builds in a second or two.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import pickle
import signal
import struct
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from fuzz_hostile import hostile_checkpoint_cases
from safetensors.torch import save_file

from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.tools import cli, generate  # noqa: F401 - imported once here, not in every forked child

FUZZ_CFG = WanConfig(dim=32, num_heads=2, num_layers=3, ffn_dim=64, text_dim=16, freq_dim=16)


def good_state_dict(dtype=torch.bfloat16) -> dict:
    return {k: v.detach().to(dtype).contiguous() for k, v in random_wan(FUZZ_CFG, seed=0).state_dict().items()}


def good_metadata(**changes) -> dict:
    cfg = dict(FUZZ_CFG.to_dict(), **changes)
    return {"fastar_config": json.dumps(cfg)}


# --- code that must never run -------------------------------------------------------------------------------

class RunsCode:
    """Unpickling this would run a shell command that creates the marker file."""

    marker = ""

    def __reduce__(self):
        return (os.system, (f"touch {RunsCode.marker}",))


class RunsEval:
    def __reduce__(self):
        return (eval, (f"open({RunsCode.marker!r}, 'w').close()",))


class RunsExec:
    def __reduce__(self):
        import builtins

        return (builtins.exec, (f"open({RunsCode.marker!r}, 'w').close()",))


class PlainObject:
    pass


class BadRebuild:
    """Allowed global (torch's tensor rebuild) with nonsense arguments."""

    def __init__(self, args):
        self.args = args

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


# --- the generator --------------------------------------------------------------------------------------------

def _st(path: Path, tensors: dict, metadata: dict | None = None) -> Path:
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _safetensors_bytes(header: dict | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + data


def _replace_zip_member(src: Path, dst: Path, suffix: str, payload: bytes) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = payload if item.filename.endswith(suffix) else zin.read(item.filename)
            zout.writestr(item, data)
    return dst


def checkpoint_cases(root: Path, marker: Path) -> dict:
    """name -> path of a file (or special file) that `fastar info` / `fastar generate` must refuse."""
    RunsCode.marker = str(marker)
    root.mkdir(parents=True, exist_ok=True)
    cases: dict = {}
    sd = good_state_dict()
    meta = good_metadata()

    def st(name, tensors, metadata=meta):
        cases[name] = _st(root / f"{name}.safetensors", tensors, metadata)

    def raw(name, data: bytes, suffix=".pt"):
        p = root / f"{name}{suffix}"
        p.write_bytes(data)
        cases[name] = p

    def pt(name, obj, **kw):
        p = root / f"{name}.pt"
        torch.save(obj, p, **kw)
        cases[name] = p

    good_st = _st(root / "reference-good.safetensors", sd, meta)
    good_pt = root / "reference-good.pt"
    torch.save({"generator_ema": sd}, good_pt)
    legacy_pt = root / "reference-legacy.pt"
    torch.save({"generator_ema": sd}, legacy_pt, _use_new_zipfile_serialization=False)

    # Truncations at many offsets (header, data, the very end).
    for label, src, suffix, n in (("st", good_st, ".safetensors", 48), ("zip", good_pt, ".pt", 36),
                                  ("legacy", legacy_pt, ".pt", 20)):
        data = src.read_bytes()
        size = len(data)
        offsets = sorted({0, 1, 4, 7, 8, 9, 16, 64, size - 1, size - 2, size // 2}
                         | {int(size * i / n) for i in range(1, n)})
        for off in offsets:
            if 0 <= off < size:
                raw(f"trunc-{label}-{off}", data[:off], suffix)

    # Safetensors headers.
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    raw("hdr-len-huge", struct.pack("<Q", 2**62) + b"{}", ".safetensors")
    raw("hdr-len-zero", struct.pack("<Q", 0), ".safetensors")
    raw("hdr-len-past-end", _safetensors_bytes({"a": entry}, b"\0" * 8, length=10_000), ".safetensors")
    raw("hdr-not-json", _safetensors_bytes(b"{not json at all}"), ".safetensors")
    raw("hdr-json-list", _safetensors_bytes([1, 2, 3]), ".safetensors")
    raw("hdr-json-number", _safetensors_bytes(b"12345678"), ".safetensors")
    raw("hdr-not-utf8", _safetensors_bytes(b"{\"\xff\xfe\": 1}"), ".safetensors")
    raw("hdr-empty-object", _safetensors_bytes({}), ".safetensors")
    raw("hdr-bad-dtype", _safetensors_bytes({"a": dict(entry, dtype="Q99")}, b"\0" * 8), ".safetensors")
    raw("hdr-offsets-past-end", _safetensors_bytes({"a": dict(entry, data_offsets=[0, 800])}, b"\0" * 8),
        ".safetensors")
    raw("hdr-offsets-reversed", _safetensors_bytes({"a": dict(entry, data_offsets=[8, 0])}, b"\0" * 8),
        ".safetensors")
    raw("hdr-offsets-negative", _safetensors_bytes({"a": dict(entry, data_offsets=[-8, 0])}, b"\0" * 8),
        ".safetensors")
    raw("hdr-shape-vs-offsets", _safetensors_bytes({"a": dict(entry, shape=[3])}, b"\0" * 8), ".safetensors")
    raw("hdr-shape-negative", _safetensors_bytes({"a": dict(entry, shape=[-2])}, b"\0" * 8), ".safetensors")
    raw("hdr-shape-huge", _safetensors_bytes({"a": dict(entry, shape=[2**40, 2**40])}, b"\0" * 8), ".safetensors")
    raw("hdr-overlap", _safetensors_bytes({"a": entry, "b": entry}, b"\0" * 8), ".safetensors")
    raw("hdr-metadata-not-str", _safetensors_bytes({"__metadata__": {"x": 1}, "a": entry}, b"\0" * 8),
        ".safetensors")
    raw("hdr-entry-not-object", _safetensors_bytes({"a": [1, 2]}, b"\0" * 8), ".safetensors")
    raw("hdr-missing-fields", _safetensors_bytes({"a": {"dtype": "F32"}}, b"\0" * 8), ".safetensors")
    raw("hdr-valid-vae", _safetensors_bytes({"encoder.w": entry}, b"\0" * 8), ".safetensors")
    raw("hdr-trailing-garbage", good_st.read_bytes() + b"garbage", ".safetensors")
    raw("hdr-zero-bytes", b"", ".safetensors")

    # Dtypes: integer, boolean, fp64, fp8, complex, one odd tensor.
    for name, dt in (("int32", torch.int32), ("int64", torch.int64), ("int8", torch.int8), ("uint8", torch.uint8),
                     ("bool", torch.bool), ("int16", torch.int16)):
        st(f"dtype-all-{name}", {k: (v * 10).to(dt) for k, v in sd.items()})
    q1 = "blocks.1.self_attn.q.weight"
    st("dtype-one-int32", dict(sd, **{q1: sd[q1].to(torch.int32)}))
    st("dtype-one-bool", dict(sd, **{"head.modulation": sd["head.modulation"] > 0}))
    st("dtype-all-fp64", {k: v.double() for k, v in sd.items()})
    st("dtype-all-fp8e4m3", {k: v.to(torch.float8_e4m3fn) for k, v in sd.items()})
    st("dtype-all-fp8e5m2", {k: v.to(torch.float8_e5m2) for k, v in sd.items()})
    pt("dtype-complex", {k: v.float().to(torch.complex64) for k, v in sd.items()})
    pt("dtype-one-complex", dict(sd, **{"head.head.bias": sd["head.head.bias"].float().to(torch.complex64)}))

    # Non-finite weights.
    for name, value in (("nan", float("nan")), ("posinf", float("inf")), ("neginf", float("-inf"))):
        bad = {k: v.clone() for k, v in sd.items()}
        bad["blocks.2.ffn.0.weight"][3, 5] = value
        st(f"weights-{name}", bad)
    bad = {k: v.clone() for k, v in sd.items()}
    bad["head.modulation"].fill_(float("nan"))
    st("weights-all-nan-modulation", bad)

    # Shapes: the tensors the config is read from, at the wrong rank or width.
    shape_cases = {
        "shape-modulation-0d": ("head.modulation", torch.tensor(1.0)),
        "shape-modulation-1d": ("head.modulation", torch.zeros(32)),
        "shape-modulation-zero": ("head.modulation", torch.zeros(1, 2, 0)),
        "shape-patch-1d": ("patch_embedding.weight", torch.zeros(32)),
        "shape-patch-4d": ("patch_embedding.weight", torch.zeros(32, 16, 2, 2)),
        "shape-patch-zero": ("patch_embedding.weight", torch.zeros(32, 16, 0, 2, 2)),
        "shape-head-1d": ("head.head.weight", torch.zeros(64)),
        "shape-head-indivisible": ("head.head.weight", torch.zeros(63, 32)),
        "shape-head-zero": ("head.head.weight", torch.zeros(0, 32)),
        "shape-ffn-1d": ("blocks.0.ffn.0.weight", torch.zeros(64)),
        "shape-ffn-0d": ("blocks.0.ffn.0.weight", torch.tensor(0.0)),
        "shape-text-1d": ("text_embedding.0.weight", torch.zeros(32)),
        "shape-time-0d": ("time_embedding.0.weight", torch.tensor(2.0)),
        "shape-q-wrong": ("blocks.0.self_attn.q.weight", torch.zeros(32, 31)),
        "shape-q-transposed-ffn": ("blocks.1.ffn.0.weight", torch.zeros(32, 64)),
        "shape-bias-2d": ("blocks.2.self_attn.k.bias", torch.zeros(1, 32)),
        "shape-modulation-wide": ("blocks.0.modulation", torch.zeros(1, 7, 32)),
        "shape-modulation-dim-odd": ("head.modulation", torch.zeros(1, 2, 33)),
    }
    for name, (key, tensor) in shape_cases.items():
        st(name, dict(sd, **{key: tensor.to(torch.bfloat16)}))
        st(name + "-nometa", dict(sd, **{key: tensor.to(torch.bfloat16)}), metadata=None)

    # Keys: stray and missing layers, gaps, collisions after unwrapping, not-Wan files, non-string keys.
    block0 = {k: v for k, v in sd.items() if k.startswith("blocks.0.")}
    st("keys-stray-block-10000", dict(sd, **{"blocks.10000.ffn.0.weight": sd["blocks.0.ffn.0.weight"]}))
    st("keys-stray-block-10000-nometa", dict(sd, **{"blocks.10000.ffn.0.weight": sd["blocks.0.ffn.0.weight"]}),
       metadata=None)
    st("keys-stray-block-huge", dict(sd, **{"blocks.99999999999999999999.ffn.0.weight": sd["head.head.bias"]}),
       metadata=None)
    st("keys-gap-block", {k: v for k, v in sd.items() if not k.startswith("blocks.1.")}, metadata=None)
    st("keys-leading-zero", dict(sd, **{k.replace("blocks.0.", "blocks.00."): v for k, v in block0.items()}),
       metadata=None)
    st("keys-no-block-0", {k: v for k, v in sd.items() if not k.startswith("blocks.0.")}, metadata=None)
    st("keys-no-blocks", {k: v for k, v in sd.items() if not k.startswith("blocks.")}, metadata=None)
    st("keys-collision-orig-mod", dict(sd, **{"blocks.0._orig_mod.self_attn.q.weight":
                                              sd["blocks.0.self_attn.q.weight"]}))
    st("keys-collision-fsdp", dict(sd, **{"_fsdp_wrapped_module.head.head.bias": sd["head.head.bias"]}))
    st("keys-missing-head-modulation", {k: v for k, v in sd.items() if k != "head.modulation"})
    st("keys-missing-one", {k: v for k, v in sd.items() if k != "blocks.2.cross_attn.o.bias"})
    st("keys-extra-one", dict(sd, **{"blocks.0.self_attn.extra": torch.zeros(2)}))
    st("keys-vae", {"encoder.conv1.weight": torch.zeros(4, 4), "decoder.conv1.weight": torch.zeros(4, 4)})
    st("keys-single-tensor", {"x": torch.zeros(1)}, metadata=None)
    st("keys-i2v", dict(sd, **{"img_emb.proj.0.weight": torch.zeros(4), "blocks.0.cross_attn.k_img.weight":
                             torch.zeros(32, 32)}))
    st("keys-long-name", dict(sd, **{"blocks.0." + "x" * 5000: torch.zeros(1)}))
    st("keys-unicode", dict(sd, **{"blocks.0.sélf_attn.q.weight": torch.zeros(1)}))
    st("keys-only-metadata", {"__dummy": torch.zeros(0)})
    pt("keys-int", {1: torch.zeros(1), 2: torch.zeros(2)})
    pt("keys-tuple", {("blocks", 0): torch.zeros(1), "head.modulation": torch.zeros(1, 2, 32)})
    pt("keys-mixed-int", {**sd, 7: torch.zeros(1)})
    pt("keys-none-key", {None: sd})
    pt("keys-empty-dict", {})
    pt("keys-empty-containers", {"generator_ema": {}, "generator": {}})
    pt("keys-container-not-dict", {"generator_ema": [torch.zeros(1)]})
    pt("keys-nested-dict-values", {"generator": {"blocks.0": {"w": torch.zeros(1)}}})
    pt("keys-values-not-tensors", dict(sd, **{"head.modulation": 3}))
    pt("keys-values-strings", {k: "x" for k in sd})
    pt("keys-collision-pt", {"generator": dict(sd, **{"blocks.1._checkpoint_wrapped_module.ffn.0.weight":
                                                      sd["blocks.1.ffn.0.weight"]})})

    # Metadata: the declared config, wrong in type, range or against the tensors.
    bad_configs = {
        "heads-0": {"num_heads": 0}, "heads-3": {"num_heads": 3}, "heads-neg": {"num_heads": -2},
        "heads-str": {"num_heads": "2"}, "heads-float": {"num_heads": 2.5}, "heads-bool": {"num_heads": True},
        "heads-null": {"num_heads": None}, "heads-32-odd-head-dim": {"num_heads": 32},
        "dim-str": {"dim": "32"}, "dim-float": {"dim": 32.0}, "dim-null": {"dim": None}, "dim-neg": {"dim": -32},
        "dim-0": {"dim": 0}, "dim-huge": {"dim": 2**40}, "dim-list": {"dim": [32]}, "dim-mismatch": {"dim": 64},
        "layers-100000": {"num_layers": 100000}, "layers-0": {"num_layers": 0}, "layers-neg": {"num_layers": -1},
        "layers-4": {"num_layers": 4}, "layers-2": {"num_layers": 2}, "layers-str": {"num_layers": "3"},
        "ffn-mismatch": {"ffn_dim": 65}, "ffn-0": {"ffn_dim": 0}, "text-mismatch": {"text_dim": 17},
        "freq-odd": {"freq_dim": 15}, "in-0": {"in_dim": 0}, "out-mismatch": {"out_dim": 8},
        "patch-5": {"patch_size": 5}, "patch-2": {"patch_size": [1, 2]}, "patch-4": {"patch_size": [1, 2, 2, 2]},
        "patch-str": {"patch_size": [1, 2, "2"]}, "patch-zero": {"patch_size": [0, 2, 2]},
        "patch-neg": {"patch_size": [1, -2, 2]}, "patch-temporal-2": {"patch_size": [2, 2, 2]},
        "patch-float": {"patch_size": [1.0, 2.0, 2.0]}, "patch-string": {"patch_size": "1,2,2"},
        "eps-str": {"eps": "tiny"}, "eps-neg": {"eps": -1.0}, "eps-nan": {"eps": float("nan")},
        "eps-inf": {"eps": float("inf")}, "text-len-neg": {"text_len": -5},
    }
    for name, change in bad_configs.items():
        st(f"meta-{name}", sd, {"fastar_config": json.dumps(dict(FUZZ_CFG.to_dict(), **change))})
    for name, value in (("list", "[1, 2]"), ("string", "\"abc\""), ("number", "42"), ("bad-json", "{dim: 3"),
                        ("null", "null"), ("empty", "{}x")):
        st(f"meta-fastar-config-{name}", sd, {"fastar_config": value})

    # Pickles: code-running, foreign objects, wrong containers, nonsense for allowed globals.
    pt("pickle-runs-code-system", {"generator_ema": sd, "x": RunsCode()})
    pt("pickle-runs-code-eval", {"generator_ema": sd, "x": RunsEval()})
    pt("pickle-runs-code-exec", RunsExec())
    pt("pickle-runs-code-legacy", {"x": RunsCode()}, _use_new_zipfile_serialization=False)
    pt("pickle-plain-object", {"generator": sd, "extra": PlainObject()})
    raw("pickle-raw-runs-code-p0", pickle.dumps(RunsCode(), protocol=0))
    raw("pickle-raw-runs-code-p2", pickle.dumps({"a": RunsCode()}, protocol=2))
    raw("pickle-raw-runs-code-p5", pickle.dumps([RunsEval()], protocol=5))
    raw("pickle-raw-dict-of-ints", pickle.dumps({"a": 1}, protocol=2))
    evil = pickle.dumps({"x": RunsCode()}, protocol=2)
    cases["pickle-zip-evil-data"] = _replace_zip_member(good_pt, root / "pickle-zip-evil-data.pt", "data.pkl", evil)
    cases["pickle-zip-garbage-data"] = _replace_zip_member(good_pt, root / "pickle-zip-garbage-data.pt", "data.pkl",
                                                           b"\x80\x02garbage")
    cases["pickle-zip-bad-storage"] = _replace_zip_member(good_pt, root / "pickle-zip-bad-storage.pt", "data/0",
                                                          b"\x00")
    for name, obj in (("list", [torch.zeros(1)]), ("tensor", torch.zeros(3)), ("int", 5), ("none", None),
                      ("string", "a model"), ("tuple", (sd,)), ("bytes", b"abc"), ("set", {1, 2}),
                      ("nested-lists", [[[[[1]]]]]), ("float-nan", float("nan"))):
        pt(f"pickle-top-{name}", obj)
    pt("pickle-rebuild-bad-args", {"generator": {"head.modulation": BadRebuild((1, 2, 3))}})
    pt("pickle-rebuild-bad-size", {"generator": {"head.modulation": BadRebuild(
        (torch.zeros(2).untyped_storage(), 0, (10**9, 10**9), (1, 1), False, None))}})
    raw("pickle-deep-nesting", b"\x80\x02" + b"]" * 50000 + b"." )
    raw("pickle-unbalanced", b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01")

    cases.update(hostile_checkpoint_cases(root / "hostile", sd, meta, good_pt))

    # Not checkpoints at all.
    import random

    rng = random.Random(0)
    for i, size in enumerate((1, 10, 100, 1000, 65536)):
        raw(f"bytes-random-{i}", bytes(rng.randrange(256) for _ in range(size)))
    raw("bytes-random-st", bytes(rng.randrange(256) for _ in range(4096)), ".safetensors")
    raw("bytes-zeros", b"\0" * 4096)
    raw("bytes-empty", b"")
    raw("compressed-gzip", gzip.compress(good_pt.read_bytes()))
    raw("compressed-gzip-st", gzip.compress(good_st.read_bytes()), ".safetensors")
    raw("compressed-bz2", bz2.compress(b"model" * 100))
    raw("compressed-xz", lzma.compress(b"model" * 100))
    raw("text-plain", b"this is not a model\n")
    raw("text-json", json.dumps({"dim": 32}).encode())
    raw("text-html", b"<!DOCTYPE html><html><body>404 Not Found</body></html>")
    raw("text-lfs-pointer", b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    raw("text-lfs-pointer-st", b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
        ".safetensors")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("readme.txt", "hello")
    raw("zip-not-torch", buf.getvalue())
    raw("zip-empty", b"PK\x05\x06" + b"\0" * 18)
    cases["suffix-gguf"] = root / "model.gguf"
    cases["suffix-gguf"].write_bytes(b"GGUF" + b"\0" * 60)
    cases["suffix-none"] = root / "model"
    cases["suffix-none"].write_bytes(good_st.read_bytes())

    # Special files.
    d = root / "a-directory.pt"
    d.mkdir(exist_ok=True)
    cases["special-directory-pt"] = d
    d2 = root / "a-directory.safetensors"
    d2.mkdir(exist_ok=True)
    cases["special-directory-st"] = d2
    for name, target in (("dev-zero", "/dev/zero"), ("dev-null", "/dev/null"), ("dev-urandom", "/dev/urandom")):
        for suffix in (".pt", ".safetensors"):
            link = root / f"special-{name}{suffix}"
            if not link.is_symlink():
                link.symlink_to(target)
            cases[f"special-{name}{suffix}"] = link
    fifo = root / "special-fifo.pt"
    if not fifo.exists():
        os.mkfifo(fifo)
    cases["special-fifo-pt"] = fifo
    broken = root / "special-broken-link.pt"
    if not broken.is_symlink():
        broken.symlink_to(root / "nowhere.pt")
    cases["special-broken-link"] = broken
    cases["special-absent"] = root / "absent.safetensors"
    loop = root / "special-loop.pt"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    cases["special-symlink-loop"] = loop
    return cases


def accepted_cases(root: Path) -> dict:
    """name -> path of odd files that are still usable models: each must load, and say what is odd about it."""
    root.mkdir(parents=True, exist_ok=True)
    sd = good_state_dict()
    meta = good_metadata()
    cases = {}
    # ComfyUI's own metadata, malformed: not ours to refuse, only not to trip on (the marker reads as unknown).
    for name, value in (("transformer-list", {"transformer": [1, 2]}), ("transformer-str", {"transformer": "x"}),
                        ("config-list", [1, 2]), ("causal-ar-str", {"transformer": {"causal_ar": "maybe"}})):
        cases[f"comfy-{name}"] = _st(root / f"comfy-{name}.safetensors", sd, dict(meta, config=json.dumps(value)))
    mixed = dict(sd, **{k: v.float() for k, v in sd.items() if k.endswith("norm3.weight")})
    cases["mixed-dtypes"] = _st(root / "mixed-dtypes.safetensors", mixed, meta)
    return cases


def conditioning_files(root: Path, text_dim: int) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    files = {}

    def st(name, tensors):
        files[name] = _st(root / f"{name}.safetensors", tensors)

    st("wrong-dim", {"context": torch.zeros(1, 4, text_dim + 1)})
    st("4d", {"context": torch.zeros(1, 1, 4, text_dim)})
    st("1d", {"context": torch.zeros(text_dim)})
    st("nan", {"context": torch.full((1, 4, text_dim), float("nan"))})
    st("int", {"context": torch.zeros(1, 4, text_dim, dtype=torch.int32)})
    st("zero-tokens", {"context": torch.zeros(1, 0, text_dim)})
    st("two-unnamed", {"a": torch.zeros(1, 4, text_dim), "b": torch.zeros(1, 4, text_dim)})
    st("batch-2", {"context": torch.zeros(2, 4, text_dim)})
    files["random-bytes"] = root / "random.safetensors"
    files["random-bytes"].write_bytes(os.urandom(256))
    files["text"] = root / "prompt.txt"
    files["text"].write_text("a cat\n")
    files["directory"] = root / "cond-dir"
    files["directory"].mkdir(exist_ok=True)
    return files


def calibration_files(root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, text in (("not-json", "{layers: "), ("list", "[1, 2]"), ("no-layers", '{"recall": 1}'),
                       ("layers-str", '{"layers": "all"}'), ("layers-out-of-range", '{"layers": [0, 99]}'),
                       ("layers-not-int", '{"layers": ["a"]}'), ("layers-nan", '{"layers": [NaN]}'),
                       ("empty", "")):
        files[name] = root / f"calibration-{name}.json"
        files[name].write_text(text)
    return files


def warm_up(ckpt: Path) -> None:
    """Run once in this process what every child would otherwise pay for on its own (torch's lazy imports)."""
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli.main(["info", str(ckpt)])


# --- running one case in a forked child -----------------------------------------------------------------------

@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    hung: bool


def _child(argv: list, out_fd: int, err_fd: int) -> None:
    torch.set_num_threads(1)  # no OpenMP pool in a forked child
    sys.stdout = open(out_fd, "w", buffering=1, closefd=False)
    sys.stderr = open(err_fd, "w", buffering=1, closefd=False)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    code = 99
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException:
        traceback.print_exc()
        code = 98
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 97)


def run_forked(argv: list, timeout: float = 30.0, memory_gib: float = 3.0) -> Outcome:
    """Run ``fastar <argv>`` in a forked child: its exit code, output, and whether it outlived ``timeout``.
    The child's address space is capped so a blow-up fails fast instead of swapping the machine."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                import resource

                with open("/proc/self/status") as f:
                    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
                limit = vm + int(memory_gib * 2**30)
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            except Exception:
                pass
            _child(argv, out.fileno(), err.fileno())
        hung, status = False, None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - start > timeout:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                hung = True
                break
            time.sleep(0.005)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        rc = os.waitstatus_to_exitcode(status) if not hung else None
        return Outcome(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"), seconds, hung)


def problems_of(outcome: Outcome, must_name: str | None = None) -> list:
    """What is wrong with how a bad input was refused (empty when it was refused well)."""
    found = []
    if outcome.hung:
        return ["hang"]
    err = outcome.stderr.strip()
    if "Traceback" in outcome.stderr or outcome.rc in (97, 98, 99):
        found.append("traceback")
    if outcome.rc != 2:
        found.append(f"exit {outcome.rc}")
    lines = err.splitlines()
    if len(lines) != 1 or not lines[0].startswith("fastar: error: "):
        found.append(f"{len(lines)} stderr lines")
    if "weights_only=False" in err or "weights_only` set to `False" in err:
        found.append("torch's weights_only=False advice")
    if must_name is not None and must_name not in err:
        found.append(f"does not name {must_name}")
    return found
