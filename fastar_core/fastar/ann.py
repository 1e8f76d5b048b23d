"""Approximate nearest-neighbour matching: attention treated as search (FAST-AR's common primitive).

Three matchers, each with "buckets of these tokens" and "top-1 match of these against those":
- ``LSHMatcher``: sign random projections, ``bits`` per table, ``tables`` tables, optional Hamming-1 probes;
- ``QuantMatcher``: per-dimension int8 scalar quantization, top-k by quantized inner product; its buckets
  come from a coarse quantizer (the nearest of ``2**bits`` seeded centroids, IVF-style);
- ``exact_top1``: chunked matmul + max, never a full N x M matrix: the reference.

Projections and centroids come from a generator seeded by the config, never the global RNG, so turning
FAST-AR on does not change the sampling noise.
"""

from __future__ import annotations

import torch

from ...kernels import lsh_codes

CHUNK_ROWS = 1024  # rows of the similarity matrix computed at once


def _normalize(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def exact_top1(a: torch.Tensor, b: torch.Tensor, b_valid: torch.Tensor | None = None, allowed=None,
               chunk: int = CHUNK_ROWS, min_score: float | None = None):
    """Cosine top-1 of each row of ``a [B,H,N,D]`` among rows of ``b [B,H,M,D]``.

    ``b_valid [B,H,M]`` bool excludes entries (empty slots, sink). ``allowed(rows) -> [B,H,n,M] bool``
    optionally restricts candidates (bucket collisions). Returns (index [B,H,N] int64, cosine [B,H,N]
    float32; -inf where nothing is allowed). With ``min_score``, rows whose best cosine is below it get index 0:
    callers that only use matches above a bar save the index search there (on a CPU a max with indices costs
    many times a max of values).
    """
    B, H, N, D = a.shape
    M = b.shape[2]
    idx = torch.zeros(B, H, N, dtype=torch.long, device=a.device)
    best = torch.full((B, H, N), float("-inf"), device=a.device)
    if M == 0:
        return idx, best
    an = _normalize(a).reshape(B * H, N, D)
    bn_t = _normalize(b).reshape(B * H, M, D).transpose(1, 2)
    # Excluded entries as a -inf column bias that the matmul adds in place (no second pass over the scores).
    col_bias = None
    if b_valid is not None:
        col_bias = torch.zeros(B * H, 1, M, device=a.device).masked_fill_(~b_valid.reshape(B * H, 1, M),
                                                                           float("-inf"))
    for start in range(0, N, chunk):
        rows = an[:, start:start + chunk]
        sim = (torch.bmm(rows, bn_t) if col_bias is None else torch.baddbmm(col_bias, rows, bn_t)).view(B, H, -1, M)
        if allowed is not None:
            sim = sim.masked_fill(~allowed(slice(start, start + chunk)), float("-inf"))
        if min_score is None:
            val, arg = sim.max(dim=-1)
        else:
            val = sim.amax(dim=-1)
            arg = torch.zeros(val.shape, dtype=torch.long, device=a.device)
            rows = val >= min_score
            if bool(rows.any()):
                arg[rows] = sim[rows].argmax(dim=-1)
        best[:, :, start:start + chunk] = val
        idx[:, :, start:start + chunk] = arg
    return idx, best


def hamming1_probes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``codes [...]`` -> ``[..., 1 + bits]``: the code itself and its Hamming-1 neighbours."""
    flips = torch.cat([torch.zeros(1, dtype=codes.dtype, device=codes.device),
                       (1 << torch.arange(bits, device=codes.device)).to(codes.dtype)])
    return codes.unsqueeze(-1) ^ flips


class LSHMatcher:
    """Sign-LSH over ``num_heads`` heads of dimension ``head_dim``, one set of planes per matcher."""

    def __init__(self, num_heads: int, head_dim: int, bits: int, tables: int, seed: int, multiprobe: bool = True,
                 device="cpu", backend: str = "auto"):
        g = torch.Generator().manual_seed(seed)
        self.planes = torch.randn(num_heads, head_dim, tables * bits, generator=g).to(device)
        self.bits, self.tables, self.multiprobe, self.backend = bits, tables, multiprobe, backend

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """Packed codes ``[B, H, N, tables]`` (int32)."""
        return lsh_codes(x, self.planes.to(x.device), bits=self.bits, backend=self.backend)

    def collide(self, ca: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        """``[B,H,n,T]`` x ``[B,H,M,T]`` codes -> ``[B,H,n,M]``: share a bucket in some table (or a probe)."""
        x = ca[:, :, :, None, :] ^ cb[:, :, None, :, :]
        if self.multiprobe:
            hit = (x & (x - 1)) == 0  # Hamming distance <= 1
        else:
            hit = x == 0
        return hit.any(dim=-1)

    def top1(self, a, b, b_valid=None):
        ca, cb = self.codes(a), self.codes(b)
        return exact_top1(a, b, b_valid, allowed=lambda rows: self.collide(ca[:, :, rows], cb))


class QuantMatcher:
    """Per-dimension symmetric int8 (``quant_bits``) quantization; inner products on the integer codes."""

    def __init__(self, num_heads: int, head_dim: int, quant_bits: int = 8, bits: int = 6, seed: int = 0, device="cpu"):
        self.levels = 2 ** (quant_bits - 1) - 1
        g = torch.Generator().manual_seed(seed)
        centroids = torch.randn(num_heads, 2**bits, head_dim, generator=g)
        self.centroids = _normalize(centroids).to(device)

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None):
        """Integer codes (held in fp32: exact for these magnitudes) and the per-dimension scale."""
        x = _normalize(x)
        if scale is None:
            scale = x.abs().amax(dim=(0, 2), keepdim=True).clamp_min(1e-8) / self.levels
        return torch.round(x / scale).clamp(-self.levels, self.levels), scale

    def buckets(self, x: torch.Tensor) -> torch.Tensor:
        """Coarse cell of each token: the best centroid by quantized inner product. ``[B, H, N]`` int32."""
        qx, scale = self.quantize(x)
        qc, _ = self.quantize(self.centroids[None].to(x.device), scale)
        return torch.argmax(qx @ qc.transpose(-1, -2), dim=-1).to(torch.int32)

    def topk(self, a, b, k: int = 1, b_valid=None, chunk: int = CHUNK_ROWS):
        """Top-k of each row of ``a`` among ``b`` by quantized inner product: (index, score) ``[B,H,N,k]``."""
        qb, scale = self.quantize(b)
        qa, _ = self.quantize(a, scale)
        B, H, N, _ = a.shape
        idx = torch.zeros(B, H, N, k, dtype=torch.long, device=a.device)
        val = torch.full((B, H, N, k), float("-inf"), device=a.device)
        for start in range(0, N, chunk):
            s = qa[:, :, start:start + chunk] @ qb.transpose(-1, -2)
            if b_valid is not None:
                s = s.masked_fill(~b_valid[:, :, None, :], float("-inf"))
            v, i = s.topk(min(k, s.shape[-1]), dim=-1)
            val[:, :, start:start + chunk, : v.shape[-1]] = v
            idx[:, :, start:start + chunk, : i.shape[-1]] = i
        return idx, val

    def top1(self, a, b, b_valid=None):
        """Candidate by quantized search, then its exact cosine (what the merge threshold is compared to)."""
        if b.shape[2] == 0:
            return exact_top1(a, b, b_valid)
        idx, score = self.topk(a, b, 1, b_valid)
        idx = idx[..., 0]
        cos = (_normalize(a) * _normalize(b).gather(2, idx[..., None].expand(-1, -1, -1, b.shape[-1]))).sum(-1)
        return idx, cos.masked_fill(torch.isinf(score[..., 0]), float("-inf"))
