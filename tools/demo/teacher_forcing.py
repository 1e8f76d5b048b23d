"""The training forward: a whole clip in one differentiable pass, laid out as the sampler will see it.

The sequence is the clip's clean frames but the last chunk (no later chunk reads them) followed by a noisy twin
of every frame but the first chunk (the demo always starts from a rendered chunk, as image-to-video). A noisy
chunk ``c`` sees the clean chunks before it and itself; a clean chunk sees the clean chunks up to and including
itself (what the sampler's clean pass writes to the cache). Noisy twins take their clean frame's RoPE position,
so each noisy chunk is trained exactly as the sampler later denoises it against a cache of earlier frames.

The block math is the runner's own: the engine's forward is reused (without its ``no_grad``) with the seam
below plugged in, so training and sampling share one source of truth for modulation, norms, RoPE and heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...fastar_core.forward.attention import PassInfo
from ...fastar_core.forward.runner import CausalRunner, TextState
from ...fastar_core.model.rope import apply_rope, grid_positions, rope_cos_sin

# The engine's forward and text projection, without the ``torch.no_grad`` they carry for inference.
_forward_with_grad = CausalRunner.forward.__wrapped__
_encode_text_with_grad = CausalRunner.encode_text.__wrapped__


def split_frames(num_frames: int, frames_per_block: int) -> tuple[range, range]:
    """(frames with a clean copy, frames with a noisy twin) of a clip of ``num_frames``."""
    if num_frames % frames_per_block or num_frames < 2 * frames_per_block:
        raise ValueError(f"a training clip needs at least two whole chunks of {frames_per_block} frames, "
                         f"got {num_frames} frames")
    return range(0, num_frames - frames_per_block), range(frames_per_block, num_frames)


def teacher_forcing_mask(num_frames: int, frames_per_block: int, tokens_per_frame: int) -> torch.Tensor:
    """Float mask (0 visible, -inf hidden) over (clean copies, noisy twins) of ``split_frames``' frames."""
    clean, noisy = split_frames(num_frames, frames_per_block)
    clean_chunk = torch.tensor(clean) // frames_per_block
    noisy_chunk = torch.tensor(noisy) // frames_per_block
    clean_sees_clean = clean_chunk[:, None] >= clean_chunk[None, :]
    noisy_sees_clean = noisy_chunk[:, None] > clean_chunk[None, :]
    noisy_sees_noisy = noisy_chunk[:, None] == noisy_chunk[None, :]
    clean_sees_noisy = torch.zeros(len(clean), len(noisy), dtype=torch.bool)
    visible = torch.cat([
        torch.cat([clean_sees_clean, clean_sees_noisy], dim=1),
        torch.cat([noisy_sees_clean, noisy_sees_noisy], dim=1),
    ], dim=0)
    visible = visible.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)
    mask = torch.zeros(visible.shape)
    return mask.masked_fill_(~visible, float("-inf"))


class TeacherForcingAttention:
    """Attention seam for the full-sequence training forward (block mask, RoPE as in sampling).

    With ``rope_max_distance`` shorter than the clip, keys older than that many frames before a chunk's last
    frame take the clamped position the sampler's ``DenseAttention(rope_max_distance=...)`` gives them, which
    differs per query chunk: one SDPA per chunk then, else one per layer."""

    def __init__(self, num_frames: int, frames_per_block: int, grid_hw: tuple, head_dim: int, device="cpu",
                 rope_max_distance: int | None = None):
        tpf = grid_hw[0] * grid_hw[1]
        self.num_frames = num_frames
        self.mask = teacher_forcing_mask(num_frames, frames_per_block, tpf).to(device)
        clean, noisy = split_frames(num_frames, frames_per_block)
        positions = torch.cat([grid_positions(clean.start, len(clean), *grid_hw, device=device),
                               grid_positions(noisy.start, len(noisy), *grid_hw, device=device)])
        self.cos, self.sin = rope_cos_sin(positions[None], head_dim)
        self.groups = []  # (query rows of chunk c, key cos, key sin) when distances are clamped
        if rope_max_distance is not None and num_frames - 1 > rope_max_distance:
            chunk = positions[:, 0] // frames_per_block
            for c in range(num_frames // frames_per_block):
                rows = torch.nonzero(chunk == c).flatten()
                clamped = positions.clone()
                clamped[:, 0].clamp_(min=c * frames_per_block + frames_per_block - 1 - rope_max_distance)
                self.groups.append((rows, *rope_cos_sin(clamped[None], head_dim)))

    def begin_rollout(self, num_layers: int) -> None:
        pass

    def self_attention(self, layer, q, k, v, positions, view, info):
        q_rot = apply_rope(q, self.cos, self.sin)
        if not self.groups:
            return F.scaled_dot_product_attention(q_rot, apply_rope(k, self.cos, self.sin), v, attn_mask=self.mask)
        out = torch.empty_like(q)
        for rows, cos, sin in self.groups:
            out[:, :, rows] = F.scaled_dot_product_attention(q_rot[:, :, rows], apply_rope(k, cos, sin), v,
                                                             attn_mask=self.mask[rows]).to(out.dtype)
        return out

    def cross_attention(self, layer, q, text_k, text_v, info):
        return F.scaled_dot_product_attention(q, text_k, text_v)


class TeacherForcingForward:
    """Flow predictions for the noisy twins of a clip, differentiable in the model's weights."""

    def __init__(self, model, num_frames: int, frames_per_block: int, frame_hw: tuple,
                 rope_max_distance: int | None = None):
        probe = CausalRunner(model)
        self.grid_hw = probe.grid_hw(*frame_hw)
        self.seam = TeacherForcingAttention(num_frames, frames_per_block, self.grid_hw, probe.geometry.head_dim,
                                            device=probe.device, rope_max_distance=rope_max_distance)
        self.runner = CausalRunner(model, attention=self.seam)
        self.num_frames = num_frames
        self.clean_frames, self.noisy_frames = split_frames(num_frames, frames_per_block)

    def encode_text(self, context: torch.Tensor) -> TextState:
        return _encode_text_with_grad(self.runner, context)

    def __call__(self, context_frames, noisy_frames, context_t, noisy_t, text: TextState) -> torch.Tensor:
        """Inputs cover the whole clip: frames ``[B, C, T, H, W]``, timesteps ``[B, T]`` (0..1000).

        Returns v ``[B, C, T - frames_per_block, H, W]`` for the noisy twins (the clip's frames after its first
        chunk); the entries of the unused parts of the inputs are ignored.
        """
        clean, noisy = self.clean_frames, self.noisy_frames
        x = torch.cat([context_frames[:, :, clean.start:clean.stop], noisy_frames[:, :, noisy.start:noisy.stop]], 2)
        t = torch.cat([context_t[:, clean.start:clean.stop], noisy_t[:, noisy.start:noisy.stop]], dim=1)
        tpf = self.grid_hw[0] * self.grid_hw[1]
        info = PassInfo(chunk=0, step=0, num_steps=1, frame_start=0, num_frames=x.shape[2], tokens_per_frame=tpf)
        flow = _forward_with_grad(self.runner, x, t, text, None, info)
        return flow[:, :, len(clean):]
