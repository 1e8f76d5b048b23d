"""What a piece of code asks a GPU to do, counted operator by operator on any device (a ``TorchDispatchMode``).

Every ATen operator that reaches the dispatcher is one record: whether it launches a kernel (views, metadata
queries and bare allocations do not), whether it makes the host wait for the device (a host sync: ``.item()``,
``bool(tensor)``, ``int(tensor)``, ``nonzero``, boolean-mask indexing, ``unique``, ``tolist()``, a tensor built
from host data, which a GPU receives by a blocking copy), whether the shape of what it returns depends on the
data (``nonzero``, ``masked_select``, ``unique``, boolean indexing, ``repeat_interleave`` without its output
size), the bytes it reads and writes and its matmul FLOPs. Each record also names the function of the pack that
called it, so a report can say where the time goes.

``tolist()`` and ``numpy()`` read a CPU tensor without dispatching anything, so the counter wraps them while it
runs. Under fake tensors (no data; ``FakeTensorMode``) a sync has nothing to read: it is counted and answered
with 0 (True for a boolean), and an operator whose output size depends on data runs on zeros of its inputs'
shapes, so code can be traced at shapes no machine here could hold (``h200_estimate``).
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...kernels.hamming import code_lanes

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = str(Path(__file__).resolve())

aten = torch.ops.aten
# Host syncs: the host waits for the device to finish and reads a value back (or sends host data with a
# blocking copy).
SYNC_OPS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.nonzero_static.default: None,  # a fixed-size nonzero: neither a sync nor data-dependent
    aten.masked_select.default: "masked_select",
    aten.unique_consecutive.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.repeat_interleave.Tensor: "repeat_interleave",
    aten.lift_fresh.default: "host_tensor",
}
# Operators whose output shape depends on the values of their inputs.
DYNAMIC_OPS = {aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default,
               aten._unique2.default, aten.unique_dim.default, aten.repeat_interleave.Tensor}
INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
# No kernel: allocation without initialisation, and metadata.
NO_LAUNCH = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
             aten.lift_fresh.default, aten.detach.default, aten.alias.default}
PURE_WRITES = {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default}
# In-place writes of a few rows into a large tensor: the bytes are the rows moved, not the whole tensor.
ROW_WRITES = {aten.index_copy_.default, aten.index_copy.default, aten.scatter_.src, aten.scatter_.value,
              aten.scatter.src, aten.scatter.value, aten.scatter_add_.default, aten.scatter_add.default,
              aten.scatter_reduce_.two, aten.scatter_reduce.two, aten.index_add_.default, aten.index_add.default,
              aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default,
              aten.index_fill_.int_Scalar, aten.index_fill.int_Scalar}
ROW_READS = {aten.index_select.default, aten.gather.default, aten.index.Tensor, aten.embedding.default}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches to read or write ``t``: broadcast (stride 0) dimensions count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _tensors(tree) -> list:
    out = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(tree)
    return out


def matmul_flops(func, args, out) -> tuple[float, torch.dtype | None]:
    """Multiply-add FLOPs (2 per multiply-add) of matmul-like operators, and the dtype they run in."""
    if func in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten._int_mm.default):
        a, b = (args[1], args[2]) if func in (aten.addmm.default, aten.baddbmm.default) else (args[0], args[1])
        return 2.0 * out.numel() * a.shape[-1], a.dtype
    if func in (aten._scaled_dot_product_flash_attention_for_cpu.default,
                aten._scaled_dot_product_flash_attention.default,
                aten._scaled_dot_product_efficient_attention.default,
                aten._scaled_dot_product_cudnn_attention.default):
        q, k, v = args[0], args[1], args[2]
        B, H, Nq, D = q.shape
        return 2.0 * B * H * Nq * k.shape[-2] * (D + v.shape[-1]), q.dtype
    if func == aten.convolution.default:
        x, w = args[0], args[1]
        groups = args[8] if len(args) > 8 else 1
        result = out[0] if isinstance(out, (tuple, list)) else out
        return 2.0 * result.numel() * (x.shape[1] // groups) * math.prod(w.shape[2:]), x.dtype
    return 0.0, None


def _is_view(func) -> bool:
    """An operator whose outputs alias its inputs without writing them (a view: no kernel)."""
    schema = func._schema
    if not schema.returns:
        return False
    for ret in schema.returns:
        info = ret.alias_info
        if info is None or info.is_write:
            return False
    return True


@dataclass
class OpRecord:
    name: str
    where: str
    launches: int
    sync: str | None
    dynamic: bool
    bytes: int
    flops: float
    dtype: str | None


@dataclass
class OpTally:
    """Totals over a stretch of code, with per-call-site and per-operator detail."""

    records: list = field(default_factory=list)

    @property
    def launches(self) -> int:
        return sum(r.launches for r in self.records)

    @property
    def syncs(self) -> int:
        return sum(1 for r in self.records if r.sync)

    @property
    def dynamic(self) -> int:
        return sum(1 for r in self.records if r.dynamic)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.records)

    @property
    def flops(self) -> float:
        return sum(r.flops for r in self.records)

    def syncs_by_kind(self) -> dict:
        return dict(Counter(r.sync for r in self.records if r.sync))

    def sync_sites(self) -> dict:
        """{call site: number of syncs} (where each sync comes from)."""
        return dict(Counter(f"{r.where} ({r.sync})" for r in self.records if r.sync))

    def dynamic_sites(self) -> dict:
        return dict(Counter(f"{r.where} ({r.name})" for r in self.records if r.dynamic))

    def summary(self) -> dict:
        return {"launches": self.launches, "host_syncs": self.syncs, "data_dependent_shapes": self.dynamic,
                "bytes": self.bytes, "matmul_flops": self.flops, "syncs_by_kind": self.syncs_by_kind(),
                "sync_sites": self.sync_sites(), "dynamic_sites": self.dynamic_sites()}


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def sparse_attention_cost(args, assumed_block_density: float) -> tuple[int, float, int]:
    """Launches, FLOPs and bytes of ``fastar::sparse_attention`` as a GPU runs it: gathers of q, k and v into
    bucket order, the block-sparse kernel over the key blocks its layout lists, the scatter back. The blocks listed
    are read from the layout; under fake tensors they are ``assumed_block_density`` of all block pairs. Like SDPA's,
    the kernel's bytes are its inputs and output once (a head's keys stay in the GPU's L2 between query blocks)."""
    q, k, v, bias, kv_num = args[0], args[1], args[2], args[3], args[8]
    block_q, block_k = args[11], args[12]
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    n_kb = -(-Nk // block_k)
    pairs = (assumed_block_density * kv_num.numel() * n_kb if _is_fake(kv_num) else float(kv_num.sum()))
    flops = 4.0 * D * block_q * block_k * pairs
    e = q.element_size()
    gathers = 2 * (tensor_bytes(q) + tensor_bytes(k) + tensor_bytes(v))  # read and write each, sorted
    codes = 4 * B * H * (Nq + Nk) + 8 * kv_num.numel() * (1 + n_kb)
    kernel = tensor_bytes(q) + tensor_bytes(k) + tensor_bytes(v) + B * H * Nq * D * e + codes + (
        4 * B * H * Nk if bias is not None else 0)
    unsort = 2 * B * H * Nq * D * e
    return 5, flops, int(gathers + kernel + unsort)


def topk_scores_cost(args) -> tuple[int, float, int]:
    """``fastar::topk_scores`` as CUDA runs it: one fused kernel (its dot on tensor cores, the best scores kept in
    registers: it reads both operands once and writes k scores and columns per row), then a sort of those k."""
    a, b, k = args[0], args[1], args[2]
    BH, N, D = a.shape
    M = b.shape[1]
    out = BH * N * k * (4 + 8)
    return 3, 2.0 * BH * N * M * D, tensor_bytes(a) + tensor_bytes(b) + 3 * out


def lsh_codes_cost(args) -> tuple[int, float, int]:
    """``fastar::lsh_codes`` as CUDA runs it: one fused kernel projecting tokens on the planes in fp32."""
    x, planes = args[0], args[1]
    B, H, N, D = x.shape
    bits_total = planes.shape[2]
    return 1, 2.0 * B * H * N * D * bits_total, tensor_bytes(x) + tensor_bytes(planes) + 4 * B * H * N * (
        bits_total // args[2])


def block_lists_cost(args) -> tuple[int, float, int]:
    """``fastar::block_lists`` as CUDA runs it: a kernel marking each key block's codes (a byte per code), then a
    kernel per query block that marks its probe codes and reads every key block's marks (no L2 reuse assumed),
    writing its list of visited blocks."""
    q_sorted, k_sorted, block_q, block_k, bits = args[0], args[1], args[3], args[4], args[6]
    B, H, Nq = q_sorted.shape
    Nk = k_sorted.shape[-1]
    n_qb, n_kb = -(-Nq // block_q), -(-Nk // block_k)
    n_codes = code_lanes(bits)
    marks = B * H * n_kb * n_codes
    lists = 4 * B * H * n_qb * (1 + n_kb)
    return 2, 0.0, tensor_bytes(k_sorted) + marks + tensor_bytes(q_sorted) + n_qb * marks + lists


class OpCounter(TorchDispatchMode):
    """Counts every operator dispatched while active (see the module docstring). ``mark()`` closes a stretch
    (a chunk) and starts the next; ``stretches`` holds them in order. The pack's own kernels that run as one
    operator (``fastar::sparse_attention``, ``fastar::topk_scores``, ``fastar::lsh_codes``,
    ``fastar::block_lists``) are costed as a GPU runs them (``*_cost``)."""

    def __init__(self, assumed_block_density: float = 0.5):
        super().__init__()
        self.assumed_block_density = assumed_block_density
        self.current = OpTally()
        self.stretches: list[OpTally] = []
        self.paused = 0
        self.inside = 0  # > 0 while an operator runs: what its implementation does is that operator's own work
        self._where_cache: dict = {}

    def mark(self) -> OpTally:
        done, self.current = self.current, OpTally()
        self.stretches.append(done)
        return done

    @contextmanager
    def pause(self):
        """Leave the operators of a block uncounted (the bench's own bookkeeping)."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def _where(self) -> str:
        """The innermost function of the pack on the Python stack (not this file, not torch)."""
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            name = self._where_cache.get(code)
            if name is None:
                path = str(Path(code.co_filename).resolve())
                inside = path.startswith(str(PACKAGE_ROOT)) and path != THIS_FILE and "/.venv/" not in path
                name = (f"{Path(path).relative_to(PACKAGE_ROOT).with_suffix('')}:{code.co_name}".replace("/", ".")
                        if inside else "")
                self._where_cache[code] = name
            if name:
                return name
            frame = frame.f_back
        return "?"

    def record_host_read(self, what: str, t: torch.Tensor) -> None:
        if not self.paused and not self.inside:
            self.current.records.append(OpRecord(what, self._where(), 1, what, False, tensor_bytes(t), 0.0, None))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fake = _fake_mode_of(args, kwargs)
        if fake is not None and func == aten._local_scalar_dense.default:
            out = True if args[0].dtype == torch.bool else 1  # nothing to read under fake tensors
        elif fake is not None and (func in DYNAMIC_OPS or _bool_index(func, args)):
            out = _on_zeros(fake, func, args, kwargs)
        else:
            self.inside += 1
            try:
                out = func(*args, **kwargs)
            finally:
                self.inside -= 1
        if self.paused:
            return out
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        sync = SYNC_OPS.get(func)
        dynamic = func in DYNAMIC_OPS and not (func == aten.repeat_interleave.Tensor
                                               and kwargs.get("output_size") is not None)
        if func == aten.repeat_interleave.Tensor and not dynamic:
            sync = None
        if _bool_index(func, args):
            sync, dynamic = "boolean_mask", True
        view = bool(outs) and _is_view(func)
        launches = 0 if (view or not outs or func in NO_LAUNCH) else 1
        if sync and func != aten.lift_fresh.default:
            launches = 1
        nbytes = 0
        if launches:
            if func in ROW_WRITES:
                src = [t for t in ins[1:]]
                nbytes = 2 * sum(tensor_bytes(t) for t in src)
            elif func in ROW_READS:
                nbytes = 2 * sum(tensor_bytes(t) for t in outs) + sum(tensor_bytes(t) for t in ins[1:])
            elif func in PURE_WRITES:
                nbytes = sum(tensor_bytes(t) for t in ins)
            else:  # every input read, every output written (an in-place output too)
                nbytes = sum(tensor_bytes(t) for t in ins) + sum(tensor_bytes(t) for t in outs)
        flops, dtype = matmul_flops(func, args, out) if launches else (0.0, None)
        if func.namespace == "fastar" and func.__name__.startswith("sparse_attention"):
            launches, flops, nbytes = sparse_attention_cost(args, self.assumed_block_density)
            dtype = args[0].dtype
        elif func.namespace == "fastar" and func.__name__.startswith("topk_scores"):
            launches, flops, nbytes = topk_scores_cost(args)
            dtype = args[0].dtype
        elif func.namespace == "fastar" and func.__name__.startswith("lsh_codes"):
            launches, flops, nbytes = lsh_codes_cost(args)
            dtype = torch.float32
        elif func.namespace == "fastar" and func.__name__.startswith("block_lists"):
            launches, flops, nbytes = block_lists_cost(args)
            dtype = torch.int32
        if launches or sync or dynamic:
            self.current.records.append(OpRecord(str(func.overloadpacket.__name__), self._where(), launches, sync,
                                                 dynamic, nbytes, flops, str(dtype).replace("torch.", "")
                                                 if dtype is not None else None))
        return out

    @contextmanager
    def counting(self):
        """Active: dispatch counted, ``tolist()``/``numpy()`` counted as host reads."""
        tolist, numpy = torch.Tensor.tolist, torch.Tensor.numpy
        counter = self

        def counted_tolist(t, *a, **k):
            counter.record_host_read("tolist", t)
            if _fake_mode_of((t,), {}) is not None:
                return _ones_list(t)
            with _inactive(counter):
                return tolist(t, *a, **k)

        def counted_numpy(t, *a, **k):
            counter.record_host_read("numpy", t)
            with _inactive(counter):
                return numpy(t, *a, **k)

        from torch._subclasses.fake_tensor import FakeTensor

        fake_tolist = FakeTensor.tolist
        torch.Tensor.tolist, torch.Tensor.numpy, FakeTensor.tolist = counted_tolist, counted_numpy, counted_tolist
        try:
            with self:
                yield self
        finally:
            torch.Tensor.tolist, torch.Tensor.numpy, FakeTensor.tolist = tolist, numpy, fake_tolist
            self.mark()


@contextmanager
def _inactive(counter):
    counter.paused += 1
    try:
        yield
    finally:
        counter.paused -= 1


def _bool_index(func, args) -> bool:
    """Boolean-mask indexing (``x[mask]``, ``x[mask] = y``): a nonzero inside, so a sync and a data-dependent
    shape."""
    return func in INDEX_OPS and len(args) > 1 and any(t.dtype == torch.bool for t in _tensors(args[1]))


def _fake_mode_of(args, kwargs):
    from torch._subclasses.fake_tensor import FakeTensor

    for t in _tensors((args, kwargs)):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return None


def _ones_list(t):
    """What a fake tensor's ``tolist()`` answers: ones (True), which every check of a report passes."""
    value = True if t.dtype == torch.bool else 1
    if t.dim() == 0:
        return value
    return [_ones_list(t[0]) for _ in range(t.shape[0])] if t.dim() > 1 else [value] * t.shape[0]


def _on_zeros(fake_mode, func, args, kwargs):
    """A data-dependent operator under fake tensors: run on real zeros of the inputs' shapes, then made fake."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    def real(x):
        if isinstance(x, FakeTensor):
            return torch.zeros(x.shape, dtype=x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(real(y) for y in x)
        return x

    with unset_fake_temporarily():
        out = func(*real(args), **{k: real(v) for k, v in kwargs.items()})

    def fake(x):
        if isinstance(x, torch.Tensor):
            return fake_mode.from_tensor(x)
        if isinstance(x, (list, tuple)):
            return type(x)(fake(y) for y in x)
        return x

    return fake(out)


# -- an H200's limits, for the estimate -------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceLimits:
    name: str = "H200"
    bf16_flops: float = 989e12  # dense bf16/fp16 tensor-core matmul
    fp32_flops: float = 67e12  # fp32 without TF32 (torch's default for matmuls)
    int8_flops: float = 1979e12
    bandwidth: float = 4.8e12  # HBM3e bytes/s
    launch_s: float = 5e-6  # least time of one kernel launch
    sync_s: float = 20e-6  # a host sync: the queue drains and a value comes back

    def peak(self, dtype: str | None) -> float:
        if dtype in ("float32", "float64"):
            return self.fp32_flops
        if dtype in ("int8",):
            return self.int8_flops
        return self.bf16_flops

    def seconds(self, r: OpRecord) -> float:
        t = 0.0
        if r.launches:
            t = max(r.flops / self.peak(r.dtype) if r.flops else 0.0, r.bytes / self.bandwidth,
                    r.launches * self.launch_s)
        return t + (self.sync_s if r.sync else 0.0)

    def assumptions(self) -> list[str]:
        return [
            f"each operator on an {self.name}: the larger of its matmul FLOPs at {self.bf16_flops / 1e12:.0f} TFLOPS "
            f"(bf16/fp16; fp32 at {self.fp32_flops / 1e12:.0f}, no TF32) and its bytes at "
            f"{self.bandwidth / 1e12:.1f} TB/s, at least {self.launch_s * 1e6:.0f} us per launch",
            f"each host sync adds {self.sync_s * 1e6:.0f} us (the queue drains, a value comes back)",
            "views, bare allocations and metadata launch nothing; elementwise FLOPs are not counted (bytes bound)",
            "bytes: every input and output once (broadcast dims once); row gathers and scatters move their rows",
            "operators traced as this machine's torch dispatches them (SDPA as one fused kernel); the pack's own "
            "kernels (sparse attention, TempCache's top-k search, LSH codes) as CUDA runs them, the search's top-k "
            "bookkeeping assumed hidden under its tensor-core dot",
        ]


H200 = DeviceLimits()


def estimate(tally: OpTally, limits: DeviceLimits = H200) -> dict:
    """Seconds the stretch would take at ``limits``, and the ten call sites that take most of it."""
    by_site: dict = defaultdict(float)
    total = 0.0
    for r in tally.records:
        s = limits.seconds(r)
        total += s
        by_site[r.where] += s
    top = sorted(by_site.items(), key=lambda kv: -kv[1])[:10]
    return {"seconds": total, "top_sites_ms": {k: round(v * 1e3, 3) for k, v in top}}
