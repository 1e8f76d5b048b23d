"""Core's AR sampler and the pack's, side by side inside one real ComfyUI (0.21+, which has core's AR nodes).

Run it with the host's python in the ComfyUI folder, one thread, nothing else busy:

    cd <ComfyUI> && OMP_NUM_THREADS=1 ../venv/bin/python <pack>/tools/bench/comfyui_side_by_side.py <pack> OUT_DIR

Everything goes through the same guider, NOISE and SIGMAS (BasicScheduler simple, 4 steps) on the host's tiny
causal model (``tiny_wan_causal_ar_t2v.safetensors``, written by setup_comfyui.sh), as SamplerCustomAdvanced would:

- agreement: core's Sampler AR Video vs the pack's AR Video Sampler (FAST-AR) with the dense global cache, on one
  step (both see the same noise) and on four (they re-noise from different generators), with per-chunk mean and
  standard deviation, and the same statistics for the pack with another seed as the seed-to-seed yardstick;
- time: core, pack dense and pack FAST-AR (balanced preset, TempCache) in alternating rounds per size;
- FAST-AR vs dense latent PSNR, pooled over all generated frames (MSE first).

Writes OUT_DIR/comfyui_side_by_side.json and, where matplotlib is installed, comfyui_side_by_side.png
(``python -m comfyui_fastar.tools.bench.comfyui_side_by_side --plot OUT_DIR/comfyui_side_by_side.json`` draws it
later from any environment that has matplotlib).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

CAUSAL = "tiny_wan_causal_ar_t2v.safetensors"
FRAMES_PER_BLOCK = 3


def chunk_stats(latent, fpb=FRAMES_PER_BLOCK) -> list[dict]:
    out = []
    for start in range(0, latent.shape[2], fpb):
        piece = latent[:, :, start:start + fpb].float()
        out.append({"frames": [start, start + piece.shape[2]], "mean": float(piece.mean()), "std": float(piece.std())})
    return out


def psnr(reference, test) -> float:
    mse = float(((reference.float() - test.float()) ** 2).mean())
    peak = float(reference.float().abs().max())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def report_module():
    """tools/bench/report.py: relative inside the package; by its package name when run as a script by a host's
    python (main() has imported the checkout as ``comfyui_fastar`` by then)."""
    if __package__:
        from . import report
    else:
        from comfyui_fastar.tools.bench import report
    return report


def plot(json_path: Path) -> Path | None:
    line_plots = report_module().line_plots
    data = json.loads(json_path.read_text())
    four = data["agreement"]["four_steps"]
    chunks = list(range(len(four["core"])))
    series = {label: (chunks, [c["std"] for c in four[label]]) for label in ("core", "pack", "pack_other_seed")}
    sizes = sorted(data["timing"], key=int)
    timing = {mode: ([int(s) for s in sizes], [data["timing"][s]["median_s"][mode] for s in sizes])
              for mode in ("core", "pack_dense", "pack_fastar")}
    return line_plots(json_path.with_suffix(".png"), [
        {"title": "per-chunk std, 4 steps", "xlabel": "chunk", "ylabel": "latent std", "series": series},
        {"title": f"{data['latent_frames']} latent frames, 1 thread", "xlabel": "pixels per side",
         "ylabel": "seconds (median)", "series": timing},
    ], title="ComfyUI core SamplerARVideo vs the pack")


def main(pack: str, out_dir: str, sizes=(128, 256), rounds: int = 3, latent_frames: int = 61) -> Path:
    sys.path.insert(0, os.getcwd())
    sys.argv = [sys.argv[0], "--cpu"]
    from comfy.cli_args import args

    args.cpu = True
    import comfy.sample
    import comfy.samplers
    import comfy.sd
    import folder_paths
    import torch

    spec = importlib.util.spec_from_file_location("comfyui_fastar", os.path.join(pack, "__init__.py"),
                                                  submodule_search_locations=[pack])
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_fastar"] = module
    spec.loader.exec_module(module)
    from comfyui_fastar.nodes.node_attention import FastARAttentionPatch
    from comfyui_fastar.nodes.node_sampler_ar import SamplerARVideoFastAR
    machine, write_json = report_module().machine, report_module().write_json

    path = folder_paths.get_full_path("diffusion_models", CAUSAL)
    if path is None:
        raise SystemExit(f"no {CAUSAL} in models/diffusion_models: build the host with setup_comfyui.sh (0.21+)")
    model = comfy.sd.load_diffusion_model(path)
    fastar = FastARAttentionPatch().patch(model, preset="balanced")[0]
    g = torch.Generator().manual_seed(1)
    positive = [[torch.randn(1, 16, 4096, generator=g), {}]]
    negative = [[torch.zeros(1, 16, 4096), {}]]
    samplers = {
        "core": comfy.samplers.ksampler("ar_video", {"num_frame_per_block": FRAMES_PER_BLOCK}),
        "pack_dense": SamplerARVideoFastAR().get_sampler(frames_per_block=FRAMES_PER_BLOCK, cache_policy="global")[0],
        "pack_fastar": SamplerARVideoFastAR().get_sampler(frames_per_block=FRAMES_PER_BLOCK, cache_policy="auto")[0],
    }
    models = {"core": model, "pack_dense": model, "pack_fastar": fastar}

    def run(mode, frames, size, steps=4, seed=0):
        patcher = models[mode]
        latent = torch.zeros(1, 16, frames, size // 8, size // 8)
        guider = comfy.samplers.CFGGuider(patcher)
        guider.set_conds(positive, negative)
        guider.set_cfg(1.0)
        sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", steps).cpu()
        noise = comfy.sample.prepare_noise(latent, seed)
        start = time.perf_counter()
        with torch.no_grad():
            out = guider.sample(noise, latent, samplers[mode], sigmas, seed=seed).cpu()
        return out, time.perf_counter() - start

    agreement = {"one_step": {}, "four_steps": {}}
    core1, _ = run("core", 7, 32, steps=1, seed=5)
    pack1, _ = run("pack_dense", 7, 32, steps=1, seed=5)
    agreement["one_step"] = {"max_abs_diff": float((core1 - pack1).abs().max()), "max_abs": float(core1.abs().max())}
    core4, _ = run("core", 13, 32, seed=5)
    pack4, _ = run("pack_dense", 13, 32, seed=5)
    other4, _ = run("pack_dense", 13, 32, seed=6)
    agreement["four_steps"] = {"core": chunk_stats(core4), "pack": chunk_stats(pack4),
                               "pack_other_seed": chunk_stats(other4),
                               "max_abs_diff_core_vs_pack": float((core4 - pack4).abs().max()),
                               "max_abs_diff_pack_vs_other_seed": float((pack4 - other4).abs().max())}

    timing = {}
    for size in sizes:
        seconds = {mode: [] for mode in samplers}
        outputs = {}
        run("pack_fastar", 4, size)  # warm-up (first-call allocations, kernel choice)
        for r in range(rounds):
            order = list(samplers) if r % 2 == 0 else list(reversed(samplers))
            for mode in order:
                out, s = run(mode, latent_frames, size)
                seconds[mode].append(s)
                outputs[mode] = out
            print(f"size {size} round {r}: " + ", ".join(f"{m} {seconds[m][-1]:.2f} s" for m in samplers), flush=True)
        median = {m: sorted(v)[len(v) // 2] for m, v in seconds.items()}
        timing[str(size)] = {"seconds": seconds, "median_s": median,
                             "core_over_pack_dense": median["core"] / median["pack_dense"],
                             "core_over_pack_fastar": median["core"] / median["pack_fastar"],
                             "fastar_vs_dense_latent_psnr_db": psnr(outputs["pack_dense"], outputs["pack_fastar"])}

    out = Path(out_dir) / "comfyui_side_by_side.json"
    write_json(out, {"machine": machine(), "threads": torch.get_num_threads(), "model": CAUSAL,
                     "latent_frames": latent_frames, "frames_per_block": FRAMES_PER_BLOCK, "rounds": rounds,
                     "agreement": agreement, "timing": timing})
    print("wrote", out)
    plot(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":
        plot(Path(sys.argv[2]))
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit(__doc__)
