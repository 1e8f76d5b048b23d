"""ComfyUI node classes (V1 API). Importing this module never imports ComfyUI."""

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
