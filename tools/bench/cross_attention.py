"""Cross-attention at Wan-1.3B shapes: the padded prompt, AnnCA's exact pad merge, and the merge plus pruning.

A 512-token prompt whose first ``real`` tokens are words and whose tail is UMT5's zero padding (identical rows),
against one 3-frame chunk of queries. Part of ``fastar bench attention``.
"""

from __future__ import annotations

import torch

from ...fastar_core.caches.base import read_figures
from ...fastar_core.fastar.attention import FastARAttention
from ...fastar_core.fastar.config import FastARConfig
from ...fastar_core.fastar.metrics import relative_error
from ...fastar_core.forward.attention import PassInfo

PROMPT_TOKENS = 512


def cross_attention_rows(q, tokens_per_frame: int, timer, real_tokens=(16, 64, 200), seed: int = 0) -> list:
    """One row per prompt length: median seconds per path, share of the 512 prompt keys attended, error."""
    g = torch.Generator().manual_seed(seed)
    _, heads, nq, head_dim = q.shape
    info = PassInfo(chunk=1, step=1, num_steps=4, frame_start=3, num_frames=nq // tokens_per_frame,
                    tokens_per_frame=tokens_per_frame)
    rows = []
    for real in real_tokens:
        k = torch.empty(1, heads, PROMPT_TOKENS, head_dim)
        v = torch.empty(1, heads, PROMPT_TOKENS, head_dim)
        k[:, :, :real] = torch.randn(1, heads, real, head_dim, generator=g)
        v[:, :, :real] = torch.randn(1, heads, real, head_dim, generator=g)
        # The padding's projection is one row repeated (the text encoder maps every pad position alike).
        k[:, :, real:] = torch.randn(1, heads, 1, head_dim, generator=g)
        v[:, :, real:] = torch.randn(1, heads, 1, head_dim, generator=g)
        k, v = k.to(q.device, q.dtype), v.to(q.device, q.dtype)
        paths = {"padded": FastARConfig(), "pad_merge": FastARConfig(annca=True),
                 "pad_merge+prune": FastARConfig(annca=True, annca_prune=True)}
        seconds, kept, outputs = {}, {}, {}
        for name, config in paths.items():
            attn = FastARAttention(config, heads, head_dim)
            attn.begin_rollout(1)
            seconds[name] = timer(attn.cross_attention, 0, q, k, v, info)
            attn.chunk_stats()  # drop the timing calls' tallies
            outputs[name] = attn.cross_attention(0, q, k, v, info)
            kept[name] = read_figures(attn.chunk_stats()).get("ca_kept", 1.0)
        rows.append({
            "real_tokens": real, "prompt_tokens": PROMPT_TOKENS, "seconds": seconds,
            "kept_share": kept, "kept_real_tokens_after_prune": round(kept["pad_merge+prune"] * PROMPT_TOKENS - 1),
            "output_error_vs_padded": {n: relative_error(outputs[n].float(), outputs["padded"].float())
                                       for n in ("pad_merge", "pad_merge+prune")},
        })
        s = seconds
        print(f"prompt {real:3d} words + pad: padded {s['padded'] * 1000:7.1f} ms, pad merge "
              f"{s['pad_merge'] * 1000:7.1f} ms, + prune {s['pad_merge+prune'] * 1000:7.1f} ms "
              f"(keeps {kept['pad_merge+prune']:.3f} of {PROMPT_TOKENS})")
    return rows
