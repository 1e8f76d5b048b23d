"""The VAE in the sampling loop (``fastar_core/rollout/vae.py``): what is decoded and re-encoded, when, and the
refusals.

A toy VAE records its calls: a latent frame "decodes" to pixel frames that are affine copies of it (1 for the
video's first, 4 after; pixel frame p of latent frame j carries j and p), and a pixel frame encodes to an affine
map of itself, so the tests can tell which frame went where. The parity with the references' own loops and a
real (tiny) Wan2.1 VAE is ``test_vae_loop_parity``.
"""

import pytest
import torch

from comfyui_fastar.fastar_core.caches import CacheShape, CacheSpec
from comfyui_fastar.fastar_core.errors import FastARError
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.rollout.sampler import ARSampler, RolloutConfig
from comfyui_fastar.fastar_core.rollout.vae import (
    CAUSVID_RESTART,
    RedecodeStream,
    RestartSpec,
    open_stream,
    pixel_frames,
)

from helpers import tiny_context, tiny_model

KREA_OFF = CacheSpec(policy="recompute", sink_frames=0, window_frames=6)


class ToyVAE:
    """Records every call; ``encode`` gives ``0.5 * pixels + 0.25`` of a clip's first frame."""

    def __init__(self):
        self.decoded, self.encoded = [], []

    def decode(self, latents):
        self.decoded.append(latents.clone())
        repeats = torch.tensor([1] + [4] * (latents.shape[2] - 1))
        pixels = torch.repeat_interleave(latents, repeats, dim=2)
        return pixels + 1e-3 * torch.arange(pixels.shape[2]).view(1, 1, -1, 1, 1)  # each pixel frame its own

    def encode(self, pixels):
        self.encoded.append(pixels.clone())
        return 0.5 * pixels[:, :, :1] + 0.25


def run(cfg_kw, vae=None, model=None, frames=48, **kw):
    cfg = RolloutConfig(num_frames=frames, latent_height=4, latent_width=4, **{"schedule": "causvid", **cfg_kw})
    return ARSampler(CausalRunner(model or tiny_model())).generate(tiny_context(), cfg, vae=vae, **kw)


def test_restarts_and_krea_without_its_first_frame_need_a_vae():
    with pytest.raises(FastARError, match="restart_every 21 is CausVid's long video.*give a VAE.*'vae' input"):
        run({"restart": CAUSVID_RESTART, "cache": CacheSpec(policy="global")})
    with pytest.raises(FastARError, match="sink_frames 0 is Krea's keep_first_frame off.*give a VAE.*sink_frames 1"):
        run({"cache": KREA_OFF})
    with pytest.raises(FastARError, match="needs encode.pixels. and decode.latents."):
        run({"cache": KREA_OFF}, vae=object())
    run({"cache": CacheSpec(policy="recompute", sink_frames=1, window_frames=6)}, frames=12)  # keep_first_frame: none


@pytest.mark.parametrize("restart,cache,mode,match", [
    (RestartSpec(every=20, overlap=3), "global", "chunk", "multiples of frames_per_block"),
    (RestartSpec(every=21, overlap=21), "global", "chunk", "less than restart_every"),
    (CAUSVID_RESTART, "tempcache", "chunk", "cache policy global or window"),
    (CAUSVID_RESTART, "global", "rolling", "sampler mode 'chunk'"),
])
def test_restart_settings_that_cannot_run_are_refused(restart, cache, mode, match):
    with pytest.raises(FastARError, match=match):
        run({"restart": restart, "cache": CacheSpec(policy=cache), "mode": mode}, vae=ToyVAE())


def test_restart_refuses_a_start_image():
    with pytest.raises(FastARError, match="takes no initial latents"):
        run({"restart": CAUSVID_RESTART, "cache": CacheSpec(policy="global")}, vae=ToyVAE(),
            initial_latents=torch.zeros(1, 16, 1, 4, 4))


