"""The FlashInfer backend against the installed FlashInfer's real API (skipped where flashinfer is not importable).

FlashInfer cannot run without CUDA, so its wrapper is replaced by a recorder that answers with what the real
kernel computes (plain attention per request, base-2 LSE). Every recorded call must bind to the real method's
signature, and the plan/run arguments must have the shapes and dtypes the real docstrings state. The lazy-import
test runs everywhere.
"""

import ast
import inspect
import math
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from comfyui_fastar.kernels import attention_flashinfer, build_sparse_layout

ROOT = pathlib.Path(__file__).resolve().parents[1]
BACKEND_FILES = ("kernels/attention_flashinfer.py", "kernels/flashinfer_plan.py")
# What the backend calls on FlashInfer; a new call must be added here, and so get checked below.
CHECKED_CALLS = {"BatchPrefillWithPagedKVCacheWrapper", "plan", "run", "single_prefill_with_kv_cache"}


def flashinfer_calls(path) -> set:
    """Attribute calls on `flashinfer.*` and on the wrapper object in one source file."""
    tree = ast.parse((ROOT / path).read_text())
    calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("flashinfer", "wrapper"):
                calls.add(node.func.attr)
    return calls


def test_the_checked_calls_are_all_the_backend_makes():
    made = set().union(*(flashinfer_calls(p) for p in BACKEND_FILES))
    assert made == CHECKED_CALLS
    assert not [p for p in BACKEND_FILES if re.search(r"^\s*(import|from) flashinfer", (ROOT / p).read_text(), re.M)
                and "flashinfer_plan" in p], "the planner must stay pure torch"


def test_importing_and_running_the_pack_never_imports_flashinfer():
    script = textwrap.dedent(f"""
        import sys, types
        package = types.ModuleType("comfyui_fastar")
        package.__path__ = [{str(ROOT)!r}]
        sys.modules["comfyui_fastar"] = package
        import torch
        from comfyui_fastar.kernels import attention, available_backends, attention_flashinfer, flashinfer_plan
        q = torch.randn(1, 2, 8, 64)
        attention(q, q, q, torch.zeros(1, 2, 8))
        print(available_backends("cpu"))
        assert "flashinfer" not in sys.modules, "flashinfer was imported"
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr


class Recorder:
    """Stands in for BatchPrefillWithPagedKVCacheWrapper: records calls, computes what the kernel would."""

    calls: list = []

    def __init__(self, *args, **kwargs):
        Recorder.calls.append(("__init__", args, kwargs))

    def plan(self, *args, **kwargs):
        Recorder.calls.append(("plan", args, kwargs))
        self.planned = inspect.signature(REAL.plan).bind(self, *args, **kwargs).arguments

    def run(self, *args, **kwargs):
        Recorder.calls.append(("run", args, kwargs))
        q, (k_pages, v_pages) = args[0], args[1]
        p = self.planned
        qo, kv, idx = p["qo_indptr"].long(), p["paged_kv_indptr"].long(), p["paged_kv_indices"].long()
        scale = p["sm_scale"]
        outs, lses = [], []
        for r in range(len(qo) - 1):
            rows = q[qo[r] : qo[r + 1], 0].float()
            pages = idx[kv[r] : kv[r + 1]]
            keys, values = k_pages[pages, 0, 0].float(), v_pages[pages, 0, 0].float()
            logits = rows @ keys.T * scale
            outs.append(torch.softmax(logits, -1) @ values)
            lses.append(torch.logsumexp(logits, -1) / math.log(2))
        return torch.cat(outs).to(q.dtype)[:, None], torch.cat(lses)[:, None]


REAL = None


@pytest.fixture()
def flashinfer_api(monkeypatch):
    global REAL
    flashinfer = pytest.importorskip("flashinfer")
    REAL = flashinfer.BatchPrefillWithPagedKVCacheWrapper
    Recorder.calls = []
    monkeypatch.setattr(flashinfer, "BatchPrefillWithPagedKVCacheWrapper", Recorder)
    monkeypatch.setattr(attention_flashinfer, "_workspaces", {})
    return flashinfer


def doc_shapes(method) -> dict:
    """{parameter: shape expression} from ``shape: ``[...]``` in a numpy-style docstring (the expression on the
    same line or the next)."""
    shapes, sections, current = {}, {}, None
    for line in inspect.getdoc(method).splitlines():
        header = re.match(r"^(\w+) : ", line)
        if header:
            current = header.group(1)
        if current:
            sections[current] = sections.get(current, "") + " " + line.strip()
    for name, text in sections.items():
        found = re.search(r"shape:\s*``(\[[^`]+\])``", text)
        if found:
            shapes[name] = found.group(1)
    return shapes


