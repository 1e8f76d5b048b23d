"""Model families: what differs between the models one causal runner drives, and the registry that picks one.

The runner's forward is Wan2.1's: patch embedding, per-frame modulation, self-attention over the cache,
cross-attention over a context, feed-forward, head. A family says what it changes around that:

The forward hands the hooks the pass's context state (a ``TextState``); a family that reads more than its
cross-attention K/V per pass (image latents, actions) puts the rollout's ``Conditioning`` on it (``cond``).

- ``model_input``: channels joined to the noisy latent before the patch embedding (Matrix-Game 2.0: mask + image);
- ``encode_context``: where the cross-attention context comes from (Wan: the T5 prompt through
  ``text_embedding``; Matrix-Game: CLIP-vision tokens through ``img_emb``);
- ``after_self_attention``: the self-attention residual and the cross-attention query (LingBot-World 2.0 scales
  and shifts the hidden state by its camera between them);
- ``block_tail``: the block after cross-attention (Wan: residual and feed-forward; Matrix-Game puts its action
  module between them);
- ``extra_caches``: caches of its own, committed and rewound with the self-attention cache (``CacheSet``);
- ``check_rollout`` / ``before_chunk``: what it refuses, and what it needs before a chunk runs (actions);
- ``make_runner`` / ``rope_max_distance``: the runner a front end builds for it, and its attention's RoPE clamp.

``family_for(model)`` asks every registered family whether a module tree is its own; Wan is the default (Wan2.1
T2V, I2V used as T2V and Wan2.2 TI2V-5B have the same block). A new family subclasses ``ModelFamily`` and calls
``register_family``.
"""

from __future__ import annotations

from ..errors import FastARError

LATENT_CHANNELS = (16, 48)  # Wan2.1's VAE and Wan2.2's (TI2V-5B)


