"""``fastar bench launches``: what one chunk of each cache mode asks a GPU to do, counted operator by operator.

Two parts, both on this machine, no GPU needed:

- **Counts at a scenario's shapes** (real data; ``op_count.OpCounter``): a rollout of each mode, counted chunk by
  chunk: kernel launches, host syncs (and where each comes from), operators whose output shape depends on data,
  bytes moved and matmul FLOPs. The steady chunk is the last one with a clean pass, once every bounded cache is
  full.
- **An H200 estimate at Wan2.1-1.3B's shapes** (480x832: 1,560 tokens per latent frame, 12 heads of 128, bf16,
  chunks of 3 frames, Self-Forcing's 4 steps and a clean pass): the same rollout traced under fake tensors (shapes
  without data, so a 30-layer model at full size costs no memory), started from committed frames so that the
  measured chunk sees a full cache (dense-global at ``global_frame``), each operator timed at an H200's limits
  (``op_count.DeviceLimits``, printed with the figures). A layer's share is the difference between traces of one
  and two layers, scaled to the model's 30.

It writes ``launches.json`` and ``launches.png``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from ...fastar_core.rollout.engine import build_sampler
from ...fastar_core.rollout.sampler import RolloutConfig
from .op_count import H200, OpCounter, estimate
from .report import machine, write_json
from .scenarios import SCENARIOS, Scenario, scenario_modes

# The modes the bench counts by default (``scenarios.bench_modes`` names).
MODES = ("dense-global", "dense-window", "dense-window-int8", "tempcache", "tempcache-quantized", "tempcache-exact",
         "tempcache-int8", "tempcache+annsa", "all", "all+forced-annsa")
ESTIMATE_MODES = ("dense-global", "dense-window", "tempcache", "tempcache-exact", "all", "all+forced-annsa")
WAN13B_LAYERS = 30
GLOBAL_FRAME = 750  # where dense-global's chunk is estimated (its cost grows with every frame)
FULL_FRAME = 24  # the first chunk that sees a full 21-frame cache (sink included) at chunks of 3


def count_rollout(scenario: Scenario, spec, fastar, frames: int, seed: int = 0, start_frames: int = 0,
                  counter: OpCounter | None = None, cond=None):
    """One rollout of ``scenario`` counted chunk by chunk: a list of ``OpTally``, one per chunk (the first holds
    the committing of ``start_frames`` given frames too). ``cond``: what it is conditioned on (default: the
    scenario's, for ``start_frames + frames``)."""
    runner = scenario.runner()
    sampler = build_sampler(runner, fastar.with_overrides(verify_kernels=False),
                            rope_max_distance=scenario.rope_max_distance)
    cfg = RolloutConfig(num_frames=frames, latent_height=scenario.latent_hw[0], latent_width=scenario.latent_hw[1],
                        frames_per_block=scenario.frames_per_block, schedule=scenario.schedule, seed=seed, cache=spec,
                        channels=scenario.channels, context_noise=scenario.context_noise)
    counter = counter or OpCounter()
    initial = scenario.initial_latents
    if start_frames:
        initial = torch.zeros(1, scenario.channels, start_frames, *scenario.latent_hw)

    def on_chunk(report):
        counter.mark()

    with counter.counting():
        with torch.no_grad():
            sampler.generate(cond if cond is not None else scenario.conditioning(start_frames + frames), cfg,
                             initial_latents=initial, callback=on_chunk)
    return counter.stretches[:-1]  # the last stretch is what ran after the final chunk's report


def steady_chunk(tallies: list):
    """The last chunk that commits (the final one takes no clean pass)."""
    return tallies[-2] if len(tallies) >= 2 else tallies[-1]


def _row(tally) -> dict:
    return tally.summary()


def wan13b_fake_scenario(layers: int) -> Scenario:
    """Wan2.1-1.3B at 480x832 as fake tensors (shapes only): bf16 weights, a 24-token prompt padded to 512."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ...fastar_core.model.wan_config import WanConfig
    from ...fastar_core.model.wan_model import WanModel

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    cfg = WanConfig(dim=1536, num_heads=12, num_layers=layers, ffn_dim=8960)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # weights made in bf16 (fake parameters cannot be converted after)
    try:
        with mode:
            model = WanModel(cfg)
            context = torch.zeros(1, 512, cfg.text_dim)
    finally:
        torch.set_default_dtype(default)
    scenario = Scenario(name="wan2.1-1.3b-480x832", model=model, context=context, latent_hw=(60, 104), channels=16,
                        schedule="self-forcing", quality=False, notes={"fake_mode": mode})
    return scenario


def as_on_cuda(spec):
    """The cache spec as CUDA resolves it: TempCache's "auto" matcher is the quantized one there."""
    settings = spec.tempcache
    return replace(spec, tempcache=replace(settings, matcher=settings.resolved_matcher("cuda")))


def _trace(name: str, layers: int, start: int, density: float):
    """One steady chunk of mode ``name`` traced under fake tensors at Wan2.1-1.3B's shapes with ``layers`` layers,
    after ``start`` committed frames. Attention runs as this machine's SDPA: one fused kernel, with the bias where
    there is one, as CUDA's ``auto`` runs it (our Triton kernel reads the bias)."""
    from unittest import mock

    from ...fastar_core.caches.tempcache import TempCache

    scenario = wan13b_fake_scenario(layers)
    spec, fastar = scenario_modes(scenario)[name]
    counter = OpCounter(assumed_block_density=density)
    # A fake report reads ones: TempCache keeps its host bound (the full capacity here, as the real mark is once
    # the cache is full) instead of a high-water mark of 1.
    with scenario.notes["fake_mode"], mock.patch.object(TempCache, "take_report", lambda self, figures: None):
        tallies = count_rollout(scenario, as_on_cuda(spec), fastar, frames=3 * scenario.frames_per_block,
                                start_frames=start, counter=counter)
    return tallies[1]  # the first generated chunk after the one that committed the start frames


def estimate_mode(name: str, layers_total: int = WAN13B_LAYERS, global_frame: int = GLOBAL_FRAME,
                  density: float = 0.5) -> dict:
    """The H200 estimate of one steady chunk of mode ``name`` at Wan2.1-1.3B's shapes (see the module docstring).
    A layer's share is the difference between one and two layers. dense-global's chunk at ``global_frame`` is
    extrapolated from chunks at frames 24 and 48: its cache only adds keys, so its bytes and FLOPs grow linearly
    and its operators stay the same."""
    def at(start):
        one, two = _trace(name, 1, start, density), _trace(name, 2, start, density)
        return one, two

    one, two = at(FULL_FRAME)
    est1, est2 = estimate(one), estimate(two)
    extra = layers_total - 1

    def scaled(a, b):
        return a + extra * (b - a)

    ms = scaled(est1["seconds"], est2["seconds"]) * 1e3
    nbytes, flops = scaled(one.bytes, two.bytes), scaled(one.flops, two.flops)
    frame = FULL_FRAME
    sites = {site: scaled(est1["top_sites_ms"].get(site, 0.0), est2["top_sites_ms"].get(site, 0.0))
             for site in set(est1["top_sites_ms"]) | set(est2["top_sites_ms"])}
    if name == "dense-global":
        later = at(2 * FULL_FRAME)
        e1, e2 = estimate(later[0]), estimate(later[1])
        growth = (global_frame - FULL_FRAME) / FULL_FRAME
        ms += growth * (scaled(e1["seconds"], e2["seconds"]) * 1e3 - ms)
        nbytes += growth * (scaled(later[0].bytes, later[1].bytes) - nbytes)
        flops += growth * (scaled(later[0].flops, later[1].flops) - flops)
        for site in sites:
            grown = scaled(e1["top_sites_ms"].get(site, 0.0), e2["top_sites_ms"].get(site, 0.0))
            sites[site] += growth * (grown - sites[site])
        frame = global_frame
    return {
        "ms_per_chunk": round(ms, 2),
        "launches": int(scaled(one.launches, two.launches)),
        "host_syncs": int(scaled(one.syncs, two.syncs)),
        "data_dependent_shapes": int(scaled(one.dynamic, two.dynamic)),
        "bytes": int(nbytes),
        "matmul_flops": flops,
        "sync_sites": two.sync_sites(),
        "top_sites_ms": {k: round(v, 2) for k, v in sorted(sites.items(), key=lambda kv: -kv[1])[:8]},
        "frame": frame,
    }


def annsa_block_density(seed: int = 0) -> float:
    """AnnSA's share of (query block, key block) pairs its layout lists at Wan2.1-1.3B's shapes, for one head of
    Gaussian queries and keys hashed as the balanced preset hashes them (6 bits, Hamming-1 probes), the sink and
    the chunk dense: what the estimate assumes for the sparse kernel under fake tensors (printed with it)."""
    from ...fastar_core.fastar.ann import LSHMatcher
    from ...kernels import build_sparse_layout

    tpf, chunk = 1560, 3
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, chunk * tpf, 128, generator=g)
    k = torch.randn(1, 1, (21 + chunk) * tpf, 128, generator=g)
    hasher = LSHMatcher(1, 128, bits=6, tables=1, seed=seed)
    layout = build_sparse_layout(hasher.codes(q)[..., 0], hasher.codes(k)[..., 0], n_dense=(3 + chunk) * tpf,
                                 block_q=64, block_k=64, radius=1, bits=6)
    return layout.block_density()


