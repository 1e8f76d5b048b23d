"""LingBot-World 2.0: the pack's rollout against the release's own pipeline (``lingbot_reference.py``).

Each tiny checkpoint (two head layouts at the released head size) is written as the release ships it (a
``from_pretrained`` folder: ``transformers/config.json`` and sharded safetensors with their index) and loaded by the
pack's own loader; both sides get the same prompt features, start-image latents, camera path (a walk that turns,
looks up and down and strafes) and noise (the initial noise as given, the pack's re-noise draws handed to the
reference). Rollouts of 72 latent frames (18 chunks of 4) roll the 18-frame window (6 of them sink) over four
windows' worth. Negative controls must exceed the tolerance: the camera one latent frame late, a window one frame
longer, the intrinsics transposed (x and y swapped: fx with fy, cx with cy).

Past the cap: the release's RoPE table has 1,024 rows, so it cannot place a key past latent frame 1,023; the pack
has no table. A 1,024-frame rollout (every frame the release can make) equals the release's within the tolerance.

Skipped unless ``FASTAR_REFERENCE_DIR`` holds ``lingbot/`` (``tools/extract_references.py``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import reference_harness as rh
import torch

pytestmark = pytest.mark.skipif(
    not rh.REFERENCE_DIR or not (rh.reference_root("lingbot") / "wan" / "modules" / "model_fast.py").is_file(),
    reason="FASTAR_REFERENCE_DIR/lingbot is not there (see tools/extract_references.py)")
pytest.importorskip("einops")
pytest.importorskip("scipy")
pytest.importorskip("safetensors")

import lingbot_reference as lr  # noqa: E402

from comfyui_fastar.fastar_core.caches.spec import CacheSpec  # noqa: E402
from comfyui_fastar.fastar_core.families.lingbot.camera import check_path  # noqa: E402
from comfyui_fastar.fastar_core.families.lingbot.checkpoint import load_lingbot  # noqa: E402
from comfyui_fastar.fastar_core.families.lingbot.rollout import lingbot_conditioning, rollout_config  # noqa: E402
from comfyui_fastar.fastar_core.forward.runner import CausalRunner  # noqa: E402
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler  # noqa: E402

FRAMES = 72
WINDOW, SINK = 18, 6
TOL = 1e-5
SHAPES = {s.name: s for s in lr.SHAPES}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def video_frames(latent: int) -> int:
    return 4 * (latent - 1) + 1


def pack_rollout(root, inputs, shape, window=WINDOW, sink=SINK, camera=None, span=None):
    """(result, the pack's re-noise draws, the camera it used) for the reference's inputs."""
    model, ckpt = load_lingbot(root)  # the release's root: the loader finds transformers/ itself
    assert ckpt.config.local_attn_size == -1 and len(ckpt.shards) > 1
    sampler = ARSampler(CausalRunner(model))
    draws = rh.record_pack_noise(sampler)
    frames = inputs.frames
    if camera is None:
        path = check_path(inputs.poses, inputs.intrinsics)
        camera = path.conditioning_over(frames, span or video_frames(frames), *shape.pixels)
    cfg = rollout_config(model.config, frames, *shape.latent_hw,
                         cache=CacheSpec(policy="window", window_frames=window, sink_frames=sink))
    cond = lingbot_conditioning(inputs.prompt, inputs.image_latents, camera)
    return sampler.generate(cond, cfg, initial_noise=inputs.noise), draws, camera


def patchified(plucker: torch.Tensor, shape) -> torch.Tensor:
    """The reference's camera input ``[1, 384, T, h, w]`` as tokens ``[T * gh * gw, 1536]`` (each token's four
    latent pixels in row-major order after the 384 channels)."""
    frames = plucker.shape[2]
    gh, gw = shape.latent_hw[0] // 2, shape.latent_hw[1] // 2
    x = plucker[0].reshape(384, frames, gh, 2, gw, 2).permute(1, 2, 4, 0, 3, 5)
    return x.reshape(frames * gh * gw, 384 * 4)


def report(what, ours, ref) -> float:
    err = rh.relative_error(ours, ref)
    first = rh.first_deviating_frame(ours, ref, TOL)
    print(f"\nPARITY LingBot-World 2.0 {what}: {ours.shape[2]} latent frames, relative error {err:.2e}"
          + (f", first deviating frame {first}" if first is not None else ""))
    return err


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            shape = SHAPES[name]
            root = lr.write_checkpoint(tmp_path_factory.mktemp(name.replace(".", "_")), shape, seed=11)
            inputs = lr.make_inputs(FRAMES, shape, seed=13)
            ours, draws, camera = pack_rollout(root, inputs, shape)
            reference = lr.run_reference(root, inputs, shape, noise_draws=draws)
            made[name] = (root, inputs, ours, camera, reference)
        return made[name]

    return get


@pytest.mark.parametrize("name", list(SHAPES))
def test_rollout_matches_the_reference(case, name):
    _, _, ours, camera, reference = case(name)
    assert report(name, ours.latent, reference.latents) <= TOL
    assert ours.cache_stats["evicted_frames"] > 0 and FRAMES >= 4 * WINDOW  # the window rolled over and over
    assert reference.timesteps[:5] == [999.0, 967.0, 908.0, 768.0, 0.0]  # generate.py's steps, then the clean pass


@pytest.mark.parametrize("name", list(SHAPES))
def test_camera_input_matches_the_reference(case, name):
    """The rays of every latent frame, as the model reads them, against the tensor the pipeline built (its
    interpolation, relative poses, normalisation and rays)."""
    _, _, _, camera, reference = case(name)
    shape = SHAPES[name]
    ours = camera.tokens(0, FRAMES, (1, 2, 2), "cpu", torch.float32)[0]
    assert rh.relative_error(ours, patchified(reference.plucker, shape)) <= 1e-6


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_camera_one_latent_frame_late_departs(case, name):
    root, inputs, _, camera, reference = case(name)
    late = replace(camera, motion=torch.cat([camera.motion[:1], camera.motion[:-1]]))
    ours, _, _ = pack_rollout(root, inputs, SHAPES[name], camera=late)
    assert report(f"{name}, camera one frame late", ours.latent, reference.latents) > 100 * TOL


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_window_one_frame_longer_departs(case, name):
    root, inputs, _, _, reference = case(name)
    ours, _, _ = pack_rollout(root, inputs, SHAPES[name], window=WINDOW + 1)
    assert report(f"{name}, window {WINDOW + 1}", ours.latent, reference.latents) > 100 * TOL


@pytest.mark.parametrize("name", list(SHAPES))
def test_transposed_intrinsics_depart(case, name):
    root, inputs, _, camera, reference = case(name)
    fx, fy, cx, cy = camera.intrinsics
    ours, _, _ = pack_rollout(root, inputs, SHAPES[name], camera=replace(camera, intrinsics=(fy, fx, cy, cx)))
    assert report(f"{name}, intrinsics transposed", ours.latent, reference.latents) > 100 * TOL


def test_a_path_stretched_over_the_video_matches_the_reference(tmp_path):
    """A path of 4 T + 1 poses asked for as many video frames: the release floors its T + 1 latent frames to
    whole chunks (T) and resamples the whole path onto them, between poses; the pack does so with
    ``conditioning_over(T, span)``."""
    shape = lr.TINY_14B
    frames = 40
    root = lr.write_checkpoint(tmp_path, shape, seed=5)
    inputs = lr.make_inputs(frames, shape, seed=7, video_frames=4 * frames + 1)
    ours, draws, camera = pack_rollout(root, inputs, shape, span=4 * frames + 1)
    reference = lr.run_reference(root, inputs, shape, noise_draws=draws, frame_num=4 * frames + 1)
    assert reference.latents.shape[2] == frames
    assert rh.relative_error(camera.tokens(0, frames, (1, 2, 2), "cpu", torch.float32)[0],
                             patchified(reference.plucker, shape)) <= 1e-6
    assert report("stretched path", ours.latent, reference.latents) <= TOL
    aligned, _, _ = pack_rollout(root, inputs, shape)  # the path's first 4 (T - 1) + 1 poses instead
    assert rh.relative_error(aligned.latent, reference.latents) > 100 * TOL


def test_the_reference_stops_at_its_rope_table():
    """The release's keys are rotated from a table of 1,024 frames: a chunk starting at frame 1,021 has 3 rows."""
    with lr.reference() as ref:
        model_fast = ref.model_fast
        freqs = torch.cat([model_fast.rope_params(1024, 44), model_fast.rope_params(1024, 42),
                           model_fast.rope_params(1024, 42)], dim=1)
        x = torch.randn(1, 4 * 6, 2, 128)
        grid = torch.tensor([[4, 2, 3]])
        model_fast.causal_rope_apply(x, grid, freqs, start_frame=1020)  # frames 1020..1023: the last that fit
        with pytest.raises(RuntimeError):
            model_fast.causal_rope_apply(x, grid, freqs, start_frame=1021)


