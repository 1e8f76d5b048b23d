"""The tensor-only pieces of one Wan2.1 block, between the attention calls, optionally under ``torch.compile``.

A block is three pieces around two attention calls: modulation and the self-attention projections; the output
projection, its gated residual and the cross-attention query; the cross-attention output and the gated
feed-forward. The attention calls and cache reads/writes stay eager (they are kernels and bookkeeping with
data-dependent sizes); the pieces are plain tensor code, which is what a compiler speeds up.

The pieces take the block as an argument, so one compiled graph serves every layer (torch inlines the
module and treats its weights as inputs). Compile settings are the ones ComfyUI's TorchCompileModel node
stores on a MODEL (``model_options["torch_compile_kwargs"]``: backend, options, mode, fullgraph, dynamic).
"""

from __future__ import annotations

import torch

from ..errors import FastARError


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, N, dim] -> [B, H, N, head_dim]"""
    return x.view(x.shape[0], x.shape[1], num_heads, x.shape[2] // num_heads).transpose(1, 2)


def _per_frame(t: torch.Tensor, frames: int) -> torch.Tensor:
    b, n, dim = t.shape
    return t.view(b, frames, n // frames, dim)


def self_attention_inputs(blk, x: torch.Tensor, e0: torch.Tensor, num_heads: int):
    """Per-frame modulation and the self-attention projections: q, k, v ``[B, H, N, D]`` (before RoPE) and the
    modulation terms the later pieces use."""
    b, n, dim = x.shape
    frames = e0.shape[1]
    mod = blk.modulation.to(device=x.device, dtype=x.dtype)[None] + e0  # [B, F, 6, dim]
    shift1, scale1, gate1, shift2, scale2, gate2 = (m[:, :, None] for m in mod.unbind(2))
    h = (_per_frame(blk.norm1(x), frames) * (1 + scale1) + shift1).view(b, n, dim)
    sa = blk.self_attn
    q = split_heads(sa.norm_q(sa.q(h)), num_heads)
    k = split_heads(sa.norm_k(sa.k(h)), num_heads)
    v = split_heads(sa.v(h), num_heads)
    return q, k, v, gate1, shift2, scale2, gate2


def after_self_attention(blk, x: torch.Tensor, y: torch.Tensor, gate1: torch.Tensor, num_heads: int):
    """Output projection and gated residual of self-attention; then the cross-attention query."""
    x = self_attention_residual(blk, x, y, gate1)
    return x, cross_attention_query(blk, x, num_heads)


def self_attention_residual(blk, x: torch.Tensor, y: torch.Tensor, gate1: torch.Tensor):
    """The self-attention output projection and gated residual alone (families that change the hidden state
    before cross-attention: LingBot-World's camera)."""
    b, n, dim = x.shape
    frames = gate1.shape[1]
    y = blk.self_attn.o(y.transpose(1, 2).reshape(b, n, dim))
    return x + (_per_frame(y, frames) * gate1).view(b, n, dim)


def cross_attention_query(blk, x: torch.Tensor, num_heads: int):
    """The cross-attention query of hidden state ``x`` (the second half of ``after_self_attention``)."""
    ca = blk.cross_attn
    return split_heads(ca.norm_q(ca.q(blk.norm3(x))), num_heads)


def after_cross_attention(blk, x: torch.Tensor, y: torch.Tensor, shift2: torch.Tensor, scale2: torch.Tensor,
                          gate2: torch.Tensor):
    """Cross-attention output and residual; then the gated feed-forward."""
    b, n, dim = x.shape
    frames = gate2.shape[1]
    x = x + blk.cross_attn.o(y.transpose(1, 2).reshape(b, n, dim))
    h = (_per_frame(blk.norm2(x), frames) * (1 + scale2) + shift2).view(b, n, dim)
    return x + (_per_frame(blk.ffn(h), frames) * gate2).view(b, n, dim)


def cross_attention_residual(blk, x: torch.Tensor, y: torch.Tensor):
    """The cross-attention output and residual alone (families that put a module before the feed-forward)."""
    b, n, dim = x.shape
    return x + blk.cross_attn.o(y.transpose(1, 2).reshape(b, n, dim))


def feed_forward(blk, x: torch.Tensor, shift2: torch.Tensor, scale2: torch.Tensor, gate2: torch.Tensor):
    """The gated feed-forward alone (the second half of ``after_cross_attention``)."""
    b, n, dim = x.shape
    frames = gate2.shape[1]
    h = (_per_frame(blk.norm2(x), frames) * (1 + scale2) + shift2).view(b, n, dim)
    return x + (_per_frame(blk.ffn(h), frames) * gate2).view(b, n, dim)


COMPILE_KEYS = ("backend", "options", "mode", "fullgraph", "dynamic")


def check_compile_kwargs(kwargs: dict) -> dict:
    unknown = sorted(set(kwargs) - set(COMPILE_KEYS))
    if unknown:
        raise FastARError(f"torch.compile settings {unknown} are not known; expected some of {list(COMPILE_KEYS)}")
    if not isinstance(kwargs.get("backend", "inductor"), str) and not callable(kwargs.get("backend")):
        raise FastARError(f"torch.compile backend {kwargs.get('backend')!r} is neither a name nor a callable")
    out = {k: v for k, v in kwargs.items() if v is not None}
    if isinstance(out.get("options"), dict):
        out["options"] = dict(out["options"])  # torch.compile pops entries (guard_filter_fn) from the dict it gets
    return out


class BlockForward:
    """The three pieces, eager or each wrapped by ``torch.compile`` with the given settings."""

    def __init__(self, compile_kwargs: dict | None = None):
        self.compile_kwargs = None if compile_kwargs is None else check_compile_kwargs(dict(compile_kwargs))
        pieces: tuple = (self_attention_inputs, after_self_attention, after_cross_attention, cross_attention_residual,
                         feed_forward, self_attention_residual, cross_attention_query)
        if self.compile_kwargs is not None:
            pieces = tuple(torch.compile(p, **self.compile_kwargs) for p in pieces)
        (self.self_attention_inputs, self.after_self_attention, self.after_cross_attention,
         self.cross_attention_residual, self.feed_forward, self.self_attention_residual,
         self.cross_attention_query) = pieces

    @property
    def compiled(self) -> bool:
        return self.compile_kwargs is not None

    def describe(self) -> str:
        if self.compile_kwargs is None:
            return "eager"
        shown = {k: v for k, v in self.compile_kwargs.items() if k != "options"}
        return "torch.compile " + ", ".join(f"{k} {v}" for k, v in shown.items())
