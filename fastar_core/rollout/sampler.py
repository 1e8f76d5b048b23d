"""The autoregressive sampling loop (Self-Forcing family), chunk by chunk against a KV cache.

Chunk mode (Self-Forcing, CausVid, LongLive, Causal Forcing): each chunk of ``frames_per_block`` latent
frames is denoised by the step list (x0 = x_t - sigma v, then re-noised with fresh noise to the next sigma),
then one clean pass at ``context_noise`` writes its keys and values to the cache.

Rolling mode (Rolling Forcing): a window of up to ``num_steps`` chunks at staggered noise levels is denoised
in one forward; each call finishes the oldest chunk, whose clean pass alone is committed.

A cache that rebuilds itself (Krea Realtime's recompute) is refilled before every chunk by clean passes over
the context it names, at positions 0..; the chunk then runs right after that context and is not committed.

Two loops take a VAE (``vae.py``): CausVid's long video restarts a fresh rollout every ``restart.every`` frames
from re-encoded decoded frames, and Krea's recompute without its first frame re-encodes the oldest context frame.

All noise comes from generators seeded per (seed, chunk, step); nothing reads the global RNG. Within one
(seed, chunk, step) the batch items are successive draws, as ComfyUI's ``prepare_noise`` draws a batch: item i's
noise is the i-th draw whatever the batch size, so a batch item can be remade alone from its ``batch_index``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...kernels import verification_turned_off
from ..caches.base import CacheShape, KVCache, read_figures
from ..caches.cache_set import CacheSet
from ..caches.spec import CacheSpec
from ..errors import FastARError, GenerationCancelled
from ..forward.attention import PassInfo
from ..forward.runner import CausalRunner, TextState, add_noise, flow_to_x0
from ..memory import send_to_device
from .conditioning import Conditioning
from .multishot import MultiShot, starts_shot
from .prompts import PromptSchedule
from .schedule import FIRST_CHUNK_SCHEDULES, DenoisingSchedule, get_schedule
from .unipc import solve_chunk_unipc
from .vae import LatentStream, RestartSpec, VideoVAE, check_vae, encode_frame, open_stream, pixel_frames

SAMPLER_MODES = ("chunk", "rolling")
MODE_CHOICES = ("auto", *SAMPLER_MODES)  # auto: rolling for the Rolling Forcing schedule, chunk otherwise
ROLLING_SCHEDULES = ("rolling-forcing",)
RESTART_POLICIES = ("global", "window")  # the caches a CausVid restart empties (its own is global)
FRAMES_PER_BLOCK = 3  # the Self-Forcing family's chunk; the default of every entry point


def resolve_mode(mode: str, schedule: DenoisingSchedule | str) -> str:
    """The sampler mode a rollout runs: ``mode``, or for "auto" the one its schedule was trained with."""
    if mode != "auto":
        return mode
    name = schedule.name if isinstance(schedule, DenoisingSchedule) else schedule
    return "rolling" if name in ROLLING_SCHEDULES else "chunk"


@dataclass
class RolloutConfig:
    num_frames: int  # latent frames to generate (after any initial clean frames)
    latent_height: int
    latent_width: int
    frames_per_block: int = FRAMES_PER_BLOCK
    schedule: DenoisingSchedule | str = "self-forcing"
    seed: int = 0
    cache: CacheSpec = field(default_factory=CacheSpec)
    context_noise: float = 0.0  # sigma of the clean pass that writes the cache (0 in every released model)
    mode: str = "chunk"  # or "rolling", or "auto" (MODE_CHOICES)
    batch: int = 1
    channels: int = 16
    # The first generated chunk's own step list (Causal Forcing++: 4 steps for the first frame, then 1 or 2);
    # None: the schedule preset's own choice (FIRST_CHUNK_SCHEDULES), else the main schedule.
    first_chunk_schedule: DenoisingSchedule | str | None = None
    # The batch item each row is (its draw number in every noise stream); None: rows 0..batch-1. As the
    # ``batch_index`` of a ComfyUI LATENT: (2,) remakes item 2 of a batch alone.
    batch_index: tuple | None = None

    def draws(self) -> tuple:
        return tuple(range(self.batch)) if self.batch_index is None else tuple(self.batch_index)
    # LongLive 2.0's multi-shot prompts (segments marked new_shot): RoPE offset and pinned shot sink
    multishot: MultiShot | None = None
    # LongLive 2.0's image-to-video: the one initial latent frame is frame 0 of the first chunk, held there (at
    # timestep 0) before and after every step, instead of being committed as clean context before the rollout
    image_in_first_chunk: bool = False
    # CausVid's long video: a fresh rollout every ``restart.every`` frames from VAE re-encoded frames (vae.py)
    restart: RestartSpec = field(default_factory=RestartSpec)

    def vae_needed(self) -> str | None:
        """Why this rollout needs a VAE, or None."""
        if self.restart.enabled:
            return (f"restart_every {self.restart.every} is CausVid's long video, whose every rollout starts from "
                    "the VAE re-encode of a decoded frame")
        return self.cache.policy_class.vae_needed(self.cache)

    @property
    def sampler_mode(self) -> str:
        """``mode`` with "auto" decided by the schedule."""
        return resolve_mode(self.mode, self.schedule)

    def first_schedule(self, main: DenoisingSchedule) -> DenoisingSchedule:
        """The first generated chunk's schedule."""
        if self.first_chunk_schedule is not None:
            return get_schedule(self.first_chunk_schedule)
        preset = FIRST_CHUNK_SCHEDULES.get(main.name)
        return get_schedule(preset) if preset else main

    def validate(self) -> DenoisingSchedule:
        if self.num_frames < 1:
            raise FastARError(f"num_frames must be >= 1 latent frame, got {self.num_frames}")
        if self.frames_per_block < 1:
            raise FastARError(f"frames_per_block must be >= 1, got {self.frames_per_block}")
        if self.mode not in MODE_CHOICES:
            raise FastARError(f"sampler mode {self.mode!r} is not one of {', '.join(MODE_CHOICES)}")
        if not 0.0 <= self.context_noise < 1.0:
            raise FastARError(f"context_noise must be in [0, 1), got {self.context_noise}")
        if self.latent_height < 1 or self.latent_width < 1:
            raise FastARError(f"latent size {self.latent_height}x{self.latent_width} is empty")
        if self.batch_index is not None and (len(self.batch_index) != self.batch
                                             or any(not isinstance(i, int) or i < 0 for i in self.batch_index)):
            raise FastARError(f"batch_index {list(self.batch_index)} must hold one item number >= 0 per batch row "
                              f"({self.batch})")
        self.cache.validate(self.frames_per_block)
        if self.multishot is not None:
            self.multishot.validate(self.cache.policy)
            if self.mode != "chunk":
                raise FastARError("multi-shot prompts need sampler mode 'chunk'")
        schedule = get_schedule(self.schedule)
        first = self.first_schedule(schedule)
        if self.image_in_first_chunk and (schedule.solver != "unipc" or self.sampler_mode != "chunk"):
            raise FastARError("image_in_first_chunk is LongLive 2.0's image-to-video: it needs a UniPC schedule "
                              "(longlive2) in sampler mode 'chunk'")
        if self.sampler_mode == "rolling" and schedule.solver != "dmd":
            raise FastARError(f"the {schedule.name} schedule's {schedule.solver} solver needs sampler mode 'chunk'")
        if self.sampler_mode == "rolling" and first is not schedule:
            raise FastARError("a separate first-chunk schedule needs sampler mode 'chunk' (rolling mode denoises "
                              "several chunks together with one step list)")
        if self.sampler_mode == "rolling" and self.cache.policy_class.rebuilds_each_chunk:
            raise FastARError(f"the {self.cache.policy} cache rebuilds itself before every chunk, which needs "
                              "sampler mode 'chunk'")
        self.restart.validate(self.frames_per_block)
        if self.restart.enabled and (self.sampler_mode != "chunk" or self.cache.policy not in RESTART_POLICIES
                                     or self.multishot is not None or self.image_in_first_chunk):
            raise FastARError(f"restart_every (CausVid's long video) restarts a dense cache one chunk at a time: it "
                              f"needs sampler mode 'chunk' and cache policy {' or '.join(RESTART_POLICIES)} (got "
                              f"{self.sampler_mode!r}, {self.cache.policy!r}), no multi-shot prompts and no image in "
                              "the first chunk")
        return schedule