def doc_layout_shape(method, parameter, layout) -> str:
    """The shape a docstring gives `parameter` for kv_layout `layout` (``[...]`` if :attr:`kv_layout` is ``X``)."""
    doc = inspect.getdoc(method)
    section = doc.split(f"{parameter} :")[1]
    found = re.search(r"``(\[[^`]+\])``\s*if\s*:attr:`kv_layout`\s*is\s*``" + layout + "``", section)
    return found.group(1)


def evaluate(shape: str, names: dict) -> list:
    return eval(shape, {"__builtins__": {}}, names)  # noqa: S307 - a shape expression from the real docstring


def check_against_the_real_api():
    init, plan, run = (c for c in Recorder.calls)
    assert [c[0] for c in Recorder.calls] == ["__init__", "plan", "run"]
    bound_init = inspect.signature(REAL.__init__).bind(None, *init[1], **init[2]).arguments
    bound_plan = inspect.signature(REAL.plan).bind(None, *plan[1], **plan[2]).arguments
    bound_run = inspect.signature(REAL.run).bind(None, *run[1], **run[2]).arguments

    workspace = bound_init["float_workspace_buffer"]
    assert workspace.dtype == torch.uint8 and workspace.numel() >= 128 * 2**20  # the documented recommendation
    layout = bound_init.get("kv_layout", "NHD")

    batch_size = len(bound_plan["qo_indptr"]) - 1
    names = {"batch_size": batch_size, **{k: v for k, v in bound_plan.items() if isinstance(v, torch.Tensor)}}
    shapes = doc_shapes(REAL.plan)
    for parameter in ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
        value = bound_plan[parameter]
        assert list(value.shape) == [int(x) for x in evaluate(shapes[parameter], names)], parameter
        assert value.dtype == torch.int32, f"{parameter}: {value.dtype}, not int32"
    for indptr in (bound_plan["qo_indptr"], bound_plan["paged_kv_indptr"]):
        assert indptr[0] == 0 and bool((indptr[1:] >= indptr[:-1]).all())
    page_size = bound_plan["page_size"]
    last = bound_plan["paged_kv_last_page_len"]
    assert bool(((last >= 1) & (last <= page_size)).all())
    for field in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "page_size"):
        assert isinstance(bound_plan[field], int) and bound_plan[field] >= 1, field
    assert bound_plan["num_qo_heads"] % bound_plan["num_kv_heads"] == 0
    q, (k_pages, v_pages) = bound_run["q"], bound_run["paged_kv_cache"]
    assert bound_plan["q_data_type"] == q.dtype and bound_plan["kv_data_type"] == k_pages.dtype
    assert isinstance(bound_plan["sm_scale"], float)

    run_names = {"qo_indptr": bound_plan["qo_indptr"], "num_qo_heads": bound_plan["num_qo_heads"],
                 "head_dim": bound_plan["head_dim_qk"], "head_dim_qk": bound_plan["head_dim_qk"],
                 "max_num_pages": k_pages.shape[0],
                 "page_size": page_size, "num_kv_heads": bound_plan["num_kv_heads"]}
    assert list(q.shape) == [int(x) for x in evaluate(doc_shapes(REAL.run)["q"], run_names)]
    kv_shape = [int(x) for x in evaluate(doc_layout_shape(REAL.run, "paged_kv_cache", layout), run_names)]
    assert list(k_pages.shape) == kv_shape and list(v_pages.shape) == kv_shape
    assert int(bound_plan["paged_kv_indices"].max()) < k_pages.shape[0]
    assert bound_run["return_lse"] is True and bound_run.get("lse_base", "log2") == "log2"  # we convert base 2


def biased_reference(q, k, v, bias, visible=None):
    logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias.double().unsqueeze(2)
    if visible is not None:
        logits = logits.masked_fill(~visible, -math.inf)
    return torch.softmax(logits, -1).nan_to_num(0.0) @ v.double()


