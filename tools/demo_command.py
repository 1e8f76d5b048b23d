"""``fastar demo``: the bundled demo model, one long video with FAST-AR and, for the same seed, dense.

The two modes run chunk by chunk in turn, so that other work on the machine slows both alike and the printed
speedup compares like with like. Writes ``fastar.gif`` and ``dense.gif`` (and a side-by-side ``compare.gif``),
``stats.json`` and ``demo.png`` (seconds per chunk and cache memory against frame index, both modes, and FAST-AR's
per-frame PSNR), and prints a short table with the pooled PSNR and mean SSIM against dense.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import torch

from ..fastar_core.fastar.metrics import video_quality
from .bench.report import line_plots, mean, write_json
from .bench.rollout import timed_rollouts
from .bench.scenarios import bench_modes, demo_scenario

DEFAULT_FRAMES = 240
UPSCALE = 4  # 24x24 demo frames are shown at 96x96
PSNR_CAP_DB = 60.0  # frames identical to dense score ~140 dB (float noise); the plot caps them so the rest shows


def to_uint8_frames(latent: torch.Tensor, upscale: int = UPSCALE) -> torch.Tensor:
    """Demo latents are RGB in [-1, 1]: ``[1, 3, T, H, W]`` -> uint8 ``[T, H*s, W*s, 3]``."""
    x = ((latent[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    x = x.permute(1, 2, 3, 0)
    return x.repeat_interleave(upscale, dim=1).repeat_interleave(upscale, dim=2)


def labelled_side_by_side(videos: dict, upscale: int = UPSCALE, header: int = 14) -> torch.Tensor:
    """Videos ``name -> [T, 3, H, W]`` in [-1, 1] side by side, each pane under its name: uint8 ``[T, header + H*s,
    n * (W*s + gap) - gap, 3]``."""
    from PIL import Image, ImageDraw

    panes = [to_uint8_frames(v.permute(1, 0, 2, 3)[None], upscale) for v in videos.values()]
    T, H, W, _ = panes[0].shape
    gap = 2
    width = len(panes) * (W + gap) - gap
    label = Image.new("RGB", (width, header), (24, 24, 24))
    draw = ImageDraw.Draw(label)
    for i, name in enumerate(videos):
        draw.text((i * (W + gap) + 3, 2), name, fill=(235, 235, 235))
    top = torch.from_numpy(np.asarray(label).copy())[None].expand(T, -1, -1, -1)
    spacer = torch.full((T, H, gap, 3), 24, dtype=torch.uint8)
    row = [p for pane in panes for p in (pane, spacer)][:-1]
    return torch.cat([top, torch.cat(row, dim=2)], dim=1)


def save_gif(frames: torch.Tensor, path: Path, fps: int = 16) -> Path:
    from PIL import Image

    images = [Image.fromarray(f.numpy()) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path


def run_demo(out: Path, frames: int | None = None, seed: int = 0) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frames = frames or DEFAULT_FRAMES
    scenario = demo_scenario(seed)
    modes = bench_modes()
    chosen = {"dense": modes["dense-global"], "fastar": modes["all"]}
    print(f"demo model, {frames} latent frames from a rendered start; prompt: {scenario.notes['prompt']!r}")
    print("FAST-AR and dense run chunk by chunk in turn, so that other work on the machine slows both alike")
    results, per_mode = timed_rollouts(scenario, chosen, frames, seed, repeats=1, progress=True)

    start = scenario.initial_latents.shape[2]
    dense_latent = results["dense"].latent
    stats = {"frames": frames, "seed": seed, "prompt": scenario.notes["prompt"], "modes": {},
             "timing": "modes run chunk by chunk in turn (the order rotating every round); seconds (wall) and "
                       "cpu_seconds (the process's CPU time while the mode held the turn) exclude the wait"}
    for name, m in per_mode.items():
        rows = m["chunks"]
        save_gif(to_uint8_frames(results[name].latent), out / f"{name}.gif")
        quality = video_quality(results[name].latent, dense_latent, start, data_range=2.0)
        stats["modes"][name] = {
            "fastar": m["fastar"], "chunks": rows, "quality": quality.to_dict(),
            "summary": {"seconds_total": round(sum(r["seconds"] for r in rows), 3),
                        "cpu_seconds_total": round(sum(r["cpu_seconds"] for r in rows), 3),
                        "seconds_last10_mean": round(mean([r["seconds"] for r in rows[-10:]]), 4),
                        "cache_bytes_max": max(r["cache_bytes"] for r in rows),
                        "psnr_vs_dense_db": quality.to_dict(curves=False)["psnr_db"],
                        "ssim_vs_dense": round(quality.ssim, 4)},
        }
    d, f = stats["modes"]["dense"]["summary"], stats["modes"]["fastar"]["summary"]
    ratios = [a["cpu_seconds"] / b["cpu_seconds"]
              for a, b in zip(per_mode["dense"]["chunks"], per_mode["fastar"]["chunks"])]
    # CPU time is the headline: other processes stretch wall time (and the wall ratio with it), not CPU time.
    stats["speedup"] = {"cpu_total": round(d["cpu_seconds_total"] / f["cpu_seconds_total"], 3),
                        "wall_total": round(d["seconds_total"] / f["seconds_total"], 3),
                        "median_chunk_cpu_ratio_last10": round(statistics.median(ratios[-10:]), 3)}
    side = labelled_side_by_side({name: results[name].latent[0].permute(1, 0, 2, 3) for name in ("dense", "fastar")})
    save_gif(side, out / "compare.gif")
    write_json(out / "stats.json", stats)
    line_plots(out / "demo.png", [
        {"title": "CPU seconds per chunk (holds still under load)", "xlabel": "latent frame", "ylabel": "CPU s",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["cpu_seconds"] for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": "wall seconds per chunk", "xlabel": "latent frame", "ylabel": "s",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["seconds"] for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": "KV cache", "xlabel": "latent frame", "ylabel": "MiB",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["cache_bytes"] / 2**20 for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": f"FAST-AR vs dense, PSNR per frame ({PSNR_CAP_DB:.0f} = identical)",
         "xlabel": "latent frame", "ylabel": "dB",
         "series": {"fastar": (list(range(start, start + frames)),
                               [PSNR_CAP_DB if p is None else min(p, PSNR_CAP_DB)
                                for p in stats["modes"]["fastar"]["quality"]["per_frame_psnr_db"]])}},
    ], title="fastar demo: FAST-AR against dense, same seed")

    print(f"\n{'mode':8s} {'CPU s':>8s} {'wall s':>8s} {'s/chunk (last 10)':>18s} {'cache MiB':>10s} "
          f"{'PSNR dB':>8s} {'SSIM':>6s}")
    for name, s in (("dense", d), ("fastar", f)):
        psnr = "ref." if name == "dense" else _db(s["psnr_vs_dense_db"])
        ssim = "ref." if name == "dense" else f"{s['ssim_vs_dense']:.3f}"
        print(f"{name:8s} {s['cpu_seconds_total']:8.2f} {s['seconds_total']:8.2f} {s['seconds_last10_mean']:18.4f} "
              f"{s['cache_bytes_max'] / 2**20:10.2f} {psnr:>8s} {ssim:>6s}")
    print(f"PSNR pooled over the {frames} generated frames, SSIM their mean, both against dense")
    sp = stats["speedup"]
    print(f"speedup {sp['cpu_total']:.2f}x by CPU time (each mode's own, which other load does not stretch; "
          f"median chunk ratio over the last 10 chunks {sp['median_chunk_cpu_ratio_last10']:.2f}x); by wall time "
          f"{sp['wall_total']:.2f}x; wrote {out}/fastar.gif, dense.gif, compare.gif, stats.json, demo.png")
    return 0


def _db(x) -> str:
    return "identical" if x is None else f"{x:.2f}"
