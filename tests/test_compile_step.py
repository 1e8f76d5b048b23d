"""One denoising step, and one clean pass, of every cache mode compiles whole (``fullgraph=True``: no graph break,
so no host read and no shape that depends on data) and computes what the eager step computes."""

import copy

import pytest
import torch

from comfyui_fastar.fastar_core.caches.base import CacheShape
from comfyui_fastar.fastar_core.forward.attention import PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.engine import build_sampler

from helpers import tiny_context, tiny_model, tiny_modes

GRID, FPB, STEPS = (2, 3), 3, 4
TPF = GRID[0] * GRID[1]


class Graphs:
    """A torch.compile backend that counts the graphs it is given and runs them as traced."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def info(frame, step):
    return PassInfo(chunk=frame // FPB, step=step, num_steps=STEPS, frame_start=frame, num_frames=FPB,
                    tokens_per_frame=TPF)


@pytest.mark.parametrize("name", list(tiny_modes()))
def test_a_step_and_a_clean_pass_compile_whole_and_match_eager(name, one_thread):
    torch._dynamo.reset()  # each mode's own compiles (the recompile limit counts per code object)
    spec, fastar = tiny_modes()[name]
    runner = build_sampler(CausalRunner(tiny_model()), fastar.with_overrides(backend="torch")).runner
    g = runner.geometry
    cache = spec.validate(FPB).build(CacheShape(g.num_layers, 1, g.num_heads, g.head_dim, GRID, frames_per_block=FPB,
                                                rotated_keys=runner.attention.wants_rotated_keys), 24)
    runner.attention.begin_rollout(g.num_layers)
    text = runner.encode_text(tiny_context(tokens=6, pad=10))
    gen = torch.Generator().manual_seed(0)

    def latent():
        return torch.randn(1, 16, FPB, 2 * GRID[0], 2 * GRID[1], generator=gen)

    t = torch.full((1, FPB), 500.0)
    clean = torch.zeros(1, FPB)
    # Eager first: the caches fill past their capacity, and every first-use check runs before anything compiles.
    for frame in range(0, 15, FPB):
        if name == "recompute":
            cache.reset()
        runner.forward(latent(), t, text, cache, info(frame, 1))
        runner.forward(latent(), clean, text, cache, info(frame, -1), commit=True, need_output=False)
    x, frame = latent(), 15

    graphs = Graphs()
    step = torch.compile(runner.forward, backend=graphs, fullgraph=True)
    torch.testing.assert_close(step(x, t, text, cache, info(frame, 2)), runner.forward(x, t, text, cache,
                                                                                        info(frame, 2)),
                               rtol=1e-5, atol=1e-5)
    assert graphs.count >= 1

    eager_cache = copy.deepcopy(cache)
    runner.forward(x, clean, text, eager_cache, info(frame, -1), commit=True, need_output=False)
    step(x, clean, text, cache, info(frame, -1), commit=True, need_output=False)
    for layer in range(g.num_layers):
        # What the next chunk reads of the cache is what the eager clean pass left.
        mine, theirs = cache.view(layer, frame + FPB, FPB), eager_cache.view(layer, frame + FPB, FPB)
        for a, b in ((mine.k, theirs.k), (mine.v, theirs.v), (mine.bias, theirs.bias),
                     (mine.positions, theirs.positions)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
