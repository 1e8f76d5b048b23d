"""The demo models' trainer: ``Trainer`` and ``TrainRecipe`` (``train_command.py`` runs them: ``fastar train-demo``).

Recipe (see ``TrainRecipe``): fresh procedural clips every step; teacher forcing (clean context chunks and noisy
twins in one block-causal sequence, exactly the sampler's visibility and RoPE positions); per-chunk flow-matching
noise levels weighted towards the sampler's own step sigmas; context chunks corrupted (blur, noise) the way the
model's own outputs will be; AdamW with warmup and cosine decay; EMA weights are what gets saved.

A run is reproducible for a given seed and step count. ``minutes`` caps the wall time and, so that a capped run
still ends annealed, also drives the LR decay when it runs out before the steps do (the run then depends on the
machine's speed). Weights and the training state are written every ``checkpoint_minutes``, so a stopped run
leaves usable weights and can be resumed.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from ...fastar_core.caches import CacheSpec
from ...fastar_core.families.demo.text import TEXT_LEN, TextEncoder, Tokenizer
from ...fastar_core.forward.attention import DenseAttention
from ...fastar_core.forward.runner import CausalRunner
from ...fastar_core.model.wan_model import WanModel
from ...fastar_core.rollout.sampler import ARSampler, RolloutConfig
from ...fastar_core.rollout.schedule import custom_schedule
from .data import corrupt_context, sprite_weights, step_generator, training_batch, training_sigmas
from .settings import (
    DEMO_SIGMAS,
    FRAME_HW,
    FRAMES_PER_BLOCK,
    MODEL_CONFIG,
    ROPE_MAX_DISTANCE,
    TRAIN_CLIP_FRAMES,
    WEIGHTS_FILE,
)
from .teacher_forcing import TeacherForcingForward
from .weights_io import save_demo_weights
from .world import CHANNELS, default_vocabulary

STATE_FILE = "train_state.pt"
STATE_KEYS = ("model", "text_encoder", "ema_model", "ema_text", "optimizer", "step", "elapsed", "losses", "seed",
              "recipe")


def print_now(message: str) -> None:
    print(message, flush=True)  # runs are often logged to a file under nohup
LOSS_FILE = "loss.json"


@dataclass(frozen=True)
class TrainRecipe:
    steps: int = 3000
    batch: int = 2
    clip_frames: int = TRAIN_CLIP_FRAMES
    lr: float = 8e-4
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float = 0.995
    p_context_corruption: float = 0.5
    p_schedule_sigma: float = 0.4
    sprite_loss_weight: float = 4.0  # loss weight of a sprite's pixels and trail (scaled per sprite by its area)
    p_own_context: float = 0.25  # per clip: context chunks replaced by the model's own one-step predictions
    p_rollout_context: float = 0.0  # per clip: context chunks replaced by the EMA model's own sampled rollout
    new_region_loss_weight: float = 1.0  # steered world: loss weight of the pixels a move brings into view
    landmark_loss_weight: float = 1.0  # steered world: loss weight of the pixels landmarks cover

    def lr_at(self, step: int, time_fraction: float = 0.0) -> float:
        """Warm-up, then cosine decay driven by whichever runs out first: the steps or the wall-time budget
        (``time_fraction`` of it used), so a run cut short by its budget still ends annealed."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, max((step - self.warmup_steps) / max(1, self.steps - self.warmup_steps), time_fraction))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def init_models(seed: int, vocabulary: list, config=MODEL_CONFIG) -> tuple[WanModel, TextEncoder]:
    """Fresh models from ``seed`` (PyTorch's default inits; the output layer starts at zero, as in DiT)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = WanModel(config)
        text_encoder = TextEncoder(len(vocabulary))
    with torch.no_grad():
        model.head.head.weight.zero_()
        model.head.head.bias.zero_()
    return model, text_encoder


class Trainer:
    model_config = MODEL_CONFIG
    frames_per_block = FRAMES_PER_BLOCK

    def __init__(self, out_dir: Path, recipe: TrainRecipe, seed: int, log=print_now):
        self.out_dir = out_dir
        self.recipe = recipe
        self.seed = seed
        self.log = log
        self.vocabulary = default_vocabulary()
        self.tokenizer = Tokenizer(self.vocabulary, TEXT_LEN)
        self.model, self.text_encoder = init_models(seed, self.vocabulary, self.model_config)
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False)
        self.ema_text = copy.deepcopy(self.text_encoder).requires_grad_(False)
        params = list(self.model.parameters()) + list(self.text_encoder.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay,
                                           betas=(0.9, 0.99))
        self.forward = self.make_forward()
        self.step = 0
        self.elapsed = 0.0
        self.losses: list[float] = []
        self.phases: list[dict] = []  # earlier runs this one was initialised from (see ``warm_start``)

    def make_forward(self) -> TeacherForcingForward:
        return TeacherForcingForward(self.model, self.recipe.clip_frames, self.frames_per_block, FRAME_HW,
                                     rope_max_distance=ROPE_MAX_DISTANCE)

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "text_encoder": self.text_encoder.state_dict(),
                "ema_model": self.ema_model.state_dict(), "ema_text": self.ema_text.state_dict(),
                "optimizer": self.optimizer.state_dict(), "step": self.step, "elapsed": self.elapsed,
                "losses": self.losses, "seed": self.seed, "recipe": asdict(self.recipe), "phases": self.phases}

    def load_state_dict(self, state: dict) -> None:
        # A run may be extended (more steps: the LR schedule is re-planned); anything else must match.
        # A field added after the state was saved counts as its default (the run trained without it).
        defaults = {f.name: f.default for f in fields(TrainRecipe)}
        saved = {k: v for k, v in {**defaults, **state["recipe"]}.items() if k != "steps"}
        mine = {k: v for k, v in asdict(self.recipe).items() if k != "steps"}
        if state["seed"] != self.seed or saved != mine:
            raise ValueError("the saved training state is from another seed or recipe; use a fresh --out (or "
                             "--fresh)")
        self._load_weights(state)
        self.step, self.elapsed, self.losses = state["step"], state["elapsed"], list(state["losses"])
        self.phases = list(state.get("phases", []))

    def _load_weights(self, state: dict) -> None:
        """Weights, EMA weights and optimizer moments of a saved state."""
        self.model.load_state_dict(state["model"])
        self.text_encoder.load_state_dict(state["text_encoder"])
        self.ema_model.load_state_dict(state["ema_model"])
        self.ema_text.load_state_dict(state["ema_text"])
        self.optimizer.load_state_dict(state["optimizer"])

    def warm_start(self, state: dict) -> None:
        """Continue from another run's weights, EMA and optimizer moments as a new phase with this recipe
        (its step count and LR schedule start afresh). The earlier phases are kept for the record."""
        self._load_weights(state)
        earlier = {"seed": state["seed"], "steps": state["step"], "wall_seconds": round(state["elapsed"], 1),
                   "recipe": state["recipe"], "losses": state["losses"]}
        self.phases = [*state.get("phases", []), earlier]

    def warm_start_from_weights(self, path) -> dict:
        """Start from a demo weights file (e.g. the bundled one): its (fp16) weights become both the live and the
        EMA weights, the optimizer starts afresh. Words new to this vocabulary get fresh embeddings; words the
        file knows keep theirs. The file's training summary is kept as an earlier phase. Returns the file's
        tensors, for what a subclass saves beside the models."""
        from ...fastar_core.families.demo.text import STATE_PREFIX
        from ...fastar_core.families.demo.weights_file import (
            check_encoder_shapes,
            check_finite_tensors,
            read_demo_metadata,
        )
        from ...fastar_core.files.raw import read_raw
        from ...fastar_core.files.wan_checkpoint import checkpoint_errors
        from .settings import MODEL_PREFIX

        meta = read_demo_metadata(path)  # every entry checked by type and range before it is used
        with checkpoint_errors(path):
            self.check_weights_file(path, meta)

            def shapes_fit(infos, _):
                check_encoder_shapes(path, infos, meta, self.model_config)

            tensors, _ = read_raw(Path(path), before_load=shapes_fit)
            check_finite_tensors(path, tensors)  # a run started from NaN weights would train NaN
        model_state = {k[len(MODEL_PREFIX):]: v.float() for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
        text_state = {k[len(STATE_PREFIX):]: v.float() for k, v in tensors.items() if k.startswith(STATE_PREFIX)}
        embedding = self.text_encoder.token.weight.detach().clone()
        old_ids = {w: i for i, w in enumerate(meta["vocabulary"])}
        for i, word in enumerate(self.vocabulary):
            if word in old_ids:
                embedding[i] = text_state["token.weight"][old_ids[word]]
        text_state["token.weight"] = embedding
        for live, ema, state in ((self.model, self.ema_model, model_state),
                                 (self.text_encoder, self.ema_text, text_state)):
            live.load_state_dict(state)
            ema.load_state_dict(state)
        training = meta["training"]
        self.phases = [{"seed": training["seed"], "steps": training.get("total_steps", training["steps"]),
                        "wall_seconds": training.get("total_wall_seconds", training["wall_seconds"]),
                        "recipe": training["recipe"], "losses": [], "weights_file": str(Path(path).name),
                        "frame_size": meta["frame_size"]}]
        return tensors

    def check_weights_file(self, path, meta: dict) -> None:
        """Refuse (``CheckpointError``) a demo weights file whose ``demo`` metadata this trainer cannot start from."""

    def demo_metadata(self) -> dict:
        return {
            "vocabulary": self.vocabulary, "text_len": TEXT_LEN, "frame_size": list(FRAME_HW), "channels": CHANNELS,
            "frames_per_block": self.frames_per_block, "schedule": list(DEMO_SIGMAS), "context_noise": 0.0,
            "trained_span_frames": self.recipe.clip_frames, "rope_max_distance": ROPE_MAX_DISTANCE,
            "training": {"seed": self.seed, "steps": self.step, "wall_seconds": round(self.elapsed, 1),
                         "final_loss": round(self.smoothed_loss(), 5), "recipe": asdict(self.recipe),
                         "earlier_phases": [{k: v for k, v in p.items() if k != "losses"} for p in self.phases],
                         "total_steps": self.step + sum(p["steps"] for p in self.phases),
                         "total_wall_seconds": round(self.elapsed + sum(p["wall_seconds"] for p in self.phases), 1)},
        }

    def extra_weights(self) -> dict:
        """Modules saved beside the video model and the text encoder: key prefix -> module (EMA weights)."""
        return {}

    def smoothed_loss(self, window: int = 50) -> float:
        tail = self.losses[-window:]
        return sum(tail) / len(tail) if tail else float("nan")

    def checkpoint(self) -> None:
        save_demo_weights(self.ema_model, self.ema_text, self.out_dir / WEIGHTS_FILE, self.demo_metadata(),
                          extra=self.extra_weights())
        tmp = self.out_dir / (STATE_FILE + ".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(self.out_dir / STATE_FILE)
        history = [x for p in self.phases for x in p["losses"]] + self.losses
        starts = [0]
        for p in self.phases:
            starts.append(starts[-1] + len(p["losses"]))
        loss_record = {"losses": history, "phase_starts": starts, "elapsed": self.elapsed}
        (self.out_dir / LOSS_FILE).write_text(json.dumps(loss_record))

    # -- one optimisation step ---------------------------------------------------------------------------------
    def train_step(self, time_fraction: float = 0.0) -> float:
        r = self.recipe
        batch = training_batch(self.seed, self.step, r.batch, r.clip_frames, FRAME_HW[0])
        g = step_generator(self.seed, self.step)
        x0 = batch.video
        sigma, noise, noisy, context = self._noised(x0, g, time_fraction)
        text = self.forward.encode_text(self.text_encoder(self.tokenizer.batch(batch.prompts)))
        if r.p_own_context > 0:
            context = self._own_context(context, x0, text, g)
        if r.p_rollout_context > 0:
            context = self._rollout_context(context, x0, batch.prompts, g)
        flow = self.forward(context, noisy, torch.zeros_like(sigma), 1000.0 * sigma, text)
        twins = slice(self.forward.noisy_frames.start, self.forward.noisy_frames.stop)
        weights = sprite_weights(batch, r.sprite_loss_weight)[:, :, twins]
        loss = ((flow - (noise - x0)[:, :, twins]).square() * weights).mean() / weights.mean()
        return self._apply(loss)

    def _noised(self, x0, g, time_fraction):
        """A clip's per-chunk noise levels (repeated per frame), its noise, the noisy clip and the corrupted
        context, drawn from ``g`` in that order; and this step's learning rate set."""
        r = self.recipe
        fpb = self.frames_per_block
        chunks = -(-r.clip_frames // fpb)
        sigma_chunk = training_sigmas(r.batch, chunks, DEMO_SIGMAS, g, r.p_schedule_sigma)
        sigma = sigma_chunk.repeat_interleave(fpb, dim=1)[:, : r.clip_frames]
        noise = torch.randn(x0.shape, generator=g)
        s = sigma[:, None, :, None, None]
        noisy = (1 - s) * x0 + s * noise
        context = corrupt_context(x0, fpb, g, p=r.p_context_corruption)
        for group in self.optimizer.param_groups:
            group["lr"] = r.lr_at(self.step, time_fraction)
        return sigma, noise, noisy, context

    def _apply(self, loss) -> float:
        """One optimizer step on ``loss`` (gradients clipped, EMA updated); the step counter moves on."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.recipe.grad_clip)
        self.optimizer.step()
        self._update_ema()
        self.step += 1
        return loss.item()

    @torch.no_grad()
    def _own_context(self, context, x0, text, g) -> torch.Tensor:
        """For some clips, replace the context chunks after the first (the rendered start stays real) by the
        model's own x0 predictions from one sampler step: the model then learns to restore the kind of frames
        it will actually be fed while rolling out, not only synthetic blur and noise."""
        B = x0.shape[0]
        use = torch.rand(B, generator=g) < self.recipe.p_own_context
        sigma = torch.tensor(DEMO_SIGMAS)[torch.randint(len(DEMO_SIGMAS), (B,), generator=g)]
        noise = torch.randn(x0.shape, generator=g)
        if not use.any():
            return context
        s = sigma[:, None, None, None, None]
        x_t = (1 - s) * x0 + s * noise
        t = (1000.0 * sigma)[:, None].expand(B, x0.shape[2])
        twins, clean = self.forward.noisy_frames, self.forward.clean_frames
        predicted = x_t[:, :, twins.start:] - s * self.forward(context, x_t, torch.zeros_like(t), t, text)
        replaced = context.clone()
        n = clean.stop - twins.start  # clean frames that have a prediction
        replaced[:, :, twins.start:clean.stop] = predicted[:, :, :n]
        return torch.where(use[:, None, None, None, None], replaced, context)

    @torch.no_grad()
    def _rollout_context(self, context, x0, prompts, g) -> torch.Tensor:
        """For some clips, replace the context chunks after the first by what the EMA weights (the ones that get
        saved) sample from the clip's rendered first chunk with the engine's own sampler: each chunk conditioned
        on the chunks it generated before, so the context carries the errors a rollout accumulates several
        chunks deep (Self-Forcing's and Diffusion Forcing's point), detached. The targets stay the rendered
        clip, so the model learns to pull a drifting rollout back to the scene."""
        B = x0.shape[0]
        use = torch.rand(B, generator=g) < self.recipe.p_rollout_context
        seed = int(torch.randint(2**31 - 1, (), generator=g))
        if not use.any():
            return context
        rows = torch.nonzero(use).flatten()
        first = FRAMES_PER_BLOCK
        generate = self.forward.clean_frames.stop - first  # context frames after the first chunk
        text = self.ema_text(self.tokenizer.batch([prompts[i] for i in rows.tolist()]))
        runner = CausalRunner(self.ema_model, attention=DenseAttention(rope_max_distance=ROPE_MAX_DISTANCE))
        cfg = RolloutConfig(num_frames=generate, latent_height=FRAME_HW[0], latent_width=FRAME_HW[1],
                            frames_per_block=FRAMES_PER_BLOCK, schedule=custom_schedule(DEMO_SIGMAS), seed=seed,
                            cache=CacheSpec("global"), context_noise=0.0, channels=CHANNELS, batch=len(rows))
        rolled = ARSampler(runner).generate(text, cfg, initial_latents=x0[rows, :, :first]).latent
        replaced = context.clone()
        replaced[rows, :, first:first + generate] = rolled[:, :, first:first + generate].to(context)
        return replaced

    @torch.no_grad()
    def _update_ema(self) -> None:
        # Short warm-up of the decay so early weights do not linger in the average (counted over all phases,
        # so a continued run keeps its average).
        done = self.step + sum(p["steps"] for p in self.phases)
        decay = min(self.recipe.ema_decay, (1 + done) / (10 + done))
        for ema, live in ((self.ema_model, self.model), (self.ema_text, self.text_encoder)):
            for e, p in zip(ema.parameters(), live.parameters()):
                e.lerp_(p, 1 - decay)
