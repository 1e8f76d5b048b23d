"""``fastar bench cost-model``: what a bounded cache can save, from the model's shapes alone (``flops.py``
counts them), as tables per model and cache length, with the sequence-parallel table of ``cost_parallel.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .flops import (  # noqa: F401 - the shapes and counts are this module's API too
    LONGLIVE2_5B,
    LONGLIVE2_GRID,
    LONGLIVE2_MODES,
    LONGLIVE2_PROMPT_TOKENS,
    PARTS,
    WAN_1_3B,
    WAN_14B,
    CacheCost,
    ModelShape,
    mode_speedup,
    modelled_speedup,
    pass_flops,
    real_prompt_tokens,
    rollout_flops,
    shape_of_scenario,
    video_to_latent_frames,
)
from .report import line_plots, write_json

VIDEO_FRAMES = (81, 241, 481, 961, 1921, 3001)


def cost_table(s: ModelShape, latent_lengths, capacity_frames: int = 21) -> list[dict]:
    rows = []
    for frames in latent_lengths:
        dense = rollout_flops(s, frames)
        shares = {k: round(v / dense["total"], 4) for k, v in dense["parts"].items()}
        rows.append({
            "latent_frames": frames, "video_frames": 4 * (frames - 1) + 1,
            "dense_global_flops": float(f"{dense['total']:.4g}"),
            "dense_global_shares": shares,
            "speedup_limit": round(modelled_speedup(s, frames, CacheCost.bounded(0)), 3),
            f"speedup_window_{capacity_frames}": round(
                modelled_speedup(s, frames, CacheCost.bounded(capacity_frames)), 3),
            f"speedup_tempcache_{capacity_frames}": round(
                modelled_speedup(s, frames, CacheCost.bounded(capacity_frames, tempcache=True)), 3),
        })
    return rows


def longlive2_modes() -> dict:
    """The rollout bench's modes at LongLive 2.0's sizes: dense-window is its own cache (window 32 with the chunk,
    sink 8: 24 frames cached), TempCache holds as many frames' worth of groups, sink 8."""
    from .scenarios import LONGLIVE2_CHUNK, LONGLIVE2_SINK, LONGLIVE2_WINDOW, bench_modes

    modes = bench_modes(capacity=LONGLIVE2_WINDOW - LONGLIVE2_CHUNK, sink=LONGLIVE2_SINK, chunk=LONGLIVE2_CHUNK)
    return {name: modes[name] for name in LONGLIVE2_MODES}


def cache_bytes(s: ModelShape, grid_hw: tuple, spec, frames: int, dtype=None) -> int:
    """Bytes a cache policy allocates for a rollout of ``frames`` latent frames at ``s`` (bf16 by default), as the
    policy class plans them (the number ``fastar generate``'s memory check uses)."""
    import torch

    from ...fastar_core.caches.base import CacheShape

    shape = CacheShape(num_layers=s.layers, batch=1, num_heads=s.heads, head_dim=s.dim // s.heads, grid_hw=grid_hw,
                       dtype=dtype or torch.bfloat16, frames_per_block=s.frames_per_block)
    return spec.policy_class.planned_bytes(spec, shape, frames)


def longlive2_table(s: ModelShape = LONGLIVE2_5B, grid_hw: tuple = LONGLIVE2_GRID, video_lengths=VIDEO_FRAMES,
                    prompt_tokens: int = LONGLIVE2_PROMPT_TOKENS) -> list[dict]:
    """Per video length: each mode's modelled speedup over dense-global and over LongLive 2.0's own window, and
    the cache bytes it allocates (bf16)."""
    modes = longlive2_modes()
    rows = []
    for video in video_lengths:
        frames = video_to_latent_frames(video)
        flops = {name: rollout_flops(s, frames, CacheCost.of(spec, s.frames_per_block),
                                     text_tokens=prompt_tokens + 1 if fastar.annca else None)["total"]
                 for name, (spec, fastar) in modes.items()}
        rows.append({
            "video_frames": video, "latent_frames": frames,
            "flops": {k: float(f"{v:.6g}") for k, v in flops.items()},
            "speedup_vs_dense_global": {k: round(flops["dense-global"] / v, 3) for k, v in flops.items()},
            "speedup_vs_longlive2_window": {k: round(flops["dense-window"] / v, 4) for k, v in flops.items()},
            "cache_gib": {name: round(cache_bytes(s, grid_hw, spec, frames) / 2**30, 3)
                          for name, (spec, _) in modes.items()},
        })
    return rows


