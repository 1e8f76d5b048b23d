"""``fastar calibrate``: per-layer AnnSA recall on a short rollout, and the layers worth sparsifying.

Every layer runs sparse (after the dense warm-up) while recall is measured on sampled queries; the layers
with the highest mean recall are kept sparse (the paper sparsifies about 70 % of blocks). The JSON it writes
is what ``FastARConfig(layers="auto", calibration=FILE)`` reads.
"""

from __future__ import annotations

from pathlib import Path

from ..fastar_core.forward.runner import CausalRunner
from ..fastar_core.rollout.engine import EngineSettings, build_sampler, resolve_settings
from ..fastar_core.rollout.sampler import RolloutConfig
from .outputs import strict_json


def calibrate_layers(model, context, latent_hw, channels, frames=24, schedule="self-forcing", initial_latents=None,
                     settings: EngineSettings | None = None, fraction=0.7, min_recall=None, rope_max_distance=None,
                     seed=0) -> dict:
    """``settings`` default: the balanced preset; AnnSA is forced on in every layer whatever they say."""
    runner = CausalRunner(model)
    settings = settings or resolve_settings(preset="balanced")
    spec = settings.cache
    fastar = settings.fastar.with_overrides(layers="all", annsa=True, annsa_min_keys=0)
    sampler = build_sampler(runner, fastar, measure=True, rope_max_distance=rope_max_distance)
    cfg = RolloutConfig(num_frames=frames, latent_height=latent_hw[0], latent_width=latent_hw[1], schedule=schedule,
                        seed=seed, cache=spec, channels=channels)
    sampler.generate(context, cfg, initial_latents=initial_latents)
    recall = {layer: sum(v) / len(v) for layer, v in sorted(runner.attention.layer_recall.items())}
    ranked = sorted(recall, key=recall.get, reverse=True)
    if min_recall is not None:
        chosen = [layer for layer in ranked if recall[layer] >= min_recall]
    else:
        chosen = ranked[: max(1, round(fraction * runner.num_layers))]
    return {"layers": sorted(chosen), "recall_per_layer": {str(k): round(v, 4) for k, v in recall.items()},
            "fraction": fraction, "min_recall": min_recall, "frames": frames, "bits": fastar.bits,
            "multiprobe": fastar.multiprobe}


def run_calibrate(args) -> int:
    if args.checkpoint:
        from ..fastar_core.files.wan_checkpoint import load_wan_model
        from .checks import random_conditioning
        from .generate import pick_device

        model, ckpt = load_wan_model(args.checkpoint, device=pick_device(None))
        result = calibrate_layers(model, random_conditioning(ckpt.config.text_dim, 0), (60, 104), ckpt.config.in_dim,
                                  frames=args.frames, fraction=args.fraction, min_recall=args.min_recall)
    else:
        from .bench.scenarios import demo_scenario

        s = demo_scenario()
        result = calibrate_layers(s.model, s.context, s.latent_hw, s.channels, frames=args.frames,
                                  schedule=s.schedule, initial_latents=s.initial_latents, fraction=args.fraction,
                                  min_recall=args.min_recall, rope_max_distance=s.rope_max_distance)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(strict_json(result))
    print(f"recall per layer: {result['recall_per_layer']}")
    print(f"sparse layers: {result['layers']} -> {out}")
    return 0
