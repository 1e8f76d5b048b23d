"""Property tests of TempCache's bookkeeping on synthetic keys."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comfyui_fastar.fastar_core.caches import TempCache, TempCacheSettings
from comfyui_fastar.fastar_core.caches.matching import search_form

TPF = 4  # tokens per frame (grid 2 x 2)
H, D = 2, 8


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    threshold=st.floats(0.3, 1.0),
    capacity=st.integers(3, 9),
    sink=st.integers(0, 2),
    frames_per_chunk=st.integers(1, 2),
    chunks=st.integers(1, 12),
    representative=st.sampled_from(["last", "mean"]),
    scope=st.sampled_from(["head", "shared"]),
    time=st.sampled_from([{}, {"similarity": "rotated"}, {"max_spread_frames": 2}, {"position": "weighted"},
                          {"merge_when": "full"}]),
    matcher=st.sampled_from(["exact", "quantized"]),
)
def test_tempcache_invariants(seed, threshold, capacity, sink, frames_per_chunk, chunks, representative, scope,
                              time, matcher):
    if capacity < sink + frames_per_chunk:
        capacity = sink + frames_per_chunk + 1
    cfg = TempCacheSettings(threshold=threshold, capacity_frames=capacity, representative=representative,
                            merge_scope=scope, matcher=matcher, **time)
    cache = TempCache(cfg, sink, num_layers=1, batch=1, num_heads=H, head_dim=D, grid_hw=(2, 2))
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(1, H, 6, D, generator=g)  # a few recurring "objects" so that merges happen
    buffers = [(t.shape, t.data_ptr()) for t in (cache.k[0], cache.v[0], cache.count[0], cache.pos[0])]
    sink_keys = None
    committed = 0
    frame = 0
    for _ in range(chunks):
        n = frames_per_chunk * TPF
        pick = torch.randint(0, 6, (n,), generator=g)
        k = pool[:, :, pick] + 0.05 * torch.randn(1, H, n, D, generator=g)
        v = torch.randn(1, H, n, D, generator=g)
        cache.prepare_commit(frame, frames_per_chunk)
        cache.commit(0, k, v)
        cache.finish_commit()
        new_sink_frames = max(0, min(sink, frame + frames_per_chunk) - frame)
        committed += n - new_sink_frames * TPF
        frame += frames_per_chunk
        if sink_keys is None and frame >= sink and sink:
            sink_keys = cache.k[0][:, :, : sink * TPF].clone()

        count = cache.count[0][:, :, : cache.capacity]
        live = (count > 0).sum(-1)
        assert (live <= cache.capacity).all()
        assert (cache.count[0][:, :, cache.capacity] == 0.0).all()
        non_sink = count[:, :, cache.sink_tokens:].sum(-1)
        torch.testing.assert_close(non_sink + cache.evicted_tokens[0], torch.full_like(non_sink, float(committed)))
        if sink_keys is not None:
            assert torch.equal(cache.k[0][:, :, : sink * TPF], sink_keys)
            assert (cache.count[0][:, :, : sink * TPF] == 1).all()
        assert (cache.pos[0][:, :, : cache.capacity, 0][count > 0] < frame).all()
        view = cache.view(0, frame, frames_per_chunk)
        assert torch.isfinite(view.bias[count[:, :, : view.length] > 0]).all()
        held = count[:, :, : view.length] > 0
        newest_t = cache.pos[0][:, :, : view.length, 0]
        assert (view.positions[..., 0][held] <= newest_t[held]).all()  # weighted positions never pass the newest
        if cache.first is not None:  # no group spans more frames than allowed
            spread = newest_t - cache.first[0][:, :, : view.length]
            assert (spread[held] <= cfg.max_spread_frames).all()
        if cache.search is not None:  # the search form is every live group's key, normalised; zero elsewhere
            candidate = (count > 0)[..., None]
            candidate[:, :, : cache.sink_tokens] = False
            want = torch.where(candidate, search_form(cache.k[0][:, :, : cache.capacity]), 0)
            assert torch.equal(cache.search[0][:, :, : cache.capacity], want.to(cache.search[0].dtype))
        if cfg.merge_when == "full" and committed <= cache.capacity - cache.sink_tokens:
            assert cache.merges[0] == 0  # still room for every key: nothing merged, exactly dense
    assert buffers == [(t.shape, t.data_ptr()) for t in (cache.k[0], cache.v[0], cache.count[0], cache.pos[0])]


def test_keys_merge_into_their_own_group_and_never_into_the_sink():
    """The search covers the slots after the sink only, and its index lands on the right group: a copy of a sink
    key is inserted as a new group, copies of two non-sink keys join exactly their groups."""
    for matcher in ("exact", "quantized"):
        cfg = TempCacheSettings(threshold=0.99, capacity_frames=4, matcher=matcher)
        cache = TempCache(cfg, 1, num_layers=1, batch=1, num_heads=1, head_dim=D, grid_hw=(2, 2))
        g = torch.Generator().manual_seed(0)
        sink, first = (torch.randn(1, 1, TPF, D, generator=g) for _ in range(2))
        new = torch.randn(1, 1, 1, D, generator=g)
        chunk = torch.cat([sink[:, :, :1], first[:, :, 2:3], new, first[:, :, :1]], dim=2)
        for frame, k in enumerate((sink, first, chunk)):
            cache.prepare_commit(frame, 1)
            cache.commit(0, k, torch.randn(1, 1, TPF, D, generator=g))
            cache.finish_commit()
        count = cache.count[0][0, 0, : cache.capacity].tolist()
        # slots 0-3 sink; 4-7 the first frame's groups (4 and 6 merged); 8, 9 the sink copy and the new key
        assert count == [1, 1, 1, 1, 2, 1, 2, 1, 1, 1, 0, 0, 0, 0, 0, 0], matcher
        assert cache.merges[0] == 2 and cache.inserted[0] == 6, matcher
        assert torch.equal(cache.k[0][0, 0, 8], sink[0, 0, 0]) and torch.equal(cache.k[0][0, 0, 6], first[0, 0, 2])
        assert cache.pos[0][0, 0, 4, 0] == 2 and cache.pos[0][0, 0, 5, 0] == 1, matcher
