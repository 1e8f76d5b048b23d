"""Sequence parallelism across ranks (Ulysses): tokens sharded outside self-attention, heads inside it.

Every rank holds, for every frame of a pass, one contiguous slice of that frame's tokens: norms, modulation,
cross-attention and the FFN are per token, so they run on the slice alone. Around self-attention two
all-to-alls (torch.distributed's own) trade the slice of every head for every token of a subset of heads, so
each rank attends with ``num_heads / world`` heads and keeps the KV cache of those heads only. Caches, TempCache's
merges and AnnSA's buckets work per head, so no cache entry ever crosses ranks; what crosses per layer and pass
is the queries, keys and values going in and the attention output coming back.

The sampler runs the same on every rank (same seeds, same noise); the output tokens are gathered before the
head, so every rank holds the whole latent and one rank (0) writes it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

import torch

from ..errors import FastARError


@dataclass
class Traffic:
    """Bytes this rank sent through the collectives, since the last ``take``."""

    sent: int = 0
    calls: int = 0

    def take(self) -> dict:
        out = {"sent_bytes": self.sent, "collectives": self.calls}
        self.sent, self.calls = 0, 0
        return out


@dataclass
class SequenceParallel:
    """One rank's view of a sequence-parallel group. ``group`` None is torch.distributed's default group."""

    rank: int
    world: int
    group: object = None
    traffic: Traffic = field(default_factory=Traffic)

    @classmethod
    def from_default_group(cls) -> SequenceParallel:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise FastARError("sequence parallelism needs torch.distributed initialised (run under torchrun)")
        return cls(dist.get_rank(), dist.get_world_size())

    # -- checks ---------------------------------------------------------------------------------------------
    def check_heads(self, num_heads: int) -> None:
        if num_heads % self.world:
            raise FastARError(f"the model's {num_heads} attention heads do not split over {self.world} ranks; use a "
                              f"number of ranks that divides {num_heads}")

    def check_geometry(self, num_heads: int, tokens_per_frame: int) -> None:
        """Refuse, before any work, a model or video size that does not split evenly over the ranks."""
        self.check_heads(num_heads)
        if tokens_per_frame % self.world:
            raise FastARError(f"{tokens_per_frame} tokens per latent frame do not split over {self.world} ranks; "
                              f"choose a height and width whose token grid (latent size / patch size) has a "
                              f"multiple of {self.world} tokens")

    def local_heads(self, num_heads: int) -> int:
        return num_heads // self.world

    def head_range(self, num_heads: int) -> tuple[int, int]:
        per = num_heads // self.world
        return self.rank * per, (self.rank + 1) * per

    # -- token shards ---------------------------------------------------------------------------------------
    def shard_tokens(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """[B, F*T, dim] frame-major -> this rank's slice of every frame, [B, F*T/world, dim]."""
        B, N, dim = x.shape
        per = N // frames // self.world
        return x.view(B, frames, self.world, per, dim)[:, :, self.rank].reshape(B, frames * per, dim).contiguous()

    def gather_tokens(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """The inverse of ``shard_tokens`` on every rank: [B, F*T/world, dim] -> [B, F*T, dim]."""
        import torch.distributed as dist

        B, n, dim = x.shape
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self._count(x, self.world - 1)
        dist.all_gather(parts, x.contiguous(), group=self.group)
        stacked = torch.stack([p.view(B, frames, n // frames, dim) for p in parts], dim=2)
        return stacked.reshape(B, frames * self.world * (n // frames), dim)

    # -- the two all-to-alls around self-attention ----------------------------------------------------------
    def heads_from_tokens(self, t: torch.Tensor, frames: int) -> torch.Tensor:
        """[B, H, F*T/world, D] (every head, this rank's tokens) -> [B, H/world, F*T, D] (this rank's heads)."""
        import torch.distributed as dist

        B, H, n, D = t.shape
        hl = H // self.world
        send = [c.contiguous() for c in t.split(hl, dim=1)]
        recv = [torch.empty_like(send[0]) for _ in range(self.world)]
        self._count(send[0], self.world - 1)
        dist.all_to_all(recv, send, group=self.group)
        # recv[j]: my heads, rank j's slice of every frame -> frame-major order over all slices.
        stacked = torch.stack([r.view(B, hl, frames, n // frames, D) for r in recv], dim=3)
        return stacked.reshape(B, hl, frames * self.world * (n // frames), D)

    def tokens_from_heads(self, y: torch.Tensor, frames: int) -> torch.Tensor:
        """The inverse: [B, H/world, F*T, D] -> [B, H, F*T/world, D]."""
        import torch.distributed as dist

        B, hl, N, D = y.shape
        per = N // frames // self.world
        slices = y.view(B, hl, frames, self.world, per, D)
        send = [slices[:, :, :, j].reshape(B, hl, frames * per, D).contiguous() for j in range(self.world)]
        recv = [torch.empty_like(send[0]) for _ in range(self.world)]
        self._count(send[0], self.world - 1)
        dist.all_to_all(recv, send, group=self.group)
        return torch.cat(recv, dim=1)

    def any_across_ranks(self, mask: torch.Tensor) -> torch.Tensor:
        """Element-wise OR of a bool tensor over the ranks."""
        import torch.distributed as dist

        as_int = mask.to(torch.uint8)
        self._count(as_int, self.world - 1)
        dist.all_reduce(as_int, op=dist.ReduceOp.MAX, group=self.group)
        return as_int.bool()

    def _count(self, piece: torch.Tensor, pieces: int) -> None:
        self.traffic.sent += piece.numel() * piece.element_size() * pieces
        self.traffic.calls += 1


def check_settings(spec, fastar) -> None:
    """Refuse settings whose state spans heads: each rank holds only its own heads."""
    if spec.policy == "tempcache" and spec.tempcache.merge_scope == "shared":
        raise FastARError("TempCache merge_scope 'shared' decides merges over all heads, which no rank holds under "
                          "sequence parallelism; use merge_scope 'head'")


def collective_failure(error: BaseException) -> str:
    """The gist of a failed collective, without the library's source location."""
    text = " ".join(str(error).split())
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:160] or type(error).__name__


def launched_world() -> int:
    """Ranks torchrun (or any launcher that sets WORLD_SIZE) started; 1 outside one."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise FastARError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of ranks") from None


def init_from_launcher(device: torch.device, timeout_s: float = 120.0) -> SequenceParallel | None:
    """Join the group torchrun set up (NCCL on CUDA, gloo on CPU); None when not launched with several ranks.

    The timeout bounds how long a rank waits for a peer that stopped: every rank then ends with an error
    instead of hanging."""
    if launched_world() <= 1:
        return None
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return SequenceParallel.from_default_group()


_left_group = False


def leave_group() -> None:
    """Leave the group ``init_from_launcher`` joined; the process should then end by ``end_rank_process``."""
    global _left_group
    import torch.distributed as dist

    dist.destroy_process_group()
    _left_group = True


def end_rank_process(code: int) -> None:
    """End the process with ``code`` at once if it left a torchrun group; return otherwise.

    After ``destroy_process_group`` torch 2.13 can keep gloo's worker threads alive (seen once a model with an
    ``nn.Embedding`` was built under ``torch.device("meta")``), and one of them may still be releasing the last
    collective's tensors, which needs the GIL, when the interpreter shuts down: that thread then aborts the process
    (``terminate called without an active exception``, then SIGSEGV), now and then, after every file was written.
    Ending without the interpreter's shutdown leaves nothing for that thread to race; output is flushed first."""
    if not _left_group:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def local_device(device: torch.device) -> torch.device:
    """On CUDA each rank takes the GPU torchrun's LOCAL_RANK names."""
    if device.type == "cuda" and device.index is None and launched_world() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device