def test_causvid_restart_decodes_the_finished_rollout_and_starts_from_its_reencoded_frame():
    model = tiny_model()
    vae = ToyVAE()
    frames = 21 + 2 * 18  # three rollouts
    out = run({"restart": CAUSVID_RESTART, "cache": CacheSpec(policy="global")}, vae=vae, model=model,
              frames=frames).latent
    plain = run({"cache": CacheSpec(policy="global")}, model=model, frames=frames).latent
    assert torch.equal(out[:, :, :21], plain[:, :, :21]), "the first rollout is the plain rollout's first 21 frames"
    assert not torch.allclose(out[:, :, 21:], plain[:, :, 21:])
    assert len(vae.decoded) == 2 and len(vae.encoded) == 2  # one restart per later rollout
    # The first restart decodes the first rollout's latents 0..18 (up to the re-encoded pixel frame) ...
    assert torch.equal(vae.decoded[0], out[:, :, :19])
    # ... and encodes its pixel frame 72 alone: the last of latent 18 (the script's video[:, -9]).
    assert vae.encoded[0].shape[2] == 1
    assert torch.allclose(vae.encoded[0], out[:, :, 18:19] + 1e-3 * 72, rtol=0, atol=1e-6)
    # The second restart decodes the second rollout: its re-encoded frame, frames 19-20, then its own 16 new ones.
    head = 0.5 * vae.encoded[0] + 0.25
    second = torch.cat([head, out[:, :, 19:21], out[:, :, 21:37]], dim=2)
    assert torch.equal(vae.decoded[1], second)


def test_restart_positions_start_again_and_the_cache_holds_one_rollout():
    spec = CAUSVID_RESTART
    assert [spec.position(f) for f in (0, 20, 21, 38, 39, 56)] == [0, 20, 3, 20, 3, 20]
    assert [f for f in range(80) if spec.segment_start(f)] == [21, 39, 57, 75]
    reports = []
    run({"restart": spec, "cache": CacheSpec(policy="global")}, vae=ToyVAE(), frames=57, callback=reports.append)
    assert max(r.cache_bytes for r in reports) == reports[6].cache_bytes  # 21 frames at most, whatever the length


def test_krea_reencodes_the_oldest_context_frame_from_one_causal_decode():
    vae = ToyVAE()
    out = run({"cache": KREA_OFF, "schedule": "krea"}, vae=vae, frames=18).latent
    # Chunks at 6, 9, 12, 15 re-encode latents 3, 6, 9, 12: each the last pixel frame of its latent frame.
    assert len(vae.encoded) == 4
    for n, (pixels, latent) in enumerate(zip(vae.encoded, (3, 6, 9, 12))):
        assert torch.allclose(pixels, out[:, :, latent:latent + 1] + 1e-3 * 4 * latent, rtol=0, atol=1e-6), n
    # A VAE without stream() is re-decoded from frame 0, each call returning the new frames only.
    assert [d.shape[2] for d in vae.decoded] == [4, 7, 10, 13]


def test_redecode_stream_gives_the_whole_decode_piece_by_piece():
    vae = ToyVAE()
    latents = torch.randn(1, 2, 7, 1, 1)
    stream = open_stream(vae)
    assert isinstance(stream, RedecodeStream)
    pieces = torch.cat([stream.decode(latents[:, :, a:b]) for a, b in ((0, 1), (1, 4), (4, 7))], dim=2)
    assert pieces.shape[2] == pixel_frames(7)
    assert torch.equal(pieces, vae.decode(latents))


def test_krea_context_rule_when_the_context_is_not_whole_chunks():
    """``get_clean_context_frames`` with kv_cache_num_frames 4: frame 0 stays first while the chunk starts under
    the context plus one chunk (frame 6: 0, 3, 4, 5); from then on the oldest is re-encoded (frame 9: 5, ...)."""
    shape = CacheShape(num_layers=1, batch=1, num_heads=1, head_dim=4, grid_hw=(1, 1))
    cache = CacheSpec(policy="recompute", sink_frames=0, window_frames=7).build(shape, 30)
    assert cache.context_frames(3, 3) == [0, 1, 2] and cache.reencoded_frame(3, 3) is None
    assert cache.context_frames(6, 3) == [0, 3, 4, 5] and cache.reencoded_frame(6, 3) is None
    assert cache.context_frames(9, 3) == [5, 6, 7, 8] and cache.reencoded_frame(9, 3) == 5
    keep = CacheSpec(policy="recompute", sink_frames=1, window_frames=7).build(shape, 30)
    assert keep.context_frames(9, 3) == [0, 6, 7, 8] and keep.reencoded_frame(9, 3) is None


def test_restart_refuses_a_model_with_caches_of_its_own():
    from matrix_game_models import conditioning, tiny_runner

    runner = tiny_runner()
    cfg = RolloutConfig(num_frames=9, latent_height=4, latent_width=6, schedule=runner.model.config.schedule_name,
                        cache=CacheSpec(policy="global"), restart=RestartSpec(every=6, overlap=3))
    with pytest.raises(FastARError, match="for a Wan text-to-video model; this model is .*would not empty"):
        ARSampler(runner).generate(conditioning(9), cfg, vae=ToyVAE())
