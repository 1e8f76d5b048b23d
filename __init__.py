"""ComfyUI-FastAR: long videos and steerable worlds from autoregressive Wan models, with a bounded KV cache.

ComfyUI imports this folder as a custom node pack and reads ``NODE_CLASS_MAPPINGS``. Standalone tools (the
``fastar`` command line, tests, benchmarks) import the same folder as the package ``comfyui_fastar``. Nothing
here imports ComfyUI: the nodes reach for it only when they run inside it.
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

# The front-end extension ComfyUI serves as /extensions/<pack folder>/*.js: the Live World node's view and keys.
WEB_DIRECTORY = "./web"
__version__ = "0.1.0"
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "__version__"]
