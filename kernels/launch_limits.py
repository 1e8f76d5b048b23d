"""What each Triton autotune config needs at launch (shared memory, registers), compiled for real GPUs without one.

Triton compiles to a cubin for any target with its bundled LLVM and ptxas; no driver is needed. The shared
memory a kernel asks for at launch is the compiler's own allocation (`metadata.shared`, dynamic) plus the
cubin's static shared memory; registers and spills (local memory) come from the cubin (`cuobjdump`). A config
fits an architecture when the shared memory is within the per-block maximum and threads x registers within the
register file. Spills (registers moved to local memory) do not stop a launch; they are recorded, since they cost
speed, and the autotuner's timings decide.

Limits per block, from the CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications
per Compute Capability" (CUDA 12.x/13.x): maximum shared memory per thread block (opt-in) 163 KB on 8.0 (A100),
99 KB on 8.6 and 8.9 (RTX 30/40), 227 KB on 9.0 (H100; 228 KB per SM); 64 K 32-bit registers per block; at most
255 registers per thread. Triton's launcher opts in to the maximum when a kernel needs more than 48 KB.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass

KB = 1024


@dataclass(frozen=True)
class ArchLimits:
    name: str
    max_shared_per_block: int
    registers_per_block: int = 64 * KB
    max_registers_per_thread: int = 255


ARCHS = {
    80: ArchLimits("sm_80 (A100)", 163 * KB),
    86: ArchLimits("sm_86 (RTX 30)", 99 * KB),
    89: ArchLimits("sm_89 (RTX 40, L4)", 99 * KB),
    90: ArchLimits("sm_90 (H100)", 227 * KB),
}
HEAD_DIMS = (64, 128)
DTYPES = ("fp16", "bf16")
# Tile sizes of the sparse kernel come from the layout (FAST-AR's block_size); 64 is the default.
SPARSE_BLOCKS = (64, 128)


def launch_problems(resources: dict, cc: int) -> list[str]:
    """Why a compiled config cannot launch on architecture `cc` (too much shared memory or registers for one
    block); empty when it fits."""
    limits = ARCHS[cc]
    found = []
    shared = resources["shared_bytes"]
    if shared > limits.max_shared_per_block:
        found.append(f"{shared} B of shared memory > {limits.max_shared_per_block} B per block on {limits.name}")
    threads = resources["num_warps"] * 32
    if resources["registers"] * threads > limits.registers_per_block:
        found.append(f"{resources['registers']} registers x {threads} threads > {limits.registers_per_block}")
    if resources["registers"] > limits.max_registers_per_thread:
        found.append(f"{resources['registers']} registers per thread > {limits.max_registers_per_thread}")
    return found


def config_cases():
    """Every (kernel, config index, config, head dim, dtype, tiles) the autotuners may launch."""
    from . import attention_triton, sparse_triton

    for index, config in enumerate(attention_triton._CONFIGS):
        for head_dim in HEAD_DIMS:
            for dtype in DTYPES:
                yield "attention", index, config, head_dim, dtype, (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])
    for index, config in enumerate(sparse_triton._CONFIGS):
        for head_dim in HEAD_DIMS:
            for dtype in DTYPES:
                for block in SPARSE_BLOCKS:
                    yield "sparse_attention", index, config, head_dim, dtype, (block, block)


def compile_resources(kernel: str, index: int, head_dim: int, dtype: str, tiles, cc: int) -> dict:
    """Compile one config for compute capability `cc` (no GPU needed) and read its launch resources.

    Needs the kernels imported without TRITON_INTERPRET (the interpreter replaces the compiler)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import attention_triton, sparse_triton

    config = (attention_triton._CONFIGS if kernel == "attention" else sparse_triton._CONFIGS)[index]
    if kernel == "attention":
        jit = attention_triton._attention_fwd.fn
        pointers = {"Q": dtype, "K": dtype, "V": dtype, "Out": dtype, "Bias": "fp32", "Lse": "fp32"}
        constants = {"HAS_BIAS": True, "WRITE_LSE": True, "BLOCK_M": tiles[0], "BLOCK_N": tiles[1]}
    else:
        jit = sparse_triton._sparse_attention_fwd.fn
        pointers = {"Q": dtype, "K": dtype, "V": dtype, "Out": dtype, "Bias": "fp32", "QCodes": "i32",
                    "KCodes": "i32", "KvNum": "i32", "KvIdx": "i32"}
        constants = {"RADIUS": 1, "HAS_BIAS": True, "BLOCK_M": tiles[0], "BLOCK_N": tiles[1]}
    if not hasattr(jit, "arg_names"):
        raise RuntimeError("the Triton kernels were imported under TRITON_INTERPRET; compile in a fresh process")
    constants.update(HEAD_DIM=head_dim, UPCAST=False, FP32_IEEE=False)
    signature = {}
    for name in jit.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    compiled = triton.compile(ASTSource(jit, signature, constants), target=GPUTarget("cuda", cc, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    usage = _cubin_usage(compiled.asm["cubin"], os.path.dirname(triton.__file__))
    return {"kernel": kernel, "config": index, "head_dim": head_dim, "dtype": dtype,
            "block_m": tiles[0], "block_n": tiles[1], "num_warps": config.num_warps,
            "num_stages": config.num_stages, "cc": cc,
            "shared_bytes": int(compiled.metadata.shared) + usage["SHARED"],
            "registers": usage["REG"], "spill_bytes": usage["LOCAL"] + usage["STACK"]}


def _cubin_usage(cubin: bytes, triton_dir: str) -> dict:
    """REG, SHARED (static), LOCAL and STACK of the one kernel in a cubin, from the bundled cuobjdump."""
    tool = os.path.join(triton_dir, "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    line = next(line for line in text.splitlines() if "REG:" in line)
    fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
    return {key: int(fields.get(key, 0)) for key in ("REG", "SHARED", "LOCAL", "STACK")}


def compile_block_lists(cc: int, block: int, bits: int) -> list[dict]:
    """Compile the sparse layout's two block-list kernels (``sparse_layout_triton``) for compute capability `cc`
    at tiles of `block` and `bits`-bit codes; their launch resources, as ``compile_resources`` reads them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import sparse_layout_triton as layout
    from .hamming import code_lanes

    n_codes = code_lanes(bits)
    kernels = (
        (layout._key_code_sets_kernel, {"KCodes": "i32", "KSets": "i8"}, {"N_CODES": n_codes, "BLOCK_K": block}),
        (layout._visit_lists_kernel, {"QCodes": "i32", "KSets": "i8", "KvNum": "i32", "KvIdx": "i32"},
         {"N_CODES": n_codes, "BITS": bits, "BLOCK_Q": block, "KB_TILE": layout.KB_TILE}),
    )
    rows = []
    for jit, pointers, constants in kernels:
        if not hasattr(jit, "arg_names"):
            raise RuntimeError("the Triton kernels were imported under TRITON_INTERPRET; compile in a fresh process")
        signature = {name: "constexpr" if name in constants else "*" + pointers[name] if name in pointers else "i32"
                     for name in jit.arg_names}
        compiled = triton.compile(ASTSource(jit, signature, constants), target=GPUTarget("cuda", cc, 32))
        usage = _cubin_usage(compiled.asm["cubin"], os.path.dirname(triton.__file__))
        rows.append({"kernel": jit.fn.__name__, "cc": cc, "block": block, "bits": bits,
                     "num_warps": compiled.metadata.num_warps,
                     "shared_bytes": int(compiled.metadata.shared) + usage["SHARED"], "registers": usage["REG"],
                     "spill_bytes": usage["LOCAL"] + usage["STACK"]})
    return rows
