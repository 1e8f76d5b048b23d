"""Writes a CLIP vision model ComfyUI loads, with random weights, for the Matrix-Game host test: run with the host's
python in its ComfyUI folder as ``python comfyui_tiny_clip_vision.py OUT.safetensors``. ComfyUI's CLIP vision
configs are fixed-size (there is no tiny one), so this is a full ViT-L/14 (257 tokens of 1024), the smallest
whose penultimate tokens are what Matrix-Game reads (257 per image), in fp16: about 600 MB.
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())
sys.argv, out = [sys.argv[0], "--cpu"], sys.argv[1]
from comfy.cli_args import args  # noqa: E402

args.cpu = True
import comfy.clip_vision  # noqa: E402
import comfy.utils  # noqa: E402
import torch  # noqa: E402

config = os.path.join(os.path.dirname(comfy.clip_vision.__file__), "clip_vision_config_vitl.json")
model = comfy.clip_vision.ClipVisionModel(config)
g = torch.Generator().manual_seed(0)
state = {}
for name, tensor in model.model.state_dict().items():
    if name.endswith(("norm1.weight", "norm2.weight", "layrnorm.weight", "layernorm.weight")):
        state[name] = torch.ones(tensor.shape, dtype=torch.float16)
    elif name.endswith("bias"):
        state[name] = torch.zeros(tensor.shape, dtype=torch.float16)
    else:
        state[name] = (torch.randn(tensor.shape, generator=g) * 0.02).to(torch.float16)
comfy.utils.save_torch_file(state, out)
print("RESULT " + json.dumps({"tensors": len(state)}))
