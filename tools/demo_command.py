"""``fastar demo``: the bundled demo model, one long video with FAST-AR and, for the same seed, dense.

Writes ``fastar.gif`` and ``dense.gif`` (and a side-by-side ``compare.gif``), ``stats.json`` and ``demo.png``
(seconds per chunk and cache memory against frame index, both modes), and prints a short table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from ..fastar_core.fastar.metrics import per_frame_psnr
from .bench.report import line_plots, mean, write_json
from .bench.rollout import run_mode
from .bench.scenarios import bench_modes, demo_scenario

DEFAULT_FRAMES = 240
UPSCALE = 4  # 24x24 demo frames are shown at 96x96


class ProgressBar:
    def __init__(self, total: int, label: str, width: int = 32, stream=sys.stderr):
        self.total, self.label, self.width, self.stream = total, label, width, stream
        self.start = time.perf_counter()
        self.done = 0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        filled = int(self.width * self.done / max(1, self.total))
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\r{self.label:8s} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{self.done}/{self.total} chunks {elapsed:6.1f}s {note}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")


def to_uint8_frames(latent: torch.Tensor, upscale: int = UPSCALE) -> torch.Tensor:
    """Demo latents are RGB in [-1, 1]: ``[1, 3, T, H, W]`` -> uint8 ``[T, H*s, W*s, 3]``."""
    x = ((latent[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    x = x.permute(1, 2, 3, 0)
    return x.repeat_interleave(upscale, dim=1).repeat_interleave(upscale, dim=2)


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
    chosen = {"fastar": modes["all"], "dense": modes["dense-global"]}
    chunks = -(-frames // scenario.frames_per_block)
    print(f"demo model, {frames} latent frames from a rendered start; prompt: {scenario.notes['prompt']!r}")
    # Warm-up so that the first timed chunks are not the allocator's.
    run_mode(scenario, *modes["dense-global"], frames=2 * scenario.frames_per_block, seed=seed)
    results = {}
    for name, (spec, fastar) in chosen.items():
        bar = ProgressBar(chunks, name)

        def tick(row, bar=bar):
            bar.update(note=f"cache {row['cache_bytes'] / 2**20:6.2f} MiB")

        result, rows = run_mode(scenario, spec, fastar, frames, seed, on_chunk=tick)
        bar.close()
        results[name] = (result, rows, fastar)

    start = scenario.initial_latents.shape[2]
    dense_latent = results["dense"][0].latent
    stats = {"frames": frames, "seed": seed, "prompt": scenario.notes["prompt"], "modes": {}}
    for name, (result, rows, fastar) in results.items():
        video = to_uint8_frames(result.latent)
        save_gif(video, out / f"{name}.gif")
        psnr = per_frame_psnr(result.latent[:, :, start:], dense_latent[:, :, start:], data_range=2.0)
        finite = [p for p in psnr if p != float("inf")]
        stats["modes"][name] = {
            "fastar": fastar.to_dict(), "chunks": rows,
            "summary": {"seconds_total": round(sum(r["seconds"] for r in rows), 3),
                        "seconds_last10_mean": round(mean([r["seconds"] for r in rows[-10:]]), 4),
                        "cache_bytes_max": max(r["cache_bytes"] for r in rows),
                        "psnr_vs_dense_mean": round(mean(finite), 3) if finite else None},
        }
    side = torch.cat([to_uint8_frames(results["dense"][0].latent), to_uint8_frames(results["fastar"][0].latent)],
                     dim=2)
    save_gif(side, out / "compare.gif")
    write_json(out / "stats.json", stats)
    line_plots(out / "demo.png", [
        {"title": "seconds per chunk", "xlabel": "latent frame", "ylabel": "s",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["seconds"] for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
        {"title": "KV cache", "xlabel": "latent frame", "ylabel": "MiB",
         "series": {n: ([r["frame_start"] for r in m["chunks"]], [r["cache_bytes"] / 2**20 for r in m["chunks"]])
                    for n, m in stats["modes"].items()}},
    ], title="fastar demo: FAST-AR against dense, same seed")

    d, f = stats["modes"]["dense"]["summary"], stats["modes"]["fastar"]["summary"]
    print(f"\n{'mode':8s} {'total s':>8s} {'s/chunk (last 10)':>18s} {'cache MiB':>10s} {'PSNR vs dense':>14s}")
    for name, s, psnr in (("dense", d, "-"), ("fastar", f, f"{f['psnr_vs_dense_mean']:.2f}")):
        print(f"{name:8s} {s['seconds_total']:8.2f} {s['seconds_last10_mean']:18.4f} "
              f"{s['cache_bytes_max'] / 2**20:10.2f} {psnr:>14s}")
    print(f"speedup {d['seconds_total'] / f['seconds_total']:.2f}x; wrote {out}/fastar.gif, dense.gif, compare.gif, "
          "stats.json, demo.png")
    return 0
