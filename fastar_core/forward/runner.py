"""The block-causal Wan2.1 forward: one chunk (or a rolling window of chunks) against a KV cache.

``CausalRunner`` drives any module tree with Wan2.1 names, the engine's own ``WanModel`` or ComfyUI's
``WanModel``, by calling its submodules (``blk.self_attn.q(x)``, ``blk.norm1(x)``, ...). It never copies
weights, so LoRA, fp8 and offloading stay the host's business. Timesteps are per frame (``[B, F]``), giving
per-frame modulation. Attention goes through the seam in ``attention.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..caches.base import KVCache
from ..caches.cache_set import CacheSet
from ..errors import FastARError
from ..model.block_forward import BlockForward
from ..model.rope import chunk_positions
from .attention import DenseAttention, PassInfo
from .family import ModelFamily, family_for
from .parallel import SequenceParallel
from .step_graphs import StepGraphs


@dataclass(frozen=True)
class Geometry:
    """The shape facts the forward needs, read from either module tree."""

    dim: int
    num_heads: int
    num_layers: int
    patch_size: tuple
    freq_dim: int
    out_dim: int
    text_dim: int
    text_len: int = 512  # prompts are zero-padded to this many tokens before text_embedding

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


def read_geometry(model) -> Geometry:
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "head_dim"):
        return Geometry(cfg.dim, cfg.num_heads, cfg.num_layers, tuple(cfg.patch_size), cfg.freq_dim, cfg.out_dim,
                        cfg.text_dim, getattr(cfg, "text_len", 512))
    # ComfyUI's WanModel keeps these as attributes.
    return Geometry(model.dim, model.num_heads, len(model.blocks), tuple(model.patch_size), model.freq_dim,
                    model.out_dim, model.text_dim, getattr(model, "text_len", 512))


@dataclass
class TextState:
    """Cross-attention K/V of one prompt for every layer, computed once per prompt."""

    k: list  # per layer [B, H, L, D]
    v: list
    num_tokens: int
    cond: object = None  # the rollout's Conditioning, for families that read image latents or actions per pass


def sinusoidal_embedding(dim: int, position: torch.Tensor) -> torch.Tensor:
    half = dim // 2
    position = position.to(torch.float64)
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=position.device).div(half))
    angles = torch.outer(position, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class CausalRunner:
    def __init__(self, model, attention: DenseAttention | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, compile_kwargs: dict | None = None,
                 parallel: SequenceParallel | None = None, family: ModelFamily | None = None):
        self.model = model
        # What this model changes around Wan2.1's block (families.py): its input, context, block tail, caches.
        self.family = family or family_for(model)
        # The tensor code between attention calls, under torch.compile when compile settings are given.
        self.pieces = BlockForward(compile_kwargs)
        self.geometry = read_geometry(model)
        # Sequence parallelism: this rank runs a slice of every frame's tokens and self-attends with its share
        # of the heads (parallel.py); None runs the whole forward here.
        self.parallel = parallel
        if parallel is not None:
            parallel.check_heads(self.geometry.num_heads)
        if self.geometry.patch_size[0] != 1:
            raise FastARError(f"temporal patch size {self.geometry.patch_size[0]} is not supported (Wan2.1 uses 1)")
        self.attention = attention or DenseAttention()
        self.dtype = dtype or model.blocks[0].self_attn.q.weight.dtype
        # A host that offloads weights (ComfyUI's partial loading) says where activations belong.
        self.device = torch.device(device) if device is not None else model.blocks[0].self_attn.q.weight.device
        # On CUDA: capture a chunk's denoising forward in a CUDA graph at its first pass and replay it for the
        # others (step_graphs.py). Off until measured on the GPUs users run.
        self.cuda_graphs = False
        self.step_graphs = StepGraphs()

    @property
    def num_layers(self) -> int:
        return self.geometry.num_layers

    @property
    def local_heads(self) -> int:
        """Self-attention heads this process attends with, and keeps the cache of."""
        g = self.geometry
        return g.num_heads if self.parallel is None else self.parallel.local_heads(g.num_heads)

    @property
    def head_range(self) -> tuple[int, int]:
        g = self.geometry
        return (0, g.num_heads) if self.parallel is None else self.parallel.head_range(g.num_heads)

    def grid_hw(self, latent_h: int, latent_w: int) -> tuple[int, int]:
        _, ph, pw = self.geometry.patch_size
        if latent_h % ph or latent_w % pw:
            raise FastARError(
                f"latent size {latent_h}x{latent_w} is not divisible by the patch size {ph}x{pw}; "
                f"pixel height and width must be multiples of {8 * ph}"
            )
        return latent_h // ph, latent_w // pw

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, dim] -> [B, H, N, head_dim]"""
        g = self.geometry
        return x.view(x.shape[0], x.shape[1], g.num_heads, g.head_dim).transpose(1, 2)

    @torch.no_grad()
    def encode_text(self, context: torch.Tensor) -> TextState:
        """Project a prompt ``[B, L, text_dim]`` through ``text_embedding`` and every layer's cross-attn K/V.

        A prompt shorter than the model's ``text_len`` is zero-padded to it first, as Wan's own forward does
        before ``text_embedding``: the pad rows become keys the model was trained to attend to (T5 features
        from ComfyUI arrive padded already; a bare conditioning file may not)."""
        if context.ndim != 3 or context.shape[-1] != self.geometry.text_dim:
            raise FastARError(
                f"conditioning has shape {list(context.shape)}; expected [batch, tokens, {self.geometry.text_dim}]"
            )
        if not torch.isfinite(context).all():
            raise FastARError("conditioning contains NaN or infinite values")
        context = pad_text(context, self.geometry.text_len)
        ctx = self.model.text_embedding(context.to(device=self.device, dtype=self.dtype))
        return self.context_state(ctx, context.shape[1])

    def context_state(self, ctx: torch.Tensor, num_tokens: int, cond=None) -> TextState:
        """Every layer's cross-attention K/V of an embedded context ``[B, L, dim]`` (no ``no_grad`` of its own:
        ``encode_text`` has it, and the demo's trainer calls ``encode_text`` without it)."""
        ks, vs = [], []
        for blk in self.model.blocks:
            ca = blk.cross_attn
            ks.append(self._heads(ca.norm_k(ca.k(ctx))).contiguous())
            vs.append(self._heads(ca.v(ctx)).contiguous())
        return TextState(ks, vs, num_tokens, cond)

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        timesteps: torch.Tensor,
        text: TextState,
        cache: KVCache | CacheSet | None,
        info: PassInfo,
        commit: bool = False,
        need_output: bool = True,
    ) -> torch.Tensor | None:
        """Flow prediction for latent frames ``x [B, C, F, h, w]`` at per-frame ``timesteps [B, F]`` (0..1000).

        Queries see the cache view of each layer plus every token of ``x``. With ``commit`` the pass's keys
        and values are written to the cache (the clean pass); ``need_output=False`` then skips the head.
        ``text`` is the context state of the pass; a family that reads more per pass (image latents, actions)
        finds the rollout's ``Conditioning`` on it (``TextState.cond``).

        With ``cuda_graphs`` on a CUDA device, a denoising pass is replayed from the chunk's captured graph where
        its host-side state is the captured one (``step_graphs.py``).
        """
        if not commit and need_output and cache is not None and self.captures_steps():
            key = (tuple(x.shape), info.frame_start, info.num_frames, tuple(info.frame_steps or ()), id(text),
                   id(cache), tuple(cache.versions), self.attention.graph_key(info))
            return self.step_graphs.run(key, lambda xs, ts: self._forward(xs, ts, text, cache, info), x, timesteps)
        return self._forward(x, timesteps, text, cache, info, commit, need_output)

    def captures_steps(self) -> bool:
        """Whether denoising passes go through ``step_graphs``: asked for, on CUDA, with attention that allows it."""
        return (self.cuda_graphs and self.device.type == "cuda" and getattr(self.attention, "capturable", False))

    def _forward(self, x, timesteps, text, cache, info, commit=False, need_output=True):
        g = self.geometry
        B, _, F, H, W = x.shape
        gh, gw = self.grid_hw(H, W)
        if timesteps.shape != (B, F):
            raise FastARError(f"timesteps have shape {list(timesteps.shape)}; expected [{B}, {F}] (one per frame)")
        x = self.family.model_input(self, x, text, info)
        embed = self.model.patch_embedding  # fp32 in ComfyUI whatever the model dtype
        tokens = embed(x.to(device=self.device, dtype=embed.weight.dtype))
        tokens = tokens.to(self.dtype).flatten(2).transpose(1, 2)  # [B, F*gh*gw, dim], frame-major
        t_emb = sinusoidal_embedding(g.freq_dim, timesteps.reshape(-1).to(self.device)).to(self.dtype)
        e = self.model.time_embedding(t_emb).view(B, F, g.dim)
        e0 = self.model.time_projection(e).unflatten(-1, (6, g.dim))  # [B, F, 6, dim]
        positions = self.token_positions(info.frame_start, F, gh, gw)
        sp = self.parallel
        if sp is not None:
            sp.check_geometry(g.num_heads, gh * gw)
            tokens = sp.shard_tokens(tokens, F)

        if commit:
            assert cache is not None, "a clean pass needs a cache to write"
            cache.prepare_commit(info.frame_start, F, positions)
        last = len(self.model.blocks) - 1
        for i, blk in enumerate(self.model.blocks):
            tokens = self._block(i, blk, tokens, e0, positions, text, cache, info, commit,
                                 skip_tail=(i == last and not need_output))
        if commit and cache is not None:
            cache.finish_commit()
        if not need_output:
            return None
        if sp is not None:
            tokens = sp.gather_tokens(tokens, F)
        return self._head(tokens, e, F, gh, gw)

    def token_positions(self, frame_start: int, num_frames: int, grid_h: int, grid_w: int) -> torch.Tensor:
        """(t, h, w) of every token of the pass, ``[F * gh * gw, 3]``: what attention rotates by and the caches keep
        with each entry. The frame grid (t absolute, h and w on the screen); a runner whose model places tokens
        otherwise (the demo's steered world: on its map) overrides this, keeping t the absolute frame, which the
        caches evict and rewind by."""
        return chunk_positions(frame_start, num_frames, grid_h, grid_w, self.device)

    def _block(self, i, blk, x, e0, positions, text, cache, info, commit, skip_tail=False):
        F = e0.shape[1]
        heads = self.geometry.num_heads
        pieces = self.pieces
        q, k, v, gate1, shift2, scale2, gate2 = pieces.self_attention_inputs(blk, x, e0, heads)
        sp = self.parallel
        if sp is not None:  # every token of this rank's heads
            q, k, v = (sp.heads_from_tokens(t, F) for t in (q, k, v))
        view = cache.view(i, info.frame_start, F) if cache is not None else None
        y = self.attention.self_attention(i, q, k, v, positions, view, info)
        if commit:
            cache.commit(i, k, v)
        if skip_tail:
            return x
        if sp is not None:  # back to every head of this rank's tokens
            y = sp.tokens_from_heads(y, F)
        x, cq = self.family.after_self_attention(self, i, blk, x, y, gate1, text, info)
        y = self.attention.cross_attention(i, cq, text.k[i], text.v[i], info)
        return self.family.block_tail(self, i, blk, x, y, shift2, scale2, gate2, text, cache, info, commit)

    def _head(self, x, e, F, gh, gw):
        g = self.geometry
        head = self.model.head
        B, N, dim = x.shape
        mod = head.modulation.to(device=x.device, dtype=x.dtype)[None] + e[:, :, None]  # [B, F, 2, dim]
        shift, scale = (m[:, :, None] for m in mod.unbind(2))
        h = (head.norm(x).view(B, F, N // F, dim) * (1 + scale) + shift).view(B, N, dim)
        out = head.head(h)
        pt, ph, pw = g.patch_size
        c = out.shape[-1] // (pt * ph * pw)
        out = out.view(B, F, gh, gw, pt, ph, pw, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(B, c, F * pt, gh * ph, gw * pw).float()


def pad_text(context: torch.Tensor, text_len: int) -> torch.Tensor:
    """Zero rows appended up to ``text_len`` tokens; longer prompts pass unchanged (ComfyUI accepts them)."""
    missing = text_len - context.shape[1]
    if missing <= 0:
        return context
    return torch.cat([context, context.new_zeros(context.shape[0], missing, context.shape[2])], dim=1)


def flow_to_x0(x_t: torch.Tensor, flow: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x0 = x_t - sigma * v for flow-matching velocity v = noise - x0; sigma per frame ``[B, F]``."""
    return x_t - sigma[:, None, :, None, None] * flow


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x_sigma = (1 - sigma) x0 + sigma noise, sigma per frame ``[B, F]``."""
    s = sigma[:, None, :, None, None]
    return (1 - s) * x0 + s * noise