# LingBot-World 2.0 (generate.py as run_fast.sh runs it): chunks of 4 latent frames, 4 steps and a clean pass, a
# window of 18 latent frames with a 6-frame sink, UMT5's 512 prompt tokens, the camera in every block; at 480x832
# (60x104 latents: 1,560 tokens per frame) and 720x1280 (90x160: 3,600).
LINGBOT_SIZES = {"1.3B": (1536, 12, 30, 8960), "14B": (5120, 40, 40, 13824)}
LINGBOT_RESOLUTIONS = {"480x832": (30, 52), "720x1280": (45, 80)}  # token grid
LINGBOT_WINDOW, LINGBOT_SINK, LINGBOT_CHUNK = 18, 6, 4
CARDS_GB = (8, 16, 24)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "4-bit": 0.5625}  # per parameter (4-bit: GGUF Q4_K's 4.5 bits)


def lingbot_shape(size: str, resolution: str) -> ModelShape:
    dim, heads, layers, ffn = LINGBOT_SIZES[size]
    gh, gw = LINGBOT_RESOLUTIONS[resolution]
    return ModelShape(f"LingBot-World 2.0 {size} {resolution}", dim=dim, heads=heads, layers=layers, ffn=ffn,
                      tokens_per_frame=gh * gw, text_tokens=512, frames_per_block=LINGBOT_CHUNK, steps=4,
                      camera_layers=4, camera_inputs=1536)


def lingbot_parameters(size: str) -> int:
    import torch

    from ...fastar_core.families.lingbot.config import LingBotConfig
    from ...fastar_core.families.lingbot.model import LingBotModel

    dim, heads, layers, ffn = LINGBOT_SIZES[size]
    with torch.device("meta"):
        model = LingBotModel(LingBotConfig(dim=dim, num_heads=heads, num_layers=layers, ffn_dim=ffn))
    return sum(p.numel() for p in model.parameters())


