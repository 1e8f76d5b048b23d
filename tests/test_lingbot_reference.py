"""The LingBot-World 2.0 reference harness itself, and the release's settings the pack's defaults are taken from.

What the pack's ``lingbot`` defaults rest on is read from the release's own files, so a changed reference fails
here first: ``run_fast.sh``'s window and sink, ``generate.py``'s chunk (its ``--chunk_size`` default) and the call
that leaves ``generate()``'s step indices in force, the A14B config's shift, the model's 1,024-row RoPE table, and
the key timeline's turn and look rates (medians of the release's example paths over their frames labelled with one
look key). Skipped unless ``FASTAR_REFERENCE_DIR`` holds ``lingbot/`` (``tools/extract_references.py``).
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
import reference_harness as rh
import torch

if not rh.REFERENCE_DIR or not (rh.reference_root("lingbot") / "generate.py").is_file():
    # a module-level skip: the module reads the release's files as it loads
    pytest.skip("FASTAR_REFERENCE_DIR/lingbot is not there (see tools/extract_references.py)", allow_module_level=True)
pytest.importorskip("einops")
pytest.importorskip("scipy")

import lingbot_reference as lr  # noqa: E402

from comfyui_fastar.fastar_core.families.lingbot.config import RELEASED_SINK, RELEASED_WINDOW  # noqa: E402
from comfyui_fastar.fastar_core.families.lingbot.rollout import FRAMES_PER_BLOCK  # noqa: E402
from comfyui_fastar.fastar_core.rollout.camera_motion import LOOK_RATE, TURN_RATE  # noqa: E402
from comfyui_fastar.fastar_core.rollout.schedule import indexed_table_schedule  # noqa: E402

ROOT = rh.reference_root("lingbot")


def _default_of(function: ast.FunctionDef, name: str):
    args = function.args
    for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
        if arg.arg == name:
            return ast.literal_eval(default)
    raise KeyError(name)


def test_the_packs_defaults_are_the_releases_run():
    run = (ROOT / "run_fast.sh").read_text()
    assert f"--local_attn_size {RELEASED_WINDOW}" in run and f"--sink_size {RELEASED_SINK}" in run
    assert "--chunk_size" not in run and "--sample_shift" not in run  # their defaults hold
    generate = (ROOT / "generate.py").read_text()
    chunk = re.search(r'"--chunk_size",\s*type=int,\s*default=(\d+)', generate)
    assert chunk and int(chunk.group(1)) == FRAMES_PER_BLOCK == lr.RUN_FAST_CHUNK
    call = generate[generate.index("return wan_i2v.generate("):]
    call = call[:call.index(")\n")]
    assert "timesteps_index" not in call and "shift=args.sample_shift" in call
    tree = ast.parse((ROOT / "wan" / "image2video.py").read_text())
    method = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "generate")
    indices = _default_of(method, "timesteps_index")
    with lr.reference() as ref:
        shift = ref.config.sample_shift
    assert indices == [0, 250, 500, 750] and shift == 10.0
    ours = indexed_table_schedule("lingbot", indices, shift)
    assert ours.timesteps == [999.0, 967.0, 908.0, 768.0]


def test_the_schedule_matches_the_releases_scheduler():
    """Conversion sigma per step (``_convert_flow_pred_to_x0``'s nearest timestep) and re-noise sigma
    (``add_noise``'s ``index_for_timestep``), from the release's own ``FlowUniPCMultistepScheduler``."""
    ours = indexed_table_schedule("lingbot", [0, 250, 500, 750], 10.0)
    with lr.reference() as ref:
        scheduler = ref.image2video.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
                                                               use_dynamic_shifting=False)
        scheduler.set_timesteps(1000, shift=10.0)
        timesteps = scheduler.timesteps[[0, 250, 500, 750]]
        convert = [float(scheduler.sigmas[torch.argmin((scheduler.timesteps - t).abs())]) for t in timesteps]
        x0, noise = torch.zeros(1), torch.ones(1)
        renoise = [float(scheduler.add_noise(x0, noise, t)) for t in timesteps[1:]]
    assert [float(t) for t in timesteps] == ours.timesteps
    assert convert == list(ours.sigmas) and renoise == list(ours.renoise_sigmas)


def test_the_harness_is_deterministic_and_the_camera_moves_the_video(tmp_path):
    shape = lr.TINY_14B
    root = lr.write_checkpoint(tmp_path, shape, seed=1)
    inputs = lr.make_inputs(16, shape, seed=2)
    g = torch.Generator().manual_seed(3)
    draws = [rh.NoiseDraw(c, s, torch.randn(1, 16, 4, *shape.latent_hw, generator=g))
             for c in range(4) for s in range(1, 4)]
    first = lr.run_reference(root, inputs, shape, noise_draws=draws)
    again = lr.run_reference(root, inputs, shape, noise_draws=draws)
    assert torch.equal(first.latents, again.latents) and first.freq_rows == 1024
    still = lr.Inputs(inputs.noise, inputs.image_latents, inputs.prompt, np.tile(inputs.poses[:1], (61, 1, 1)),
                      inputs.intrinsics)
    moved = lr.run_reference(root, still, shape, noise_draws=draws)
    assert rh.relative_error(moved.latents, first.latents) > 1e-2


def test_the_key_timelines_rates_are_the_release_examples_medians():
    """Per example path (00-02: those with look-key labels), the turn between consecutive video frames labelled
    with one look key alone (``ijkl_action.npy``: I J K L), as the motion model's rates at 16 frames a second."""
    yaw, pitch = [], []
    for name in ("00", "01", "02"):
        folder = ROOT / "examples" / name
        poses = np.load(folder / "poses.npy").astype(np.float64)
        keys = np.load(folder / "ijkl_action.npy")
        step = np.linalg.inv(poses[:-1]) @ poses[1:]
        turn = np.degrees(np.arctan2(step[:, 0, 2], step[:, 2, 2]))  # right positive
        tilt = np.degrees(np.arctan2(-step[:, 1, 2], step[:, 2, 2]))  # up positive
        alone = keys[1:].sum(axis=1) == 1
        for column, sign, values, out in ((1, -1, turn, yaw), (3, 1, turn, yaw), (0, 1, tilt, pitch),
                                          (2, -1, tilt, pitch)):
            out.extend(sign * values[alone & (keys[1:, column] > 0)])
    turn_rate, look_rate = 16 * np.median(yaw), 16 * np.median(pitch)
    print(f"\nthe examples' medians: turn {turn_rate:.2f} deg/s ({len(yaw)} frames), look {look_rate:.2f} deg/s "
          f"({len(pitch)} frames)")
    assert abs(turn_rate / TURN_RATE - 1) < 0.05 and abs(look_rate / LOOK_RATE - 1) < 0.05
