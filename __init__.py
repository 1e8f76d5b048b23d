"""ComfyUI-FastAR: long videos and steerable worlds from autoregressive Wan models, with a bounded KV cache.

ComfyUI imports this folder as a custom node pack and reads ``NODE_CLASS_MAPPINGS``. Standalone tools (the
``fastar`` command line, tests, benchmarks) import the same folder as the package ``comfyui_fastar``. Nothing
here imports ComfyUI: the nodes reach for it only when they run inside it.

The node classes (and torch with them) are imported when ComfyUI first reads the mappings, not when the package
is imported: the command line starts without them, so its own error handling is in place before torch loads.
"""

# The front-end extension ComfyUI serves as /extensions/<pack folder>/*.js: the Live World node's view and keys.
WEB_DIRECTORY = "./web"
__version__ = "0.1.0"
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "__version__"]
_NODE_NAMES = ("NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS")


def __getattr__(name: str):
    if name in _NODE_NAMES:
        from . import nodes

        return getattr(nodes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
