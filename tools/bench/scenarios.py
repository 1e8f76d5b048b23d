"""What a rollout benchmark runs on: the bundled demo model, random weights at Wan-1.3B attention shapes, random
weights at Wan2.2-TI2V-5B shapes with LongLive 2.0's rollout (its UniPC schedule, blocks of 8, window 32, sink 8), or
random weights at LingBot-World 2.0's shapes with its rollout (blocks of 4, window 18 with a 6-frame sink, a camera
path from a key timeline)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...fastar_core.families import longlive2
from ...fastar_core.model.wan_config import WanConfig
from ...fastar_core.model.wan_model import random_wan
from ...fastar_core.rollout.engine import resolve_settings


@dataclass
class Scenario:
    name: str
    model: torch.nn.Module
    context: torch.Tensor  # [1, L, text_dim]
    latent_hw: tuple
    channels: int
    schedule: object
    frames_per_block: int = 3
    initial_latents: torch.Tensor | None = None
    rope_max_distance: int | None = None
    context_noise: float = 0.0
    quality: bool = True  # False for random weights: quality figures would mean nothing
    notes: dict = field(default_factory=dict)
    # The bench modes' shared sizes (bench_modes): frames cached beside the chunk, sink included, and the sink.
    capacity_frames: int = 21
    sink_frames: int = 3
    make_runner: object = None  # () -> a CausalRunner of the model (a conditioned one); None: a plain runner
    # frames -> the rollout's Conditioning, for a family conditioned on more than the prompt (``context`` stays
    # the prompt, which the cost model counts); None: the prompt alone
    make_conditioning: object = None

    def conditioning(self, frames: int):
        """What a rollout of ``frames`` latent frames is conditioned on."""
        return self.make_conditioning(frames) if self.make_conditioning is not None else self.context

    def runner(self):
        from ...fastar_core.forward.runner import CausalRunner

        return self.make_runner() if self.make_runner is not None else CausalRunner(self.model)


def demo_scenario(seed: int = 0, device="cpu") -> Scenario:
    from ..demo.bundled import load_demo_model, render_start

    demo = load_demo_model(device=device)
    start = render_start(demo, seed, long_prompt=True)
    return Scenario(
        name="demo", model=demo.model, context=demo.encode_prompt(start.prompt), latent_hw=demo.frame_size,
        channels=demo.channels, schedule=demo.schedule, frames_per_block=demo.frames_per_block,
        initial_latents=start.latents, rope_max_distance=demo.rope_max_distance, context_noise=demo.context_noise,
        notes={"prompt": start.prompt, "start_frames": start.latents.shape[2]},
    )


def random_weights(cfg: WanConfig, seed: int, device):
    """A random model of ``cfg`` (bfloat16 on CUDA, float32 elsewhere) and a 24-token prompt padded to 512, as the
    shape benches use them: speed and memory only."""
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    model = random_wan(cfg, seed=seed, dtype=dtype).to(device)
    g = torch.Generator().manual_seed(seed)
    context = torch.zeros(1, 512, cfg.text_dim)
    context[:, :24] = torch.randn(1, 24, cfg.text_dim, generator=g) * 0.2
    return model, context, dtype


def wan_shapes_scenario(seed: int = 0, device="cpu", heads: int | None = None, layers: int | None = None,
                        latent_hw=None) -> Scenario:
    """Random weights with Wan-1.3B's attention geometry (head_dim 128, hundreds of tokens per frame).

    On a CPU the head and layer counts shrink (2 heads, 2 layers, 240 tokens per frame) so that attention still
    dominates, as it does in the real model at long lengths.
    """
    cuda = torch.device(device).type == "cuda"
    heads = heads or (12 if cuda else 2)
    layers = layers or (30 if cuda else 2)
    latent_hw = latent_hw or ((60, 104) if cuda else (24, 40))
    cfg = WanConfig(dim=128 * heads, num_heads=heads, num_layers=layers, ffn_dim=(8960 if cuda else 4 * 128 * heads))
    model, context, dtype = random_weights(cfg, seed, device)
    tpf = (latent_hw[0] // 2) * (latent_hw[1] // 2)
    return Scenario(name="wan-shapes", model=model, context=context, latent_hw=latent_hw, channels=16,
                    schedule="self-forcing", quality=False,
                    notes={"config": cfg.to_dict(), "tokens_per_frame": tpf, "dtype": str(dtype)})


# LongLive 2.0 (configs/inference.yaml): chunks of 8 latent frames, local_attn_size 32 (the chunk included), sink 8:
# its family's own cache.
LONGLIVE2_CHUNK = longlive2.FRAMES_PER_BLOCK
LONGLIVE2_WINDOW = longlive2.WINDOW_FRAMES
LONGLIVE2_SINK = longlive2.SINK_FRAMES


def longlive2_scenario(seed: int = 0, device="cpu", heads: int | None = None, layers: int | None = None,
                       latent_hw=None) -> Scenario:
    """Random weights at Wan2.2-TI2V-5B's shapes (48 latent channels, head_dim 128) with LongLive 2.0's rollout.

    On a GPU: the 5B's 24 heads, 30 layers, ffn 14336 and 704x1280 video (44x80 latents, 880 tokens per frame). On a
    CPU the widths shrink (2 heads, 2 layers, 20x32 latents = 160 tokens per frame) so that attention over the
    cache still weighs as it does at full size over long videos.
    """
    cuda = torch.device(device).type == "cuda"
    heads = heads or (24 if cuda else 2)
    layers = layers or (30 if cuda else 2)
    latent_hw = latent_hw or ((44, 80) if cuda else (20, 32))
    cfg = WanConfig(dim=128 * heads, num_heads=heads, num_layers=layers, ffn_dim=(14336 if cuda else 4 * 128 * heads),
                    in_dim=48, out_dim=48)
    model, context, dtype = random_weights(cfg, seed, device)
    tpf = (latent_hw[0] // 2) * (latent_hw[1] // 2)
    return Scenario(name="longlive2-5b", model=model, context=context, latent_hw=latent_hw, channels=48,
                    schedule="longlive2", frames_per_block=LONGLIVE2_CHUNK, quality=False,
                    capacity_frames=LONGLIVE2_WINDOW - LONGLIVE2_CHUNK, sink_frames=LONGLIVE2_SINK,
                    notes={"config": cfg.to_dict(), "tokens_per_frame": tpf, "dtype": str(dtype),
                           "window_frames": LONGLIVE2_WINDOW, "sink_frames": LONGLIVE2_SINK})


# LingBot-World 2.0 (generate.py as run_fast.sh runs it): chunks of 4, local_attn_size 18 (the chunk included), sink 6.
LINGBOT_CHUNK = 4
LINGBOT_WINDOW = 18
LINGBOT_SINK = 6
LINGBOT_PERIOD = 12  # seconds
# The key timeline its bench camera follows, repeated every 12 s (at 16 fps): a walk that turns, looks up and
# down, strafes.
LINGBOT_TIMELINE = """variant lingbot
0 W
2 W L
4 W
5 W I
6 D
7 W J
9 W K
10 S
11 -
"""


def lingbot_path(frames: int):
    """The bench's camera path (a ``CameraPath``) for ``frames`` latent frames: ``LINGBOT_TIMELINE`` repeated over
    the video, its poses by the key motion model."""
    from ...fastar_core.families.lingbot.camera import check_path
    from ...fastar_core.rollout.action_script import parse_text

    head, *entries = LINGBOT_TIMELINE.strip().splitlines()
    video = 4 * (frames - 1) + 1
    repeats = video // (LINGBOT_PERIOD * 16) + 1
    lines = [f"{float(e.split()[0]) + LINGBOT_PERIOD * k:g} {' '.join(e.split()[1:])}"
             for k in range(repeats) for e in entries]
    script = parse_text("\n".join([head, *lines]), "the bench's key timeline")
    return check_path(script.to_poses(video), script.intrinsics(), "the bench's key timeline")


def lingbot_camera(frames: int, height: int, width: int, scale: float | None = None):
    """The bench's camera for ``frames`` latent frames at ``height x width`` pixels (``lingbot_path``'s);
    ``scale``: a fixed divisor of its translations instead of the path's longest move."""
    return lingbot_path(frames).condition(frames, height, width, scale=scale)


