"""The FLOPs of a rollout from a model's shapes alone, by part: what ``fastar bench cost-model`` tabulates.

Matrix-multiply FLOPs (2 per multiply-add) of the transformer, by part, per layer and forward pass over the ``n``
query tokens of a chunk with ``m`` cached tokens:

- projections: self-attention q, k, v, o and cross-attention q, o: ``6 * 2 n d^2`` (the prompt's cross-attention
  keys and values are projected once per prompt, not per chunk);
- FFN: ``2 * 2 n d f``;
- cross-attention over ``L`` prompt keys: ``2 * 2 n L d``;
- self-attention over the cache and the chunk itself: ``2 * 2 n (m + n) d``;
- TempCache matching, at the clean pass only: each new key's cosine against the ``r`` representatives,
  ``2 n r d``;
- a camera (LingBot-World 2.0): per layer ``camera_layers`` more ``d x d`` linears on every query token
  (``cam_injector_layer1/2``, ``cam_scale_layer``, ``cam_shift_layer``: ``4 * 2 n d^2``), and once per pass the camera
  embedding (``patch_embedding_wancamctrl``, 1,536 inputs, and two ``d x d`` layers).

A chunk runs one forward per denoising step and one clean pass (skipped for the last chunk). What a chunk attends
to, matches against and rebuilds is the cache policy's to say (``CacheCost.of``: the policy class's
``attended_frames``, ``matched_frames``, ``rebuilt_frames``): ``dense-global`` attends to every committed frame, a
window or TempCache holding ``C`` frames to at most ``C``, a recompute cache also re-encodes its context before
every chunk (block-causal clean passes) and takes no clean pass after it. The speedup any
bounded cache can reach is dense-global's total over the total with ``C = 0`` (attention to the chunk itself
only): whatever a cache keeps only adds to that. Not counted: norms, RoPE, softmax, modulation, the patch
embedding and head, the VAE and the text encoder (elementwise or per-rollout work; on a GPU small beside the
matmuls, on a CPU at small widths not, which the measured/modelled efficiency shows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

PARTS = ("projections", "ffn", "cross_attention", "self_attention", "tempcache_matching", "camera")


@dataclass(frozen=True)
class ModelShape:
    name: str
    dim: int
    heads: int
    layers: int
    ffn: int
    tokens_per_frame: int
    text_tokens: int  # cross-attention keys per query
    frames_per_block: int = 3
    steps: int = 4  # denoising forwards per chunk; the clean pass comes on top
    start_frames: int = 0  # given clean frames committed before the first chunk
    camera_layers: int = 0  # d x d camera linears per layer on every token (LingBot-World 2.0: 4)
    camera_inputs: int = 0  # inputs of the camera embedding run once per pass (LingBot-World 2.0: 1,536)

    def to_dict(self) -> dict:
        return asdict(self)


# Wan2.1 at 480x832: 60x104 latent, 2x2 patches = 1,560 tokens per latent frame; Self-Forcing's 4 steps,
# chunks of 3 latent frames; UMT5's 512 prompt tokens (padding included: the dense reference attends to all).
WAN_1_3B = ModelShape("Wan2.1-1.3B 480x832", dim=1536, heads=12, layers=30, ffn=8960, tokens_per_frame=1560,
                      text_tokens=512)
WAN_14B = ModelShape("Wan2.1-14B 480x832", dim=5120, heads=40, layers=40, ffn=13824, tokens_per_frame=1560,
                     text_tokens=512)
# LongLive 2.0 on Wan2.2-TI2V-5B at 704x1280: 44x80 latents (the Wan2.2 VAE's 16x16 pixels per latent), 2x2 patches
# = 22x40 = 880 tokens per latent frame; chunks of 8 latent frames, 4 UniPC steps and a clean pass.
LONGLIVE2_5B = ModelShape("LongLive 2.0 (Wan2.2-TI2V-5B) 704x1280", dim=3072, heads=24, layers=30, ffn=14336,
                          tokens_per_frame=880, text_tokens=512, frames_per_block=8)
LONGLIVE2_GRID = (22, 40)
LONGLIVE2_PROMPT_TOKENS = 128  # real prompt tokens where AnnCA's exact pad merge is counted (its "all" mode)
LONGLIVE2_MODES = ("dense-global", "dense-window", "tempcache", "all")


def shape_of_scenario(scenario, text_tokens: int | None = None) -> ModelShape:
    """The shapes a rollout bench scenario runs at (its model, frame size, chunk size and schedule)."""
    from ...fastar_core.families.lingbot.config import LingBotConfig
    from ...fastar_core.rollout.schedule import get_schedule

    cfg = scenario.model.config
    camera = {"camera_layers": 4, "camera_inputs": cfg.camera_dim} if isinstance(cfg, LingBotConfig) else {}
    ph, pw = cfg.patch_size[1], cfg.patch_size[2]
    tpf = (scenario.latent_hw[0] // ph) * (scenario.latent_hw[1] // pw)
    schedule = get_schedule(scenario.schedule)
    start = scenario.initial_latents.shape[2] if scenario.initial_latents is not None else 0
    return ModelShape(scenario.name, dim=cfg.dim, heads=cfg.num_heads, layers=cfg.num_layers, ffn=cfg.ffn_dim,
                      tokens_per_frame=tpf, text_tokens=text_tokens or scenario.context.shape[1],
                      frames_per_block=scenario.frames_per_block, steps=schedule.num_steps, start_frames=start,
                      **camera)


def _nothing(_frames: int) -> int:
    return 0


@dataclass(frozen=True)
class CacheCost:
    """What a cache makes each chunk attend to, as the cost model counts it (frames; see the module's text)."""

    attended: Callable[[int], int]  # committed frames -> cached frames a chunk attends to beside itself
    matched: Callable[[int], int] = _nothing  # committed -> frames' worth of keys a clean pass matches against
    rebuilt: Callable[[int], int] = _nothing  # first frame of the chunk -> frames re-encoded before it
    commits: bool = True  # a clean pass after each chunk (but the last)

    @classmethod
    def of(cls, spec, frames_per_block: int) -> CacheCost:
        """A ``CacheSpec``'s cost, as its policy class describes itself."""
        p, f = spec.policy_class, frames_per_block
        return cls(attended=lambda c: p.attended_frames(spec, c, f), matched=lambda c: p.matched_frames(spec, c, f),
                   rebuilt=lambda s: p.rebuilt_frames(spec, s, f), commits=not p.rebuilds_each_chunk)

    @classmethod
    def dense_global(cls) -> CacheCost:
        return cls(attended=lambda c: c)

    @classmethod
    def bounded(cls, capacity_frames: int, tempcache: bool = False, sink_frames: int = 3) -> CacheCost:
        """An idealised cache of ``capacity_frames`` frames (0: no cache at all, the floor of any bounded cache),
        with TempCache's matching against what it holds beside the sink when ``tempcache``."""
        def attended(c):
            return min(c, capacity_frames)

        def matched(c):
            return max(0, attended(c) - sink_frames) if tempcache else 0

        return cls(attended=attended, matched=matched)


def real_prompt_tokens(context) -> int:
    """Prompt rows that are not zero padding, plus the one key the exact pad merge leaves."""
    nonzero = int((context[0].abs().sum(-1) > 0).sum())
    return nonzero + int(nonzero < context.shape[1])


def pass_flops(s: ModelShape, n: int, m: int, text_tokens: int | None = None, reps: int = 0) -> dict:
    """FLOPs of one forward over ``n`` query tokens with ``m`` cached tokens, every layer; ``reps``: TempCache
    representatives matched against (clean pass only)."""
    d, L = s.dim, text_tokens if text_tokens is not None else s.text_tokens
    per_layer = {
        "projections": 6 * 2 * n * d * d,
        "ffn": 2 * 2 * n * d * s.ffn,
        "cross_attention": 2 * 2 * n * L * d,
        "self_attention": 2 * 2 * n * (m + n) * d,
        "tempcache_matching": 2 * n * reps * d,
        "camera": s.camera_layers * 2 * n * d * d,
    }
    out = {k: v * s.layers for k, v in per_layer.items()}
    if s.camera_layers:
        out["camera"] += 2 * n * s.camera_inputs * d + 2 * 2 * n * d * d
    return out


def rollout_flops(s: ModelShape, frames: int, cache: CacheCost | None = None, text_tokens: int | None = None) -> dict:
    """Total and per-chunk FLOPs of generating ``frames`` latent frames with ``cache`` (None: dense-global)."""
    cache = cache or CacheCost.dense_global()
    p, fpb = s.tokens_per_frame, s.frames_per_block
    totals = dict.fromkeys(PARTS, 0)
    per_chunk = []
    committed, f = s.start_frames, 0
    while f < frames:
        n_frames = min(fpb, frames - f)
        chunk = dict.fromkeys(PARTS, 0)

        def add(n, m, reps=0, chunk=chunk):
            for k, v in pass_flops(s, n * p, m * p, text_tokens, reps * p).items():
                chunk[k] += v

        context = cache.rebuilt(committed)
        for pos in range(0, context, fpb):  # block-causal clean passes over the rebuilt context
            add(min(fpb, context - pos), pos)
        cached = cache.attended(committed)
        for _ in range(s.steps):
            add(n_frames, cached)
        if f + n_frames < frames and cache.commits:  # the last chunk's clean pass is skipped
            add(n_frames, cached, cache.matched(committed))
        for k in PARTS:
            totals[k] += chunk[k]
        per_chunk.append(sum(chunk.values()))
        committed += n_frames
        f += n_frames
    return {"total": sum(totals.values()), "parts": totals, "per_chunk": per_chunk}


def modelled_speedup(s: ModelShape, frames: int, cache: CacheCost | None, text_tokens: int | None = None,
                     reference_text_tokens: int | None = None) -> float:
    """dense-global's FLOPs over those with ``cache`` (None: dense-global itself)."""
    dense = rollout_flops(s, frames, None, text_tokens=reference_text_tokens)["total"]
    return dense / rollout_flops(s, frames, cache, text_tokens)["total"]


def mode_speedup(s: ModelShape, frames: int, spec, fastar, prompt_tokens: int) -> float:
    """The modelled speedup of a bench mode: its cache policy as it describes itself, and AnnCA's prompt tokens
    (the real ones and one pad key) where AnnCA is on."""
    return modelled_speedup(s, frames, CacheCost.of(spec, s.frames_per_block),
                            text_tokens=prompt_tokens if fastar.annca else None)


def video_to_latent_frames(video_frames: int) -> int:
    return (video_frames - 1) // 4 + 1
