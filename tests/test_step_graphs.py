"""The CUDA-graph option's bookkeeping, on a CPU with a stand-in capture (a CPU has no graphs; the GPU check runs
the real capture): a chunk's first denoising pass runs and is captured, its other passes replay it with their own
inputs, a new chunk or a committed cache captures anew, and the rollout is the eager one."""

import torch

from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.forward.step_graphs import StepGraphs
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig

from helpers import tiny_context, tiny_model


def stand_in_capture(fn):
    """What a CUDA graph does, in Python: the output tensor a replay rewrites by running the captured function."""
    out = fn()

    def replay():
        out.copy_(fn())

    return replay, out


def test_a_chunk_s_passes_replay_its_first_and_a_new_key_captures_anew():
    graphs = StepGraphs(stand_in_capture)
    seen = []

    def forward(x, t):
        seen.append(float(t[0]))
        return x * t

    x = torch.ones(3)
    for step, t in enumerate((1.0, 2.0, 3.0)):
        out = graphs.run(("chunk", 0), forward, x, torch.tensor([t]))
        assert torch.equal(out, x * t), step
    assert (graphs.captures, graphs.replays) == (1, 2)
    out = graphs.run(("chunk", 1), forward, 2 * x, torch.tensor([5.0]))
    assert torch.equal(out, 2 * x * 5) and graphs.captures == 2


def test_a_rollout_with_replayed_passes_is_the_eager_rollout(monkeypatch):
    # The balanced preset's AnnSA is dense in the first step and sparse after: two graphs per chunk, the second
    # replayed twice.
    for preset, policy, captures, replays in (("off", "window", 4, 4 * 3), ("balanced", "tempcache", 8, 4 * 2)):
        s = resolve_settings(preset=preset, cache_policy=policy, sink_frames=1, window_frames=6 if policy == "window"
                             else None, attention_overrides={"annsa_min_keys": 0} if preset != "off" else None,
                             tempcache_overrides={"capacity_frames": 6, "threshold": 0.5} if preset != "off" else None)
        cfg = RolloutConfig(num_frames=12, latent_height=4, latent_width=6, seed=3, cache=s.cache)
        eager = build_sampler(CausalRunner(tiny_model()), s.fastar).generate(tiny_context(), cfg).latent
        runner = CausalRunner(tiny_model())
        runner.cuda_graphs = True
        runner.step_graphs = StepGraphs(stand_in_capture)
        monkeypatch.setattr(CausalRunner, "captures_steps", lambda self: self.cuda_graphs)
        replayed = build_sampler(runner, s.fastar).generate(tiny_context(), cfg).latent
        monkeypatch.undo()
        assert (runner.step_graphs.captures, runner.step_graphs.replays) == (captures, replays)  # 4 chunks, 4 steps
        torch.testing.assert_close(replayed, eager, rtol=1e-6, atol=1e-6)
