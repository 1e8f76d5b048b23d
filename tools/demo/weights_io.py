"""Writing the bundled weights file: one fp16 safetensors holding the video model and its text encoder (read back by
``fastar_core/families/demo/model.py``).

The video model's keys carry ComfyUI's bundle prefix (``model.diffusion_model.``), which the engine's
checkpoint loader strips, so ``load_wan_model`` and ``fastar info`` read the file as any Wan checkpoint; the text
encoder sits beside it under ``text_encoder.``. The metadata holds the Wan config (``fastar_config``) and a
``demo`` entry: vocabulary, trained span, recommended rollout settings and a training summary. It is read back,
every entry checked, by ``fastar_core/families/demo/weights_file.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...fastar_core.families.demo.text import STATE_PREFIX
from .settings import MODEL_PREFIX


def save_demo_weights(model, text_encoder, path, demo_metadata: dict, dtype=torch.float16,
                      extra: dict | None = None) -> None:
    """``extra``: key prefix -> module, stored beside the text encoder (the world model's action encoder)."""
    from safetensors.torch import save_file

    tensors = {MODEL_PREFIX + k: v for k, v in model.state_dict().items()}
    tensors.update({STATE_PREFIX + k: v for k, v in text_encoder.state_dict().items()})
    for prefix, module in (extra or {}).items():
        tensors.update({prefix + k: v for k, v in module.state_dict().items()})
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
    metadata = {"fastar_config": json.dumps(model.config.to_dict()), "demo": json.dumps(demo_metadata)}
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)  # a run stopped mid-write never leaves a truncated file behind
