"""What every KV cache shares: the view it hands attention, the interface the runner drives, and memory checks.

Every cache stores keys with their (t, h, w) positions, allocates its buffers once per rollout,
and hands the runner a ``CacheView`` per layer: ``k, v, bias, positions``. ``bias`` is 0 for live entries,
``log(count)`` for merged groups (TempCache) and ``-inf`` for empty slots, so compressed caches plug into the
same attention seam as the dense ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from ..memory import check_fits as fits
from ..model.rope import RopeTables, chunk_positions, span_of


@dataclass
class CacheView:
    k: torch.Tensor  # [B, H, L, D] pre-RoPE keys
    v: torch.Tensor  # [B, H, L, D]
    bias: torch.Tensor  # [B|1, H|1, L] float32 additive logit bias
    positions: torch.Tensor  # [H|1, L, 3] int64 (t, h, w); t absolute, re-based where the policy moves a sink
    n_sink: int  # the first n_sink entries are sink tokens
    uniform: bool  # True when bias is 0 everywhere, so attention may skip it
    version: int = 0  # changes whenever the layer's entries change (commit, rewind): lets readers memoise
    # True: ``k`` is already rotated by RoPE at ``positions`` (absolute), so attention rotates only the new tokens
    # (at their absolute positions) and reads the cache as it is; False: pre-RoPE keys.
    rotated: bool = False
    # The K and V buffers ``k`` and ``v`` are a prefix of, where the slots after the view are free: attention may
    # write the current chunk's rotated keys and values there and read one slice instead of joining the whole
    # cache to them on every call. Free means unread until the next commit, which writes its own entries.
    room: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        return self.k.shape[2]


@dataclass(frozen=True)
class Figure:
    """A figure for a chunk's report that lives on the device (a 0-d tensor, or 1-d: one entry per layer), with
    the decimals it is reported to; read with the rest of the report in one transfer (``read_figures``)."""

    value: torch.Tensor
    digits: int | None = None


def read_figures(figures: dict) -> dict:
    """``figures`` with every device value (a ``Figure`` or a tensor) read to the host in ONE transfer: the one
    host sync a chunk's report costs. Numbers pass through; a 1-d value becomes a list."""
    pending = [(key, f if isinstance(f, Figure) else Figure(f)) for key, f in figures.items()
               if isinstance(f, (Figure, torch.Tensor))]
    out: dict[str, Any] = dict(figures)
    if not pending:
        return out
    flat = torch.cat([f.value.detach().reshape(-1).to(torch.float64) for _, f in pending]).cpu().tolist()
    at = 0
    for key, f in pending:
        n = f.value.numel()
        values = [round(x, f.digits) if f.digits is not None else x for x in flat[at:at + n]]
        at += n
        out[key] = values if f.value.dim() else values[0]
    return out


@dataclass(frozen=True)
class CacheShape:
    """The model- and rollout-dependent sizes every cache is built for."""

    num_layers: int
    batch: int
    num_heads: int
    head_dim: int
    grid_hw: tuple
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    frames_per_block: int = 1  # the rollout's chunk size (a window holds what a full chunk reads back)
    # Keep keys rotated (RoPE at their absolute positions, once, at commit) where the cache can: the dense caches.
    # Attention that clamps RoPE distances to the query needs pre-RoPE keys and leaves it off.
    rotated_keys: bool = False


def element_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def check_fits(device: torch.device, nbytes: int, what: str) -> None:
    """Refuse, before allocating, a cache that cannot fit in the device's free memory (GPU, or the host's RAM for
    a CPU cache): one clear message instead of an out-of-memory error halfway through a rollout."""
    fits(nbytes, device, what, "use the window or rolling cache, or FAST-AR's tempcache, whose memory is bounded")


