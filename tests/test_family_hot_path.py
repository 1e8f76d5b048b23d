"""The world models' hot path held to what Wan's is (``test_bench_launches.py``, ``test_compile_step.py``):
LingBot-World 2.0 (its own window of 18 frames with a sink of 6, and TempCache holding 14 frames beside the same
sink) and Matrix-Game 2.0 (its own window, and TempCache) read the device once per steady chunk (its report), make
no shape from data and launch at most 1.5x their window's kernels; a denoising pass and a clean pass compile whole;
and the channels a pass joins to its latent leave the host once per chunk, not once per pass."""

import matrix_game_models as mg
import pytest
import test_lingbot as lb
import torch

from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
from comfyui_fastar.fastar_core.families.lingbot.rollout import default_cache, rollout_config
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.conditioning import Conditioning
from comfyui_fastar.fastar_core.rollout.engine import build_sampler, resolve_settings
from comfyui_fastar.fastar_core.rollout.sampler import RolloutConfig
from comfyui_fastar.tools.bench import launches
from comfyui_fastar.tools.bench.op_count import OpCounter

OFF = resolve_settings(preset="off").fastar


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def fastar_modes(sink: int, capacity: int) -> dict:
    def temp(matcher="exact", **attention):
        s = resolve_settings(preset="balanced", sink_frames=sink,
                             tempcache_overrides={"capacity_frames": capacity, "matcher": matcher},
                             attention_overrides={"annca": False, "annsa": False, "annsa_min_keys": 0, **attention})
        return s.cache, s.fastar

    return {"tempcache": temp(), "tempcache-quantized": temp("quantized"), "tempcache+annsa": temp(annsa=True),
            "all": temp("quantized", annca=True, annsa=True)}


class World:
    """One world model's tiny rollout: its runner, conditioning and config, by mode."""

    def __init__(self, family: str):
        self.family = family
        if family == "lingbot":
            self.model = random_lingbot(lb.TINY, seed=2)
            self.frames = 24  # chunks of 4: the window (14 cached frames) is full from chunk 4 (frame 16) on
            self.modes = {"window": (default_cache(self.model.config), OFF), **fastar_modes(6, 14)}
        else:
            self.model = mg.tiny_runner().model
            self.frames = 18  # chunks of 3 against a 6-frame window and a 6-frame TempCache: full from frame 6
            self.modes = {"window": (mg.window_spec("universal"), OFF), **fastar_modes(0, 6)}

    def conditioning(self) -> Conditioning:
        return lb.conditioning(self.frames) if self.family == "lingbot" else mg.conditioning(self.frames)

    def config(self, spec) -> RolloutConfig:
        if self.family == "lingbot":
            return rollout_config(self.model.config, self.frames, *lb.LATENT_HW, cache=spec)
        return RolloutConfig(num_frames=self.frames, latent_height=4, latent_width=6,
                             schedule=self.model.config.schedule_name, seed=0, cache=spec)

    def rollout(self, mode: str, runner=None, callback=None):
        spec, fastar = self.modes[mode]
        runner = runner or CausalRunner(self.model)
        sampler = build_sampler(runner, fastar.with_overrides(verify_kernels=False, backend="torch"))
        with torch.no_grad():
            return sampler.generate(self.conditioning(), self.config(spec), callback=callback)


@pytest.mark.parametrize("family", ["lingbot", "matrix-game"])
def test_a_steady_chunk_of_every_world_model_mode_reads_the_device_once_and_makes_no_shape_from_data(family):
    world = World(family)
    counted = {}
    for mode in world.modes:
        counter = OpCounter()
        with counter.counting():
            world.rollout(mode, callback=lambda report, counter=counter: counter.mark())
        steady = launches.steady_chunk(counter.stretches[:-1])
        counted[mode] = steady
        assert steady.syncs_by_kind() == {"tolist": 1}, (mode, steady.sync_sites())  # the report, one transfer
        assert steady.dynamic == 0, (mode, steady.dynamic_sites())
    for mode, steady in counted.items():
        if "annsa" not in mode and mode != "all":
            assert steady.launches <= 1.5 * counted["window"].launches, (mode, steady.launches)


