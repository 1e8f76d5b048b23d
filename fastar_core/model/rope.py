"""Wan's 3-D rotary position embedding from integer (t, h, w) positions.

Head dims split into time / height / width pairs as Wan does (44 / 42 / 42 for head_dim 128; in general
``d - 4*(d//6)``, ``2*(d//6)``, ``2*(d//6)``), rotating interleaved (adjacent) pairs. The cos/sin tables
(``RopeTables``) cover the positions a rollout reaches and grow when it reaches further, so rollouts have no length
limit; positions may be absolute or relative to the current chunk (negative).
"""

from __future__ import annotations

import torch


def _inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """Per-pair inverse frequencies, float64, in Wan's (time, height, width) order. Made anew each time a table
    grows (rarely), not cached: a tensor cached while fake tensors trace a model (``fastar bench launches``) would
    be a fake one that every later real table of that head size mixes with."""
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


# A rollout's tables are sized for its whole length up to this span before it starts (rows of ``2 * span``: 8 MiB
# per table at a head of 128); a longer rollout grows them past it as its positions reach further.
RESERVED_SPAN_MAX = 16384


class RopeTables:
    """cos and sin of Wan's RoPE for every integer position in ``[-span, span)`` of each axis, on one device.

    Built once (and grown, doubling, the few times a rollout reaches past them), so a call gathers its tables with
    device indexing: no transcendentals per call, no table built on the host and copied, no host read of the
    positions. ``span`` comes from what the caller knows on the host (the frames of the pass, the grid), never from
    the positions' values. Each entry is the value the direct formula gives (the same float64 angle and cosine).
    Tables are ``[2 * span, pairs of the axis, 2]`` (cos, sin), so a gather lands as interleaved (cos, sin)."""

    def __init__(self, head_dim: int, device, theta: float = 10000.0):
        self.head_dim, self.device, self.theta = head_dim, torch.device(device), theta  # Wan's theta: 10000
        self.span = 0
        self.tables: list[torch.Tensor] = []

    def reserve(self, span: int) -> RopeTables:
        """Cover ``[-span, span)`` before a rollout starts, up to ``RESERVED_SPAN_MAX``: tables grown mid-rollout
        make the chunk that crosses each doubling pay for the rebuild (a fifth of a chunk at 1,024 and 2,048 frames
        on the LingBot cap bench's model) and a captured step be captured again."""
        return self.ensure(min(span, RESERVED_SPAN_MAX))

    def ensure(self, span: int) -> RopeTables:
        """Cover positions in ``[-span, span)`` on every axis."""
        if span > self.span:
            self.span = max(span, 2 * self.span, 64)
            inv = _inverse_frequencies(self.head_dim, self.theta).to(self.device)
            t = torch.arange(-self.span, self.span, dtype=torch.float64, device=self.device)[:, None]
            bounds = [0]
            for size in rope_axes(self.head_dim):
                bounds.append(bounds[-1] + size)
            self.tables = []
            for axis in range(3):
                angles = t * inv[bounds[axis]:bounds[axis + 1]]
                self.tables.append(torch.stack((torch.cos(angles).float(), torch.sin(angles).float()), dim=-1))
        return self

    def cos_sin_pairs(self, positions: torch.Tensor) -> torch.Tensor:
        """``[..., L, head_dim/2, 2]`` (cos, sin) for integer positions ``[..., L, 3]`` inside the span."""
        index = positions + self.span
        return torch.cat([self.tables[axis][index[..., axis]] for axis in range(3)], dim=-2)

    def cos_sin(self, positions: torch.Tensor):
        pairs = self.cos_sin_pairs(positions)
        return pairs[..., 0], pairs[..., 1]


def span_of(*extents: int) -> int:
    """The table span covering positions up to these extents (a frame index, the grid's height and width) and
    their negatives (positions relative to a later frame)."""
    return max(extents) + 1


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float = 10000.0):
    """cos/sin tables ``[..., L, head_dim/2]`` (fp32) for integer positions ``[..., L, 3]``. Reads the positions'
    range on the host to size the tables: for tools and tests; the hot path passes a span it knows."""
    span = int(positions.abs().max()) + 1 if positions.numel() else 1
    return RopeTables(head_dim, positions.device, theta).ensure(span).cos_sin(positions.long())


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


def rotate(x: torch.Tensor, positions: torch.Tensor, tables: RopeTables | None = None) -> torch.Tensor:
    """``apply_rope`` at ``positions [P, L, 3]`` (P in (1, H)): from ``tables`` that cover them (the hot path), or
    (None) from tables sized by reading the positions on the host."""
    cos, sin = tables.cos_sin(positions) if tables is not None else rope_cos_sin(positions, x.shape[-1])
    return apply_rope(x, cos, sin)


def grid_positions(frame_start: int, num_frames: int, grid_h: int, grid_w: int, device=None) -> torch.Tensor:
    """(t, h, w) of every token of ``num_frames`` frames, frame-major then row-major: ``[F*gh*gw, 3]`` int64."""
    t = torch.arange(frame_start, frame_start + num_frames, device=device)
    h = torch.arange(grid_h, device=device)
    w = torch.arange(grid_w, device=device)
    tt, hh, ww = torch.meshgrid(t, h, w, indexing="ij")
    return torch.stack((tt, hh, ww), dim=-1).reshape(-1, 3)


_grids: dict = {}


def chunk_positions(frame_start: int, num_frames: int, grid_h: int, grid_w: int, device) -> torch.Tensor:
    """``grid_positions``, from a grid built once per (frames, grid, device) and moved in time by one add whose
    frame is a scalar argument (no host tensor per call). A fresh tensor: callers may keep or change it."""
    key = (num_frames, grid_h, grid_w, torch.device(device))
    if key not in _grids:
        unit = torch.zeros(1, 3, dtype=torch.long, device=device)
        unit[0, 0] = 1
        _grids[key] = (grid_positions(0, num_frames, grid_h, grid_w, device=device), unit)
    grid, unit = _grids[key]
    return torch.add(grid, unit, alpha=frame_start)
