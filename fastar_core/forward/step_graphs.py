"""Denoising forwards captured in a CUDA graph and replayed (``CausalRunner.cuda_graphs``; off by default).

Within one chunk every denoising pass reads the same cache view, prompt and positions; only the latents and the
timesteps change. So the first pass of a chunk runs eagerly (its result is that pass's; kernels are checked, tuned
and compiled at their first use there, before any capture), the same forward is then captured on static copies
of the latents and timesteps, and every later pass of the chunk copies its inputs in and replays: one launch for
the whole forward instead of thousands, and no Python between them. A pass whose host-side state differs (another
chunk, a cache that committed, another prompt, attention that decides differently by step) captures anew, and the
graph before it is released.

The forward must not read the device from the host (a capture refuses a host sync) and must not make shapes from
data; the hot path is written so (``fastar bench launches`` counts it). Attention that keeps running tallies on the
host (``measure``, AnnCA's pruning share) says it is not capturable and runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_capture(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """Capture ``fn`` in a CUDA graph: (replay, the output tensor each replay rewrites)."""
    graph = torch.cuda.CUDAGraph()
    # Thread-local: a bench may run rollouts in threads (one at a time), each capturing its own steps.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = fn()
    return graph.replay, out


class StepGraphs:
    """The captured forward of the chunk in progress, keyed by everything on the host that the forward reads."""

    def __init__(self, capture: Callable = cuda_capture):
        self.capture = capture  # tests pass a stand-in: a CPU has no graphs
        self.key = None
        self.inputs: tuple = ()
        self.replay: Callable[[], None] | None = None
        self.out: torch.Tensor | None = None
        self.captures = 0
        self.replays = 0

    def release(self) -> None:
        self.key, self.inputs, self.replay, self.out = None, (), None, None

    def run(self, key, forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
            timesteps: torch.Tensor) -> torch.Tensor:
        """``forward(x, timesteps)``, replayed when ``key`` is the captured one, else run and captured."""
        if key == self.key and self.replay is not None:
            for static, new in zip(self.inputs, (x, timesteps)):
                static.copy_(new)
            self.replay()
            self.replays += 1
            assert self.out is not None
            return self.out.clone()  # the next replay rewrites it
        self.release()
        out = forward(x, timesteps)  # eager: this pass's result, and every first-use check before the capture
        static = (x.clone(), timesteps.clone())
        self.replay, self.out = self.capture(lambda: forward(*static))
        self.key, self.inputs = key, static
        self.captures += 1
        return out