def noise_seed(seed: int, chunk: int, step: int) -> int:
    """Independent stream per (seed, chunk, step), stable across runs and devices."""
    x = (seed * 0x9E3779B97F4A7C15 + chunk * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 31
    return x & (2**63 - 1)


@dataclass(frozen=True)
class NoiseSource:
    """Gaussian noise for (chunk, step) of one rollout, from its own generator: never the global RNG.

    ``draws`` names the batch item of each row: row r gets the ``draws[r]``-th draw of the stream, so item 1 of a
    batch and a run of item 1 alone (``draws=(1,)``) get the same noise bit for bit."""

    seed: int
    draws: tuple
    channels: int
    latent_height: int
    latent_width: int
    device: torch.device

    def __call__(self, chunk: int, step: int, frames: int) -> torch.Tensor:
        item = (1, self.channels, frames, self.latent_height, self.latent_width)
        g = torch.Generator().manual_seed(noise_seed(self.seed, chunk, step))
        if self.draws == tuple(range(len(self.draws))):  # rows 0..B-1: one draw of the whole batch, the same values
            return _to_device(torch.randn((len(self.draws), *item[1:]), generator=g), self.device)
        pieces = [torch.randn(item, generator=g) for _ in range(max(self.draws) + 1)]
        return _to_device(torch.cat([pieces[i] for i in self.draws]), self.device)


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-made noise onto the device without the host waiting (the noise comes from a CPU generator, so every
    device gets the same values)."""
    return send_to_device(x, device)


def frame_runs(frames: list[int]) -> list[tuple[int, int]]:
    """The ascending frame indices ``frames`` as runs of consecutive frames, ``(start, end)`` each."""
    runs: list[tuple[int, int]] = []
    for f in frames:
        if runs and runs[-1][1] == f:
            runs[-1] = (runs[-1][0], f + 1)
        else:
            runs.append((f, f + 1))
    return runs


@dataclass(frozen=True)
class RolloutPlan:
    """The chunks a rollout generates and how many forwards it takes (what a progress bar counts)."""

    chunks: list  # (frame_start, frames) per generated chunk
    mode: str
    num_steps: int
    first_chunk_steps: int | None = None  # when the first chunk has its own step list

    @property
    def total_forwards(self) -> int:
        if self.mode == "chunk":
            extra = (self.first_chunk_steps - self.num_steps) if self.first_chunk_steps and self.chunks else 0
            return len(self.chunks) * (self.num_steps + 1) + extra  # the steps, then the clean pass
        return len(self.chunks) + self.num_steps - 1  # one forward per window position


def plan_rollout(cfg: RolloutConfig, schedule: DenoisingSchedule, initial_frames: int) -> RolloutPlan:
    return RolloutPlan(chunk_plan(initial_frames, cfg.num_frames, cfg.frames_per_block), cfg.sampler_mode,
                       schedule.num_steps, cfg.first_schedule(schedule).num_steps)


@dataclass
class ChunkReport:
    index: int
    frame_start: int
    frames: int
    seconds: float
    cache_bytes: int
    x0: torch.Tensor  # [B, C, F, h, w] the chunk's clean latent
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"index": self.index, "frame_start": self.frame_start, "frames": self.frames,
                "seconds": round(self.seconds, 6), "cache_bytes": self.cache_bytes, **self.extra}


@dataclass
class RolloutResult:
    latent: torch.Tensor  # [B, C, T, h, w], initial frames included
    chunks: list
    cache_stats: dict
    schedule: DenoisingSchedule
    seconds: float


class ARSampler:
    """Runs rollouts on one runner; each rollout builds its cache from its ``RolloutConfig.cache``."""

    def __init__(self, runner: CausalRunner):
        self.runner = runner

    def build_cache(self, cfg: RolloutConfig, total_frames: int, grid_hw) -> CacheSet:
        """The rollout's caches: the self-attention cache its spec names, and the family's own beside it."""
        attention = self.build_attention_cache(cfg, total_frames, grid_hw)
        try:
            extra = self.runner.family.extra_caches(self.runner, cfg, total_frames, grid_hw)
        except BaseException:
            attention.free()
            raise
        return CacheSet(attention, extra)

    def build_attention_cache(self, cfg: RolloutConfig, total_frames: int, grid_hw) -> KVCache:
        g = self.runner.geometry
        # Under sequence parallelism a rank caches its own heads only.
        shape = CacheShape(num_layers=g.num_layers, batch=cfg.batch, num_heads=self.runner.local_heads,
                           head_dim=g.head_dim, grid_hw=grid_hw, dtype=self.runner.dtype, device=self.runner.device,
                           frames_per_block=cfg.frames_per_block,
                           rotated_keys=getattr(self.runner.attention, "wants_rotated_keys", False))
        return cfg.cache.build(shape, total_frames)

    def noise_source(self, cfg: RolloutConfig) -> NoiseSource:
        return NoiseSource(cfg.seed, cfg.draws(), cfg.channels, cfg.latent_height, cfg.latent_width, self.runner.device)

    def generate(
        self,
        prompts,
        cfg: RolloutConfig,
        initial_latents: torch.Tensor | None = None,
        callback: Callable[[ChunkReport], None] | None = None,
        cancel: Callable[[], bool] | None = None,
        step_callback: Callable[[int, int], None] | None = None,
        output_device=None,
        initial_noise: torch.Tensor | None = None,
        vae: VideoVAE | None = None,
    ) -> RolloutResult:
        """Generate ``cfg.num_frames`` latent frames. ``callback`` gets a report per finished chunk,
        ``step_callback(done, total)`` every forward, ``cancel()`` is polled between steps.

        ``initial_noise`` (shaped like the output latent, initial frames included) replaces the seeded noise of
        each chunk's first step, as ComfyUI's NOISE input does; re-noising between steps stays seeded.

        ``prompts``: text prompts (a tensor, a list of segments, a ``PromptSchedule``), or a ``Conditioning``
        for families conditioned on more (image latents, CLIP-vision features, actions).

        ``vae`` (``fastar_core.vae.VideoVAE``): needed where the family's loop decodes and re-encodes frames
        (CausVid's restarts, Krea's recompute without its first frame); unused otherwise."""
        schedule = cfg.validate()
        needs = cfg.vae_needed()
        if needs is not None and vae is None:
            raise FastARError(f"{needs}: give a VAE (the Long Video Sampler's 'vae' input; ARSampler.generate(vae=...)"
                              "; the command line loads none)" + (", or keep the first frame (sink_frames 1)"
                                                                  if not cfg.restart.enabled else ""))
        if needs is not None:
            vae = check_vae(vae)
        cond = Conditioning.coerce(prompts)
        self.runner.family.check_rollout(cfg, cond)
        if cfg.restart.enabled and not self.runner.family.restartable:
            raise FastARError(f"restart_every is CausVid's long video, for a Wan text-to-video model; this model is "
                              f"{self.runner.family.describe()}, whose own caches a restart would not empty")
        schedule_prompts = cond.prompts
        grid_hw = self.runner.grid_hw(cfg.latent_height, cfg.latent_width)
        n_init = 0
        if initial_latents is not None:
            want = (cfg.batch, cfg.channels, cfg.latent_height, cfg.latent_width)
            got = tuple(initial_latents.shape[:2]) + tuple(initial_latents.shape[3:])
            if initial_latents.ndim != 5 or got != want:
                raise FastARError(f"initial latents have shape {list(initial_latents.shape)}; expected "
                                  f"[{cfg.batch}, {cfg.channels}, frames, {cfg.latent_height}, {cfg.latent_width}]")
            n_init = initial_latents.shape[2]
            if cfg.restart.enabled:
                raise FastARError("restart_every (CausVid's long video) starts from text alone; it takes no initial "
                                  "latents (start image)")
        first_frame = None
        if initial_latents is not None and cfg.image_in_first_chunk:
            if n_init != 1:
                raise FastARError(f"image_in_first_chunk holds one image latent frame; the initial latents have "
                                  f"{n_init}")
            first_frame, initial_latents, n_init = initial_latents.to(self.runner.device, torch.float32), None, 0
        total = n_init + cfg.num_frames
        out_device = torch.device(output_device) if output_device is not None else self.runner.device
        latent = torch.zeros(cfg.batch, cfg.channels, total, cfg.latent_height, cfg.latent_width, device=out_device)
        plan = plan_rollout(cfg, schedule, n_init)
        if initial_noise is not None and tuple(initial_noise.shape) != tuple(latent.shape):
            raise FastARError(f"initial noise has shape {list(initial_noise.shape)}; expected {list(latent.shape)} "
                              "(the output latent, initial frames included)")
        # A restarted rollout's positions start again at 0: its cache holds one rollout's frames.
        cached_frames = min(total, cfg.restart.every) if cfg.restart.enabled else total
        cache = self.build_cache(cfg, cached_frames, grid_hw)
        loop = RolloutLoop(runner=self.runner, cfg=cfg, schedule=schedule, first_schedule=cfg.first_schedule(schedule),
                           prompts=schedule_prompts, cond=cond, latent=latent,
                           plan=plan, cache=cache, noise=self.noise_source(cfg), initial_noise=initial_noise,
                           callback=callback, cancel=cancel, step_callback=step_callback, first_frame=first_frame,
                           vae=vae if needs is not None else None)
        self.runner.attention.begin_rollout(self.runner.num_layers)
        self.runner.attention.reserve_positions(cached_frames, grid_hw[0] * grid_hw[1], self.runner.geometry.head_dim,
                                                self.runner.device)
        start = time.perf_counter()
        # Kernel checks turned off by the attention's config stay off for this rollout only.
        no_checks = not getattr(self.runner.attention, "verify_kernels", True)
        try:
            with verification_turned_off(no_checks):
                if initial_latents is not None:
                    loop.commit_initial(initial_latents.to(self.runner.device, torch.float32))
                if cfg.sampler_mode == "chunk":
                    loop.run_chunks()
                else:
                    loop.run_rolling()
            stats = cache.stats()
        finally:
            cache.free()
        return RolloutResult(latent, loop.reports, stats, schedule, time.perf_counter() - start)


def chunk_plan(first_frame: int, num_frames: int, frames_per_block: int) -> list[tuple[int, int]]:
    """(frame_start, frames) of each generated chunk; the last one may be shorter."""
    plan, f = [], first_frame
    while f < first_frame + num_frames:
        n = min(frames_per_block, first_frame + num_frames - f)
        plan.append((f, n))
        f += n
    return plan


class RolloutLoop:
    """State of one rollout: the cache, the active prompt, the output latent, the reports."""

    def __init__(self, *, runner: CausalRunner, cfg: RolloutConfig, schedule: DenoisingSchedule,
                 first_schedule: DenoisingSchedule, prompts: PromptSchedule | None, latent: torch.Tensor,
                 plan: RolloutPlan, cache: CacheSet | KVCache, noise: NoiseSource, cond: Conditioning | None = None,
                 initial_noise: torch.Tensor | None = None, callback=None, cancel=None, step_callback=None,
                 first_frame: torch.Tensor | None = None, vae: VideoVAE | None = None):
        self.runner = runner
        self.cfg = cfg
        self.schedule = schedule
        self.first_schedule = first_schedule
        self.prompts = prompts
        self.cond = cond if cond is not None else Conditioning(prompts=prompts)
        self.latent = latent
        self.plan = plan.chunks
        # The rollout's CacheSet (or a bare KVCache): both answer the self-attention cache's interface.
        self.cache: Any = cache
        self.noise = noise
        self.initial_noise = initial_noise
        self.callback = callback
        self.cancel = cancel
        self.step_callback = step_callback
        self.reports: list[ChunkReport] = []
        self.prompt_index = -1
        self.text: TextState | None = None
        self.steps_done = 0
        self.steps_total = plan.total_forwards
        self.shot = 0  # shots started so far (multi-shot prompts)
        self.first_frame = first_frame  # the image latent held as the first chunk's frame 0 (image_in_first_chunk)
        self.last_report = time.perf_counter()
        self.vae = vae
        self.decoded = DecodedTail(vae, latent) if vae is not None else None  # Krea's streaming decode
        # CausVid's restarts: the clean frames the rollout in progress started from (None for the first one)
        self.rollout_head: torch.Tensor | None = None

    # -- helpers ----------------------------------------------------------------------------------------------
    def _start_noise(self, chunk: int) -> torch.Tensor:
        f0, frames = self.plan[chunk]
        if self.initial_noise is not None:
            return send_to_device(self.initial_noise[:, :, f0:f0 + frames], self.runner.device, torch.float32)
        return self.noise(chunk, 0, frames)

    def _times(self, schedule: DenoisingSchedule, steps, frames) -> torch.Tensor:
        """Model timesteps ``[B, F]`` for chunks at the given step indices (one per chunk, ``frames`` each), made on
        the device from host numbers (fills, no host tensor copied per step)."""
        return self._per_frame([schedule.timesteps[s] for s in steps], frames)

    def _per_frame(self, values, frames) -> torch.Tensor:
        """``[B, F]`` float32 on the device: ``values[i]`` for the ``frames[i]`` frames of the i-th chunk."""
        parts = [torch.full((self.cfg.batch, n), float(v), device=self.runner.device) for v, n in zip(values, frames)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _check_cancel(self):
        if self.cancel is not None and self.cancel():
            raise GenerationCancelled("generation was cancelled")

    def _tick(self):
        self.steps_done += 1
        if self.step_callback is not None:
            self.step_callback(self.steps_done, self.steps_total)

    def _info(self, chunk, step, frame_start, frames, frame_steps=None, num_steps=None):
        return PassInfo(chunk=chunk, step=step, num_steps=num_steps or self.schedule.num_steps,
                        frame_start=frame_start, num_frames=frames, tokens_per_frame=self.cache.tokens_per_frame,
                        frame_steps=frame_steps)

    def _predict_x0(self, x: torch.Tensor, sigma: torch.Tensor, times: torch.Tensor, info: PassInfo) -> torch.Tensor:
        """One denoising forward: the model's flow at per-frame ``sigma`` (fed as ``times``), turned into the
        clean estimate."""
        assert self.text is not None, "the prompt is encoded before the first forward"
        flow = self.runner.forward(x, times, self.text, self.cache, info)
        assert flow is not None
        return flow_to_x0(x, flow, sigma)

    def _clean_pass(self, chunk, x0, frame_start):
        """Write a finished chunk's clean keys/values to the cache (at ``context_noise``)."""
        cfg = self.cfg
        frames = x0.shape[2]
        clean = x0
        if cfg.context_noise > 0:
            noise = self.noise(chunk, self.schedule.num_steps, frames)
            clean = add_noise(x0, noise, torch.full((cfg.batch, frames), cfg.context_noise, device=x0.device))
        times = 1000.0 * self._per_frame([cfg.context_noise], [frames])  # in float32, as the model's timesteps are
        self.runner.forward(clean, times, self.text, self.cache, self._info(chunk, -1, frame_start, frames),
                            commit=True, need_output=False)

    def _update_prompt(self, frame_start: int):
        if self.prompts is None:  # a context that is not text (CLIP-vision features): encoded once
            if self.text is None:
                self.text = self.runner.family.encode_context(self.runner, self.cond, None)
            return
        idx = self.prompts.index_at(frame_start)
        if idx == self.prompt_index:
            return
        switching = self.prompt_index >= 0
        self.prompt_index = idx
        segment = self.prompts.segments[idx]
        self.text = self.runner.family.encode_context(self.runner, self.cond, segment)
        # A cache rebuilt before every chunk re-encodes its context under the new prompt anyway.
        if switching and segment.recache_frames > 0 and not self.cache.rebuilds_each_chunk:
            self._recache(frame_start, segment.recache_frames)

    def _recache(self, frame_start: int, n: int):
        """LongLive's recache (its ``_recache_after_switch``): the clean frames still in reach are re-encoded
        under the new prompt in one pass, every one seeing all the others; the cache policy says where it starts
        (``recache_start``: from frame 0, the sink included, when the frames reach back there, as LongLive's own
        recache does; otherwise never the sink, whose keys stay the old prompt's)."""
        first = self.cache.recache_start(self.cfg.cache, frame_start, n)
        if first >= frame_start:
            return
        self.cache.rewind(first)
        self._clean_pass(-1, self.latent[:, :, first:frame_start].to(self.runner.device), first)

    def _rebuild(self, frame_start: int) -> int:
        """Krea's recompute: empty the cache, re-encode its context in block-causal chunks at positions 0..,
        and return the position the chunk starting at ``frame_start`` runs at."""
        fpb = self.cfg.frames_per_block
        frames = self.cache.context_frames(frame_start, fpb)  # type: ignore[attr-defined]
        reencoded = self.cache.reencoded_frame(frame_start, fpb)  # type: ignore[attr-defined]
        self.cache.reset()  # type: ignore[attr-defined]
        if not frames:  # the first chunk: nothing to re-encode
            return 0
        # A copy (the output keeps its latents), joined from slices: indexing by the list would send the host's
        # index to the device on every chunk.
        context = send_to_device(torch.cat([self.latent[:, :, a:b] for a, b in frame_runs(frames)], dim=2),
                                 self.runner.device)
        if reencoded is not None:  # Krea without keep_first_frame: the oldest one through the VAE
            assert self.decoded is not None and self.vae is not None and frames[0] == reencoded
            context[:, :, :1] = encode_frame(self.vae, self.decoded.last_pixel(reencoded), context[:, :, :1])
        for pos in range(0, len(frames), fpb):
            self._clean_pass(-1, context[:, :, pos:pos + fpb], pos)
        return len(frames)

    def _restart(self, frame_start: int) -> None:
        """CausVid's long-video restart (its script's loop): the rollout that just ended (the clean frames it started
        from, then its own) is decoded from a fresh VAE state up to the pixel frame it re-encodes; that latent and
        the rollout's last ``overlap - 1`` latent frames are the new rollout's first frames, written to the emptied
        cache by clean passes at positions 0.. as its first blocks (``start_latents`` at timestep 0)."""
        spec, fpb = self.cfg.restart, self.cfg.frames_per_block
        assert self.vae is not None
        own = spec.every if self.rollout_head is None else spec.new_frames  # the output frames the rollout made
        finished = self.latent[:, :, frame_start - own:frame_start].to(self.runner.device)
        if self.rollout_head is not None:
            finished = torch.cat([self.rollout_head, finished], dim=2)
        # The script re-encodes video[:, -4 * (overlap - 1) - 1] of the whole rollout's decode: the last pixel
        # frame of latent every - overlap. Decoding is causal, so the latents up to that one decode it the same.
        upto = spec.every - spec.overlap + 1
        pixels = self.vae.decode(finished[:, :, :upto])
        if pixels.ndim != 5 or pixels.shape[2] != pixel_frames(upto):
            raise FastARError(f"the VAE decoded {upto} latent frames into {list(pixels.shape)}; expected [B, 3, "
                              f"{pixel_frames(upto)}, H, W]")
        first = encode_frame(self.vae, pixels[:, :, -1:], finished[:, :, :1])
        self.rollout_head = torch.cat([first, finished[:, :, upto:]], dim=2)
        self.cache.reset()
        for pos in range(0, spec.overlap, fpb):
            self._clean_pass(-1, self.rollout_head[:, :, pos:pos + fpb], pos)

    def _position(self, frame_start: int) -> int:
        """The position the chunk starting at output frame ``frame_start`` runs at (after a restart, if it starts
        a new rollout)."""
        spec = self.cfg.restart
        if not spec.enabled:
            return frame_start + self._shot_offset(frame_start)
        if spec.segment_start(frame_start):
            self._restart(frame_start)
        return spec.position(frame_start)

    def _shot_offset(self, frame_start: int) -> int:
        """RoPE frames the chunk starting at ``frame_start`` is shifted by (multi-shot prompts; else 0)."""
        if self.cfg.multishot is None:
            return 0
        if starts_shot(self.prompts, frame_start):
            self.shot += 1
        return self.shot * self.cfg.multishot.rope_offset

    def _report(self, chunk, frame_start, x0, since: float) -> float:
        """The chunk's report, read from the device in one transfer with the finite check: the chunk's one host
        sync, which also ends its timing (the device has done all of it then). ``since``: when its time started;
        returns when it ended."""
        own = self.cache.report_figures()
        figures = {**self.cache.chunk_stats(), **self.runner.attention.chunk_stats(),
                   **{f"_cache_{k}": v for k, v in own.items()},
                   "_finite": torch.isfinite(x0).all(), "_cache_bytes": self.cache.live_bytes_figure()}
        extra = read_figures(figures)
        self.cache.take_report({k: extra.pop(f"_cache_{k}") for k in own})
        end = time.perf_counter()
        seconds = end - since
        if not extra.pop("_finite"):
            raise FastARError(f"chunk {chunk} produced NaN or infinite values (check the model weights, dtype and "
                              "conditioning)")
        cache_bytes = int(extra.pop("_cache_bytes"))
        self.latent[:, :, frame_start:frame_start + x0.shape[2]] = x0.to(self.latent.device)
        x0 = self.latent[:, :, frame_start:frame_start + x0.shape[2]]  # a view: no second copy per chunk
        report = ChunkReport(chunk, frame_start, x0.shape[2], seconds, cache_bytes, x0, extra)
        self.reports.append(report)
        if self.callback is not None:
            self.callback(report)
        return end

    # -- initial clean frames (image to video) ---------------------------------------------------------------
    def commit_initial(self, init: torch.Tensor):
        self._update_prompt(0)
        fpb = self.cfg.frames_per_block
        n = init.shape[2]
        for f in range(0, n, fpb):
            x0 = init[:, :, f:f + fpb]
            self.runner.family.before_chunk(self.cond, f, x0.shape[2])
            self._clean_pass(-1, x0, f)
            self.latent[:, :, f:f + x0.shape[2]] = x0.to(self.latent.device)

    # -- chunk mode ---------------------------------------------------------------------------------------------
    def run_chunks(self) -> None:
        cfg = self.cfg
        last = len(self.plan) - 1
        rebuilds = self.cache.rebuilds_each_chunk
        for c, (f0, frames) in enumerate(self.plan):
            self._check_cancel()
            t_start = time.perf_counter()
            self._update_prompt(f0)
            self.runner.family.before_chunk(self.cond, f0, frames)
            schedule = self.first_schedule if c == 0 else self.schedule
            sigmas = schedule.sigmas
            position = self._rebuild(f0) if rebuilds else self._position(f0)
            x = self._start_noise(c)
            x0 = None
            if schedule.solver == "unipc":  # LongLive 2.0: multistep UniPC, no re-noising
                x0 = solve_chunk_unipc(self, c, schedule, x, position)
                sigmas = ()
            for s, sigma in enumerate(sigmas):
                self._check_cancel()
                sig = torch.full((cfg.batch, frames), sigma, device=self.runner.device)
                info = self._info(c, s, position, frames, num_steps=schedule.num_steps)
                x0 = self._predict_x0(x, sig, self._times(schedule, [s], [frames]), info)
                if s + 1 < len(sigmas):
                    nxt = torch.full((cfg.batch, frames), schedule.renoise_sigma(s + 1), device=self.runner.device)
                    x = add_noise(x0, self.noise(c, s + 1, frames), nxt)
                self._tick()
            # The final chunk's keys would never be read, nor those of a rollout's last chunk before a restart.
            if c < last and not rebuilds and not self.cfg.restart.segment_start(f0 + frames):
                shots = self.cfg.multishot
                if shots is not None and shots.pin_shot_sink and starts_shot(self.prompts, f0):
                    self.cache.pin(range(position, position + frames))  # type: ignore[attr-defined]
                self._clean_pass(c, x0, position)
            self._tick()
            self._report(c, f0, x0, t_start)

    # -- rolling mode (Rolling Forcing) ------------------------------------------------------------------------
    def run_rolling(self) -> None:
        cfg, sigmas = self.cfg, self.schedule.sigmas
        n_steps = len(sigmas)
        n_chunks = len(self.plan)
        noisy: dict[int, torch.Tensor] = {}
        for w in range(n_chunks + n_steps - 1):
            self._check_cancel()
            first, newest = max(0, w - n_steps + 1), min(n_chunks - 1, w)
            window = list(range(first, newest + 1))
            if w < n_chunks:
                noisy[w] = self._start_noise(w)
            f0 = self.plan[first][0]
            self._update_prompt(self.plan[newest][0])
            x = torch.cat([noisy[b] for b in window], dim=2)
            sig = self._per_frame([sigmas[w - b] for b in window], [self.plan[b][1] for b in window])
            frame_steps = [w - b for b in window for _ in range(self.plan[b][1])]
            times = self._times(self.schedule, [w - b for b in window], [self.plan[b][1] for b in window])
            x0_all = self._predict_x0(x, sig, times, self._info(newest, w - newest, f0, x.shape[2], frame_steps))
            offset = 0
            for b in window:
                frames = self.plan[b][1]
                x0 = x0_all[:, :, offset:offset + frames]
                offset += frames
                s = w - b
                if s + 1 < n_steps:
                    nxt = torch.full((cfg.batch, frames), self.schedule.renoise_sigma(s + 1), device=self.runner.device)
                    noisy[b] = add_noise(x0, self.noise(b, s + 1, frames), nxt)
                    continue
                del noisy[b]
                if b < n_chunks - 1:
                    self._clean_pass(b, x0, self.plan[b][0])
                # Windows overlap, so a chunk's time is the time since the previous chunk finished.
                self.last_report = self._report(b, self.plan[b][0], x0, self.last_report)
            self._tick()


class DecodedTail:
    """The rollout's output latents decoded as they are needed, through one causal stream (Krea decodes every
    block as it is made), each latent frame once: the last pixel frame of the most recent latent asked for."""

    def __init__(self, vae: VideoVAE, latent: torch.Tensor):
        self.vae, self.latent = vae, latent
        self.stream: LatentStream | None = None
        self.done = 0  # latent frames decoded
        self.last: torch.Tensor | None = None

    def last_pixel(self, frame: int) -> torch.Tensor:
        """Pixels ``[B, 3, 1, H, W]``: the last pixel frame latent ``frame`` decodes to."""
        if frame < self.done - 1:
            raise FastARError(f"latent frame {frame} was decoded and passed already (the stream is at {self.done})")
        if frame >= self.done:
            if self.stream is None:
                self.stream = open_stream(self.vae)
            pixels = self.stream.decode(self.latent[:, :, self.done:frame + 1])
            want = pixel_frames(frame + 1) - pixel_frames(self.done)
            if pixels.ndim != 5 or pixels.shape[2] != want:
                raise FastARError(f"the VAE decoded latent frames {self.done}..{frame} into {list(pixels.shape)}; "
                                  f"expected [B, 3, {want}, H, W]")
            self.last, self.done = pixels[:, :, -1:], frame + 1
        assert self.last is not None
        return self.last