def lingbot_modes() -> dict:
    """The cache of the release (its window 18 with a 6-frame sink; the pack caches 14 of those frames, the chunk's
    own 4 being the pass's keys), as int8, and TempCache holding the same 14 frames' worth and half of it."""
    from ...fastar_core.caches.spec import CacheSpec, TempCacheSettings

    window = CacheSpec(policy="window", window_frames=LINGBOT_WINDOW, sink_frames=LINGBOT_SINK)
    cached = LINGBOT_WINDOW - LINGBOT_CHUNK
    return {
        "window": window,
        "window-int8": replace(window, kv_quant="int8"),
        "tempcache": CacheSpec(policy="tempcache", sink_frames=LINGBOT_SINK,
                               tempcache=TempCacheSettings(capacity_frames=cached)),
        "tempcache-half": CacheSpec(policy="tempcache", sink_frames=LINGBOT_SINK // 2,
                                    tempcache=TempCacheSettings(capacity_frames=cached // 2)),
    }


def lingbot_table(video_frames: int = 961) -> list[dict]:
    """Per size and resolution: the release's KV buffer (18 frames of K and V in bf16: the "21 GB" figure), each
    mode's cache as the pack allocates it, FLOPs per chunk and over ``video_frames``, and which cards hold the
    weights (bf16, fp8, 4-bit), the cache and one chunk's activations."""
    frames = video_to_latent_frames(video_frames)
    rows = []
    for size in LINGBOT_SIZES:
        params = lingbot_parameters(size)
        for resolution, grid in LINGBOT_RESOLUTIONS.items():
            s = lingbot_shape(size, resolution)
            per_frame = 2 * s.layers * s.tokens_per_frame * s.dim * 2  # K and V, bf16
            modes = lingbot_modes()
            cache = {name: cache_bytes(s, grid, spec, frames) for name, spec in modes.items()}
            # One chunk's activations in bf16: hidden states, the FFN's, q k v and attention's output (a floor).
            activations = LINGBOT_CHUNK * s.tokens_per_frame * (s.ffn + 8 * s.dim) * 2
            flops = {name: rollout_flops(s, frames, CacheCost.of(spec, s.frames_per_block)) for name, spec in
                     modes.items()}
            dense = rollout_flops(s, frames)
            fits = {}
            for weights, per_param in WEIGHT_BYTES.items():
                need = {name: params * per_param + b + activations for name, b in cache.items()}
                fits[weights] = {name: [gb for gb in CARDS_GB if n <= gb * 10**9] for name, n in need.items()}
            rows.append({
                "size": size, "resolution": resolution, "tokens_per_frame": s.tokens_per_frame, "parameters": params,
                "keys_per_head_attended": LINGBOT_WINDOW * s.tokens_per_frame,
                "kv_gib_per_latent_frame": round(per_frame / 2**30, 3),
                "release_buffer_gib": round(LINGBOT_WINDOW * per_frame / 2**30, 2),
                "release_buffer_gb": round(LINGBOT_WINDOW * per_frame / 1e9, 2),
                "cache_gib": {k: round(v / 2**30, 2) for k, v in cache.items()},
                "activations_gib": round(activations / 2**30, 2),
                "weights_gib": {k: round(params * v / 2**30, 2) for k, v in WEIGHT_BYTES.items()},
                "tflops_per_chunk": {k: round(v["per_chunk"][-2] / 1e12, 1) for k, v in flops.items()},
                "speedup_vs_dense_global": {k: round(dense["total"] / v["total"], 2) for k, v in flops.items()},
                "camera_share": round(flops["window"]["parts"]["camera"] / flops["window"]["total"], 4),
                "fits_cards_gb": fits,
            })
    return rows


def print_lingbot(section: dict) -> None:
    modes = ("window", "window-int8", "tempcache", "tempcache-half")
    print(f"\nLingBot-World 2.0, window {LINGBOT_WINDOW} with a {LINGBOT_SINK}-frame sink, chunks of {LINGBOT_CHUNK}, "
          f"{section['video_frames']} video frames. Cache GiB; the smallest of the {'/'.join(map(str, CARDS_GB))} GB "
          "cards holding weights + cache + one chunk's activations, per mode (window / int8 / tempcache / half), "
          "with the weights in bf16, fp8, 4-bit")
    print(f"{'model':14s} {'release':>14s} {'window':>7s} {'int8':>6s} {'temp':>6s} {'half':>6s} {'params':>7s} "
          f"{'TFLOP/chunk':>11s}  {'bf16':>11s} {'fp8':>11s} {'4-bit':>11s}")
    for r in section["rows"]:
        c = r["cache_gib"]
        cards = []
        for weights in WEIGHT_BYTES:
            smallest = [min(r["fits_cards_gb"][weights][m], default=None) for m in modes]
            cards.append("/".join("-" if g is None else str(g) for g in smallest))
        release = f"{r['release_buffer_gib']:.2f} ({r['release_buffer_gb']:.1f} GB)"
        print(f"{r['size'] + ' ' + r['resolution']:14s} {release:>14s} {c['window']:7.2f} {c['window-int8']:6.2f} "
              f"{c['tempcache']:6.2f} {c['tempcache-half']:6.2f} {r['parameters'] / 1e9:6.1f}B "
              f"{r['tflops_per_chunk']['window']:11.1f}  " + " ".join(f"{x:>11s}" for x in cards))


LONGLIVE2_CPU_FRAMES = (24, 48, 96)  # latent frames: one, two and three windows


def longlive2_cpu_rows(scenario) -> dict:
    shape = shape_of_scenario(scenario)
    grid = (scenario.latent_hw[0] // 2, scenario.latent_hw[1] // 2)
    videos = [4 * (f - 1) + 1 for f in LONGLIVE2_CPU_FRAMES]
    return {"shape": shape.to_dict(), "grid_hw": list(grid),
            "rows": longlive2_table(shape, grid, videos, prompt_tokens=real_prompt_tokens(scenario.context) - 1)}


def run_cost_model(out_dir, cpu_frames: int = 240, capacity_frames: int = 21) -> dict:
    from .scenarios import demo_scenario, longlive2_scenario, wan_shapes_scenario

    out_dir = Path(out_dir)
    lengths = [video_to_latent_frames(v) for v in VIDEO_FRAMES]
    models = {}
    for shape in (WAN_1_3B, WAN_14B):
        models[shape.name] = {"shape": shape.to_dict(), "rows": cost_table(shape, lengths, capacity_frames)}
    for scenario in (demo_scenario(0), wan_shapes_scenario(0)):
        shape = shape_of_scenario(scenario)
        cpu_lengths = sorted({min(cpu_frames, x) for x in (21, 60, 120, cpu_frames)})
        models[f"{shape.name} (CPU bench)"] = {"shape": shape.to_dict(),
                                               "rows": cost_table(shape, cpu_lengths, capacity_frames)}
    report = {"benchmark": "cost-model", "capacity_frames": capacity_frames, "models": models,
              "definitions": {
                  "speedup_limit": "dense-global FLOPs / FLOPs with no cache at all: no bounded cache can beat it",
                  f"speedup_window_{capacity_frames}": f"dense-global / a dense cache of {capacity_frames} frames",
                  f"speedup_tempcache_{capacity_frames}": "the same plus TempCache's matching at each clean pass",
                  "dense_global_shares": "share of dense-global's FLOPs by part",
                  "counted": "matmul FLOPs of the transformer (see tools/bench/cost_model.py)"}}
    from .cost_parallel import parallel_report, print_parallel

    report["sequence_parallel"] = parallel_report(capacity_frames=capacity_frames)
    report["longlive2"] = {
        "shape": LONGLIVE2_5B.to_dict(), "grid_hw": list(LONGLIVE2_GRID), "window_frames": 32, "sink_frames": 8,
        "prompt_tokens_for_annca": LONGLIVE2_PROMPT_TOKENS, "cache_dtype": "bfloat16",
        "modes": {name: {"cache": spec.describe(), "fastar": fastar.to_dict()}
                  for name, (spec, fastar) in longlive2_modes().items()},
        "rows": longlive2_table(),
        # the rollout bench's reduced shapes (--scenario longlive2-5b on a CPU), at the 96 latent frames it is run at
        "cpu_bench": longlive2_cpu_rows(longlive2_scenario(0)),
        "definitions": {
            "dense-window": "LongLive 2.0's own cache: the sink and the most recent frames, 32 with the chunk",
            "tempcache": "FAST-AR's TempCache holding as many frames' worth of groups (24), sink 8",
            "all": f"TempCache with AnnSA (counted dense) and AnnCA's pad merge ({LONGLIVE2_PROMPT_TOKENS} real "
                   "prompt tokens + 1 merged pad key)",
            "cache_gib": "bytes the policy allocates for the rollout (K and V in bf16 with their positions; "
                         "TempCache's groups with their counts and positions)"}}
    report["lingbot"] = {
        "video_frames": 961, "window_frames": LINGBOT_WINDOW, "sink_frames": LINGBOT_SINK,
        "frames_per_block": LINGBOT_CHUNK, "modes": {k: v.describe() for k, v in lingbot_modes().items()},
        "rows": lingbot_table(961),
        "definitions": {
            "release_buffer_gib": "the release's self-attention cache: local_attn_size (18) latent frames of K and V "
                                  "in bf16 for every layer (its kv_size = 18 x tokens per frame)",
            "cache_gib": "what the pack allocates for each mode (K and V in bf16 or int8 with their positions; the "
                         "window caches 14 frames, the chunk's own 4 being the pass's keys)",
            "keys_per_head_attended": "keys each query head attends to with the window full: 18 frames",
            "fits_cards_gb": "cards (GB) whose memory holds the weights at that precision, the mode's cache and one "
                             "chunk's activations (bf16); T5 and the VAE not counted (the release can keep T5 on "
                             "the CPU; the VAE decodes between chunks)",
            "camera_share": "share of the window mode's FLOPs in the camera layers",
        }}
    write_json(out_dir / "cost_model.json", report)
    series_speed, series_share = {}, {}
    for name, m in models.items():
        if "CPU" in name:
            continue
        xs = [r["video_frames"] for r in m["rows"]]
        series_speed[f"{name}: limit"] = (xs, [r["speedup_limit"] for r in m["rows"]])
        series_speed[f"{name}: {capacity_frames}-frame cache"] = (
            xs, [r[f"speedup_window_{capacity_frames}"] for r in m["rows"]])
        series_share[name] = (xs, [r["dense_global_shares"]["self_attention"] for r in m["rows"]])
    line_plots(out_dir / "cost_model.png", [
        {"title": "modelled end-to-end speedup over dense-global", "xlabel": "video frames", "ylabel": "x",
         "series": series_speed},
        {"title": "self-attention share of dense-global FLOPs", "xlabel": "video frames", "ylabel": "share",
         "series": series_share},
    ], title="cost model (matmul FLOPs), Self-Forcing schedule")
    ll2 = report["longlive2"]["rows"]
    xs = [r["video_frames"] for r in ll2]
    line_plots(out_dir / "cost_model_longlive2.png", [
        {"title": "modelled speedup over dense-global", "xlabel": "video frames", "ylabel": "x",
         "series": {m: (xs, [r["speedup_vs_dense_global"][m] for r in ll2]) for m in LONGLIVE2_MODES}},
        {"title": "KV cache allocated (bf16)", "xlabel": "video frames", "ylabel": "GiB",
         "series": {m: (xs, [r["cache_gib"][m] for r in ll2]) for m in LONGLIVE2_MODES}},
    ], title="LongLive 2.0 (Wan2.2-TI2V-5B) 704x1280, blocks of 8, window 32 sink 8")
    print_cost_model(report)
    print_longlive2(report["longlive2"])
    print_lingbot(report["lingbot"])
    print_parallel(report["sequence_parallel"])
    return report


def print_longlive2(section: dict) -> None:
    print(f"\n{section['shape']['name']}: modelled speedup over dense-global (over LongLive 2.0's window) and "
          "cache allocated, bf16")
    print(f"{'video fr':>8s} {'latent fr':>9s} " + " ".join(f"{m:>26s}" for m in LONGLIVE2_MODES))
    for r in section["rows"]:
        cells = [f"{r['speedup_vs_dense_global'][m]:6.2f}x ({r['speedup_vs_longlive2_window'][m]:5.3f}) "
                 f"{r['cache_gib'][m]:7.2f} GiB" for m in LONGLIVE2_MODES]
        print(f"{r['video_frames']:8d} {r['latent_frames']:9d} " + " ".join(f"{c:>26s}" for c in cells))


def print_cost_model(report: dict) -> None:
    c = report["capacity_frames"]
    for name, m in report["models"].items():
        print(f"\n{name}" + ("" if "CPU" in name else " (video frames = 4 x (latent frames - 1) + 1)"))
        print(f"{'video fr':>8s} {'latent fr':>9s} {'dense FLOP':>11s} {'self-attn share':>15s} {'limit':>7s} "
              f"{f'{c}-fr cache':>11s} {'tempcache':>9s}")
        for r in m["rows"]:
            video = "-" if "CPU" in name else str(r["video_frames"])  # CPU models' frames are latent frames only
            print(f"{video:>8s} {r['latent_frames']:9d} {r['dense_global_flops']:11.3g} "
                  f"{r['dense_global_shares']['self_attention']:15.3f} {r['speedup_limit']:7.2f} "
                  f"{r[f'speedup_window_{c}']:11.2f} {r[f'speedup_tempcache_{c}']:9.2f}")
