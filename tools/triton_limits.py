"""``python -m comfyui_fastar.tools.triton_limits --out DIR``: compile every Triton autotune config of the
attention kernels for sm_80, sm_86 and sm_90 (no GPU needed) and record the shared memory, registers and spills
each one launches with, against the per-block limits (``kernels/launch_limits.py``). sm_89 has sm_86's limits and
compiled identically in a spot check. Several minutes on a CPU: one compile per (config, head dim, dtype, tiles,
architecture).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

COMPILED_ARCHS = (80, 86, 90)


def run_triton_limits(out_dir, archs=None) -> dict:
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}:
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the compiler this needs")
    import triton

    from ..kernels import launch_limits
    from .bench.report import write_json

    archs = archs or COMPILED_ARCHS
    report = {"triton": triton.__version__, "limits": {str(cc): vars(launch_limits.ARCHS[cc]) for cc in archs},
              "configs": []}
    path = Path(out_dir) / "triton_limits.json"
    for kernel, index, _config, head_dim, dtype, tiles in launch_limits.config_cases():
        for cc in archs:
            start = time.perf_counter()
            row = launch_limits.compile_resources(kernel, index, head_dim, dtype, tiles, cc)
            row["launch_problems"] = launch_limits.launch_problems(row, cc)
            row["compile_s"] = round(time.perf_counter() - start, 2)
            report["configs"].append(row)
            print(row, flush=True)
            write_json(path, report)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run_triton_limits(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
