"""Matrix-Game 2.0's sizes, read from the ``config.json`` its checkpoints ship beside them.

The backbone is Wan2.1's (``WanConfig``) with a 36-channel input (noisy latent 16 + first-frame mask 4 + start
image latent 16), CLIP-vision tokens as the only context, a local attention window of ``local_attn_size`` latent
frames (the chunk included) and an action module in the blocks ``action_config.blocks`` names. The released
variants differ in their keys, mouse and window:

| variant   | keys | mouse | window | steps (warped)        |
| universal | 4    | yes   | 6      | 1000, 666, 333        |
| gta_drive | 2    | yes   | 4      | 1000, 666, 333        |
| templerun | 7    | no    | 6      | 1000, 750, 500, 250   |

``RELEASED`` holds those three configs (the ``config.json`` of each distilled model), so a released file that
sits alone in a models folder, as ComfyUI's model download leaves it, is still read with its own sizes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...model.wan_config import WanConfig
from ...rollout.actions import ActionLayout

CLIP_DIM = 1280  # the CLIP ViT-H/14 features' width (img_emb's input)
CLIP_TOKENS = 257  # 16 x 16 patches and the class token
CONCAT_CHANNELS = 20  # the 4-channel first-frame mask and the start image's 16-channel latent


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ActionConfig:
    """The action module's ``action_config`` (defaults: the reference module's own)."""

    blocks: tuple = ()
    enable_keyboard: bool = True
    enable_mouse: bool = True
    keyboard_dim_in: int = 6
    mouse_dim_in: int = 2
    hidden_size: int = 128
    img_hidden_size: int = 1536
    keyboard_hidden_dim: int = 1024
    mouse_hidden_dim: int = 1024
    vae_time_compression_ratio: int = 4
    windows_size: int = 3
    heads_num: int = 16
    patch_size: tuple = (1, 2, 2)
    qk_norm: bool = True
    qkv_bias: bool = False
    rope_dim_list: tuple = (8, 28, 28)
    rope_theta: float = 256
    mouse_qk_dim_list: tuple = (8, 28, 28)

    def __post_init__(self):
        for name in ("blocks", "patch_size", "rope_dim_list", "mouse_qk_dim_list"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
            if not isinstance(value, (list, tuple)) or len(value) > 4096 or not all(_is_int(v) and v >= 0
                                                                                  for v in value):
                raise ValueError(f"action_config.{name} must be a list of integers >= 0, got {value!r}")
        for name in ("enable_keyboard", "enable_mouse", "qk_norm", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"action_config.{name} must be true or false, got {getattr(self, name)!r}")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 1 < theta < 1e9:
            raise ValueError(f"action_config.rope_theta must be a number above 1, got {theta!r}")
        for name in ("keyboard_dim_in", "mouse_dim_in", "hidden_size", "img_hidden_size", "keyboard_hidden_dim",
                     "mouse_hidden_dim", "vae_time_compression_ratio", "windows_size", "heads_num"):
            value = getattr(self, name)
            if not _is_int(value) or not 1 <= value <= 1 << 16:
                raise ValueError(f"action_config.{name} must be an integer in 1..65536, got {value!r}")
        if self.enable_keyboard and self.keyboard_hidden_dim % self.heads_num:
            raise ValueError(f"action_config.keyboard_hidden_dim {self.keyboard_hidden_dim} is not divisible by "
                             f"heads_num {self.heads_num}")
        if self.enable_mouse and self.mouse_hidden_dim % self.heads_num:
            raise ValueError(f"action_config.mouse_hidden_dim {self.mouse_hidden_dim} is not divisible by "
                             f"heads_num {self.heads_num}")
        if self.enable_keyboard and sum(self.rope_dim_list) != self.keyboard_hidden_dim // self.heads_num:
            raise ValueError(f"action_config.rope_dim_list {list(self.rope_dim_list)} must sum to the keyboard "
                             f"head size {self.keyboard_hidden_dim // self.heads_num}")
        if self.enable_mouse and sum(self.mouse_qk_dim_list) != self.mouse_hidden_dim // self.heads_num:
            raise ValueError(f"action_config.mouse_qk_dim_list {list(self.mouse_qk_dim_list)} must sum to the mouse "
                             f"head size {self.mouse_hidden_dim // self.heads_num}")
        if len(self.patch_size) != 3 or self.patch_size[0] != 1:
            raise ValueError(f"action_config.patch_size {list(self.patch_size)}: the action module's RoPE runs over "
                             "latent frames, which needs a temporal patch of 1")
        if any(d % 2 for d in (*self.rope_dim_list, *self.mouse_qk_dim_list)):
            raise ValueError("action_config rope dimensions must be even (RoPE rotates pairs)")

    @property
    def window_frames(self) -> int:
        """Pixel frames of actions each latent frame reads (``4 x windows_size``)."""
        return self.vae_time_compression_ratio * self.windows_size

    @property
    def layout(self) -> ActionLayout:
        return ActionLayout(num_keys=self.keyboard_dim_in, mouse=self.enable_mouse, mouse_dims=self.mouse_dim_in)


@dataclass(frozen=True)
class MatrixGameConfig(WanConfig):
    in_dim: int = 36
    text_dim: int = CLIP_DIM  # the context's width before img_emb (CLIP-vision, no text)
    local_attn_size: int = 6
    sink_size: int = 0
    clip_dim: int = CLIP_DIM
    action: ActionConfig = field(default_factory=ActionConfig)

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.action, dict):
            object.__setattr__(self, "action", action_config(self.action))
        if not _is_int(self.clip_dim) or not 1 <= self.clip_dim <= 65536:
            raise ValueError(f"clip_dim must be an integer in 1..65536, got {self.clip_dim!r}")
        if not _is_int(self.local_attn_size) or not 1 <= self.local_attn_size <= 4096:
            raise ValueError(f"local_attn_size must be an integer in 1..4096 (the reference needs a window), got "
                             f"{self.local_attn_size!r}")
        if self.sink_size != 0:
            raise ValueError(f"sink_size {self.sink_size}: the released Matrix-Game models keep no sink (0)")
        if self.in_dim != self.out_dim + CONCAT_CHANNELS:
            raise ValueError(f"in_dim {self.in_dim} must be out_dim {self.out_dim} + {CONCAT_CHANNELS} (mask and image "
                             "latent)")
        bad = [b for b in self.action.blocks if b >= self.num_layers]
        if bad:
            raise ValueError(f"action_config.blocks names layers {bad} beyond the model's {self.num_layers}")
        if self.action.blocks and self.action.img_hidden_size != self.dim:
            raise ValueError(f"action_config.img_hidden_size {self.action.img_hidden_size} must equal dim {self.dim}")

    @property
    def variant(self) -> str:
        """Which released model these sizes are, from the action layout and window; 'custom' otherwise."""
        a = self.action
        known = {(True, True, 4, 6): "universal", (True, True, 2, 4): "gta_drive", (True, False, 7, 6): "templerun"}
        return known.get((a.enable_keyboard, a.enable_mouse, a.keyboard_dim_in, self.local_attn_size), "custom")

    @property
    def schedule_name(self) -> str:
        """The step list its inference config gives (templerun 4 steps, the others 3)."""
        return "self-forcing" if self.variant == "templerun" else "matrix-game"

    @property
    def architecture(self) -> str:
        return "Matrix-Game 2.0"

    @property
    def family(self) -> str:
        return f"Matrix-Game-2.0 {self.variant}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch_size"] = list(self.patch_size)
        d["action"] = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.action).items()}
        return d


def action_config(d: dict) -> ActionConfig:
    if not isinstance(d, dict):
        raise ValueError(f"action_config must be a JSON object, got {type(d).__name__}")
    return ActionConfig(**{k: v for k, v in d.items() if k in ActionConfig.__dataclass_fields__})


def from_reference_config(d: dict) -> MatrixGameConfig:
    """A config from the reference's ``config.json`` (``CausalWanModel``'s arguments); ValueError naming a bad
    field."""
    if not isinstance(d, dict):
        raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
    if d.get("model_type", "i2v") != "i2v":
        raise ValueError(f"model_type {d.get('model_type')!r}: Matrix-Game 2.0 is an i2v model")
    if d.get("local_attn_size", 6) == -1:
        raise ValueError("local_attn_size -1 (global attention): the Matrix-Game inference needs a window")
    kw = {k: d[k] for k in ("dim", "num_heads", "num_layers", "ffn_dim", "in_dim", "out_dim", "freq_dim", "text_len",
                            "eps", "local_attn_size", "sink_size", "clip_dim") if k in d}
    if "clip_dim" in kw:  # not in the released files (img_emb takes 1280); the pack's tiny models may set it
        kw["text_dim"] = kw["clip_dim"]
    if "patch_size" in d:
        kw["patch_size"] = tuple(d["patch_size"])
    return MatrixGameConfig(**kw, action=action_config(d.get("action_config") or {}))


def _released(keys: int, mouse: bool, window: int) -> MatrixGameConfig:
    """A released distilled model's config.json: Wan2.1-1.3B's sizes, action modules in blocks 0-14."""
    return MatrixGameConfig(dim=1536, num_heads=12, num_layers=30, ffn_dim=8960, freq_dim=256, text_len=512,
                            local_attn_size=window,
                            action=ActionConfig(blocks=tuple(range(15)), keyboard_dim_in=keys, enable_mouse=mouse))


# The three released variants' configs (Skywork/Matrix-Game-2.0: base_distilled_model, gta_distilled_model,
# templerun_distilled_model), by variant. Their keys and shapes tell them apart (4 keys and a mouse, 2 keys and a
# mouse, 7 keys and none), which is how the loader recognises a released file that has no config.json beside it.
RELEASED = {"universal": _released(4, True, 6), "gta_drive": _released(2, True, 4), "templerun": _released(7, False, 6)}
