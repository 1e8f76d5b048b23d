"""Once a bounded cache is full, a chunk asks the device for the same work as the chunk before it, however long the
rollout: the kernel launches, the bytes moved and the matmul FLOPs, counted operator by operator
(``op_count.OpCounter``), so the check is exact where the benches' per-chunk CPU times carry the machine's noise.
A growing cache is the control: its work grows with every chunk."""

from contextlib import ExitStack

import pytest
import torch

from comfyui_fastar.tools.bench.launches import count_rollout
from comfyui_fastar.tools.bench.lingbot_cap import cap_setting
from comfyui_fastar.tools.bench.live_world import play_once
from comfyui_fastar.tools.bench.op_count import OpCounter
from comfyui_fastar.tools.bench.scenarios import scenario_modes
from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE

LINGBOT_FRAMES = 112  # 28 chunks of 4: the window (18 frames) turns over 6 times
LINGBOT_FULL = 24  # the first chunk after both bounded caches are full
LIVE_FROM, LIVE_CHUNKS = 60, 12  # the live-world bar's first frame, and how many chunks from it are counted


def _lingbot_work(name: str) -> list[tuple]:
    """(frame_start, launches, bytes, flops) of every chunk of a LingBot rollout in the bench's mode ``name``."""
    scenario, modes, cond = cap_setting(LINGBOT_FRAMES)
    mode = modes.get(name) or scenario_modes(scenario)[name]
    tallies = count_rollout(scenario, *mode, frames=LINGBOT_FRAMES, cond=cond)[:-1]  # the last takes no clean pass
    return [(i * scenario.frames_per_block, t.launches, t.bytes, t.flops) for i, t in enumerate(tallies)]


@pytest.mark.parametrize("name", ["window", "tempcache"])
def test_a_full_lingbot_cache_costs_every_chunk_the_same_work(name, one_thread):
    late = [r for r in _lingbot_work(name) if r[0] >= LINGBOT_FULL]
    assert len(late) >= 20
    assert len({r[2] for r in late}) == 1 and len({r[3] for r in late}) == 1, late[:4]  # bytes, FLOPs
    launches = [r[1] for r in late]  # the window's ring takes two writes where the chunk wraps round
    assert max(launches) <= 1.01 * min(launches), sorted(set(launches))


def test_the_growing_lingbot_cache_is_the_control_its_work_grows_every_chunk(one_thread):
    flops = [r[3] for r in _lingbot_work("dense-global") if r[0] >= LINGBOT_FULL]
    assert all(b > a for a, b in zip(flops, flops[1:])) and flops[-1] > 1.5 * flops[0]


def _live_work(preset: str, first: int, chunks: int) -> list[tuple]:
    """Work of ``chunks`` one-frame chunks of the Live World node's play from frame ``first`` (uncounted before)."""
    demo = load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE)
    counter, rows, start = OpCounter(), [], [demo.frames_per_block]  # the play's first chunk starts after the view
    counting = ExitStack()  # the frames before ``first`` run without the counter (faster)

    def hand_on(_):
        frame, start[0] = start[0], start[0] + demo.frames_per_block
        if start[0] == first:
            counting.enter_context(counter.counting())
        elif start[0] > first:
            tally = counter.mark()
            rows.append((frame, tally.launches, tally.bytes, tally.flops))

    with counting, torch.no_grad():
        play_once(demo, preset, first + chunks + 2, seed=0, hand_on=hand_on)
    return rows[:chunks]


def test_the_live_world_with_fast_ar_asks_each_chunk_from_frame_60_for_the_same_work(one_thread):
    # The bar of the live-world bench, on counted work: every chunk within 10 % of the median. TempCache's groups
    # are places, so its view reaches further while the person still finds new places: the bytes and FLOPs creep
    # up (a few per cent over hundreds of frames) and stop at the capacity; the launches do not change.
    rows = _live_work("balanced", LIVE_FROM, LIVE_CHUNKS)
    assert [r[0] for r in rows] == list(range(LIVE_FROM, LIVE_FROM + LIVE_CHUNKS))
    assert len({r[1] for r in rows}) == 1
    for column in (2, 3):
        values = sorted(r[column] for r in rows)
        median = values[len(values) // 2]
        assert all(abs(v / median - 1) <= 0.10 for v in values) and values[-1] <= 1.02 * values[0], values


def test_the_live_world_without_fast_ar_is_the_control_its_work_grows(one_thread):
    rows = _live_work("off", 4, 12)
    flops = [r[3] for r in rows]
    assert all(b > a for a, b in zip(flops, flops[1:])) and flops[-1] > 1.10 * flops[0]
