"""One sampler run as a request: the MODEL, its family's inputs and the settings, read and checked once.

Both samplers build a ``RolloutRequest`` from their inputs in ``build_request`` and hand it to ``run_rollout``
(``rollout.py``), which asks nothing more of the MODEL. What differs between families is behind one call: the
reader ``READERS[family.name]`` turns the sampler's 'positive' and 'actions' into the family's ``FamilyInputs``, and
the family's ``own_cache`` is the cache 'auto' means for it. A new family adds a reader here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..fastar_core.caches.spec import SINK_FRAMES, WINDOW_FRAMES
from ..fastar_core.errors import FastARError
from ..fastar_core.families.demo.family import DemoWorldFamily
from ..fastar_core.families.lingbot.family import LingBotFamily
from ..fastar_core.families.longlive2 import LongLive2Family
from ..fastar_core.families.matrix_game.family import MatrixGameFamily
from ..fastar_core.forward.family import ModelFamily
from ..fastar_core.rollout.engine import EngineSettings
from ..fastar_core.rollout.sampler import FRAMES_PER_BLOCK, RolloutConfig, plan_rollout
from ..fastar_core.rollout.sampler import resolve_mode as engine_resolve_mode
from ..fastar_core.rollout.schedule import DenoisingSchedule, get_schedule
from ..fastar_core.rollout.vae import RestartSpec
from .demo_world import read_demo_world_inputs
from .family_inputs import FamilyInputs, SamplerInputs, batch_rows
from .lingbot import read_lingbot_inputs
from .model_access import ARModel
from .prompting import read_text_inputs
from .world import read_world_inputs

# The engine family's name -> the reader of its sampler inputs.
READERS = {ModelFamily.name: read_text_inputs, LongLive2Family.name: read_text_inputs,
           MatrixGameFamily.name: read_world_inputs, LingBotFamily.name: read_lingbot_inputs,
           DemoWorldFamily.name: read_demo_world_inputs}


@dataclass
class RolloutSettings:
    frames_per_block: int = FRAMES_PER_BLOCK
    schedule: object = "self-forcing"  # engine preset name, or sigmas (ComfyUI SIGMAS accepted)
    mode: str = "auto"  # auto: rolling for the Rolling Forcing schedule, chunk otherwise
    seed: int = 0
    cache_policy: str = "auto"  # auto: tempcache when the FAST-AR patch turns TempCache on, else the family's own
    # (or global)
    sink_frames: int = SINK_FRAMES
    # frames a chunk attends to, sink and chunk included (window and recompute caches)
    window_frames: int = WINDOW_FRAMES
    context_noise: float = 0.0
    first_chunk_schedule: object = None  # the first chunk's own step list (preset name or sigmas); None: preset's
    # CausVid's long video: a fresh rollout every restart_every latent frames (0: never), from restart_overlap
    # clean frames (a VAE re-encode first)
    restart_every: int = 0
    restart_overlap: int = 3


@dataclass
class RolloutRequest:
    """Everything one sampler run needs; ``run_rollout`` reads nothing else."""

    model: ARModel
    inputs: FamilyInputs
    settings: RolloutSettings
    engine: EngineSettings  # the cache and FAST-AR's attention, resolved once
    schedule: DenoisingSchedule
    config: RolloutConfig  # video 0's; video r is batch item items[r] of every noise stream
    total_frames: int  # latent frames of the video, start frames included
    start_frames: int  # latent frames of the start image (committed before the rollout, or LongLive 2.0's frame 0)
    items: tuple
    start_noise: torch.Tensor | None = None
    vae: object = None
    notes: list = field(default_factory=list)

    @property
    def batch(self) -> int:
        return len(self.items)

    @property
    def committed_start_frames(self) -> int:
        """Start frames committed as clean context before the first chunk (none when held in the first chunk)."""
        return 0 if self.config.image_in_first_chunk else self.start_frames

    def plan(self):
        return plan_rollout(self.config, self.schedule, self.committed_start_frames)


def resolve_settings_for(model: ARModel, settings: RolloutSettings) -> EngineSettings:
    """The FAST-AR patch on the MODEL and the sampler's cache inputs, resolved by the engine in one place, with the
    family's own cache where the sampler leaves the choice to it (cache 'auto', TempCache's capacity)."""
    return model.fastar.resolve(cache_policy=settings.cache_policy, sink_frames=settings.sink_frames,
                                window_frames=settings.window_frames, num_layers=model.num_layers,
                                own_cache=model.family.own_cache(), frames_per_block=settings.frames_per_block,
                                family=model.family.describe())


def resolve_mode(settings: RolloutSettings, schedule_name: str) -> str:
    return engine_resolve_mode(settings.mode, schedule_name)  # the engine decides "auto", as for the CLI


def image_in_first_chunk(family: ModelFamily, schedule) -> bool:
    """Where the family holds a start image: frame 0 of the first chunk, or clean context before it."""
    return family.start_image_in_first_chunk(schedule)


def read_inputs(model: ARModel, given: SamplerInputs) -> FamilyInputs:
    """The MODEL's family reads the sampler's inputs (one call, whatever the family)."""
    reader = READERS.get(model.family.name)
    if reader is None:
        raise FastARError(f"the MODEL is {model.family.describe()}, which the samplers cannot condition yet")
    return reader(model, given)


def build_request(model: ARModel, given: SamplerInputs, settings: RolloutSettings, *, batch: int = 1,
                  batch_index=None, start_noise: torch.Tensor | None = None, vae=None,
                  notes=()) -> RolloutRequest:
    """``batch`` videos, one after another (a video's memory, not a batch's); video r takes row r of the prompt,
    start image and start noise (or their only row) and is batch item ``batch_index[r]`` (default r) of every
    noise stream, so it equals that item made alone bit for bit. ``vae``: the engine's ``VideoVAE`` (ComfyUI's
    wrapped, ``vae_loop``), for the loops that re-encode decoded frames."""
    if batch < 1:
        raise FastARError(f"batch_size must be at least 1, got {batch}")
    items = tuple(range(batch)) if batch_index is None else tuple(int(i) for i in batch_index)
    if len(items) != batch:
        raise FastARError(f"batch_index {list(items)} must name one batch item per video ({batch})")
    inputs = read_inputs(model, given)
    inputs.check_batch(batch)
    if start_noise is not None:
        batch_rows("the initial noise", start_noise, batch)
        if start_noise.shape[0] != batch:
            start_noise = start_noise.expand(batch, *start_noise.shape[1:])
    total_frames = given.latent_frames
    sched = get_schedule(settings.schedule)
    mode = resolve_mode(settings, sched.name)
    n_init = inputs.start_frames
    in_chunk = n_init > 0 and image_in_first_chunk(model.family, sched)
    if in_chunk and n_init != 1:
        raise FastARError(f"the start image latent has {n_init} frames; LongLive 2.0's image-to-video holds one")
    generated = total_frames - (0 if in_chunk else n_init)
    if generated < 1:
        raise FastARError(f"the video has {total_frames} latent frames and the start image fills {n_init}; "
                          "raise 'length' so that at least one frame is generated")
    engine = resolve_settings_for(model, settings)
    cfg = RolloutConfig(num_frames=generated, latent_height=given.latent_h, latent_width=given.latent_w,
                        frames_per_block=settings.frames_per_block, schedule=sched, seed=settings.seed,
                        cache=engine.cache, context_noise=settings.context_noise, mode=mode, batch=1,
                        channels=model.latent_channels, first_chunk_schedule=settings.first_chunk_schedule,
                        image_in_first_chunk=in_chunk,
                        restart=RestartSpec(settings.restart_every, settings.restart_overlap))
    return RolloutRequest(model=model, inputs=inputs, settings=settings, engine=engine, schedule=sched, config=cfg,
                          total_frames=total_frames, start_frames=n_init, items=items,
                          start_noise=start_noise, vae=vae,
                          notes=[*inputs.notes, *notes, *engine.notes])
