"""What TempCache's merge is exact for under real RoPE: identical keys at identical positions (Lemma 5.1), and
not copies of one content at different times, which only a comparison after RoPE keeps apart."""

import torch

from comfyui_fastar.fastar_core.caches import GlobalCache, TempCache, TempCacheSettings
from comfyui_fastar.fastar_core.caches.base import CacheView
from comfyui_fastar.fastar_core.forward.attention import DenseAttention, PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.rope import grid_positions

from helpers import tiny_context, tiny_model

H, D, GRID = 2, 32, (2, 2)
TPF = GRID[0] * GRID[1]


def random(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def commit(cache, frame, k, v):
    cache.prepare_commit(frame, 1)
    cache.commit(0, k, v)
    cache.finish_commit()


def attend(view, frame=6):
    """Self-attention of one frame of queries at ``frame`` over ``view`` plus itself, with Wan's RoPE."""
    q, k, v = random(1, H, TPF, D, seed=1), random(1, H, TPF, D, seed=2), random(1, H, TPF, D, seed=3)
    info = PassInfo(chunk=0, step=0, num_steps=4, frame_start=frame, num_frames=1, tokens_per_frame=TPF)
    return DenseAttention(backend="torch").self_attention(0, q, k, v, grid_positions(frame, 1, *GRID), view, info)


def plain_view(keys, values, frames):
    """Every key as its own entry (count 1) at its frame: what dense attention sees."""
    positions = torch.cat([grid_positions(f, 1, *GRID) for f in frames])[None]
    return CacheView(k=torch.cat(keys, 2), v=torch.cat(values, 2), bias=torch.zeros(1, 1, positions.shape[1]),
                     positions=positions, n_sink=0, uniform=True)


def tempcache(**settings):
    return TempCache(TempCacheSettings(threshold=1.0, capacity_frames=8, **settings), 0, num_layers=1, batch=1,
                     num_heads=H, head_dim=D, grid_hw=GRID)


def test_identical_keys_at_identical_positions_merge_exactly_with_rope():
    k, v1, v2 = random(1, H, TPF, D, seed=4), random(1, H, TPF, D, seed=5), random(1, H, TPF, D, seed=6)
    cache = tempcache()
    commit(cache, 2, k, v1)
    commit(cache, 2, k, v2)  # the same keys again at the same frame (and the same h, w)
    assert cache.merges[0] == TPF and cache.groups(0) == TPF
    merged = attend(cache.view(0, 6, 1))
    dense = attend(plain_view([k, k], [v1, v2], [2, 2]))
    assert (merged - dense).abs().max() < 1e-5


def test_copies_at_other_times_are_not_identical_keys_and_only_rotated_similarity_keeps_them_apart():
    k, v1, v2 = random(1, H, TPF, D, seed=4), random(1, H, TPF, D, seed=5), random(1, H, TPF, D, seed=6)
    dense = attend(plain_view([k, k], [v1, v2], [2, 4]))
    content = tempcache()
    commit(content, 2, k, v1)
    commit(content, 4, k, v2)
    assert content.merges[0] == TPF  # same content: merged, one position for both copies
    error = ((attend(content.view(0, 6, 1)) - dense).norm() / dense.norm()).item()
    assert error > 1e-3
    rotated = tempcache(similarity="rotated")
    commit(rotated, 2, k, v1)
    commit(rotated, 4, k, v2)
    assert rotated.merges[0] == 0  # after RoPE two frames apart the copies differ: kept apart, exact
    assert (attend(rotated.view(0, 6, 1)) - dense).abs().max() < 1e-5


def test_repeated_frames_through_the_model_with_real_rope():
    """Threshold 1.0 on 12 copies of one frame: by content they merge and the output moves off dense; compared
    after RoPE nothing merges and the output is dense's."""
    from test_fastar import commit_frames, query_after

    runner = CausalRunner(tiny_model())
    text = runner.encode_text(tiny_context())
    frame = random(1, 16, 1, 4, 4, seed=4)
    n = 12
    dense = GlobalCache(2, 1, 2, 32, GRID, capacity_frames=n)
    commit_frames(runner, text, dense, [frame] * n)
    out_dense = query_after(runner, text, dense, n)
    errors = {}
    for similarity in ("content", "rotated"):
        temp = TempCache(TempCacheSettings(threshold=1.0, capacity_frames=n + 1, similarity=similarity), 1,
                         num_layers=2, batch=1, num_heads=2, head_dim=32, grid_hw=GRID)
        commit_frames(runner, text, temp, [frame] * n)
        errors[similarity] = (query_after(runner, text, temp, n) - out_dense).abs().max().item()
        merged = temp.merges[0]
        assert merged == ((n - 2) * TPF if similarity == "content" else 0), similarity
    assert errors["content"] > 1e-4 and errors["rotated"] < 1e-5, errors