class KVCache(ABC):
    """Interface shared by every cache policy. A policy also implements ``from_spec`` (build it from a
    ``CacheSpec``) and ``check_spec`` (refuse sizes it cannot honour) and is listed in ``spec.POLICIES``.

    A policy also knows itself from its spec alone, before anything is allocated: which spec fields it reads,
    how it reads in a report, how many frames it allocates, attends to, matches against and rebuilds, whether
    it keeps a sink, what a prompt switch re-encodes, and its memory. Reports, the sampler, the command line's
    checks, the memory check and the cost model ask these, so a new policy changes nothing outside its class
    and its line in ``spec.POLICIES``."""

    policy = "base"
    rebuilds_each_chunk = False  # True: the sampler rebuilds it before every chunk (``context_frames``, ``reset``)
    # The CacheSpec fields this policy reads; options that set any other are refused as doing nothing.
    size_fields: tuple[str, ...] = ()
    keeps_sink = False  # its first ``sink_frames`` frames stay for good (never evicted, merged or recached)
    rope: RopeTables | None = None  # the tables a policy that rotates keys itself keeps

    def __init__(self, num_layers, batch, num_heads, head_dim, grid_hw, dtype, device):
        self.num_layers = num_layers
        self.batch = batch
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.grid_hw = tuple(grid_hw)
        self.tokens_per_frame = grid_hw[0] * grid_hw[1]
        self.dtype = dtype
        self.device = torch.device(device)
        self.versions = [0] * num_layers

    def reserve_positions(self, total_frames: int) -> None:
        """Size the RoPE tables this cache rotates keys with, where it keeps any (``rope``), for a rollout of
        ``total_frames`` latent frames before it starts (``RopeTables.reserve``)."""
        if self.rope is not None:
            self.rope.reserve(span_of(total_frames, *self.grid_hw))

    # -- building from the user's choice -----------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def from_spec(cls, spec, shape: CacheShape, total_frames: int) -> KVCache:
        """The cache ``spec`` describes, for a rollout of ``total_frames`` latent frames."""

    @classmethod  # noqa: B027 - most policies accept any size
    def check_spec(cls, spec, frames_per_block: int) -> None:
        """Raise ``FastARError`` when ``spec``'s sizes cannot hold a chunk of ``frames_per_block`` frames."""

    # -- the policy from its spec (no cache built) --------------------------------------------------------------
    @classmethod
    def describe(cls, spec) -> str:
        """One line for reports: the policy and the sizes it uses."""
        return cls.policy

    @classmethod
    def sink(cls, spec) -> int:
        """Frames kept for good."""
        return spec.sink_frames if cls.keeps_sink else 0

    @classmethod
    @abstractmethod
    def allocated_frames(cls, spec, total_frames: int, frames_per_block: int) -> int:
        """Frames' worth of keys and values allocated for a rollout of ``total_frames`` frames."""

    @classmethod
    @abstractmethod
    def attended_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        """Cached frames a chunk of ``frames_per_block`` frames attends to beside itself, once ``committed``
        frames are committed (merged TempCache groups counted as a full cache: its most)."""

    @classmethod
    def matched_frames(cls, spec, committed: int, frames_per_block: int) -> int:
        """Frames' worth of cached keys each new key is compared with when a clean pass commits (TempCache)."""
        return 0

    @classmethod
    def rebuilt_frames(cls, spec, frame_start: int, frames_per_block: int) -> int:
        """Frames re-encoded, block-causally at positions 0.., before the chunk at ``frame_start`` (recompute);
        such a cache takes no clean pass after its chunk."""
        return 0

    @classmethod
    def vae_needed(cls, spec) -> str | None:
        """Why a rollout with this cache needs a VAE (it re-encodes decoded frames), or None."""
        return None

    @classmethod
    def recache_start(cls, spec, frame_start: int, frames: int) -> int:
        """First frame a prompt switch at ``frame_start`` re-encodes when asked for ``frames`` frames (LongLive's
        recache). When they reach back to frame 0 (a switch within the first window) the recache starts there
        and re-encodes the sink too, as LongLive's does (it protects its sink only in a recompute that does not
        start at frame 0); otherwise never the sink. ``frame_start`` or more: nothing to re-encode."""
        if frame_start - frames <= 0:
            return 0
        return max(cls.sink(spec), frame_start - frames)

    @classmethod
    @abstractmethod
    def planned_bytes(cls, spec, shape: CacheShape, total_frames: int) -> int:
        """Bytes the cache allocates for ``shape`` and a rollout of ``total_frames`` frames (what
        ``allocated_bytes`` will report), known before anything is allocated."""

    # -- reading ---------------------------------------------------------------------------------------------
    @abstractmethod
    def view(self, layer: int, query_start: int, query_frames: int) -> CacheView | None:
        """What queries of frames ``query_start ..`` see of the past in ``layer`` (None: nothing yet)."""

    # -- writing (one clean pass: prepare once, commit per layer, finish once) --------------------------------
    @abstractmethod
    def prepare_commit(self, frame_start: int, num_frames: int, positions: torch.Tensor | None = None) -> None:
        """A clean pass of frames ``frame_start ..`` starts; ``positions`` ``[F * gh * gw, 3]`` are its tokens'
        (t, h, w) as the runner placed them (None: the frame grid), kept with each entry."""

    @abstractmethod
    def commit(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None: ...

    def pass_positions(self, frame_start: int, num_frames: int, positions: torch.Tensor | None) -> torch.Tensor:
        """The clean pass's token positions: the runner's, or the frame grid."""
        if positions is None:
            return chunk_positions(frame_start, num_frames, self.grid_hw[0], self.grid_hw[1], self.device)
        return positions.to(device=self.device, dtype=torch.long)

    def finish_commit(self) -> None:  # noqa: B027 - only caches that stage writes need it
        """Called once after the last layer's commit of a clean pass."""

    @abstractmethod
    def rewind(self, frame: int) -> None:
        """Forget entries of frames >= ``frame`` before they are re-encoded: sink frames excepted, unless ``frame``
        is 0 (a re-encode from the first frame replaces the sink too, as LongLive's recache does)."""

    # -- accounting ------------------------------------------------------------------------------------------
    @abstractmethod
    def live_bytes(self) -> int: ...

    def live_bytes_figure(self):
        """``live_bytes`` for a chunk's report: an int where the host knows it, a device tensor where it would
        have to read it (read with the rest of the report, ``read_figures``)."""
        return self.live_bytes()

    @abstractmethod
    def allocated_bytes(self) -> int: ...

    def chunk_stats(self) -> dict:
        """Figures reported with every finished chunk (TempCache: groups per layer): numbers, or ``Figure``s on the
        device, which the report reads in one transfer."""
        return {}

    def report_figures(self) -> dict:
        """Device figures the cache wants read with a chunk's report, in the same transfer (``take_report`` gets
        them back as numbers): how a cache learns what only the device knows without a read of its own."""
        return {}

    def take_report(self, figures: dict) -> None:  # noqa: B027 - only caches that asked for figures need it
        """``report_figures`` as read with the chunk's report."""

    def stats(self) -> dict:
        return {"policy": self.policy, "live_bytes": self.live_bytes(), "allocated_bytes": self.allocated_bytes()}

    def free(self) -> None:
        """Drop every buffer (after a rollout, on error or interruption)."""
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) or (isinstance(value, list) and value and torch.is_tensor(value[0])):
                setattr(self, name, None)
