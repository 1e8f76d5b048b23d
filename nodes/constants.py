"""Names shared by the nodes, the workflows and the tests (changing one breaks saved workflows)."""

# The engine's defaults for the sampler inputs (re-exported), so the nodes and the engine never disagree.
from ..fastar_core.caches.spec import SINK_FRAMES as SINK_FRAMES
from ..fastar_core.caches.spec import WINDOW_FRAMES as WINDOW_FRAMES
from ..fastar_core.fastar.config import BACKENDS, PRESET_NAMES
from ..fastar_core.rollout import video_geometry
from ..fastar_core.rollout.engine import CACHE_CHOICES
from ..fastar_core.rollout.sampler import FRAMES_PER_BLOCK as FRAMES_PER_BLOCK
from ..fastar_core.rollout.sampler import MODE_CHOICES

CATEGORY = "FAST-AR"

# Custom socket type carrying an ``ARPromptSchedule`` between our nodes.
PROMPT_SCHEDULE = "AR_PROMPT_SCHEDULE"
# Custom socket type carrying an action script (``fastar_core.action_script.ActionScript``) to the samplers.
ACTIONS = "FASTAR_ACTIONS"
# Inputs that take a plain CONDITIONING or a schedule; ComfyUI matches comma-separated types as a union.
CONDITIONING_OR_SCHEDULE = f"CONDITIONING,{PROMPT_SCHEDULE}"

# Key in a conditioning entry's dict that carries the start image's raw VAE latent (image to video).
INITIAL_LATENT_KEY = "fastar_initial_latent"
# Key in a conditioning entry's dict that carries a world model's start: the VAE latent of the start image followed
# by blank frames, which Matrix-Game 2.0 reads beside every frame it generates: [B, 16, T, h, w], or its distinct
# frames [B, 16, D, h, w] with WORLD_START_INDEX_KEY's [T] long tensor saying which one each latent frame is (the
# blank frames' latents stop changing once the VAE's reach has left the image).
WORLD_START_KEY = "fastar_world_start"
WORLD_START_INDEX_KEY = "fastar_world_start_index"
# Key in a conditioning entry's dict where a start node records the video's (width, height, length, node name): the
# one place they are set (video_size.py).
VIDEO_SIZE_KEY = "fastar_video_size"
# Key in a conditioning entry's dict that carries the demo world's start: {"map_seed", "x", "y"} (Demo World Start).
DEMO_WORLD_START_KEY = "fastar_demo_world_start"
# Matrix-Game 2.0's own size (352x640) and the CLIP vision tokens it attends to (ViT-H penultimate layer).
WORLD_WIDTH, WORLD_HEIGHT = 640, 352
CLIP_VISION_TOKENS = 257
# Where ComfyUI's own AR nodes (0.21+: ARVideoI2V, the ar_video sampler) keep a start image: the raw VAE latent in
# model_options["transformer_options"]["ar_config"]["initial_latent"].
CORE_AR_CONFIG_KEY = "ar_config"
CORE_START_LATENT_KEY = "initial_latent"
# Where ComfyUI's TorchCompileModel (comfy_api.torch_helpers.set_torch_compile_wrapper) keeps its torch.compile
# settings: model_options["torch_compile_kwargs"] = {backend, options, mode, fullgraph, dynamic}.
TORCH_COMPILE_KWARGS_KEY = "torch_compile_kwargs"
# Key in model_options["transformer_options"] that carries the FAST-AR config as a plain dict.
FASTAR_OPTIONS_KEY = "fastar"

# Sampler widget value -> engine schedule preset.
SCHEDULE_PRESETS = {
    "Self-Forcing 4-step": "self-forcing",
    "Rolling Forcing 5-step": "rolling-forcing",
    "CausVid 3-step": "causvid",
    "Krea Realtime 5-step": "krea",
    "Causal Forcing++ 1-step": "causal-forcing++-1step",
    "Causal Forcing++ 2-step": "causal-forcing++-2step",
    "Matrix-Game 3-step": "matrix-game",
    "LongLive 2.0 4-step (UniPC)": "longlive2",
    "LingBot-World 4-step": "lingbot",
    "model's own": "own",  # the step list of the MODEL's own inference (a world model's; the demo world's file's)
}
MODEL_OWN = "model's own"
# The engine's own names, so a node can never offer a choice the engine refuses.
CACHE_POLICIES = CACHE_CHOICES
SAMPLER_MODES = MODE_CHOICES
FASTAR_PRESETS = PRESET_NAMES
FASTAR_BACKENDS = (*BACKENDS, "comfy")  # "comfy": ComfyUI's attention, registered by host.py inside ComfyUI
SWITCH = ("preset", "on", "off")  # a FAST-AR component: as the preset says, or forced
# AnnCA: the exact pad merge (what the presets use), the merge plus per-frame prompt pruning, or nothing.
ANNCA_CHOICES = ("preset", "pad merge", "pad merge + prune", "off")

# Wan2.1's VAE arithmetic lives in the engine (fastar_core.video_geometry); the widgets use its steps.
PIXEL_STEP = video_geometry.PIXEL_STEP
LATENT_CHANNELS = video_geometry.LATENT_CHANNELS
MAX_RESOLUTION = 8192
MAX_LENGTH = 4 * 4096 + 1  # no RoPE limit in the engine; this only keeps the widget sane