def inputs(dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen).to(dtype) for n in (20, 40, 40))
    bias = torch.randint(1, 4, (1, 2, 40), generator=gen).float().log()
    bias[..., ::5] = -math.inf
    return q, k, v, bias


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_calls_bind_to_the_installed_flashinfer(flashinfer_api, dtype):
    q, k, v, bias = inputs(dtype)
    out, lse = attention_flashinfer.attention_flashinfer(q, k, v, bias, 64**-0.5, True)
    check_against_the_real_api()
    assert (out.double() - biased_reference(q, k, v, bias)).abs().max() < 2e-2


def test_sparse_calls_bind_to_the_installed_flashinfer(flashinfer_api):
    q, k, v, bias = inputs()
    gen = torch.Generator().manual_seed(1)
    q_codes, k_codes = torch.randint(0, 3, (1, 2, 20), generator=gen), torch.randint(0, 3, (1, 2, 40), generator=gen)
    layout = build_sparse_layout(q_codes, k_codes, n_dense=8, block_q=16, block_k=16)
    out = attention_flashinfer.sparse_attention_flashinfer(q, k, v, layout, bias, 64**-0.5)
    check_against_the_real_api()
    visible = (torch.arange(40) < 8) | (q_codes[..., :, None] == k_codes[..., None, :])
    assert (out.double() - biased_reference(q, k, v, bias, visible)).abs().max() < 2e-2



@pytest.mark.parametrize("return_lse", [False, True])
def test_plain_dense_calls_bind_to_the_installed_single_prefill(monkeypatch, return_lse):
    """Dense attention without a bias goes to single_prefill_with_kv_cache: its arguments bind to the real
    signature, q is [qo_len, num_qo_heads, head_dim] and k, v [num_kv_heads, kv_len, head_dim] (HND) as its
    docstring states, views of ours (the strides are the kernel's to read), and the result is plain attention."""
    flashinfer = pytest.importorskip("flashinfer")
    real = flashinfer.single_prefill_with_kv_cache
    calls = []

    def recorder(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs).arguments
        calls.append(bound)
        q, k, v = bound["q"], bound["k"], bound["v"]
        layout = bound.get("kv_layout", "NHD")
        names = {"qo_len": q.shape[0], "num_qo_heads": q.shape[1], "head_dim_qk": q.shape[2],
                 "kv_len": k.shape[1] if layout == "HND" else k.shape[0],
                 "num_kv_heads": k.shape[0] if layout == "HND" else k.shape[1], "head_dim_vo": v.shape[-1]}
        assert list(q.shape) == [int(x) for x in evaluate(doc_shapes(real)["q"], names)]
        assert list(k.shape) == [int(x) for x in evaluate(doc_layout_shape(real, "k", layout), names)]
        assert list(v.shape) == [int(x) for x in evaluate(doc_layout_shape(real, "v", layout), names)]
        keys, values = (k, v) if layout == "HND" else (k.transpose(0, 1), v.transpose(0, 1))
        logits = q.transpose(0, 1).float() @ keys.float().transpose(-1, -2) * bound["sm_scale"]
        out = (torch.softmax(logits, -1) @ values.float()).transpose(0, 1).to(q.dtype)  # [qo_len, H, D]
        lse = (torch.logsumexp(logits, -1) / math.log(2)).transpose(0, 1)  # base 2, [qo_len, H]
        return (out, lse) if bound.get("return_lse", False) else out

    monkeypatch.setattr(flashinfer, "single_prefill_with_kv_cache", recorder)
    q, k, v, _ = inputs(torch.bfloat16)
    q, k, v = torch.cat([q, q]), torch.cat([k, k.flip(2)]), torch.cat([v, v])  # two batch items
    out, lse = attention_flashinfer.attention_flashinfer(q, k, v, None, 64**-0.5, return_lse)
    assert len(calls) == 2 and all(c["kv_layout"] == "HND" and isinstance(c["sm_scale"], float) for c in calls)
    assert calls[0]["q"].data_ptr() == q.data_ptr() and calls[1]["k"].data_ptr() == k[1].data_ptr()  # views
    reference = biased_reference(q, k, v, torch.zeros(2, 2, 40))
    assert out.shape == q.shape and (out.double() - reference).abs().max() < 2e-2
    if return_lse:
        logits = q.double() @ k.double().transpose(-1, -2) / 8.0
        torch.testing.assert_close(lse.double(), torch.logsumexp(logits, -1), atol=2e-2, rtol=0)
