"""Names shared by the nodes, the workflows and the tests (changing one breaks saved workflows)."""

CATEGORY = "FAST-AR"

# Custom socket type carrying an ``ARPromptSchedule`` between our nodes.
PROMPT_SCHEDULE = "AR_PROMPT_SCHEDULE"
# Inputs that take a plain CONDITIONING or a schedule; ComfyUI matches comma-separated types as a union.
CONDITIONING_OR_SCHEDULE = f"CONDITIONING,{PROMPT_SCHEDULE}"

# Key in a conditioning entry's dict that carries the start image's raw VAE latent (image to video).
INITIAL_LATENT_KEY = "fastar_initial_latent"
# Key in model_options["transformer_options"] that carries the FAST-AR config as a plain dict.
FASTAR_OPTIONS_KEY = "fastar"

# Sampler widget value -> engine schedule preset.
SCHEDULE_PRESETS = {
    "Self-Forcing 4-step": "self-forcing",
    "Rolling Forcing 5-step": "rolling-forcing",
    "CausVid 3-step": "causvid",
}
CACHE_POLICIES = ("auto", "global", "window", "rolling", "tempcache")
SAMPLER_MODES = ("auto", "chunk", "rolling")
FASTAR_PRESETS = ("off", "quality", "balanced", "fast")
FASTAR_BACKENDS = ("auto", "triton", "flashinfer", "flex", "torch")
SWITCH = ("preset", "on", "off")  # a FAST-AR component: as the preset says, or forced
# AnnCA: the exact pad merge (what the presets use), the merge plus per-frame prompt pruning, or nothing.
ANNCA_CHOICES = ("preset", "pad merge", "pad merge + prune", "off")

# Wan2.1: 8x spatial VAE and a 2x2 patch, so pixel sizes step by 16; 4x temporal VAE, so lengths are 4k+1.
PIXEL_STEP = 16
VAE_SPATIAL = 8
VAE_TEMPORAL = 4
LATENT_CHANNELS = 16
MAX_RESOLUTION = 8192
MAX_LENGTH = 4 * 4096 + 1  # no RoPE limit in the engine; this only keeps the widget sane
