"""A small causal video encoder with the calling convention of ComfyUI's Wan2.1 ``Encoder3d`` (a feature cache of the
last frames of each causal conv's input, handed from call to call), for testing the streaming start encode without
ComfyUI. ``flushes=True`` is ComfyUI 0.18+'s encoder: two frames a call, a lone time-downsampled frame held back
until a later call or the last one (``final``); ``flushes=False`` takes four frames a call. The real encoders are
checked against ComfyUI's full encode on the hosts (tests/comfyui_world_start.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

CACHE_T = 2


class CausalConv(torch.nn.Module):
    def __init__(self, channels_in: int, channels_out: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(channels_out, channels_in, 3, 1, 1, generator=g) * 0.4)

    def forward(self, x, cache):
        pad = x.new_zeros(*x.shape[:2], 2, *x.shape[3:]) if cache is None else cache
        if cache is not None and cache.shape[2] < 2:
            pad = torch.cat([x.new_zeros(*x.shape[:2], 2 - cache.shape[2], *x.shape[3:]), cache], dim=2)
        return F.conv3d(torch.cat([pad, x], dim=2), self.weight)


class Downsample(torch.nn.Module):
    """Halves the frame rate: frame 0 passes (the first call), then pairs (with the last frame of the previous call)."""

    def __init__(self, channels: int, seed: int, flushes: bool):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(channels, channels, 3, 1, 1, generator=g) * 0.4)
        self.flushes = flushes

    def forward(self, x, cache, idx, final):
        if cache[idx] is None:
            cache[idx] = x[:, :, -1:]
            return x
        y = F.conv3d(torch.cat([cache[idx][:, :, -1:], x], dim=2), self.weight, stride=(2, 1, 1))
        cache[idx] = x[:, :, -1:]
        if not self.flushes:
            return y
        held = cache[idx + 1]
        if held is not None:
            y, cache[idx + 1] = torch.cat([held, y], dim=2), None
        if y.shape[2] == 1 and not final:
            cache[idx + 1] = y
            return None
        return y


class Encoder(torch.nn.Module):
    def __init__(self, flushes: bool, width: int = 4, seed: int = 0):
        super().__init__()
        self.flushes = flushes
        self.inp = CausalConv(3, width, seed)
        self.early = torch.nn.ModuleList(CausalConv(width, width, seed + 1 + i) for i in range(3))
        self.down1 = Downsample(width, seed + 10, flushes)
        self.mid = torch.nn.ModuleList(CausalConv(width, width, seed + 20 + i) for i in range(3))
        self.down2 = Downsample(width, seed + 30, flushes)
        self.late = torch.nn.ModuleList(CausalConv(width, width, seed + 40 + i) for i in range(4))
        self.head = CausalConv(width, 32, seed + 50)

    def _conv(self, conv, x, cache, idx):
        old = cache[idx[0]]
        cache[idx[0]] = x[:, :, -CACHE_T:]
        idx[0] += 1
        return conv(x, old)

    def forward(self, x, feat_cache=None, feat_idx=(0,), final=False):
        idx = list(feat_idx)
        x = F.avg_pool3d(torch.tanh(self._conv(self.inp, x, feat_cache, idx)), (1, 8, 8))  # Wan's 8x in space
        for conv in self.early:
            x = x + torch.tanh(self._conv(conv, x, feat_cache, idx))
        x = self.down1(x, feat_cache, idx[0], final)
        idx[0] += 2
        if x is None:
            return None
        for conv in self.mid:
            x = x + torch.tanh(self._conv(conv, x, feat_cache, idx))
        x = self.down2(x, feat_cache, idx[0], final)
        idx[0] += 2
        if x is None:
            return None
        for conv in self.late:
            x = x + torch.tanh(self._conv(conv, x, feat_cache, idx))
        return self._conv(self.head, x, feat_cache, idx)


class EncoderFourFrames(Encoder):
    """Before ComfyUI 0.18: no ``final`` argument (the streaming encoder reads the cut from the signature)."""

    def forward(self, x, feat_cache=None, feat_idx=(0,)):
        return super().forward(x, feat_cache, feat_idx)


class PointwiseMix(torch.nn.Module):
    """Wan's 1x1x1 ``conv1``, as elementwise products summed in a fixed order: the same bits for a frame whatever
    the number of frames beside it (a conv kernel may round differently for another tensor size)."""

    def __init__(self, channels: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(channels, channels, generator=g) * 0.2)

    def forward(self, x):
        out = x[:, :1] * self.weight[:, 0].view(1, -1, 1, 1, 1)
        for c in range(1, x.shape[1]):
            out = out + x[:, c:c + 1] * self.weight[:, c].view(1, -1, 1, 1, 1)
        return out


class StubWanVAE(torch.nn.Module):
    def __init__(self, flushes: bool):
        super().__init__()
        self.encoder = Encoder(True) if flushes else EncoderFourFrames(False)
        self.conv1 = PointwiseMix(32, 99)

    def full_encode(self, x):
        """ComfyUI's ``WanVAE.encode`` loop for this encoder: the whole video, cut the same way."""
        step = 2 if self.encoder.flushes else 4
        t = x.shape[2]
        cache = [None] * 64
        calls = [(0, 1)] + [(s, s + step) for s in range(1, t, step)]
        outs = []
        for i, (a, b) in enumerate(calls):
            extra = {"final": i == len(calls) - 1} if self.encoder.flushes and i else {}
            out = self.encoder(x[:, :, a:b], feat_cache=cache, feat_idx=[0], **extra)
            if out is not None:
                outs.append(out)
        return self.conv1(torch.cat(outs, dim=2)).chunk(2, dim=1)[0]


def stub_vae(flushes: bool) -> SimpleNamespace:
    """What the streaming encoder reads of ComfyUI's VAE object."""
    fsm = StubWanVAE(flushes).eval()
    return SimpleNamespace(first_stage_model=fsm, process_input=lambda image: image * 2.0 - 1.0,
                           vae_dtype=torch.float32, device=torch.device("cpu"), output_device=torch.device("cpu"))


def full_encode(vae, image: torch.Tensor, frames: int) -> torch.Tensor:
    """The whole start video [1, 16, T, h, w] encoded at once, as VAE Encode would (image, then blank frames)."""
    video = torch.full((frames, *image.shape[1:]), 0.5)
    video[:1] = image
    x = vae.process_input(video.movedim(-1, 1).movedim(1, 0).unsqueeze(0))
    with torch.no_grad():
        return vae.first_stage_model.full_encode(x)
