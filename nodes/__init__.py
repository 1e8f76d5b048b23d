"""ComfyUI node classes (V1 API). Importing this package never imports ComfyUI: the nodes reach it at run time
through ``host.py``, which falls back to plain Python when ComfyUI is not loaded."""

from .host import comfy_loaded, get_host
from .live import live_routes
from .node_action_script import ActionScriptNode
from .node_attention import FastARAttentionPatch
from .node_camera_path import CameraPathNode
from .node_demo_world_frames import DemoWorldFrames
from .node_demo_world_start import DemoWorldStart
from .node_image_to_video import ARImageToVideo
from .node_lingbot_start import LingBotWorldStart
from .node_live_world import LiveWorld
from .node_loader import LoadARVideoModel
from .node_long_sampler import LongVideoSampler
from .node_prompt_schedule import ARPromptScheduleNode
from .node_sampler_ar import SamplerARVideoFastAR
from .node_streaming_save import SaveLongVideoStreaming
from .node_world_start import WorldModelStart

# Stable ids: saved workflows refer to them. Prefixed so they never collide with core nodes.
NODE_CLASS_MAPPINGS = {
    "FastAR_LoadARVideoModel": LoadARVideoModel,
    "FastAR_Attention": FastARAttentionPatch,
    "FastAR_PromptSchedule": ARPromptScheduleNode,
    "FastAR_LongVideoSampler": LongVideoSampler,
    "FastAR_SamplerARVideo": SamplerARVideoFastAR,
    "FastAR_ImageToVideo": ARImageToVideo,
    "FastAR_SaveLongVideo": SaveLongVideoStreaming,
    "FastAR_ActionScript": ActionScriptNode,
    "FastAR_WorldModelStart": WorldModelStart,
    "FastAR_LingBotWorldStart": LingBotWorldStart,
    "FastAR_CameraPath": CameraPathNode,
    "FastAR_LiveWorld": LiveWorld,
    "FastAR_DemoWorldStart": DemoWorldStart,
    "FastAR_DemoWorldFrames": DemoWorldFrames,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "FastAR_LoadARVideoModel": "Load AR Video Model",
    "FastAR_Attention": "FAST-AR Attention",
    "FastAR_PromptSchedule": "AR Prompt Schedule",
    "FastAR_LongVideoSampler": "Long Video Sampler (AR)",
    "FastAR_SamplerARVideo": "AR Video Sampler (FAST-AR)",
    "FastAR_ImageToVideo": "AR Image to Video",
    "FastAR_SaveLongVideo": "Save Long Video (streaming decode)",
    "FastAR_ActionScript": "Action Script (world models)",
    "FastAR_WorldModelStart": "World Model Start (Matrix-Game)",
    "FastAR_LingBotWorldStart": "LingBot World Start (LingBot-World 2.0)",
    "FastAR_CameraPath": "Camera Path (LingBot-World 2.0)",
    "FastAR_LiveWorld": "Live World (play)",
    "FastAR_DemoWorldStart": "Demo World Start",
    "FastAR_DemoWorldFrames": "Demo World Frames",
}

if comfy_loaded():  # the live plays' key route, on ComfyUI's own server
    get_host().add_routes(live_routes())

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
