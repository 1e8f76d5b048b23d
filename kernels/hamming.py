"""Hamming distance between 16-bit bucket codes, with elementwise ops only.

Elementwise so the same function works on plain tensors, inside FlexAttention's traced `mask_mod`, and in
the layout planner.
"""

import itertools

import torch


def popcount16(x: torch.Tensor) -> torch.Tensor:
    """Number of set bits in the low 16 bits of an integer tensor (SWAR bit counting)."""
    x = x & 0xFFFF
    x = x - ((x >> 1) & 0x5555)
    x = (x & 0x3333) + ((x >> 2) & 0x3333)
    x = (x + (x >> 4)) & 0x0F0F
    return (x + (x >> 8)) & 0x1F


def within_radius(q_codes: torch.Tensor, k_codes: torch.Tensor, radius: int) -> torch.Tensor:
    """Token rule for sparse keys: popcount(q xor k) <= radius (radius 0 = same bucket)."""
    if radius == 0:
        return q_codes == k_codes
    x = q_codes ^ k_codes
    if radius == 1:
        return (x & (x - 1)) == 0  # zero or one set bit: three ops instead of a popcount
    return popcount16(x) <= radius


def flip_masks(bits: int, radius: int, device=None) -> torch.Tensor:
    """All XOR masks over `bits` bits with at most `radius` set bits (the probe set of a code), int64."""
    radius = min(radius, bits)
    masks = [sum(1 << i for i in combo) for r in range(radius + 1) for combo in itertools.combinations(range(bits), r)]
    return torch.tensor(masks, dtype=torch.int64, device=device)


def num_flip_masks(bits: int, radius: int) -> int:
    from math import comb

    return sum(comb(bits, r) for r in range(min(radius, bits) + 1))


def hamming_ball_adjacency(bits: int, radius: int, device=None) -> torch.Tensor:
    """[2**bits, 2**bits] float matrix, 1 where two codes are within `radius` (for small `bits`)."""
    codes = torch.arange(2**bits, device=device)
    return within_radius(codes[:, None], codes[None, :], radius).float()


def code_lanes(bits: int) -> int:
    """Lanes the Triton block-list kernels give a code bitmap: one per code, at least 16 (a tile); the codes past
    2**bits are held by no key."""
    return max(16, 2**bits)