class Graphs:
    """A torch.compile backend that counts the graphs it is given and runs them as traced."""

    def __init__(self):
        self.count = 0

    def __call__(self, gm, example_inputs):
        self.count += 1
        return gm.forward


def compile_one_chunk(runner, chunk: int) -> list:
    """Run the runner's second denoising pass and its clean pass of ``chunk`` compiled whole (their outputs and
    commits are the rollout's); the graphs each made, listed."""
    eager = runner.forward
    made = []

    def forward(x, t, text, cache, info, commit=False, need_output=True):
        if info.chunk == chunk and (info.step == 1 or commit):
            torch._dynamo.reset()
            graphs = Graphs()
            out = torch.compile(eager, backend=graphs, fullgraph=True)(x, t, text, cache, info, commit, need_output)
            made.append(graphs.count)
            return out
        return eager(x, t, text, cache, info, commit, need_output)

    runner.forward = forward
    return made


@pytest.mark.parametrize("family", ["lingbot", "matrix-game"])
def test_a_step_and_a_clean_pass_of_every_world_model_mode_compile_whole_and_keep_the_rollout(family):
    """``fullgraph=True`` refuses any graph break (a host read, a shape from data, a call it cannot trace); the
    compiled passes' outputs and commits carry on into the later chunks, whose latents stay the eager ones."""
    world = World(family)
    for mode in ("window", "all"):  # the family's own cache, and every FAST-AR piece at once
        eager = world.rollout(mode).latent
        runner = CausalRunner(world.model)
        made = compile_one_chunk(runner, chunk=4)  # every cache full; the next chunk reads its commit
        compiled = world.rollout(mode, runner=runner).latent
        assert made == [1, 1], (mode, made)  # the denoising pass and the clean pass, one graph each
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["lingbot", "matrix-game"])
def test_the_joined_channels_leave_the_host_once_per_chunk_not_once_per_pass(family, monkeypatch):
    world = World(family)
    asked = []
    real = Conditioning.concat_frames
    monkeypatch.setattr(Conditioning, "concat_frames", lambda self, start, frames: asked.append(start)
                        or real(self, start, frames))
    chunks = []
    result = world.rollout("window", callback=lambda report: chunks.append(report.frame_start))
    assert asked == chunks  # one read per chunk: its passes (denoising and clean) share it
    assert torch.equal(result.latent, world.rollout("window").latent)


@pytest.mark.parametrize("family", ["lingbot", "matrix-game"])
def test_a_captured_pass_reads_nothing_from_the_host_and_replays_keep_the_rollout(family, monkeypatch):
    """With the CUDA-graph option (a stand-in capture here: a CPU has no graphs), a chunk's passes after its first
    replay the capture; what the family makes on the host (joined channels, camera, actions) was made at the
    chunk's first pass, so none of it is asked for while a pass is captured, and the latents are the eager ones."""
    from comfyui_fastar.fastar_core.families.lingbot.camera import CameraConditioning
    from comfyui_fastar.fastar_core.forward.step_graphs import StepGraphs
    from comfyui_fastar.fastar_core.rollout.actions import Actions

    world = World(family)
    capturing, asked = [False], []

    def stand_in_capture(fn):
        capturing[0] = True
        try:
            out = fn()
        finally:
            capturing[0] = False
        return (lambda: out.copy_(fn())), out

    for owner, name in ((Conditioning, "concat_frames"), (CameraConditioning, "tokens"), (Actions, "upto")):
        real = getattr(owner, name)

        def spy(self, *args, real=real, name=name):
            if capturing[0]:
                asked.append(name)
            return real(self, *args)

        monkeypatch.setattr(owner, name, spy)
    for mode in ("window", "tempcache"):
        eager = world.rollout(mode).latent
        runner = CausalRunner(world.model)
        runner.cuda_graphs, runner.step_graphs = True, StepGraphs(stand_in_capture)
        monkeypatch.setattr(CausalRunner, "captures_steps", lambda self: self.cuda_graphs)
        replayed = world.rollout(mode, runner=runner).latent
        monkeypatch.setattr(CausalRunner, "captures_steps", lambda self: False)
        assert runner.step_graphs.captures > 0 and runner.step_graphs.replays > 0, mode
        assert asked == [], (mode, asked)
        torch.testing.assert_close(replayed, eager, rtol=1e-6, atol=1e-6)
