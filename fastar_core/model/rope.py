"""Wan's 3-D rotary position embedding, computed on the fly from integer (t, h, w) positions.

Head dims split into time / height / width pairs as Wan does (44 / 42 / 42 for head_dim 128; in general
``d - 4*(d//6)``, ``2*(d//6)``, ``2*(d//6)``), rotating interleaved (adjacent) pairs. There is no precomputed
1024-position table, so rollouts have no length limit; callers pass positions relative to the current chunk.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=16)
def _inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """Per-pair inverse frequencies, float64, in Wan's (time, height, width) order."""
    pairs = head_dim // 2
    hw_pairs = pairs // 3
    t_pairs = pairs - 2 * hw_pairs

    def axis(n):
        return 1.0 / theta ** (torch.arange(0, 2 * n, 2, dtype=torch.float64) / (2 * n))

    return torch.cat([axis(t_pairs), axis(hw_pairs), axis(hw_pairs)])


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    pairs = head_dim // 2
    hw = pairs // 3
    return pairs - 2 * hw, hw, hw


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float = 10000.0):
    """cos/sin tables ``[..., L, head_dim/2]`` (fp32) for integer positions ``[..., L, 3]``."""
    if positions.device.type == "cpu":
        return _cos_sin_by_lookup(positions, head_dim, theta)
    inv = _inverse_frequencies(head_dim, theta).to(positions.device)
    t_pairs, hw_pairs, _ = rope_axes(head_dim)
    axis_of_pair = torch.tensor([0] * t_pairs + [1] * hw_pairs + [2] * hw_pairs, device=positions.device)
    angles = positions.to(torch.float64)[..., axis_of_pair] * inv
    return torch.cos(angles).float(), torch.sin(angles).float()


def _cos_sin_by_lookup(positions: torch.Tensor, head_dim: int, theta: float):
    """On a CPU the transcendentals dominate: evaluate them once per distinct position of each axis (a few
    dozen) and gather. Same values as the direct formula; on a GPU the direct formula avoids host syncs."""
    inv = _inverse_frequencies(head_dim, theta)
    sizes = rope_axes(head_dim)
    bounds = torch.cumsum(torch.tensor((0, *sizes)), 0).tolist()
    cos_parts, sin_parts = [], []
    for axis in range(3):
        p = positions[..., axis].long()
        lo, hi = int(p.min()), int(p.max())
        angles = torch.arange(lo, hi + 1, dtype=torch.float64)[:, None] * inv[bounds[axis]:bounds[axis + 1]]
        idx = p - lo
        cos_parts.append(torch.cos(angles).float()[idx])
        sin_parts.append(torch.sin(angles).float()[idx])
    return torch.cat(cos_parts, dim=-1), torch.cat(sin_parts, dim=-1)


# Complex numbers per vector of the widest CPU kernels (AVX-512: 16 floats).
COMPLEX_LANES = 8


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x [B, H, L, D]``; cos/sin broadcast as ``[P, L, D/2]`` with P in (1, H)."""
    shape = x.shape
    if x.device.type == "cpu" and (shape[-1] // 2) % COMPLEX_LANES == 0:
        # On a CPU, the pairs as complex numbers times cos + i sin: one vectorised pass instead of six elementwise
        # ones and a stack (a fifth of the time or less at Wan's shapes). The vector kernel forms the same rounded
        # products and sums, so the values are the same bit for bit; its scalar tail may fuse a multiply-add, which
        # head dims whose pairs fill whole vectors never reach.
        pairs = torch.view_as_complex(x.float().contiguous().reshape(*shape[:-1], shape[-1] // 2, 2))
        turn = torch.complex(cos.float(), sin.float()).expand(pairs.shape).contiguous()
        return torch.view_as_real(pairs * turn).reshape(shape).to(x.dtype)
    pairs = x.float().reshape(*shape[:-1], shape[-1] // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.reshape(shape).to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """``apply_rope`` with tables computed from ``positions [P, L, 3]`` (P in (1, H))."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    return apply_rope(x, cos, sin)


def grid_positions(frame_start: int, num_frames: int, grid_h: int, grid_w: int, device=None) -> torch.Tensor:
    """(t, h, w) of every token of ``num_frames`` frames, frame-major then row-major: ``[F*gh*gw, 3]`` int64."""
    t = torch.arange(frame_start, frame_start + num_frames, device=device)
    h = torch.arange(grid_h, device=device)
    w = torch.arange(grid_w, device=device)
    tt, hh, ww = torch.meshgrid(t, h, w, indexing="ij")
    return torch.stack((tt, hh, ww), dim=-1).reshape(-1, 3)