# The scenarios whose model the H200 estimate is about (Wan2.1-1.3B's block); others are counted only.
WAN_SCENARIOS = ("demo", "wan-shapes")


def run_launches_bench(out_dir, model: str = "wan-shapes", frames: int | None = None, modes=None, seed: int = 0,
                       estimate_modes=None, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    scenario = SCENARIOS[model](seed, "cpu")
    if estimate_modes is None:
        estimate_modes = ESTIMATE_MODES if model in WAN_SCENARIOS else ()
    all_modes = scenario_modes(scenario)
    names = [m for m in (modes or MODES) if m in all_modes]
    frames = frames or 11 * scenario.frames_per_block  # full caches from frame 24 on; the last chunk takes no pass
    counts = {}
    for name in names:
        start = time.perf_counter()
        spec, fastar = all_modes[name]
        tallies = count_rollout(scenario, spec, fastar, frames=frames, seed=seed)
        steady = steady_chunk(tallies)
        counts[name] = {"steady_chunk": _row(steady),
                        "per_chunk": [{"launches": t.launches, "host_syncs": t.syncs,
                                       "data_dependent_shapes": t.dynamic} for t in tallies]}
        if progress:
            print(f"counted {name:18s} {steady.launches:7d} launches {steady.syncs:5d} syncs {steady.dynamic:4d} "
                  f"data-dependent ({time.perf_counter() - start:.1f} s)", flush=True)
    estimates = {}
    density = annsa_block_density(seed) if estimate_modes else None
    for name in estimate_modes or ():
        if name not in all_modes:
            continue
        start = time.perf_counter()
        estimates[name] = estimate_mode(name, density=density)
        if progress:
            e = estimates[name]
            print(f"estimated {name:16s} {e['ms_per_chunk']:9.1f} ms {e['launches']:7d} launches {e['host_syncs']:5d} "
                  f"syncs ({time.perf_counter() - start:.1f} s)", flush=True)
    window = estimates.get("dense-window", {}).get("ms_per_chunk")
    for e in estimates.values():
        e["vs_window"] = round(e["ms_per_chunk"] / window, 4) if window else None
    window_launches = counts.get("dense-window", {}).get("steady_chunk", {}).get("launches")
    for c in counts.values():
        c["launches_vs_window"] = (round(c["steady_chunk"]["launches"] / window_launches, 4)
                                   if window_launches else None)
    report = {"benchmark": "launches", "machine": machine(), "scenario": model, "frames": frames,
              "frames_per_block": scenario.frames_per_block, "counts": counts,
              "estimate": {"device": H200.name, "shapes": "Wan2.1-1.3B 480x832, bf16, 30 layers, chunks of 3 frames, "
                           "4 denoising steps and a clean pass", "assumptions": H200.assumptions() + [
                               f"caches full (21 frames, sink 3; dense-global at frame {GLOBAL_FRAME}, extrapolated "
                               "linearly from frames 24 and 48); TempCache's matcher and attention with a bias as "
                               "CUDA's auto picks them (quantized; one kernel reading the bias)",
                               f"AnnSA's kernel visits {density:.3f} of the block pairs (a layout of Gaussian "
                               "queries and keys at these shapes)" if density is not None else "no AnnSA"],
                           "modes": estimates}}
    write_json(out_dir / "launches.json", report)
    plot_launches(out_dir / "launches.png", report)
    print_launches_table(report)
    return report


def print_launches_table(report: dict) -> None:
    print(f"\nsteady chunk at {report['scenario']} shapes (counted):")
    print(f"{'mode':18s} {'launches':>9s} {'vs window':>9s} {'syncs':>6s} {'data-dep.':>9s} {'MiB moved':>10s}")
    for name, c in report["counts"].items():
        s = c["steady_chunk"]
        ratio = c["launches_vs_window"]
        print(f"{name:18s} {s['launches']:9d} {ratio if ratio is not None else '-':>9} {s['host_syncs']:6d} "
              f"{s['data_dependent_shapes']:9d} {s['bytes'] / 2**20:10.1f}")
        if s["sync_sites"]:
            print("    syncs: " + ", ".join(f"{k} x{v}" for k, v in s["sync_sites"].items()))
    est = report["estimate"]
    if est["modes"]:
        print(f"\nestimate on an {est['device']} ({est['shapes']}):")
        for line in est["assumptions"]:
            print(f"  - {line}")
        print(f"{'mode':18s} {'ms/chunk':>9s} {'vs window':>9s} {'launches':>9s} {'syncs':>6s}")
        for name, e in est["modes"].items():
            print(f"{name:18s} {e['ms_per_chunk']:9.1f} {e['vs_window'] if e['vs_window'] is not None else '-':>9} "
                  f"{e['launches']:9d} {e['host_syncs']:6d}")
            print("    most time: " + ", ".join(f"{k} {v} ms" for k, v in list(e["top_sites_ms"].items())[:4]))


def plot_launches(path: Path, report: dict):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping", path.name)
        return None
    counts, est = report["counts"], report["estimate"]["modes"]
    panels = [("launches per steady chunk", {n: c["steady_chunk"]["launches"] for n, c in counts.items()}),
              ("host syncs per steady chunk", {n: c["steady_chunk"]["host_syncs"] for n, c in counts.items()})]
    if est:
        panels.append((f"est. {report['estimate']['device']} ms per chunk (1.3B)",
                       {n: e["ms_per_chunk"] for n, e in est.items()}))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, values) in zip(axes[0], panels):
        ax.barh(list(values), list(values.values()))
        ax.set_title(title)
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


