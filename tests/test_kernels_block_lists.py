"""The sparse layout's block lists: the Triton kernels (interpreted here, compiled for real GPUs in a fresh process)
list exactly what the torch planner lists, a wrong kernel is caught at first use, and the planner is one operator."""

import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from comfyui_fastar.kernels import build_sparse_layout, verify
from comfyui_fastar.kernels import sparse_layout as layout_module
from comfyui_fastar.kernels.sparse_layout import DENSE_CODE, _block_lists_torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
triton = pytest.importorskip("triton")


def sorted_codes(gen, Nq, Nk, n_dense, bits, buckets):
    """Sorted int32 codes as the planner hands them over: keys in a few buckets, dense keys marked."""
    q = torch.randint(0, 2**bits, (2, 3, Nq), generator=gen, dtype=torch.int32).sort(-1).values
    k = torch.randint(0, buckets, (2, 3, Nk), generator=gen, dtype=torch.int32)
    k[..., :n_dense] = DENSE_CODE
    return q, k.sort(-1).values


@pytest.mark.parametrize("bits, radius, block_q, block_k, Nq, Nk, n_dense", [
    (1, 0, 16, 16, 1, 0, 0),  # no keys at all
    (3, 0, 16, 32, 37, 200, 0),
    (3, 1, 64, 16, 130, 200, 40),  # dense blocks, a mixed block, ragged tiles
    (6, 2, 16, 16, 70, 333, 3),
    (8, 0, 64, 64, 130, 517, 64),
    (8, 1, 32, 16, 100, 300, 17),
])
def test_the_triton_block_lists_equal_the_torch_planner(bits, radius, block_q, block_k, Nq, Nk, n_dense):
    from comfyui_fastar.kernels.sparse_layout_triton import block_lists_triton

    gen = torch.Generator().manual_seed(bits * 100 + Nk)
    q, k = sorted_codes(gen, Nq, Nk, n_dense, bits, buckets=min(2**bits, 5))
    got = block_lists_triton(q, k, n_dense, block_q, block_k, radius, bits)
    expected = _block_lists_torch(q, k, n_dense, block_q, block_k, radius, bits)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    if Nk > n_dense:
        assert 0 < int(expected[0].sum()) < expected[0].numel() * expected[1].shape[-1]  # neither none nor all


def test_a_layout_planned_by_triton_is_the_layout_torch_plans():
    gen = torch.Generator().manual_seed(3)
    q_codes = torch.randint(0, 64, (1, 2, 150), generator=gen)
    k_codes = torch.randint(0, 8, (1, 2, 400), generator=gen)
    kwargs = dict(n_dense=50, block_q=32, block_k=32, radius=1, bits=6)
    a = build_sparse_layout(q_codes, k_codes, backend="torch", **kwargs)
    b = build_sparse_layout(q_codes, k_codes, backend="triton", **kwargs)
    for field in ("q_perm", "k_perm", "q_codes_sorted", "k_codes_sorted", "kv_num", "kv_idx"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_a_wrong_block_list_kernel_is_caught_at_first_use_and_torch_plans(monkeypatch, caplog, fresh_kernel_checks):
    from comfyui_fastar.kernels import sparse_layout_triton

    real = sparse_layout_triton.block_lists_triton

    def drops_the_last_visited_block(*args):
        kv_num, kv_idx = real(*args)
        return (kv_num - 1).clamp(min=0), kv_idx

    monkeypatch.setattr(sparse_layout_triton, "block_lists_triton", drops_the_last_visited_block)
    gen = torch.Generator().manual_seed(4)
    q_codes, k_codes = torch.randint(0, 16, (1, 2, 90), generator=gen), torch.randint(0, 16, (1, 2, 300), generator=gen)
    kwargs = dict(n_dense=20, block_q=16, block_k=16, radius=0, bits=4)
    with caplog.at_level(logging.WARNING):
        layout = build_sparse_layout(q_codes, k_codes, backend="triton", **kwargs)
    verify.reset()
    assert "failed its check for block_lists" in caplog.text and "kv_num entries differ" in caplog.text
    expected = build_sparse_layout(q_codes, k_codes, backend="torch", **kwargs)
    assert torch.equal(layout.kv_num, expected.kv_num) and torch.equal(layout.kv_idx, expected.kv_idx)


def test_the_planner_is_one_operator_for_a_compiler():
    """The block lists are one opaque operator with static shapes: a compiled planner takes no graph break."""
    gen = torch.Generator().manual_seed(5)
    q, k = sorted_codes(gen, 70, 210, 20, 6, buckets=6)
    compiled = torch.compile(layout_module.block_lists, backend="eager", fullgraph=True)
    got = compiled(q, k, 20, 16, 16, 1, 6, "torch")
    expected = _block_lists_torch(q, k, 20, 16, 16, 1, 6)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_the_kernels_compile_for_real_gpus_within_their_launch_limits(tmp_path):
    """sm_80, sm_86 and sm_90, at AnnSA's tiles and its widest bitmap codes, in a fresh process (no interpreter)."""
    script = textwrap.dedent(f"""
        import json, sys, types
        package = types.ModuleType("comfyui_fastar")
        package.__path__ = [{str(ROOT)!r}]
        sys.modules["comfyui_fastar"] = package
        from comfyui_fastar.kernels import launch_limits
        rows = [row for cc in (80, 86, 90) for block in (64, 128)
                for row in launch_limits.compile_block_lists(cc, block, 8)]
        print(json.dumps(rows))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from comfyui_fastar.kernels import launch_limits

    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert {row["kernel"] for row in rows} == {"_key_code_sets_kernel", "_visit_lists_kernel"} and len(rows) == 12
    for row in rows:
        assert launch_limits.launch_problems(row, row["cc"]) == [] and row["spill_bytes"] == 0, row