def lingbot_scenario(seed: int = 0, device="cpu", heads: int | None = None, layers: int | None = None,
                     latent_hw=None) -> Scenario:
    """Random weights at LingBot-World 2.0's shapes (head_dim 128, 36 input channels, the camera layers) with its
    rollout: chunks of 4, schedule ``lingbot``, a window of 18 with a 6-frame sink, a start image and a camera
    path from a key timeline.

    On a GPU: the 1.3B's 12 heads, 30 layers, ffn 8960 at 480x832 (60x104 latents, 1,560 tokens per frame). On a
    CPU the widths shrink (2 heads, 2 layers, 16x24 latents = 96 tokens per frame)."""
    from ...fastar_core.families.lingbot.config import LingBotConfig
    from ...fastar_core.families.lingbot.model import random_lingbot
    from ...fastar_core.families.lingbot.rollout import lingbot_conditioning

    cuda = torch.device(device).type == "cuda"
    heads = heads or (12 if cuda else 2)
    layers = layers or (30 if cuda else 2)
    latent_hw = latent_hw or ((60, 104) if cuda else (16, 24))
    cfg = LingBotConfig(dim=128 * heads, num_heads=heads, num_layers=layers,
                        ffn_dim=(8960 if cuda else 4 * 128 * heads))
    dtype = torch.bfloat16 if cuda else torch.float32
    model = random_lingbot(cfg, seed=seed, dtype=dtype).to(device)
    g = torch.Generator().manual_seed(seed)
    context = torch.zeros(1, 512, cfg.text_dim)
    context[:, :24] = torch.randn(1, 24, cfg.text_dim, generator=g) * 0.2
    image = torch.randn(1, 16, 1, *latent_hw, generator=g)
    blank = torch.randn(1, 16, 1, *latent_hw, generator=g)  # the VAE latent of a blank frame, every later frame

    def conditioning(frames: int, scale: float | None = None):
        latents = torch.cat([image, blank.expand(-1, -1, frames - 1, -1, -1)], dim=2)
        camera = lingbot_camera(frames, latent_hw[0] * 8, latent_hw[1] * 8, scale)
        return lingbot_conditioning(context, latents, camera)

    tpf = (latent_hw[0] // 2) * (latent_hw[1] // 2)
    return Scenario(name="lingbot", model=model, context=context, latent_hw=latent_hw, channels=16,
                    schedule="lingbot", frames_per_block=LINGBOT_CHUNK, quality=False,
                    capacity_frames=LINGBOT_WINDOW - LINGBOT_CHUNK, sink_frames=LINGBOT_SINK,
                    make_conditioning=conditioning,
                    notes={"config": cfg.to_dict(), "tokens_per_frame": tpf, "dtype": str(dtype),
                           "window_frames": LINGBOT_WINDOW, "sink_frames": LINGBOT_SINK,
                           "camera": "key timeline " + " | ".join(LINGBOT_TIMELINE.strip().splitlines()[1:])})


SCENARIOS = {"demo": demo_scenario, "wan-shapes": wan_shapes_scenario, "longlive2-5b": longlive2_scenario,
             "lingbot": lingbot_scenario}

# The benchmark's modes: (cache spec, FAST-AR config), each resolved by the engine from the same settings a user
# would give. Capacity is shared, so dense-window and TempCache hold the same number of frames' worth of tokens.
CAPACITY_FRAMES = 21
SINK_FRAMES = 3
CHUNK_FRAMES = 3  # frames per block of the demo and wan-shapes models


def window_attending(cached_frames: int, chunk_frames: int = CHUNK_FRAMES) -> int:
    """The window size (frames attended: LongLive's local_attn_size) of a window that caches ``cached_frames``,
    sink included, as a TempCache of that capacity does: the chunk attends to them and to itself."""
    return cached_frames + chunk_frames


def scenario_modes(scenario: Scenario, preset: str = "balanced") -> dict:
    """``bench_modes`` at a scenario's sizes (LongLive 2.0's: dense-window is its own window 32 with sink 8)."""
    return bench_modes(preset, capacity=scenario.capacity_frames, sink=scenario.sink_frames,
                       chunk=scenario.frames_per_block)


def bench_modes(preset: str = "balanced", capacity: int = CAPACITY_FRAMES, sink: int = SINK_FRAMES,
                chunk: int = CHUNK_FRAMES) -> dict:
    def mode(**kw):
        s = resolve_settings(sink_frames=sink, **kw)
        return s.cache, s.fastar

    def temp(**attention):
        return mode(preset=preset, tempcache_overrides={"capacity_frames": capacity},
                    attention_overrides=attention)

    return {
        "dense-global": mode(cache_policy="global"),
        "dense-window": mode(cache_policy="window", window_frames=window_attending(capacity, chunk)),
        # The same window with K and V stored as int8 with a float32 scale per token and head.
        "dense-window-int8": (replace(mode(cache_policy="window", window_frames=window_attending(capacity, chunk))[0],
                                      kv_quant="int8"), mode(cache_policy="window")[1]),
        "tempcache": temp(annca=False, annsa=False),
        "tempcache-int8": (replace(temp(annca=False, annsa=False)[0], kv_quant="int8"),
                           temp(annca=False, annsa=False)[1]),
        # The top-1 search named (caches/matching.py) whatever the device ("tempcache" takes "auto": quantized on
        # CUDA, exact elsewhere).
        "tempcache-quantized": mode(preset=preset, tempcache_overrides={"capacity_frames": capacity,
                                                                        "matcher": "quantized"},
                                    attention_overrides={"annca": False, "annsa": False}),
        "tempcache-exact": mode(preset=preset, tempcache_overrides={"capacity_frames": capacity, "matcher": "exact"},
                                attention_overrides={"annca": False, "annsa": False}),
        "tempcache+annsa": temp(annca=False, annsa=True),
        "all": temp(annca=True, annsa=True),
        # AnnCA's per-frame prompt pruning on top (off in the presets): what it saves and what it costs.
        "all+annca-prune": temp(annca=True, annca_prune=True, annsa=True),
        # AnnSA on every call whatever the size: what bucketing costs and keeps where the default would skip it.
        "all+forced-annsa": temp(annca=True, annsa=True, annsa_min_keys=0),
    }



def pareto_modes(capacities, thresholds, variants: dict, chunk: int = CHUNK_FRAMES,
                 tempcache: dict | None = None) -> dict:
    """``fastar bench pareto``'s points: name -> {"spec", "fastar", "policy", "capacity", ...}. ``variants``:
    label -> TempCache setting overrides, each run at every capacity (threshold 0.9 unless overridden);
    ``tempcache``: settings of every TempCache point (the steered world's: groups are places); ``chunk``: the
    model's chunk, which a window of the same memory attends to beside its cached frames."""
    def point(policy, capacity, **kw):
        s = resolve_settings(sink_frames=SINK_FRAMES, **kw)
        return {"spec": s.cache, "fastar": s.fastar, "policy": policy, "capacity": capacity}

    def temp(cap, **settings):
        return point("tempcache", cap, preset="balanced",
                     tempcache_overrides={"capacity_frames": cap, **(tempcache or {}), **settings},
                     attention_overrides={"annca": False, "annsa": False})

    points = {"dense-global": point("global", None, cache_policy="global")}
    for cap in capacities:
        points[f"dense-window@{cap}"] = point("window", cap, cache_policy="window",
                                              window_frames=window_attending(cap, chunk))
        for th in thresholds:
            points[f"tempcache-{th}@{cap}"] = {**temp(cap, threshold=th), "threshold": th}
        for label, overrides in variants.items():
            p = temp(cap, **{"threshold": 0.9, **overrides})
            points[f"tempcache-{label}@{cap}"] = {**p, "threshold": p["spec"].tempcache.threshold, "variant": label}
    return points
