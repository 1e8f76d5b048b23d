"""Hashing for AnnSA's and AnnCA's buckets: attention treated as search (FAST-AR's common primitive).

``LSHMatcher``: sign random projections, ``bits`` per table, ``tables`` tables, optional Hamming-1 probes, as
bucket codes and collisions. (TempCache's top-1 search is ``caches/matching.py``.)

Projections come from a generator seeded by the config, never the global RNG, so turning FAST-AR on does not
change the sampling noise.
"""

from __future__ import annotations

import torch

from ...kernels import lsh_codes


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
