"""Block layout for bucketed sparse attention: plan once per (codes, radius), run many times.

Rule every backend implements exactly: query i sees key j iff j < n_dense, or
popcount(q_code[i] xor k_code[j]) <= radius. Queries are sorted by code, sparse keys too (the dense keys stay
first, in their original order), so each bucket is a contiguous run. Per (batch, head, query block) the layout
lists the key blocks that may hold a visible key: a superset that kernels skip to, while the token rule above
decides inside a block.
"""

from dataclasses import dataclass, field

import torch

from .checks import check_codes
from .dispatch import backend_chain
from .errors import KernelInputError
from .hamming import flip_masks, hamming_ball_adjacency, num_flip_masks
from .verify import Family, run_with_fallback

DENSE_CODE = -1  # code stored for dense keys in `k_codes_sorted`
# Up to this many bits, block code sets are exact bitmaps and a Hamming-ball matmul finds neighbours.
BITMAP_MAX_BITS = 8
# Above it, each query block's probe codes are listed; beyond this many per (b, h) we list every block.
MAX_PROBE_ENTRIES = 2**22


@dataclass(eq=False)
class SparseLayout:
    """Bucket-sorted order of queries and keys, and the key blocks each query block visits.

    q_perm [B,H,Nq] int64: sorted position -> original query index (stable sort by code).
    k_perm [B,H,Nk] int64: dense keys 0..n_dense-1 first, then sparse keys stably sorted by code.
    q_codes_sorted [B,H,Nq] int32, k_codes_sorted [B,H,Nk] int32 (DENSE_CODE = -1 for dense keys).
    kv_num [B,H,nQB] int32 and kv_idx [B,H,nQB,maxKB] int32 (ascending; entries past kv_num are 0):
    the key blocks of the sorted keys that query block `qb` of the sorted queries visits.
    """

    q_perm: torch.Tensor
    k_perm: torch.Tensor
    q_codes_sorted: torch.Tensor
    k_codes_sorted: torch.Tensor
    kv_num: torch.Tensor
    kv_idx: torch.Tensor
    n_dense: int
    block_q: int
    block_k: int
    radius: int
    bits: int
    # What backends precompute from the layout (BlockMask, FlashInfer plan): built once, reused every run.
    cache: dict = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Nq, Nk)."""
        B, H, Nq = self.q_perm.shape
        return B, H, Nq, self.k_perm.shape[-1]

    @property
    def num_q_blocks(self) -> int:
        return self.kv_num.shape[-1]

    @property
    def num_k_blocks(self) -> int:
        return -(-self.shape[3] // self.block_k)

    @property
    def device(self) -> torch.device:
        return self.q_perm.device

    def density(self) -> float:
        """Visible (query, key) pairs / (Nq * Nk), over all batches and heads (token level)."""
        if "density" not in self.cache:
            B, H, Nq, Nk = self.shape
            pairs = B * H * Nq * Nk
            self.cache["density"] = float(self.visible_keys_per_query().sum()) / pairs if pairs else 0.0
        return self.cache["density"]

    def block_density(self) -> float:
        """Listed (query block, key block) pairs / all block pairs."""
        total = self.kv_num.numel() * self.num_k_blocks
        return float(self.kv_num.sum()) / total if total else 0.0

    def visible_keys_per_query(self, counted_keys: torch.Tensor | None = None) -> torch.Tensor:
        """[B, H, Nq] int64 (sorted query order): how many keys each query sees under the token rule.

        `counted_keys` [B, H, Nk] bool in sorted key order (e.g. finite bias) restricts which keys count."""
        B, H, Nq, Nk = self.shape
        if counted_keys is None:
            counted_keys = torch.ones(B, H, Nk, dtype=torch.bool, device=self.device)
        weights = counted_keys.long()
        sparse = self.k_codes_sorted[..., self.n_dense :].long()
        hist = torch.zeros(B, H, 2**self.bits, dtype=torch.int64, device=self.device)
        hist.scatter_add_(-1, sparse, weights[..., self.n_dense :])
        q_codes = self.q_codes_sorted.long()
        if self.bits <= BITMAP_MAX_BITS:
            per_code = (hist.double() @ hamming_ball_adjacency(self.bits, self.radius, self.device).double()).long()
            counts = per_code.gather(-1, q_codes)
        else:
            counts = torch.zeros(B, H, Nq, dtype=torch.int64, device=self.device)
            masks = flip_masks(self.bits, self.radius, self.device)
            for chunk in masks.split(256):
                probes = q_codes.unsqueeze(-1) ^ chunk
                counts += hist.gather(-1, probes.flatten(2)).view(B, H, Nq, -1).sum(-1)
        return counts + weights[..., : self.n_dense].sum(-1, keepdim=True)

    # Gathering into the sorted order and scattering back: shared by every backend.
    def sort_queries(self, q: torch.Tensor) -> torch.Tensor:
        return q.gather(2, self.q_perm.unsqueeze(-1).expand(-1, -1, -1, q.shape[-1]))

    def sort_keys(self, k: torch.Tensor) -> torch.Tensor:
        return k.gather(2, self.k_perm.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1]))

    def sort_key_bias(self, bias: torch.Tensor | None) -> torch.Tensor | None:
        """A [B|1, H|1, Nk] bias as [B, H, Nk] float32 in sorted key order."""
        if bias is None:
            return None
        B, H, _, Nk = self.shape
        return bias.expand(B, H, Nk).gather(2, self.k_perm)

    def unsort_queries(self, out_sorted: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(out_sorted)
        return out.scatter_(2, self.q_perm.unsqueeze(-1).expand_as(out_sorted), out_sorted)


def build_sparse_layout(q_codes, k_codes, *, n_dense: int, block_q: int = 64, block_k: int = 64, radius: int = 0,
                        bits: int | None = None, checked: bool = False, backend: str = "auto"):
    """Plan block-sparse attention from bucket codes.

    q_codes [B, H, Nq] and k_codes [B, H, Nk]: non-negative integer codes < 2**16. The first `n_dense` keys
    are seen by every query. Query i sees sparse key j iff popcount(q_code[i] xor k_code[j]) <= radius.
    Block sizes are powers of two >= 16 (tile sizes of the kernels).

    `bits`: the codes' width when the caller knows it (a hash of that many bits); the layout's shapes then depend
    on the sizes alone (`kv_idx` lists up to every key block), and nothing is read back to the host: what a
    compiled or captured step needs. None reads the widest code. `checked=True`: the caller vouches that the codes
    are in range (checked at first use), so they are not read to check them. `backend` plans the block lists
    ("auto": Triton on CUDA for codes of at most 8 bits, else torch; see `block_lists`).
    """
    if not isinstance(q_codes, torch.Tensor) or q_codes.dim() != 3:
        raise KernelInputError(f"q_codes must be a [B, H, Nq] integer tensor, got {_describe(q_codes)}")
    B, H, Nq = q_codes.shape
    q_codes = q_codes if checked else check_codes(q_codes, "q_codes")
    if not isinstance(k_codes, torch.Tensor) or k_codes.dim() != 3 or tuple(k_codes.shape[:2]) != (B, H):
        raise KernelInputError(f"k_codes must be a [B={B}, H={H}, Nk] integer tensor, got {_describe(k_codes)}")
    k_codes = k_codes if checked else check_codes(k_codes, "k_codes")
    if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16):
        raise KernelInputError(f"bits must be an int in [1, 16] (the codes' width), got {bits!r}")
    static = bits is not None
    if k_codes.device != q_codes.device:
        raise KernelInputError(f"q_codes and k_codes must be on one device, got {q_codes.device} and {k_codes.device}")
    Nk = k_codes.shape[2]
    if isinstance(n_dense, bool) or not isinstance(n_dense, int) or not 0 <= n_dense <= Nk:
        raise KernelInputError(f"n_dense must be an int in [0, Nk={Nk}], got {n_dense!r}")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 16 or size & (size - 1):
            raise KernelInputError(f"{name} must be a power of two >= 16 (a kernel tile size), got {size!r}")
    if isinstance(radius, bool) or not isinstance(radius, int) or not 0 <= radius <= 16:
        raise KernelInputError(f"radius must be an int in [0, 16] (Hamming radius on 16-bit codes), got {radius!r}")

    q_sorted, q_perm = torch.sort(q_codes.to(torch.int32), dim=-1, stable=True)
    # Dense keys get the code -1, below every real code: one stable sort puts them first, in their order.
    k_marked = k_codes.to(torch.int32, copy=True)
    if n_dense:
        k_marked[..., :n_dense].fill_(DENSE_CODE)
    k_sorted, k_perm = torch.sort(k_marked, dim=-1, stable=True)
    if bits is None:
        top_q = int(q_sorted[..., -1].max()) if q_codes.numel() else 0
        top_k = int(k_sorted[..., -1].max()) if k_sorted.numel() else 0
        bits = max(1, max(top_q, top_k, 0).bit_length())

    kv_num, kv_idx = block_lists(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits, backend)
    if not static:
        kv_idx = kv_idx[..., : max(1, int(kv_num.max()) if kv_num.numel() else 1)].contiguous()
    return SparseLayout(
        q_perm=q_perm,
        k_perm=k_perm,
        q_codes_sorted=q_sorted,
        k_codes_sorted=k_sorted,
        kv_num=kv_num,
        kv_idx=kv_idx,
        n_dense=n_dense,
        block_q=block_q,
        block_k=block_k,
        radius=radius,
        bits=bits,
    )


def block_lists(q_sorted, k_sorted, n_dense: int, block_q: int, block_k: int, radius: int, bits: int,
                backend: str = "auto"):
    """(kv_num [B, H, nQB] int32, kv_idx [B, H, nQB, nKB] int32) from the sorted int32 codes.

    Codes of at most 8 bits (the bitmap case, AnnSA's) run as one operator, ``fastar::block_lists``: two Triton
    kernels on CUDA (checked against torch at first use), torch's operators elsewhere. Wider codes, or a radius
    that makes every sparse key visible, take torch's operators one by one."""
    if bits > BITMAP_MAX_BITS or radius >= bits:
        return _block_lists_torch(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits)
    device = q_sorted.device
    chain = backend_chain("block_lists", backend, device)
    family = Family(str(device), torch.int32, 0, False, block_q=block_q, block_k=block_k, radius=radius, bits=bits)
    return run_with_fallback(
        "block_lists", chain, family,
        lambda name: block_lists_op(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits, name),
        lambda name: _probe_block_lists(name, family),
    )


@torch.library.custom_op("fastar::block_lists", mutates_args=())
def block_lists_op(q_sorted: torch.Tensor, k_sorted: torch.Tensor, n_dense: int, block_q: int, block_k: int,
                   radius: int, bits: int, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One operator whatever the backend (what an operator count sees as the kernels a GPU launches)."""
    if backend == "triton":
        from .sparse_layout_triton import block_lists_triton

        return block_lists_triton(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits)
    return _block_lists_torch(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits)


@block_lists_op.register_fake
def _(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits, backend):
    B, H, Nq = q_sorted.shape
    n_qb, n_kb = -(-Nq // block_q), -(-k_sorted.shape[-1] // block_k)
    return (q_sorted.new_empty((B, H, n_qb), dtype=torch.int32),
            q_sorted.new_empty((B, H, n_qb, n_kb), dtype=torch.int32))


def _probe_block_lists(name: str, family: Family) -> str | None:
    """Backend `name` against torch: dense keys, ragged tiles, codes in a few buckets and spread over all."""
    bq, bk, bits = family.block_q, family.block_k, family.bits
    gen = torch.Generator().manual_seed(bq + bk + bits)
    n_dense, Nq, Nk = bk + 5, 3 * bq + 7, 6 * bk + 11
    few = torch.randint(0, min(2**bits, 3), (1, 2, Nq + Nk), generator=gen)
    spread = torch.randint(0, 2**bits, (1, 2, Nq + Nk), generator=gen)
    codes = torch.where(torch.rand(1, 2, Nq + Nk, generator=gen) < 0.8, few, spread).to(torch.int32)
    q_sorted = codes[..., :Nq].sort(dim=-1).values.to(family.device)
    k_sorted = codes[..., Nq:].clone()
    k_sorted[..., :n_dense] = DENSE_CODE
    k_sorted = k_sorted.sort(dim=-1).values.to(family.device)
    args = (q_sorted, k_sorted, n_dense, bq, bk, family.radius, bits)
    got = block_lists_op(*args, name)
    expected = _block_lists_torch(*args)
    for what, a, b in zip(("kv_num", "kv_idx"), got, expected):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{what} has shape {tuple(a.shape)} {a.dtype}, expected {tuple(b.shape)} {b.dtype}"
        wrong = int((a.cpu() != b.cpu()).sum())
        if wrong:
            return f"{wrong} of {b.numel()} {what} entries differ from torch"
    return None


def _block_lists_torch(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits):
    visits = _block_visits(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits)
    kv_num = visits.sum(-1, dtype=torch.int32)
    # A stable sort of the "not visited" flag lists the visited blocks first, in ascending order.
    kv_idx = torch.sort((~visits).to(torch.int8), dim=-1, stable=True).indices
    kv_idx = torch.where(torch.arange(visits.shape[-1], device=visits.device) < kv_num.unsqueeze(-1), kv_idx, 0)
    return kv_num, kv_idx.to(torch.int32)


def _block_visits(q_sorted, k_sorted, n_dense, block_q, block_k, radius, bits) -> torch.Tensor:
    """[B, H, nQB, nKB] bool: key blocks that may hold a key visible to some query of the query block."""
    B, H, Nq = q_sorted.shape
    Nk = k_sorted.shape[-1]
    n_qb, n_kb = -(-Nq // block_q), -(-Nk // block_k)
    device = q_sorted.device
    # Padding codes: -2 never matches; dense keys (-1) are handled by the dense blocks below.
    q_blocks = _pad_last(q_sorted, n_qb * block_q, -2).view(B, H, n_qb, block_q)
    k_blocks = _pad_last(k_sorted, n_kb * block_k, -2).view(B, H, n_kb, block_k)
    if radius >= bits:
        visits = torch.ones(B, H, n_qb, n_kb, dtype=torch.bool, device=device)
        visits &= (k_blocks >= 0).any(-1).unsqueeze(2)
    elif bits <= BITMAP_MAX_BITS:
        visits = _bitmap_visits(q_blocks, k_blocks, radius, bits)
    elif Nq * num_flip_masks(bits, radius) <= MAX_PROBE_ENTRIES:
        visits = _probe_range_visits(q_blocks, k_blocks, radius, bits)
    else:  # too many probes to list: every block with a sparse key is a safe superset
        visits = (k_blocks >= 0).any(-1).unsqueeze(2).expand(B, H, n_qb, n_kb).clone()
    visits[..., : -(-n_dense // block_k)].fill_(True)
    return visits


def _bitmap_visits(q_blocks, k_blocks, radius, bits):
    """Exact at code level: per block a bitmap of its codes; probe sets via a Hamming-ball matmul."""
    n_codes = 2**bits
    q_set = _code_bitmap(q_blocks, n_codes)
    k_set = _code_bitmap(k_blocks, n_codes)
    probe = (q_set @ hamming_ball_adjacency(bits, radius, q_blocks.device)) > 0
    return (probe.float() @ k_set.transpose(-1, -2)) > 0


def _code_bitmap(blocks, n_codes):
    """[..., n_blocks, block] codes -> [..., n_blocks, n_codes] float 0/1; codes < 0 are left out."""
    slot = torch.where(blocks >= 0, blocks, n_codes)
    bitmap = torch.zeros(*blocks.shape[:-1], n_codes + 1, device=blocks.device)
    bitmap.scatter_(-1, slot, 1.0)
    return bitmap[..., :n_codes]


def _probe_range_visits(q_blocks, k_blocks, radius, bits):
    """Superset for wide codes: a key block is visited if some probe code of the query block falls in the
    block's [min, max] code range (its codes are sorted, so the range is tight where buckets are)."""
    B, H, n_qb, block_q = q_blocks.shape
    masks = flip_masks(bits, radius, q_blocks.device)
    probes = torch.where(q_blocks.unsqueeze(-1) >= 0, q_blocks.unsqueeze(-1) ^ masks, -3)
    probes = probes.view(B, H, n_qb, block_q * masks.numel()).sort(dim=-1).values
    sparse = k_blocks >= 0
    big = 1 << 17  # past every 16-bit code
    k_min = torch.where(sparse, k_blocks, big).amin(-1)
    k_max = torch.where(sparse, k_blocks, -big).amax(-1)
    n_kb = k_blocks.shape[2]
    lo = torch.searchsorted(probes, k_min.unsqueeze(2).expand(B, H, n_qb, n_kb).contiguous())
    hi = torch.searchsorted(probes, k_max.unsqueeze(2).expand(B, H, n_qb, n_kb).contiguous(), right=True)
    return hi > lo


def _pad_last(t, length, value):
    if t.shape[-1] == length:
        return t
    return torch.nn.functional.pad(t, (0, length - t.shape[-1]), value=value)


def _describe(x) -> str:
    return f"shape {tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
