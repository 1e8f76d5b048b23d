"""The sampler's STRING output: what ran, per-chunk speed and cache memory, and FAST-AR statistics."""

from __future__ import annotations

import torch

from ..fastar_core.rollout.engine import EngineSettings

MAX_CHUNK_LINES = 40  # longer rollouts show the first and last 20 chunks


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def describe_fastar(engine: EngineSettings) -> str:
    c = engine.fastar
    tempcache = engine.cache.policy == "tempcache"
    if not (tempcache or c.annca or c.annsa):
        return "off (dense reference)"
    parts = []
    if tempcache:
        t = engine.cache.tempcache
        parts.append(f"TempCache threshold {t.threshold}, capacity {t.capacity_frames} frames "
                     f"(sink {engine.cache.sink_frames}), matcher {t.matcher}")
    if c.annca:
        parts.append("AnnCA " + ("prune" if c.annca_prune else "pad merge only"))
    if c.annsa:
        layers = c.layers if isinstance(c.layers, str) else ",".join(str(i) for i in c.layers)
        parts.append(f"AnnSA {c.bits} bits x {c.tables} table(s), dense warm-up {c.dense_warmup}, layers {layers}")
    return f"{c.preset}: " + "; ".join(parts) + f"; backend {c.backend}"


def _extra_text(extra: dict) -> str:
    out = []
    for key, value in extra.items():
        if isinstance(value, (list, tuple)):
            if not value:
                continue
            value = sum(value) / len(value)
            key = f"{key}(mean)"
        out.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return "  ".join(out)


def chunk_lines(chunks) -> list[str]:
    lines = [f"{'chunk':>5}  {'latent frames':>13}  {'ms':>9}  {'latent fps':>10}  {'cache':>12}  FAST-AR"]
    shown = list(chunks)
    hidden = 0
    if len(shown) > MAX_CHUNK_LINES:
        hidden = len(shown) - MAX_CHUNK_LINES
        shown = shown[: MAX_CHUNK_LINES // 2] + [None] + shown[-MAX_CHUNK_LINES // 2:]
    for c in shown:
        if c is None:
            lines.append(f"{'...':>5}  ({hidden} chunks not shown)")
            continue
        fps = c.frames / c.seconds if c.seconds > 0 else float("inf")
        frames = f"{c.frame_start}-{c.frame_start + c.frames - 1}"
        lines.append(f"{c.index:>5}  {frames:>13}  {c.seconds * 1000:>9.1f}  {fps:>10.2f}  {mib(c.cache_bytes):>12}  "
                     f"{_extra_text(c.extra)}")
    return lines


def _matcher_ran(engine: EngineSettings, device) -> str:
    """TempCache's search 'auto' is decided by the device: say which one ran."""
    t = engine.cache.tempcache
    if engine.cache.policy != "tempcache" or t.matcher != "auto":
        return ""
    return f" | matcher {t.resolved_matcher(device)} on {torch.device(device).type}"


def build_report(*, model, result, settings, engine: EngineSettings, mode: str,
                 n_init: int, width: int, height: int, schedule_text: str, prompts: str, notes=()) -> str:
    total = result.latent.shape[2]
    generated = total - n_init
    geometry = model.geometry
    video_frames = geometry.video_frames(total)
    g = model.diffusion_model
    architecture = {48: "Wan2.2 TI2V", 16: "Wan2.1"}.get(model.latent_channels, model.family.describe())
    chunks = result.chunks
    peak = max((c.cache_bytes for c in chunks), default=0)
    seconds = max(result.seconds, 1e-9)
    stats = dict(result.cache_stats)
    allocated = stats.pop("allocated_bytes", None)
    stats.pop("live_bytes", None)
    lines = [
        "FAST-AR long video report",
        f"model     : {architecture} dim {g.dim if hasattr(g, 'dim') else g.config.dim}, {len(g.blocks)} layers | "
        f"{str(model.dtype).replace('torch.', '')} on {model.device}",
        f"video     : {video_frames} frames = {total} latent frames"
        + (f" ({n_init} from the start image, {generated} generated)" if n_init else "")
        + f", {width}x{height}, {len(chunks)} chunk(s) of up to {settings.frames_per_block} latent frames",
        f"sampling  : {schedule_text} | mode {mode} | seed {settings.seed} | context noise {settings.context_noise}",
        f"prompts   : {prompts}",
        f"cache     : {engine.cache.describe()}{_matcher_ran(engine, model.device)} | peak live {mib(peak)}"
        + (f", allocated {mib(allocated)}" if allocated is not None else ""),
        f"FAST-AR   : {describe_fastar(engine)}",
        "",
        *chunk_lines(chunks),
        "",
        f"total     : {result.seconds:.2f} s, {generated / seconds:.2f} latent frames/s "
        f"({geometry.temporal * generated / seconds:.2f} video frames/s)",
        "cache end : " + ", ".join(f"{k} {_short(v)}" for k, v in stats.items()),
    ]
    lines += [f"note      : {n}" for n in notes]
    return "\n".join(lines)


def _short(value) -> str:
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"[{', '.join(str(v) for v in value[:3])}, ..., {value[-1]}]"
    return str(value)
