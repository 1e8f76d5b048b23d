"""The streaming decode hands a Wan VAE decoder the same latent slices as ComfyUI's own one-shot decode, whatever
the piece size: frame 0, then one frame per call (0.3.x decoder, returns a tensor) or pairs (0.2x decoder, returns
a list). The real decoders are compared pixel for pixel in test_comfyui_host.py; this checks the cut without
ComfyUI."""

import pytest
import torch

from comfyui_fastar.nodes.streaming_decode import decode_pieces, pixel_frames, stream_pixels


class FakeDecoder(torch.nn.Module):
    """Records the latent frame numbers of every call; 4 pixel frames per latent frame (1 for frame 0)."""

    def __init__(self, chunked: bool):
        super().__init__()
        self.chunked = chunked
        self.calls = []

    def forward(self, x, feat_cache=None, feat_idx=(0,)):
        frames = [int(v) for v in x[0, 0, :, 0, 0]]
        self.calls.append(frames)
        pixels = [torch.full((1, 3, 1 if f == 0 else 4, 2, 2), float(f)) for f in frames]
        return pixels if self.chunked else torch.cat(pixels, 2)


def fake_wan_vae(chunked: bool):
    vae_cls = type("WanVAE", (torch.nn.Module,), {"__module__": "comfy.ldm.wan.vae"})
    fsm = vae_cls()
    fsm.decoder = FakeDecoder(chunked)
    fsm.conv2 = torch.nn.Identity()
    return type("VAE", (), {"first_stage_model": fsm, "device": "cpu", "vae_dtype": torch.float32,
                            "process_output": staticmethod(lambda x: x / 100)})()


def comfy_cut(frames: int, chunked: bool) -> list:
    """The slices ComfyUI's WanVAE.decode gives its decoder."""
    if not chunked:
        return [[i] for i in range(frames)]
    return [[0]] + [list(range(i, min(i + 2, frames))) for i in range(1, frames, 2)]


@pytest.mark.parametrize("chunked", [False, True], ids=["one-frame-calls", "pair-calls"])
@pytest.mark.parametrize("frames", [1, 2, 5, 6])
def test_decoder_sees_comfyuis_cut_for_every_piece_size(chunked, frames):
    latent = torch.arange(frames, dtype=torch.float32).view(1, 1, frames, 1, 1).expand(1, 16, frames, 2, 2)
    for piece in range(1, frames + 2):
        vae = fake_wan_vae(chunked)
        pixels = torch.cat(list(stream_pixels(vae, latent, piece)), 2)
        assert vae.first_stage_model.decoder.calls == comfy_cut(frames, chunked), piece
        assert pixels.shape[2] == pixel_frames(frames)
        expected = torch.cat([torch.full((1 if f == 0 else 4,), f / 100) for f in range(frames)])
        assert torch.equal(pixels[0, 0, :, 0, 0], expected), piece


def test_uint8_pieces_cover_every_frame_once():
    latent = torch.arange(7, dtype=torch.float32).view(1, 1, 7, 1, 1).expand(1, 16, 7, 2, 2)
    pieces = list(decode_pieces(fake_wan_vae(True), latent, 2))
    assert all(p.dtype == torch.uint8 and p.shape[-1] == 3 for p in pieces)
    assert sum(p.shape[1] for p in pieces) == pixel_frames(7)
