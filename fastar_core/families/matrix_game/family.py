"""Matrix-Game 2.0 as a model family: the runner's hooks and what a rollout must give it.

Per pass: the noisy latent frames joined with the conditioning's mask and image latent of the same frames (36
channels), the CLIP-vision context through ``img_emb``, the action module after cross-attention in the blocks that
have one, reading the actions up to the pass's last latent frame; keyboard and mouse caches beside the
self-attention cache, committed by the same clean pass.
"""

from __future__ import annotations

import torch

from ...errors import FastARError
from ...forward.family import ModelFamily, register_family
from ...rollout.conditioning import ChunkConcat, check_first_frame_conditioning
from .action import action_module
from .caches import FrameWindowCache
from .config import MatrixGameConfig
from .rollout import FRAMES_PER_BLOCK, default_cache


@register_family
class MatrixGameFamily(ModelFamily):
    name = "matrix-game-2"
    restartable = False

    def __init__(self, config: MatrixGameConfig):
        self.config = config
        self._actions_key: tuple | None = None
        self._concat = ChunkConcat()  # the chunk's joined channels on the device
        self._actions: tuple = (None, None)

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(getattr(model, "config", None), MatrixGameConfig)

    @classmethod
    def for_model(cls, model) -> MatrixGameFamily:
        return cls(model.config)

    def describe(self) -> str:
        return f"Matrix-Game 2.0 {self.config.variant}"

    def check_model(self, model) -> None:
        """Nothing to refuse: the pack's Matrix-Game loader built this module tree from its config."""

    def latent_channels(self, model) -> int:
        """16: the input's other 20 channels are the mask and the start image's latent."""
        return self.config.out_dim

    def own_cache(self):
        return default_cache(self.config)

    def own_rollout(self) -> tuple:
        return FRAMES_PER_BLOCK, self.config.schedule_name

    def start_image_in_first_chunk(self, schedule) -> bool:
        return False  # the start view is committed context, whatever the solver

    def live_variant(self) -> str:
        return self.config.variant

    def fastar_attention_refusal(self) -> str:
        return ("FAST-AR's attention patch is written for Wan's text-conditioned block (AnnCA merges a padded text "
                "prompt), and Matrix-Game 2.0 attends to the start image's CLIP tokens and runs an action module in "
                "its blocks. FAST-AR's TempCache does run on it: leave the MODEL unpatched and set the Long Video "
                "Sampler's cache_policy to tempcache (it then holds what the model's own window holds)")

    @property
    def action_layers(self) -> tuple:
        return tuple(sorted(self.config.action.blocks))

    # -- rollout checks -------------------------------------------------------------------------------------
    def check_rollout(self, cfg, cond) -> None:
        c = self.config
        if cfg.sampler_mode != "chunk":
            raise FastARError("Matrix-Game 2.0 runs in sampler mode 'chunk'")
        if cfg.multishot is not None or cfg.image_in_first_chunk:
            raise FastARError("multi-shot prompts and image_in_first_chunk are LongLive 2.0's; Matrix-Game takes "
                              "neither")
        if cfg.cache.policy_class.rebuilds_each_chunk:
            raise FastARError(f"the {cfg.cache.policy} cache rebuilds itself before every chunk; Matrix-Game's "
                              "keyboard and mouse caches follow the clean passes: use window (its own) or tempcache")
        if cfg.frames_per_block > c.local_attn_size:
            raise FastARError(f"frames_per_block {cfg.frames_per_block} exceeds the model's local_attn_size "
                              f"{c.local_attn_size}")
        if cfg.channels != c.out_dim:
            raise FastARError(f"the rollout's latent channels ({cfg.channels}) must be the model's {c.out_dim}")
        if cond.prompts is not None:
            raise FastARError("Matrix-Game 2.0 takes no text prompt: its context is the start image's CLIP-vision "
                              "features (Conditioning.clip)")
        clip = cond.clip
        if clip is None or clip.ndim != 3 or clip.shape[-1] != c.clip_dim or clip.shape[0] not in (1, cfg.batch):
            got = "none" if clip is None else list(clip.shape)
            raise FastARError(f"CLIP-vision features have shape {got}; expected [batch ({cfg.batch}) or 1, tokens, "
                              f"{c.clip_dim}] (257 tokens from CLIP ViT-H/14)")
        check_first_frame_conditioning(cond, cfg)
        if not clip.isfinite().all():
            raise FastARError("the CLIP-vision features contain NaN or infinite values")
        if self.action_layers:
            if cond.actions is None:
                keys = "keyboard and mouse" if c.action.enable_mouse else "keyboard"
                raise FastARError(f"this Matrix-Game model ({c.variant}) is steered by {keys} actions: give "
                                  "Conditioning.actions")
            cond.actions.check_layout(c.action.layout)
        self._actions_key = None
        self._concat = ChunkConcat()

    def before_chunk(self, cond, frame_start: int, frames: int) -> None:
        if cond.actions is not None:
            cond.actions.require(frame_start + frames)

    # -- the forward's hooks --------------------------------------------------------------------------------
    def model_input(self, runner, x, context, info):
        return torch.cat([x, self._concat(context.cond, info.frame_start, x)], dim=1)

    def encode_context(self, runner, cond, segment):
        clip = cond.clip.to(device=runner.device, dtype=runner.dtype)
        if clip.shape[0] != cond.concat.shape[0]:
            clip = clip.expand(cond.concat.shape[0], -1, -1)
        with torch.no_grad():
            return runner.context_state(runner.model.img_emb(clip), clip.shape[1], cond)

    def block_tail(self, runner, layer, blk, x, y, shift2, scale2, gate2, context, caches, info, commit):
        x = runner.pieces.cross_attention_residual(blk, x, y)
        am = getattr(blk, "action_model", None)
        if am is not None:
            frames = shift2.shape[1]
            keyboard, mouse = self._pass_actions(context.cond, info.frame_start, frames, x)
            extra = getattr(caches, "extra", {}) if caches is not None else {}
            x = action_module(am, self.config.action, x, frames, keyboard, mouse, info.frame_start, extra, layer,
                              commit)
        return runner.pieces.feed_forward(blk, x, shift2, scale2, gate2)

    def _pass_actions(self, cond, frame_start, frames, x):
        """The actions up to this pass's last latent frame, read once per pass (every action layer uses them)."""
        key = (id(cond.actions), frame_start, frames, cond.actions.num_frames, x.device, x.dtype)
        if key != self._actions_key:
            self._actions = cond.actions.upto(frame_start + frames, x.device, x.dtype)
            self._actions_key = key
        return self._actions

    def extra_caches(self, runner, cfg, total_frames: int, grid_hw) -> dict:
        if runner.parallel is not None:
            raise FastARError("sequence parallelism is not supported for Matrix-Game 2.0 (its action module attends "
                              "over every location of a frame): run it on one device")
        a, layers = self.config.action, self.action_layers
        if not layers:
            return {}
        window, dtype, device = self.config.local_attn_size, runner.dtype, runner.device
        out = {}
        if a.enable_keyboard:  # one token per frame, the same for every batch item (actions are shared)
            out["keyboard"] = FrameWindowCache("keyboard", layers, 1, a.heads_num, a.keyboard_hidden_dim // a.heads_num,
                                               window, dtype, device)
        if a.enable_mouse:  # one token per location and frame
            rows = cfg.batch * grid_hw[0] * grid_hw[1]
            out["mouse"] = FrameWindowCache("mouse", layers, rows, a.heads_num, a.mouse_hidden_dim // a.heads_num,
                                            window, dtype, device)
        return out

