"""LingBot-World 2.0's module tree, named as its checkpoints' keys.

Wan's blocks (``wan_model.py``) with four camera layers each (``cam_injector_layer1/2``, ``cam_scale_layer``,
``cam_shift_layer``), a 36-channel patch embedding, and the camera embedding at the top (``patch_embedding_wancamctrl``
and ``c2ws_hidden_states_layer1/2``). Weights only: the forward is the runner's, with this family's hooks
(``family.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...model.wan_model import WanBlock, WanHead, randomize_
from .config import LingBotConfig


class LingBotBlock(WanBlock):
    def __init__(self, cfg: LingBotConfig):
        super().__init__(cfg)
        d = cfg.dim
        self.cam_injector_layer1 = nn.Linear(d, d)
        self.cam_injector_layer2 = nn.Linear(d, d)
        self.cam_scale_layer = nn.Linear(d, d)
        self.cam_shift_layer = nn.Linear(d, d)


class LingBotModel(nn.Module):
    def __init__(self, cfg: LingBotConfig):
        super().__init__()
        self.config = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_dim, d)
        self.c2ws_hidden_states_layer1 = nn.Linear(d, d)
        self.c2ws_hidden_states_layer2 = nn.Linear(d, d)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, d * 6))
        self.blocks = nn.ModuleList([LingBotBlock(cfg) for _ in range(cfg.num_layers)])
        self.head = WanHead(cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.head.head.weight.dtype


def random_lingbot(cfg: LingBotConfig, seed: int = 0, std: float = 0.05, dtype=torch.float32) -> LingBotModel:
    """A randomly initialised model (seeded, global RNG untouched) for tests and shape benches."""
    model = LingBotModel(cfg)
    randomize_(model, seed, std, lambda name, p: name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")))
    return model.to(dtype)
