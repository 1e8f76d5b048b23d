"""Every Triton autotune config launches on sm_80, sm_86 and sm_90: shared memory and registers per block as the
real compiler reports them (``docs/results/triton-limits``, written by ``tools/triton_limits.py``), with one
config recompiled here to show the table is the compiler's."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from comfyui_fastar.kernels import launch_limits
from comfyui_fastar.tools.triton_limits import COMPILED_ARCHS

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "results" / "triton-limits" / "triton_limits.json"
triton = pytest.importorskip("triton")


@pytest.fixture(scope="module")
def table():
    return json.loads(TABLE.read_text())


def test_the_table_is_for_this_triton_and_these_configs(table):
    assert table["triton"] == triton.__version__, "configs were compiled with another Triton: rerun tools/triton_limits"
    expected = {(kernel, index, config.num_warps, config.num_stages, head_dim, dtype, tiles, cc)
                for kernel, index, config, head_dim, dtype, tiles in launch_limits.config_cases()
                for cc in COMPILED_ARCHS}
    found = {(r["kernel"], r["config"], r["num_warps"], r["num_stages"], r["head_dim"], r["dtype"],
              (r["block_m"], r["block_n"]), r["cc"]) for r in table["configs"]}
    assert found == expected, "autotune configs changed: rerun tools/triton_limits"


def test_every_config_launches_on_every_architecture(table):
    for row in table["configs"]:
        assert launch_limits.launch_problems(row, row["cc"]) == [], row
    # The limits themselves (CUDA Programming Guide, per compute capability): a typo here would pass everything.
    assert {cc: launch_limits.ARCHS[cc].max_shared_per_block // 1024 for cc in COMPILED_ARCHS} == {
        80: 163, 86: 99, 90: 227}
    biggest = max(table["configs"], key=lambda r: r["shared_bytes"])
    assert biggest["cc"] == 90 and biggest["shared_bytes"] > 64 * 1024  # the table is not trivially small


def test_launch_problems_names_what_does_not_fit():
    row = {"shared_bytes": 120 * 1024, "registers": 255, "num_warps": 8, "spill_bytes": 0}
    assert launch_limits.launch_problems(row, 90) == []
    [problem] = launch_limits.launch_problems(row, 86)
    assert "shared memory" in problem and "sm_86" in problem
    assert launch_limits.launch_problems({**row, "shared_bytes": 0, "num_warps": 16}, 90)  # 255 x 512 threads


def test_one_config_recompiles_to_the_recorded_figures(table, tmp_path):
    """Compile attention config 0 (head dim 64, fp16) for sm_90 in a fresh process (no interpreter)."""
    recorded = next(r for r in table["configs"] if r["kernel"] == "attention" and r["config"] == 0
                    and r["head_dim"] == 64 and r["dtype"] == "fp16" and r["cc"] == 90)
    script = textwrap.dedent(f"""
        import json, sys, types
        package = types.ModuleType("comfyui_fastar")
        package.__path__ = [{str(ROOT)!r}]
        sys.modules["comfyui_fastar"] = package
        from comfyui_fastar.kernels import launch_limits
        print(json.dumps(launch_limits.compile_resources("attention", 0, 64, "fp16", (64, 64), 90)))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a real compile, not a cache hit
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    for field in ("shared_bytes", "registers", "spill_bytes"):
        assert compiled[field] == recorded[field], field