class ModelFamily:
    """Wan2.1's block, unchanged: the base every family starts from."""

    name = "wan"
    # CausVid's long video restarts a rollout from a few clean frames; a family whose state lives in caches of its
    # own (actions) cannot be restarted that way.
    restartable = True

    @classmethod
    def matches(cls, model) -> bool:
        return True

    def describe(self) -> str:
        """The family as a report names it."""
        return "Wan"

    # -- what a front end asks before it builds a rollout ---------------------------------------------------
    def check_model(self, model) -> None:
        """Refuse a module tree the runner cannot drive as this family (one message naming what to load)."""
        missing = [name for name in ("patch_embedding", "text_embedding", "time_embedding", "time_projection",
                                     "blocks", "head") if not hasattr(model, name)]
        if missing:
            raise FastARError(f"the MODEL is not a Wan2.1 diffusion model ({type(model).__name__} has no "
                              f"{', '.join(missing)}); load a Wan2.1 T2V model of the Self-Forcing family")
        weight = getattr(model.patch_embedding, "weight", None)
        if len(model.blocks) == 0 or weight is None or weight.ndim != 5:
            raise FastARError(f"the MODEL is not a Wan2.1 diffusion model ({type(model).__name__} has no layers or "
                              "no 3-D patch embedding); load a Wan2.1 T2V model of the Self-Forcing family")
        if getattr(model, "img_emb", None) is not None or hasattr(model.blocks[0].cross_attn, "k_img"):
            raise FastARError("the MODEL is a Wan2.1 image-to-video (I2V) model; the AR models are text-to-video. "
                              "For a start image use the 'AR Image to Video' node with the T2V model")
        if self.latent_channels(model) not in LATENT_CHANNELS:
            raise FastARError(f"the MODEL takes {self.latent_channels(model)} latent channels; the AR models take 16 "
                              "(Wan2.1 T2V) or 48 (Wan2.2 TI2V-5B, LongLive 2.0)")

    def latent_channels(self, model) -> int:
        """Channels of the latents the model denoises (16 for Wan2.1, 48 for Wan2.2 TI2V-5B): its input's."""
        return int(model.patch_embedding.weight.shape[1])

    @property
    def rope_max_distance(self) -> int | None:
        """Temporal RoPE distances past this are clamped in attention (a model trained on short clips), or None."""
        return None

    def make_runner(self, model, **kw):
        """A runner of the family's own for its module tree (``kw``: dtype, device, compile settings), for a family
        that conditions every forward on more (the demo world's keys); None: a plain ``CausalRunner``
        (``runner.runner_for`` builds whichever applies)."""
        return None

    def geometry(self, model):
        """How the model's latents map to video (a ``rollout.video_geometry.VideoGeometry``), or None for the Wan
        VAE its latent channels name (Wan2.1's 8x, Wan2.2's 16x; 4 frames per latent frame)."""
        return None

    def own_rollout(self) -> tuple | None:
        """(frames_per_block, schedule) of the family's own inference, which a live play runs and a sampler's
        schedule 'model's own' names; None where the checkpoint's family decides (Wan: the user picks)."""
        return None

    def live_variant(self) -> str | None:
        """The action script variant (``rollout/action_script.VARIANTS``) a person steers this model with live: its
        key table and how held keys become actions. None: not a world model."""
        return None

    def start_image_in_first_chunk(self, schedule) -> bool:
        """Whether a start image is frame 0 of the first chunk, held at timestep 0 (LongLive 2.0's image-to-video:
        a Wan model on a UniPC schedule), rather than clean context committed before it (the Self-Forcing family's,
        and every world family's: their start view is context whatever their solver)."""
        return schedule.solver == "unipc"

    def own_cache(self):
        """The self-attention cache the family's own inference uses (a ``CacheSpec``), or None when that is the
        user's choice; a sampler left on cache 'auto' without TempCache takes it."""
        return None

    def fastar_attention_refusal(self) -> str | None:
        """None when FAST-AR's attention patch (AnnCA, AnnSA, the presets' TempCache) is written for this family's
        block; else why not, and what of FAST-AR runs on it instead (a front end's message)."""
        return None

    # -- rollout checks -------------------------------------------------------------------------------------
    def check_rollout(self, cfg, cond) -> None:
        """Refuse a rollout this family cannot run (before anything is allocated)."""
        if cond.prompts is None:
            raise FastARError("this model is conditioned on text: give a prompt (T5 features)")

    def before_chunk(self, cond, frame_start: int, frames: int) -> None:  # noqa: B027 - Wan needs nothing
        """Called before each chunk (and each clean pass of initial frames) runs."""

    # -- the forward's hooks --------------------------------------------------------------------------------
    def model_input(self, runner, x, context, info):
        """The patch embedding's input for noisy latent frames ``x`` of this pass."""
        return x

    def encode_context(self, runner, cond, segment):
        """Cross-attention K/V (a ``TextState``) for the context in force: a prompt ``segment`` for Wan."""
        return runner.encode_text(segment.context)

    def after_self_attention(self, runner, layer, blk, x, y, gate1, context, info):
        """Block ``layer``'s self-attention output ``y`` into the hidden state, and the cross-attention query:
        Wan's gated residual, then the query of ``norm3`` of the result."""
        return runner.pieces.after_self_attention(blk, x, y, gate1, runner.geometry.num_heads)

    def block_tail(self, runner, layer, blk, x, y, shift2, scale2, gate2, context, caches, info, commit):
        """Block ``layer`` after its cross-attention output ``y``: Wan's residual and gated feed-forward."""
        return runner.pieces.after_cross_attention(blk, x, y, shift2, scale2, gate2)

    def extra_caches(self, runner, cfg, total_frames: int, grid_hw) -> dict:
        """Caches beside the self-attention cache, by name (none for Wan)."""
        return {}


FAMILIES: dict[str, type[ModelFamily]] = {}


def register_family(cls: type[ModelFamily]) -> type[ModelFamily]:
    """Add a family to the registry (a class decorator); later ones are asked first."""
    FAMILIES[cls.name] = cls
    return cls


register_family(ModelFamily)


def family_for(model) -> ModelFamily:
    """The family whose module tree ``model`` is: the most recently registered one that claims it, else Wan."""
    for cls in reversed(list(FAMILIES.values())):
        if cls is not ModelFamily and cls.matches(model):
            return cls.for_model(model)  # type: ignore[attr-defined]
    return ModelFamily()