def test_1024_frames_match_the_reference(tmp_path):
    """Every latent frame the release can make (256 chunks of 4, up to its RoPE table's end): the pack, whose
    positions have no table, gives the same video."""
    shape = lr.TINY_14B
    frames = 1024
    root = lr.write_checkpoint(tmp_path, shape, seed=17)
    inputs = lr.make_inputs(frames, shape, seed=19)
    ours, draws, _ = pack_rollout(root, inputs, shape)
    reference = lr.run_reference(root, inputs, shape, noise_draws=draws)
    assert reference.freq_rows == 1024 and reference.latents.shape[2] == frames
    assert report("1,024 frames", ours.latent, reference.latents) <= TOL


def test_the_cap_bench_rollout_matches_the_reference(tmp_path):
    """``fastar bench lingbot-cap``'s own setting (its model, prompt, start latents, key-timeline camera of the
    3,000-frame path and seeded noise), 1,024 frames in the release's window: the rollout whose frames the bench
    finds bit for bit at the start of its 3,000-frame rollout equals the release's within the tolerance."""
    from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
    from comfyui_fastar.fastar_core.rollout.engine import build_sampler
    from comfyui_fastar.tools.bench.lingbot_cap import FRAMES, LATENT_HW, RELEASE_CAP, cap_setting, cap_video
    from comfyui_fastar.tools.bench.rollout import run_mode

    frames = RELEASE_CAP
    scenario, modes, cond = cap_setting(FRAMES)
    spec, fastar = modes["window"]
    config = scenario.model.config
    shape = lr.TinyShape("cap bench", dim=config.dim, num_heads=config.num_heads, num_layers=config.num_layers,
                         ffn_dim=config.ffn_dim, latent_hw=LATENT_HW, freq_dim=config.freq_dim,
                         text_len=config.text_len)
    sampler = build_sampler(scenario.runner(), fastar)
    draws = rh.record_pack_noise(sampler)
    cfg = rollout_config(config, frames, *LATENT_HW, cache=spec)
    ours = sampler.generate(cond, cfg)
    bench, _ = run_mode(scenario, spec, fastar, frames=frames, seed=0, cond=cond)
    assert torch.equal(ours.latent, bench.latent)  # what the bench compares its 3,000-frame rollout's start with

    root = tmp_path / "release"
    save_lingbot(scenario.model, root / "transformers", max_shard_bytes=1 << 20)
    prompt = cond.prompts.segments[0].context
    used = int((prompt[0].abs().sum(-1) > 0).nonzero().max()) + 1  # the UMT5 features before their zero padding
    poses, intrinsics = cap_video(FRAMES)
    video = 4 * (frames - 1) + 1
    initial = torch.cat([d.tensor for d in draws if d.step == 0], dim=2)
    inputs = lr.Inputs(initial, cond.concat[:, 4:, :frames], prompt[:, :used], poses[:video],
                       np.tile(intrinsics, (video, 1)))
    reference = lr.run_reference(root, inputs, shape, noise_draws=[d for d in draws if d.step > 0])
    assert reference.freq_rows == 1024 and reference.latents.shape[2] == frames
    assert report("the cap bench's 1,024 frames", ours.latent, reference.latents) <= TOL
