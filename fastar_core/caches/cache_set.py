"""The caches of one rollout, committed and rewound together: the self-attention cache and a family's own.

The self-attention ``KVCache`` is the one FAST-AR compresses and the sampler asks about (views, policy facts,
reports); a family may add caches of its own (Matrix-Game 2.0: keyboard and mouse keys per action layer). A
``CacheSet`` is driven like the self-attention cache, and every write, rewind and free reaches all of them, so a
family cache can never fall out of step with the frames the self-attention cache holds.
"""

from __future__ import annotations

from .base import KVCache


class FamilyCache:
    """Interface of a family's extra cache (dense, per layer, frame-granular)."""

    name = "family"

    def prepare_commit(self, frame_start: int, num_frames: int) -> None:  # noqa: B027 - optional
        """A clean pass of frames ``frame_start ..`` starts."""

    def finish_commit(self) -> None:  # noqa: B027 - optional
        """The clean pass ended."""

    def rewind(self, frame: int) -> None:
        raise NotImplementedError

    def live_bytes(self) -> int:
        raise NotImplementedError

    def allocated_bytes(self) -> int:
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError


class CacheSet:
    """A self-attention cache with a family's extra caches; attributes it does not define are the self-attention
    cache's (``view``, ``commit``, ``tokens_per_frame``, the policy facts)."""

    def __init__(self, attention: KVCache, extra: dict | None = None):
        self.attention = attention
        self.extra: dict[str, FamilyCache] = dict(extra or {})

    def __getattr__(self, name):
        # Only reached for names not set on the set itself: the self-attention cache answers.
        if name in ("attention", "extra"):
            raise AttributeError(name)
        return getattr(self.attention, name)

    def prepare_commit(self, frame_start: int, num_frames: int, positions=None) -> None:
        self.attention.prepare_commit(frame_start, num_frames, positions)
        for cache in self.extra.values():
            cache.prepare_commit(frame_start, num_frames)

    def finish_commit(self) -> None:
        self.attention.finish_commit()
        for cache in self.extra.values():
            cache.finish_commit()

    def rewind(self, frame: int) -> None:
        self.attention.rewind(frame)
        for cache in self.extra.values():
            cache.rewind(frame)

    def live_bytes(self) -> int:
        return self.attention.live_bytes() + sum(c.live_bytes() for c in self.extra.values())

    def report_figures(self) -> dict:
        return self.attention.report_figures()

    def take_report(self, figures: dict) -> None:
        self.attention.take_report(figures)

    def live_bytes_figure(self):
        """``live_bytes`` for a chunk's report, a device tensor where the self-attention cache keeps its count
        there (read with the rest of the report)."""
        return self.attention.live_bytes_figure() + sum(c.live_bytes() for c in self.extra.values())

    def allocated_bytes(self) -> int:
        return self.attention.allocated_bytes() + sum(c.allocated_bytes() for c in self.extra.values())

    def stats(self) -> dict:
        out = self.attention.stats()
        if self.extra:
            out["self_attention_live_bytes"] = self.attention.live_bytes()
            for name, cache in self.extra.items():
                out[f"{name}_live_bytes"] = cache.live_bytes()
            out["live_bytes"] = self.live_bytes()
            out["allocated_bytes"] = self.allocated_bytes()
        return out

    def free(self) -> None:
        self.attention.free()
        for cache in self.extra.values():
            cache.free()
