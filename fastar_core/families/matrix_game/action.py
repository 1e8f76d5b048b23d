"""The action module's forward: mouse and keyboard conditioning between cross-attention and the feed-forward.

For a pass over latent frames ``f0 .. f0 + T - 1`` (``S`` tokens each, frame-major ``x [B, T*S, dim]``):

- every latent frame ``f`` reads a window of ``w = 4 x windows_size`` pixel-frame actions, pixel frames
  ``4f - w .. 4f - 1`` (before the first frame: copies of frame 0), as the reference groups them;
- mouse: each location's features joined to its frame's window of camera moves go through ``mouse_mlp`` to
  q/k/v; each location attends over time (its own keys of the cached frames and of this pass);
- keyboard: the window of embedded key presses becomes one key/value token per latent frame; every token
  attends to the tokens of the cached frames and of this pass;
- both use their own RoPE over time only (theta 256, ``rope_dim_list`` dims; the two spatial parts sit at
  position 0 of a one-cell grid, so they do not rotate) and RMSNorms without weights, at absolute frame positions
  (the caches hold rotated keys, as the reference's do).

The cached frames are the ``local_attn_size - T`` most recent committed ones (``caches.py``), so a chunk sees a
window of ``local_attn_size`` frames in all, as the reference's rolling caches give.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ActionConfig


def action_rope(start: int, frames: int, dims, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``[frames, sum(dims)]`` for time positions ``start ..``, pairs interleaved, in float32."""
    cos, sin = [], []
    for axis, d in enumerate(dims):
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, device=device)[: d // 2].float() / d))
        if axis == 0:
            pos = torch.arange(start, start + frames, device=device, dtype=torch.float32)
        else:
            pos = torch.zeros(frames, device=device, dtype=torch.float32)
        angles = torch.outer(pos, freqs)
        cos.append(angles.cos().repeat_interleave(2, dim=1))
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [N, T, H, D]`` with interleaved pairs (x0, x1) -> (x0 c - x1 s, x1 c + x0 s)."""
    xf = x.float()
    pairs = xf.reshape(*xf.shape[:-1], -1, 2)
    half = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (xf * cos[None, :, None] + half * sin[None, :, None]).type_as(x)


def action_windows(actions: torch.Tensor, start: int, frames: int, a: ActionConfig) -> torch.Tensor:
    """``[1, frames, w, C]``: for each latent frame of the pass, its window of ``w`` pixel-frame actions."""
    w, r = a.window_frames, a.vae_time_compression_ratio
    padded = torch.cat([actions[:, :1].expand(-1, w, -1), actions], dim=1)
    return torch.stack([padded[:, r * f: r * f + w] for f in range(start, start + frames)], dim=1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full attention ``[N, H, Lq, D]`` over ``[N, H, Lk, D]`` (no mask: every window entry is visible)."""
    return F.scaled_dot_product_attention(q, k, v)


def mouse_path(am, a: ActionConfig, x: torch.Tensor, frames: int, mouse: torch.Tensor, start: int, cache, layer: int,
               commit: bool) -> torch.Tensor:
    B, N, C = x.shape
    S = N // frames
    heads = a.heads_num
    hs = x.view(B, frames, S, C).transpose(1, 2).reshape(B * S, frames, C)  # each location over time
    windows = action_windows(mouse.to(x.dtype), start, frames, a).flatten(2)  # [1, T, w * 2], window-major
    joined = torch.cat([hs, windows.expand(B * S, -1, -1)], dim=-1)
    qkv = am.t_qkv(am.mouse_mlp(joined)).view(B * S, frames, 3, heads, -1)
    q, k, v = qkv.unbind(2)
    q = am.img_attn_q_norm(q).to(v)
    k = am.img_attn_k_norm(k).to(v)
    cos, sin = action_rope(start, frames, a.mouse_qk_dim_list, a.rope_theta, x.device)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    keys, values = _with_cache(cache, layer, start, frames, k, v, commit)
    y = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2))  # [BS, H, T, D]
    y = y.transpose(1, 2).reshape(B, S, frames, -1).transpose(1, 2).reshape(B, N, -1)
    return x + am.proj_mouse(y)


def keyboard_path(am, a: ActionConfig, x: torch.Tensor, frames: int, keyboard: torch.Tensor, start: int, cache,
                  layer: int, commit: bool) -> torch.Tensor:
    B, N, _ = x.shape
    S = N // frames
    heads = a.heads_num
    # Each pixel frame is embedded on its own, so embedding the windows is embedding the frames they hold.
    windows = action_windows(keyboard.to(am.keyboard_embed[0].weight.dtype), start, frames, a)
    windows = am.keyboard_embed(windows).flatten(2)  # [1, T, w * hidden], window-major
    q = am.mouse_attn_q(x).view(B, N, heads, -1)
    k, v = am.keyboard_attn_kv(windows).view(1, frames, 2, heads, -1).unbind(2)
    q = am.key_attn_q_norm(q).to(v)
    k = am.key_attn_k_norm(k).to(v)
    cos, sin = action_rope(start, frames, a.rope_dim_list, a.rope_theta, x.device)
    q = q.view(B, frames, S, heads, -1).transpose(1, 2).reshape(B * S, frames, heads, -1)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    keys, values = _with_cache(cache, layer, start, frames, k, v, commit)  # [1, L, H, D]: the same for every token
    q = q.reshape(B, S * frames, heads, -1).transpose(1, 2)  # every token's query against the same keys
    y = attend(q, keys.transpose(1, 2).expand(B, -1, -1, -1), values.transpose(1, 2).expand(B, -1, -1, -1))
    y = y.transpose(1, 2).reshape(B, S, frames, -1).transpose(1, 2).reshape(B, N, -1)
    return x + am.proj_keyboard(y)


def _with_cache(cache, layer, start, frames, k, v, commit):
    """Keys and values of the cached frames then this pass's; a clean pass then writes this pass's to the cache
    (after reading: the view is a slice of the buffer the write shifts)."""
    past = cache.view(layer, start, frames) if cache is not None else None
    keys, values = (k, v) if past is None else (torch.cat([past[0].to(k.dtype), k], dim=1),
                                                torch.cat([past[1].to(v.dtype), v], dim=1))
    if commit and cache is not None:
        cache.commit(layer, start, k, v)
    return keys, values


def action_module(am, a: ActionConfig, x: torch.Tensor, frames: int, keyboard, mouse, start: int, caches: dict,
                  layer: int, commit: bool) -> torch.Tensor:
    """The block's action module on ``x [B, T*S, dim]``: the mouse path, then the keyboard path on its output."""
    if a.enable_mouse and mouse is not None:
        x = mouse_path(am, a, x, frames, mouse, start, caches.get("mouse"), layer, commit)
    if a.enable_keyboard and keyboard is not None:
        x = keyboard_path(am, a, x, frames, keyboard, start, caches.get("keyboard"), layer, commit)
    return x
