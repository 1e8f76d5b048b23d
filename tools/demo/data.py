"""Training batches from the procedural world: fresh scenes every step, reproducible from (seed, step).

Besides clean clips, this holds the corruption applied to the *context* copy of a clip: the sampler feeds the
model its own slightly blurred, slightly noisy frames as context, so training contexts carry the same kinds of
error (labelled clean, timestep 0) and the model learns to restore crisp frames instead of drifting.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .world import make_scene

_SEED_MIX = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D)


def clip_seed(seed: int, step: int, index: int) -> int:
    """A scene seed per (run seed, step, clip); disjoint from the small seeds used for evaluation."""
    return (seed * _SEED_MIX[0] + step * _SEED_MIX[1] + index * _SEED_MIX[2] + 1_000_003) % (2**31 - 1) + 1_000_000


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(clip_seed(seed, step, 10_007))


@dataclass
class Batch:
    video: torch.Tensor  # [B, 3, T, H, W] in [-1, 1] (the model's latent layout)
    prompts: list
    backgrounds: torch.Tensor  # [B, 3, H, W] each clip's clean background


def training_batch(seed: int, step: int, batch: int, frames: int, size: int) -> Batch:
    videos, prompts, backgrounds = [], [], []
    for i in range(batch):
        scene = make_scene(clip_seed(seed, step, i), size)
        videos.append(scene.render(frames).permute(1, 0, 2, 3))
        prompts.append(scene.prompt(long=bool((step + i) % 2)))
        backgrounds.append(scene.background())
    return Batch(torch.stack(videos), prompts, torch.stack(backgrounds))


def sprite_weights(batch: Batch, weight: float) -> torch.Tensor:
    """Per-pixel loss weights ``[B, 1, T, H, W]``: ``weight`` where a sprite is or just was (its trail), else 1.

    Sprites cover a tenth of the pixels but carry all of the dynamics; without this the loss is spent on the
    static background the model copies early on.
    """
    off_background = (batch.video - batch.backgrounds[:, :, None]).abs().sum(dim=1, keepdim=True) > 0.05
    recent = off_background.clone()
    recent[:, :, 1:] |= off_background[:, :, :-1]
    B, _, T, H, W = recent.shape
    grown = F.max_pool2d(recent.float().transpose(1, 2).reshape(B * T, 1, H, W), 3, stride=1, padding=1)
    return 1 + (weight - 1) * grown.reshape(B, T, 1, H, W).transpose(1, 2)


def _blur(video: torch.Tensor) -> torch.Tensor:
    """A 3x3 binomial blur of every frame of ``[B, C, T, H, W]`` (edges replicated)."""
    B, C, T, H, W = video.shape
    k1 = torch.tensor([1.0, 2.0, 1.0]) / 4
    kernel = (k1[:, None] * k1[None, :]).expand(C, 1, 3, 3).to(video)
    frames = video.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
    out = F.conv2d(F.pad(frames, (1, 1, 1, 1), mode="replicate"), kernel, groups=C)
    return out.reshape(B, T, C, H, W).permute(0, 2, 1, 3, 4)


def corrupt_context(video: torch.Tensor, frames_per_block: int, g: torch.Generator, p: float = 0.5,
                    max_noise: float = 0.08, max_blur: float = 0.6) -> torch.Tensor:
    """Per chunk, with probability ``p``: mix in a blurred copy and add Gaussian noise (random strengths)."""
    B, _, T, _, _ = video.shape
    chunks = -(-T // frames_per_block)

    def per_frame(values):  # [B, chunks] -> [B, 1, T, 1, 1]
        return values.repeat_interleave(frames_per_block, dim=1)[:, :T].view(B, 1, T, 1, 1).to(video)

    hit = (torch.rand(B, chunks, generator=g) < p).float()
    blur = per_frame(hit * torch.rand(B, chunks, generator=g) * max_blur)
    noise = per_frame(hit * torch.rand(B, chunks, generator=g) * max_noise)
    out = (1 - blur) * video + blur * _blur(video)
    return out + noise * torch.randn(video.shape, generator=g).to(video)


def training_sigmas(batch: int, chunks: int, schedule: tuple, g: torch.Generator, p_schedule: float = 0.4):
    """Per-chunk noise levels: the sampler's own step sigmas with probability ``p_schedule``, else logit-normal."""
    on_grid = torch.tensor(schedule)[torch.randint(len(schedule), (batch, chunks), generator=g)]
    continuous = torch.sigmoid(torch.randn(batch, chunks, generator=g)).clamp(0.02, 1.0)
    pick = torch.rand(batch, chunks, generator=g) < p_schedule
    return torch.where(pick, on_grid, continuous)
