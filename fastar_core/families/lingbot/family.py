"""LingBot-World 2.0 as a model family: the runner's hooks and what a rollout must give it.

Per pass: the noisy latent frames joined with the conditioning's mask and image latent of the same frames (36
channels), the prompt's T5 context as Wan's (``text_embedding``), and the camera: the rays of the pass's frames
(``Conditioning.camera``) through ``patch_embedding_wancamctrl`` and a residual MLP (``c2ws_hidden_states_layer1/2``)
once per pass, then in every block, between the self-attention residual and cross-attention, another residual MLP
(``cam_injector_layer1/2``) whose output gives a scale and a shift: ``x = (1 + scale) x + shift``. The
self-attention cache is a window with a sink (``rollout.default_cache``); the family keeps no cache of its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import FastARError
from ...forward.family import ModelFamily, register_family
from ...rollout.conditioning import ChunkConcat, check_first_frame_conditioning
from .config import VAE_STRIDE, LingBotConfig
from .rollout import FRAMES_PER_BLOCK, SCHEDULE, default_cache


def camera_embedding(model, tokens: torch.Tensor) -> torch.Tensor:
    """The model's camera embedding of ray tokens ``[B, N, camera_dim]`` (once per pass)."""
    e = model.patch_embedding_wancamctrl(tokens)
    return e + model.c2ws_hidden_states_layer2(F.silu(model.c2ws_hidden_states_layer1(e)))


def inject_camera(blk, x: torch.Tensor, camera: torch.Tensor) -> torch.Tensor:
    """One block's camera scale and shift of the hidden state."""
    h = blk.cam_injector_layer2(F.silu(blk.cam_injector_layer1(camera))) + camera
    return (1.0 + blk.cam_scale_layer(h)) * x + blk.cam_shift_layer(h)


@register_family
class LingBotFamily(ModelFamily):
    name = "lingbot-world-2"
    restartable = False  # its image and camera are read by absolute latent frame

    def __init__(self, config: LingBotConfig):
        self.config = config
        self._camera_key: tuple | None = None
        self._concat = ChunkConcat()  # the chunk's joined channels on the device
        self._camera: torch.Tensor | None = None

    @classmethod
    def matches(cls, model) -> bool:
        return isinstance(getattr(model, "config", None), LingBotConfig)

    @classmethod
    def for_model(cls, model) -> LingBotFamily:
        return cls(model.config)

    def describe(self) -> str:
        return f"LingBot-World 2.0 ({self.config.size})"

    def check_model(self, model) -> None:
        """Nothing to refuse: the pack's LingBot loader built this module tree from its config."""

    def latent_channels(self, model) -> int:
        """16: the input's other 20 channels are the mask and the start image's latent."""
        return self.config.out_dim

    def own_cache(self):
        return default_cache(self.config)

    def own_rollout(self) -> tuple:
        return FRAMES_PER_BLOCK, SCHEDULE

    def start_image_in_first_chunk(self, schedule) -> bool:
        return False  # the start view is committed context, whatever the solver

    def live_variant(self) -> str:
        return "lingbot"  # its key timeline's variant: keys walk a camera (live.KeyCamera, one call per chunk)

    # -- rollout checks -------------------------------------------------------------------------------------
    def check_rollout(self, cfg, cond) -> None:
        from .camera import CameraConditioning

        c = self.config
        if cfg.sampler_mode != "chunk":
            raise FastARError("LingBot-World 2.0 runs in sampler mode 'chunk'")
        if cfg.multishot is not None or cfg.image_in_first_chunk:
            raise FastARError("multi-shot prompts and image_in_first_chunk are LongLive 2.0's; LingBot-World takes "
                              "neither (its start image is joined to every frame)")
        if cfg.cache.policy_class.rebuilds_each_chunk:
            raise FastARError(f"the {cfg.cache.policy} cache re-encodes its context at new positions before every "
                              "chunk, where LingBot-World's camera is read by frame: use window (its own) or "
                              "tempcache")
        if cfg.channels != c.out_dim:
            raise FastARError(f"the rollout's latent channels ({cfg.channels}) must be the model's {c.out_dim}")
        super().check_rollout(cfg, cond)  # a prompt (T5 features)
        check_first_frame_conditioning(cond, cfg)
        camera = cond.camera
        if not isinstance(camera, CameraConditioning):
            raise FastARError("LingBot-World 2.0 is steered by a camera path: give Conditioning.camera (a camera "
                              "folder with poses.npy and intrinsics.npy, or a key timeline, through "
                              "lingbot.rollout.lingbot_conditioning)")
        size = (cfg.latent_height * VAE_STRIDE, cfg.latent_width * VAE_STRIDE)
        if (camera.height, camera.width) != size:
            raise FastARError(f"the camera's rays are for {camera.height}x{camera.width} pixels; the rollout's "
                              f"latents are {size[0]}x{size[1]}")
        if camera.source is None and camera.num_frames < cfg.num_frames:
            raise FastARError(f"the camera path covers {camera.num_frames} latent frames; the rollout makes "
                              f"{cfg.num_frames}")
        self._camera_key = None
        self._concat = ChunkConcat()

    def before_chunk(self, cond, frame_start: int, frames: int) -> None:
        """A live camera (one with a source) makes the chunk's motion now."""
        cond.camera.require(frame_start + frames)

    # -- the forward's hooks --------------------------------------------------------------------------------
    def encode_context(self, runner, cond, segment):
        """The prompt's cross-attention K/V, as Wan's; the passes read the image and camera from ``cond``."""
        state = runner.encode_text(segment.context)
        state.cond = cond
        return state

    def model_input(self, runner, x, context, info):
        return torch.cat([x, self._concat(context.cond, info.frame_start, x)], dim=1)

    def after_self_attention(self, runner, layer, blk, x, y, gate1, context, info):
        frames = gate1.shape[1]
        x = runner.pieces.self_attention_residual(blk, x, y, gate1)
        x = inject_camera(blk, x, self._pass_camera(runner, context.cond, info.frame_start, frames, x))
        return x, runner.pieces.cross_attention_query(blk, x, runner.geometry.num_heads)

    def _pass_camera(self, runner, cond, frame_start, frames, x):
        """The camera embedding of this pass's frames, made once per pass (every block reads it)."""
        key = (id(cond.camera), frame_start, frames, x.shape[0], x.device, x.dtype)
        if key != self._camera_key:
            with torch.no_grad():
                tokens = cond.camera.tokens(frame_start, frames, self.config.patch_size, x.device, x.dtype)
                e = camera_embedding(runner.model, tokens).expand(x.shape[0], -1, -1)
                if runner.parallel is not None:  # this rank's tokens of every frame, as the hidden state holds them
                    e = runner.parallel.shard_tokens(e, frames)
            self._camera, self._camera_key = e, key
        assert self._camera is not None
        return self._camera
