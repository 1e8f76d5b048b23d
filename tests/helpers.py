"""Shared test helpers: tiny Wan models and a cache-free reference forward."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import torch

from comfyui_fastar.fastar_core.forward.attention import PassInfo
from comfyui_fastar.fastar_core.forward.runner import CausalRunner
from comfyui_fastar.fastar_core.model.rope import grid_positions, rotate
from comfyui_fastar.fastar_core.model.wan_config import WanConfig
from comfyui_fastar.fastar_core.model.wan_model import random_wan
from comfyui_fastar.fastar_core.rollout.engine import resolve_settings

TINY = WanConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32, freq_dim=32)


def tiny_model(seed=0, cfg=TINY, dtype=torch.float32):
    return random_wan(cfg, seed=seed, dtype=dtype)


def tiny_context(seed=1, tokens=8, text_dim=32, pad=0):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(1, tokens, text_dim, generator=g)
    if pad:
        ctx = torch.cat([ctx, torch.zeros(1, pad, text_dim)], dim=1)
    return ctx


class GroupedReference:
    """Attention seam for a full-sequence forward in which each query group (a frame range) sees its own key
    frames at its own temporal positions: the block-causal mask of every cache policy, written out directly."""

    def __init__(self, groups, tokens_per_frame):
        # groups: list of (query_frames: range, key_frames: list[(frame, effective_t)])
        self.groups = groups
        self.tpf = tokens_per_frame

    def begin_rollout(self, num_layers):
        pass

    def _tokens(self, frames):
        return torch.cat([torch.arange(f * self.tpf, (f + 1) * self.tpf) for f in frames])

    def self_attention(self, layer, q, k, v, positions, view, info):
        out = torch.zeros_like(q)
        for q_frames, key_frames in self.groups:
            qi = self._tokens(list(q_frames))
            ki = self._tokens([f for f, _ in key_frames])
            q_pos = positions[qi].clone()
            k_pos = positions[ki].clone()
            k_pos[:, 0] = torch.cat([torch.full((self.tpf,), t) for _, t in key_frames])
            qr = rotate(q[:, :, qi], q_pos[None])
            kr = rotate(k[:, :, ki], k_pos[None])
            scores = qr @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
            out[:, :, qi] = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v[:, :, ki]
        return out

    def cross_attention(self, layer, q, text_k, text_v, info):
        return torch.softmax(q @ text_k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ text_v


def reference_forward(model, x_all, t_all, text_ctx, groups, grid_hw):
    """One forward over every frame with per-group visibility; returns the flow prediction for all frames."""
    runner = CausalRunner(model, attention=GroupedReference(groups, grid_hw[0] * grid_hw[1]))
    text = runner.encode_text(text_ctx)
    info = PassInfo(chunk=0, step=0, num_steps=1, frame_start=0, num_frames=x_all.shape[2],
                    tokens_per_frame=grid_hw[0] * grid_hw[1])
    return runner.forward(x_all, t_all, text, None, info)


def tiny_modes() -> dict:
    """The bench's modes at tiny sizes (a 9-frame capacity, sink 3), AnnSA on at every size where it is on."""
    def mode(**kw):
        s = resolve_settings(sink_frames=3, **kw)
        return s.cache, s.fastar

    def temp(matcher="exact", **attention):
        return mode(preset="balanced", tempcache_overrides={"capacity_frames": 9, "threshold": 0.5,
                                                            "matcher": matcher},
                    attention_overrides={"annca": False, "annsa": False, "annsa_min_keys": 0, **attention})

    window = mode(cache_policy="window", window_frames=12)
    return {
        "dense-global": mode(cache_policy="global"),
        "dense-window": window,
        "dense-window-int8": (replace(window[0], kv_quant="int8"), window[1]),
        "rolling": mode(cache_policy="rolling", rolling_capacity=9, rolling_attend=9),
        "recompute": mode(cache_policy="recompute", window_frames=9),
        "tempcache": temp(),
        "tempcache-quantized": temp("quantized"),
        "tempcache-int8": (replace(temp()[0], kv_quant="int8"), temp()[1]),
        "tempcache+annsa": temp(annsa=True),
        "all": temp("quantized", annca=True, annsa=True),
        "all+annca-prune": temp("quantized", annca=True, annca_prune=True, annsa=True),
    }


__all__ = ["TINY", "assert_one_run", "tiny_model", "tiny_context", "tiny_modes", "GroupedReference",
           "reference_forward", "grid_positions"]


def assert_one_run(out, users=()):
    """An output folder holds one run and nothing else (but the user's own ``users`` files): the two names, and
    .fastar with the lock, the switch and the run's own folder."""
    from comfyui_fastar.tools import outputs as o

    assert sorted(p.name for p in out.iterdir()) == sorted([o.STATE_DIR, o.LATENT_FILE, o.STATS_FILE, *users])
    current = os.readlink(out / o.STATE_DIR / o.CURRENT)
    assert set(os.listdir(out / o.STATE_DIR)) <= {o.LOCK_FILE, o.CURRENT, current}
    assert sorted(os.listdir(out / o.STATE_DIR / current)) == [o.LATENT_FILE, o.STATS_FILE]
