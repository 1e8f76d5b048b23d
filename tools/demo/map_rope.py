"""Positions on the map: the rotary positions of the steered world model (files whose world entry says
``"positions": "map"``).

Each token's spatial position is its place on the map, not on the screen: the camera's map position (in patches)
plus the token's offset in the view, modulo the map. The rotary frequencies are whole cycles per map, so a
position and the same position one map further rotate alike and the wrap is seamless. Time is dropped: the world
is static, so a place looks the same whenever it is seen, and every key of a place, from any frame, sits at
relative position 0 from a query at that place. Carrying what stays in view and reading back a place seen long
ago are then one mechanism (attend to your own place and copy), and identical keys of one place are identical
keys at identical positions, which TempCache merges exactly.

The engine keeps (t, h, w) per token as always: t stays the absolute frame (caches evict, rewind and keep their
sink by it), h and w become the map row and column. ``MapRoPE`` is the attention's rotary table (it ignores t);
``map_positions`` the runner's positions.
"""

from __future__ import annotations

import math

import torch

from ...fastar_core.model.rope import grid_positions, rope_axes

POSITIONS = "map"  # world metadata ``positions``: rotary positions are places on the map, time dropped


def map_cycles(pairs: int, map_patches: int) -> tuple[int, ...]:
    """Cycles per map of an axis's rotary pairs: the first odd numbers (1, 3, 5, 7, 9 for five pairs). Of all sets
    of five whole frequencies below the map's Nyquist limit, odd ones leave the largest gap between a place and its
    nearest other place when every pair counts alike (a peak of 5 against at most 0.97)."""
    cycles = tuple(range(1, 2 * pairs, 2))
    if cycles[-1] >= map_patches / 2:
        raise ValueError(f"a map of {map_patches} patches cannot tell {pairs} rotary frequencies per axis apart")
    return cycles


class MapRoPE:
    """cos/sin of positions ``[..., L, 3]`` (t, map row, map column) for a head dim: the time pairs unrotated, each
    spatial pair at a whole number of cycles per map. The attention's tables in place of Wan's
    (``DenseAttention.own_rope``); the tables are built once per device."""

    def __init__(self, map_patches: int, head_dim: int):
        self.map_patches, self.head_dim = map_patches, head_dim
        self._tables: dict = {}  # device -> (cos [M, pairs], sin [M, pairs]) per axis position

    def _axis_tables(self, device) -> tuple:
        key = str(device)
        if key not in self._tables:
            _, pairs, _ = rope_axes(self.head_dim)
            m = self.map_patches
            freq = torch.tensor(map_cycles(pairs, m), dtype=torch.float64) * (2 * math.pi / m)
            angles = torch.arange(m, dtype=torch.float64)[:, None] * freq
            self._tables[key] = (torch.cos(angles).float().to(device), torch.sin(angles).float().to(device))
        return self._tables[key]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t_pairs, _, _ = rope_axes(self.head_dim)
        cos_m, sin_m = self._axis_tables(positions.device)
        rows = torch.remainder(positions[..., 1].long(), self.map_patches)
        cols = torch.remainder(positions[..., 2].long(), self.map_patches)
        still = torch.zeros(*positions.shape[:-1], t_pairs, device=positions.device)
        cos = torch.cat([still + 1, cos_m[rows], cos_m[cols]], dim=-1)
        sin = torch.cat([still, sin_m[rows], sin_m[cols]], dim=-1)
        return cos, sin


def map_positions(cameras: torch.Tensor, frame_start: int, grid_hw: tuple, map_patches: int) -> torch.Tensor:
    """(t, map row, map column) of every token of frames ``frame_start ..`` whose cameras (top-left corner, (x, y)
    in patches) are ``cameras [F, 2]``: ``[F * gh * gw, 3]`` int64, frame-major then row-major as
    ``grid_positions``."""
    gh, gw = grid_hw
    grid = grid_positions(frame_start, cameras.shape[0], gh, gw, device=cameras.device)
    cam = cameras.long().repeat_interleave(gh * gw, dim=0)
    out = grid.clone()
    out[:, 1] = torch.remainder(grid[:, 1] + cam[:, 1], map_patches)
    out[:, 2] = torch.remainder(grid[:, 2] + cam[:, 0], map_patches)
    return out
