"""Every workflow in example_workflows/ is a valid ComfyUI UI-format graph of nodes that exist, with matching widgets
and well-typed links, naming the model files it needs the way ComfyUI templates do."""

import json
from pathlib import Path

import pytest

from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS
from comfyui_fastar.nodes.node_loader import BUNDLED_DEMO_WORLD

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "example_workflows").glob("*.json"))
# ComfyUI serves a pack's example_workflows/, example/, examples/, workflow/ or workflows/ folder as templates
# (app/custom_node_manager.py), listing the files of every one of them; ours is example_workflows/, the name both
# 0.3.x and 0.2x prefer (the others log a hint on 0.2x), and the only one, so nothing is listed twice.
TEMPLATE_FOLDERS = ("example_workflows", "example", "examples", "workflow", "workflows")
FRONTEND_ONLY = {"MarkdownNote": ["text"], "Note": ["text"]}
FILE_WIDGETS = {"model_name": "diffusion_models", "lora_name": "loras", "clip_name": "text_encoders",
                "vae_name": "vae", "unet_name": "diffusion_models"}
# Nodes whose file widget names another folder than FILE_WIDGETS says.
NODE_FILE_WIDGETS = {"CLIPVisionLoader": {"clip_name": "clip_vision"}}


def w(name, kind, **opts):
    return (name, kind, opts)


def s(name, kind, optional=False):
    return (name, kind, {"socket": True, "optional": optional})


# The core nodes the workflows use, as ComfyUI 0.3.64's /object_info describes them (input order matters), plus two
# of 0.27.0's for the core AR template.
CORE_NODES = {
    "CLIPLoader": ([w("clip_name", "COMBO"), w("type", "COMBO", options=["wan"]),
                    w("device", "COMBO", options=["default", "cpu"])], ["CLIP"]),
    "CLIPTextEncode": ([w("text", "STRING"), s("clip", "CLIP")], ["CONDITIONING"]),
    "VAELoader": ([w("vae_name", "COMBO")], ["VAE"]),
    "VAEDecode": ([s("samples", "LATENT"), s("vae", "VAE")], ["IMAGE"]),
    "CreateVideo": ([s("images", "IMAGE"), w("fps", "FLOAT", min=1.0, max=120.0), s("audio", "AUDIO", True)],
                    ["VIDEO"]),
    "SaveVideo": ([s("video", "VIDEO"), w("filename_prefix", "STRING"), w("format", "COMBO", options=["auto", "mp4"]),
                   w("codec", "COMBO", options=["auto", "h264"])], []),
    "PreviewAny": ([s("source", "*")], []),
    "LoadImage": ([w("image", "COMBO", upload=True)], ["IMAGE", "MASK"]),
    "CLIPVisionLoader": ([w("clip_name", "COMBO")], ["CLIP_VISION"]),
    "CLIPVisionEncode": ([s("clip_vision", "CLIP_VISION"), s("image", "IMAGE"),
                          w("crop", "COMBO", options=["center", "none"])], ["CLIP_VISION_OUTPUT"]),
    "EmptyHunyuanLatentVideo": ([w("width", "INT", min=16, max=16384), w("height", "INT", min=16, max=16384),
                                 w("length", "INT", min=1, max=16384), w("batch_size", "INT", min=1, max=4096)],
                                ["LATENT"]),
    "SamplerCustomAdvanced": ([s("noise", "NOISE"), s("guider", "GUIDER"), s("sampler", "SAMPLER"),
                               s("sigmas", "SIGMAS"), s("latent_image", "LATENT")], ["LATENT", "LATENT"]),
    "CFGGuider": ([s("model", "MODEL"), s("positive", "CONDITIONING"), s("negative", "CONDITIONING"),
                   w("cfg", "FLOAT", min=0.0, max=100.0)], ["GUIDER"]),
    "BasicScheduler": ([s("model", "MODEL"), w("scheduler", "COMBO", options=["simple", "sgm_uniform", "karras"]),
                        w("steps", "INT", min=1, max=10000), w("denoise", "FLOAT", min=0.0, max=1.0)], ["SIGMAS"]),
    "RandomNoise": ([w("noise_seed", "INT", min=0, max=2**64 - 1, seed=True)], ["NOISE"]),
    # ComfyUI 0.21+ (0.27.0's definitions): its own loader for causal checkpoints and AR image to video
    "UNETLoader": ([w("unet_name", "COMBO"), w("weight_dtype", "COMBO", options=["default", "fp8_e4m3fn"])],
                   ["MODEL"]),
    "ARVideoI2V": ([s("model", "MODEL"), s("vae", "VAE"), s("start_image", "IMAGE"),
                    w("width", "INT", min=16, max=8192), w("height", "INT", min=16, max=8192),
                    w("length", "INT", min=1, max=1024), w("batch_size", "INT", min=1, max=64)], ["MODEL", "LATENT"]),
}


def pack_node(node_type):
    cls = NODE_CLASS_MAPPINGS[node_type]
    spec = cls.INPUT_TYPES()
    inputs = []
    for section in ("required", "optional"):
        for name, (kind, *rest) in spec.get(section, {}).items():
            opts = rest[0] if rest else {}
            if isinstance(kind, list):
                options = kind if name not in FILE_WIDGETS else None
                inputs.append(w(name, "COMBO", options=options))
            elif kind in ("INT", "FLOAT", "STRING", "BOOLEAN"):
                inputs.append(w(name, kind, min=opts.get("min"), max=opts.get("max"),
                                seed=bool(opts.get("control_after_generate"))))
            else:
                inputs.append(s(name, kind, section == "optional"))
    return inputs, list(cls.RETURN_TYPES)


def node_spec(node_type):
    if node_type in NODE_CLASS_MAPPINGS:
        return pack_node(node_type)
    if node_type in CORE_NODES:
        return CORE_NODES[node_type]
    raise AssertionError(f"node type {node_type} is neither ours nor in the list of core nodes the workflows use")


def accepts(input_type, link_type):
    if input_type == "*":
        return True
    return bool({t.strip() for t in input_type.split(",")} & {t.strip() for t in link_type.split(",")})


def check_widgets(node, inputs):
    values = list(node.get("widgets_values") or [])
    i = 0
    for name, kind, opts in inputs:
        if opts.get("socket"):
            continue
        assert i < len(values), f"node {node['id']} {node['type']}: no value for widget {name}"
        value = values[i]
        where = f"node {node['id']} {node['type']}.{name} = {value!r}"
        if kind == "COMBO":
            assert isinstance(value, str), where
            if opts.get("options"):
                assert value in opts["options"], where
        elif kind in ("INT", "FLOAT"):
            assert isinstance(value, (int, float)) and not isinstance(value, bool), where
            if kind == "INT":
                assert isinstance(value, int), where
            if opts.get("min") is not None:
                assert opts["min"] <= value <= opts["max"], where
        elif kind == "STRING":
            assert isinstance(value, str), where
        i += 1
        if opts.get("seed"):
            assert values[i] in ("fixed", "increment", "decrement", "randomize"), f"{where}: control value"
            i += 1
        if opts.get("upload"):
            i += 1  # the upload button's value
    assert i == len(values), f"node {node['id']} {node['type']}: {len(values)} widget values for {i} widgets"


def widget_value(node, inputs, wanted):
    i = 0
    for name, _, opts in inputs:
        if opts.get("socket"):
            continue
        if name == wanted:
            return node["widgets_values"][i]
        i += 1 + bool(opts.get("seed")) + bool(opts.get("upload"))
    return None


# The editor's missing-model dialog downloads only .safetensors/.sft on 1.27.10 (1.45.20 also takes .pt/.pth/.ckpt).
# These repositories release the family's weights as .pt only, so a workflow may name their .pt files; any other
# model must be named as the .safetensors file it is released as.
PT_ONLY_RELEASES = ("https://huggingface.co/gdhe17/Self-Forcing/", "https://huggingface.co/Efficient-Large-Model/",
                    "https://huggingface.co/TencentARC/RollingForcing/", "https://huggingface.co/tianweiy/CausVid/",
                    "https://huggingface.co/zhuhz22/Causal-Forcing/resolve/main/chunkwise/")
# .pt releases that also exist as safetensors: name the safetensors file instead.
SAFETENSORS_INSTEAD = {
    "https://huggingface.co/zhuhz22/Causal-Forcing/resolve/main/framewise/causal_forcing.pt":
        "https://huggingface.co/TalmajM/causal_forcing_framewise_ComfyUI_repackaged/resolve/main/split_files/"
        "diffusion_models/causal_forcing-framewise.safetensors",
}
MODEL_ENTRY_KEYS = {"name", "url", "directory", "hash", "hash_type"}  # the editor's model metadata fields


def check_model_entry(node, model):
    where = f"node {node['id']} {node['type']}: {model.get('name')}"
    assert {"name", "url", "directory"} <= set(model) <= MODEL_ENTRY_KEYS, f"{where}: fields {sorted(model)}"
    assert model["url"] not in SAFETENSORS_INSTEAD, f"{where}: released as {SAFETENSORS_INSTEAD.get(model['url'])}"
    if not model["name"].endswith((".safetensors", ".sft")):
        assert model["url"].startswith(PT_ONLY_RELEASES), f"{where}: not .safetensors nor a .pt-only release"
    # The editor's Download saves the file under its URL's name: the workflow names the file that download gives,
    # at the top of the folder (the loader lists subfolders as "a/b", which no download makes).
    assert model["url"].split("?")[0].rsplit("/", 1)[-1] == model["name"], f"{where}: the URL downloads another name"


def check_models(node, inputs):
    listed = {m["name"]: m for m in node.get("properties", {}).get("models", [])}
    for model in listed.values():
        check_model_entry(node, model)
    for name, folder in {**FILE_WIDGETS, **NODE_FILE_WIDGETS.get(node["type"], {})}.items():
        value = widget_value(node, inputs, name)
        if value is None or value == "none" or value == BUNDLED_DEMO_WORLD:  # that one ships with the pack
            continue
        assert value in listed, f"node {node['id']} {node['type']}: {value} is not named in properties.models"
        model = listed[value]
        assert model["directory"] == folder, f"{value} belongs in models/{folder}"
        assert model["url"].startswith("https://huggingface.co/"), model["url"]


def check_wan_sizes(node, inputs):
    if node["type"] not in ("FastAR_LongVideoSampler", "FastAR_ImageToVideo", "EmptyHunyuanLatentVideo", "ARVideoI2V",
                            "FastAR_WorldModelStart"):
        return
    length = widget_value(node, inputs, "length")
    assert (length - 1) % 4 == 0, f"node {node['id']}: length {length} is not 4k+1"
    for name in ("width", "height"):
        assert widget_value(node, inputs, name) % 16 == 0, f"node {node['id']}: {name} not a multiple of 16"


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_is_valid(path):
    wf = json.loads(path.read_text())
    assert wf["version"] == 0.4 and isinstance(wf["nodes"], list) and isinstance(wf["links"], list)
    nodes = {n["id"]: n for n in wf["nodes"]}
    assert len(nodes) == len(wf["nodes"]), "node ids must be unique"
    assert wf["last_node_id"] >= max(nodes) and wf["last_link_id"] >= max(link[0] for link in wf["links"])
    specs = {}
    for node in wf["nodes"]:
        assert node["properties"].get("Node name for S&R", node["type"]) == node["type"]
        if node["type"] in FRONTEND_ONLY:
            assert len(node["widgets_values"]) == len(FRONTEND_ONLY[node["type"]])
            continue
        inputs, outputs = node_spec(node["type"])
        specs[node["id"]] = (inputs, outputs)
        check_widgets(node, inputs)
        check_models(node, inputs)
        check_wan_sizes(node, inputs)
        sockets = {name: (kind, opts) for name, kind, opts in inputs if opts.get("socket")}
        widgets = {name for name, _, opts in inputs if not opts.get("socket")}
        widgets |= {"upload" for _, _, opts in inputs if opts.get("upload")}  # the editor's upload button
        for slot in node.get("inputs", []):
            if "widget" in slot:
                assert slot["widget"]["name"] in widgets, f"node {node['id']}: {slot['name']} is not a widget"
            else:
                assert slot["name"] in sockets, f"node {node['id']} {node['type']} has no input {slot['name']}"
                assert slot["type"] == sockets[slot["name"]][0], f"node {node['id']}.{slot['name']} type"
        connected = {slot["name"] for slot in node.get("inputs", []) if slot.get("link") is not None}
        for name, (_, opts) in sockets.items():
            assert opts["optional"] or name in connected, f"node {node['id']} {node['type']}: {name} not connected"
        assert [o["type"] for o in node.get("outputs", [])] == outputs, f"node {node['id']} outputs"

    for link_id, origin, origin_slot, target, target_slot, link_type in wf["links"]:
        src, dst = nodes[origin], nodes[target]
        out = src["outputs"][origin_slot]
        into = dst["inputs"][target_slot]
        assert out["type"] == link_type and link_id in out["links"], f"link {link_id} origin"
        assert into["link"] == link_id, f"link {link_id} target"
        assert accepts(into["type"], link_type), f"link {link_id}: {link_type} into {dst['type']}.{into['name']}"

    types = {n["type"] for n in wf["nodes"]}
    assert types & {"SaveVideo", "FastAR_SaveLongVideo"}, "a workflow ends in a saved video"
    if "FastAR_LongVideoSampler" in types:
        reports = [link for link in wf["links"] if nodes[link[1]]["type"] == "FastAR_LongVideoSampler" and link[2] == 1]
        assert reports and all(nodes[link[3]]["type"] == "PreviewAny" for link in reports), "show the report"


@pytest.mark.parametrize("name, start", [("fastar_world_model_universal", "FastAR_WorldModelStart"),
                                         ("fastar_world_model_templerun", "FastAR_WorldModelStart"),
                                         ("fastar_image_to_video", "FastAR_ImageToVideo")])
def test_the_start_node_sets_the_samplers_size_and_length(name, start):
    """Size and length in one place: the start node's width, height and length outputs are linked to the sampler's
    (whose own widgets keep the same values, shown greyed out by the editor)."""
    wf = json.loads((ROOT / "example_workflows" / f"{name}.json").read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    sampler = next(n for n in wf["nodes"] if n["type"] == "FastAR_LongVideoSampler")
    source = next(n for n in wf["nodes"] if n["type"] == start)
    links = {link[0]: link for link in wf["links"]}
    for field in ("width", "height", "length"):
        slot = next(s for s in sampler["inputs"] if s["name"] == field)
        _, origin, origin_slot, *_ = links[slot["link"]]
        assert nodes[origin] is source and source["outputs"][origin_slot]["name"] == field, field
        assert widget_value(sampler, node_spec(sampler["type"])[0], field) == \
            widget_value(source, node_spec(start)[0], field), field


def test_workflows_cover_the_advertised_uses_and_are_served_as_templates():
    names = {p.stem for p in WORKFLOWS}
    assert {"fastar_long_text_to_video", "fastar_ab_dense_vs_fastar", "fastar_prompt_schedule",
            "fastar_image_to_video", "fastar_custom_sampler", "fastar_core_ar_template"} <= names
    assert WORKFLOWS and [name for name in TEMPLATE_FOLDERS if (ROOT / name).exists()] == ["example_workflows"]
    used = {n["type"] for p in WORKFLOWS for n in json.loads(p.read_text())["nodes"]}
    assert set(NODE_CLASS_MAPPINGS) <= used, f"nodes without an example: {set(NODE_CLASS_MAPPINGS) - used}"


def test_the_live_world_workflow_plays_the_bundled_demo_world_with_fastar_and_dense():
    """Both Live World nodes play the bundled demo world at its own size from one start with one seed, one through
    FAST-AR Attention and one dense, and each saves its frames."""
    wf = json.loads((ROOT / "example_workflows" / "fastar_live_world_demo.json").read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    source = {(link[3], link[4]): nodes[link[1]] for link in wf["links"]}
    live = [n for n in wf["nodes"] if n["type"] == "FastAR_LiveWorld"]
    inputs = node_spec("FastAR_LiveWorld")[0]
    assert len(live) == 2
    models = sorted(source[(n["id"], 0)]["type"] for n in live)
    assert models == ["FastAR_Attention", "FastAR_LoadARVideoModel"]
    assert {source[(n["id"], 1)]["id"] for n in live} == {next(n["id"] for n in wf["nodes"]
                                                                if n["type"] == "FastAR_DemoWorldStart")}
    for n in live:
        assert (widget_value(n, inputs, "width"), widget_value(n, inputs, "height")) == (24, 24)
        assert widget_value(n, inputs, "seed") == widget_value(live[0], inputs, "seed")
    loader = next(n for n in wf["nodes"] if n["type"] == "FastAR_LoadARVideoModel")
    assert loader["widgets_values"][0] == BUNDLED_DEMO_WORLD
    assert sum(n["type"] == "SaveVideo" for n in wf["nodes"]) == 2


def test_the_first_workflows_need_only_files_the_editor_downloads():
    """The plain text-to-video workflows run on a checkpoint released as safetensors (Causal Forcing frame-wise),
    so a new user gets every file from the editor's missing-model dialog, on 1.27.10 too."""
    for name in ("fastar_long_text_to_video", "fastar_custom_sampler", "fastar_core_ar_template"):
        wf = json.loads((ROOT / "example_workflows" / f"{name}.json").read_text())
        models = [m for n in wf["nodes"] for m in n.get("properties", {}).get("models", [])]
        assert models and all(m["name"].endswith(".safetensors") for m in models), name
        blocks = [widget_value(n, node_spec(n["type"])[0], "frames_per_block") for n in wf["nodes"]
                  if n["type"] in ("FastAR_LongVideoSampler", "FastAR_SamplerARVideo")]
        assert all(b == 1 for b in blocks), f"{name}: the frame-wise checkpoint takes frames_per_block 1"



def test_no_two_workflows_save_under_the_same_prefix():
    """Each save node writes under a prefix of its own, so a run of one workflow never numbers on from another's."""
    seen: dict[str, str] = {}
    for path in WORKFLOWS:
        for node in json.loads(path.read_text())["nodes"]:
            if node.get("mode", 0) != 0 or node["type"] in FRONTEND_ONLY:
                continue
            inputs = node_spec(node["type"])[0]
            if not any(name == "filename_prefix" for name, _, _ in inputs):
                continue
            prefix = widget_value(node, inputs, "filename_prefix")
            where = f"{path.name} node {node['id']}"
            assert isinstance(prefix, str) and prefix, where
            assert prefix not in seen, f"{where} saves under {prefix!r}, as {seen.get(prefix)} does"
            seen[prefix] = where
    assert len(seen) >= len(WORKFLOWS)


@pytest.mark.parametrize("variant, steps", [("templerun", [1000, 750, 500, 250]), ("universal", [1000, 666, 333])])
def test_the_world_model_workflows_agree_with_themselves_and_their_variant(variant, steps):
    """World Model Start and the sampler make the same video, the script's times are Create Video's frames, and
    the sampler runs the variant's own settings (its inference config: 3 frames per block, a window of 6 frames
    and no sink, the steps warped at shift 5; TempleRun's four are the Self-Forcing list)."""
    from comfyui_fastar.fastar_core.families.matrix_game.config import MatrixGameConfig
    from comfyui_fastar.fastar_core.rollout.schedule import get_schedule, warp_steps
    from comfyui_fastar.nodes.constants import SCHEDULE_PRESETS
    from comfyui_fastar.nodes.node_action_script import script_from_widgets

    wf = json.loads((ROOT / "example_workflows" / f"fastar_world_model_{variant}.json").read_text())
    by_type = {n["type"]: n for n in wf["nodes"]}

    def value(node_type, name):
        return widget_value(by_type[node_type], node_spec(node_type)[0], name)

    for name in ("width", "height", "length"):
        assert value("FastAR_WorldModelStart", name) == value("FastAR_LongVideoSampler", name), name
    assert value("FastAR_ActionScript", "fps") == by_type["CreateVideo"]["widgets_values"][0]
    actions = script_from_widgets(value("FastAR_ActionScript", "variant"), value("FastAR_ActionScript", "fps"),
                                  value("FastAR_ActionScript", "script"))
    assert actions.variant == variant and not actions.unused(value("FastAR_LongVideoSampler", "length"))
    assert (value("FastAR_LongVideoSampler", "frames_per_block"), value("FastAR_LongVideoSampler", "cache_policy"),
            value("FastAR_LongVideoSampler", "sink_frames"), value("FastAR_LongVideoSampler", "window_frames")) == \
        (3, "window", 0, 6)
    schedule = get_schedule(SCHEDULE_PRESETS[value("FastAR_LongVideoSampler", "schedule")])
    assert list(schedule.sigmas) == warp_steps(steps, 5.0)
    assert schedule.name == get_schedule(MatrixGameConfig(action={"keyboard_dim_in": 4 if variant == "universal"
                                                                  else 7, "enable_mouse": variant == "universal"})
                                         .schedule_name).name
    assert value("CLIPVisionEncode", "crop") == "none"


def sampler_caches(wf) -> list[str]:
    """The cache each sampler of a workflow resolves to (the report's ``cache`` line): its widgets, the FAST-AR
    Attention node on its model's path, and the family's own cache of the file its loader names."""
    from comfyui_fastar.fastar_core.caches.spec import SINK_FRAMES, WINDOW_FRAMES
    from comfyui_fastar.fastar_core.families.lingbot.config import RELEASED as LINGBOT
    from comfyui_fastar.fastar_core.families.lingbot.rollout import default_cache as lingbot_cache
    from comfyui_fastar.fastar_core.families.longlive2 import LongLive2Family
    from comfyui_fastar.fastar_core.families.matrix_game.config import RELEASED
    from comfyui_fastar.fastar_core.families.matrix_game.rollout import default_cache
    from comfyui_fastar.fastar_core.rollout.engine import resolve_settings

    own = {"model_bf16.pt": LongLive2Family().own_cache(),
           "base_distill.safetensors": default_cache(RELEASED["universal"]),
           "gta_keyboard2dim.safetensors": default_cache(RELEASED["gta_drive"]),
           "templerun_7dim_onlykey.safetensors": default_cache(RELEASED["templerun"]),
           "diffusion_pytorch_model-00001-of-00004.safetensors": lingbot_cache(LINGBOT["14B"])}
    nodes = {n["id"]: n for n in wf["nodes"]}
    links = {link[0]: link for link in wf["links"]}

    def upstream(node, name):
        slot = next(s for s in node["inputs"] if s["name"] == name)
        return nodes[links[slot["link"]][1]]

    def value(node, name):
        return widget_value(node, node_spec(node["type"])[0], name)

    caches = []
    for sampler in wf["nodes"]:
        own_sizes = sampler["type"] == "FastAR_LiveWorld"  # the engine's sink and window, the model's own chunk
        if sampler["type"] in ("FastAR_LongVideoSampler", "FastAR_LiveWorld"):
            model = upstream(sampler, "model")
        elif sampler["type"] == "FastAR_SamplerARVideo":
            custom = next(n for n in wf["nodes"] if n["type"] == "SamplerCustomAdvanced")
            model = upstream(upstream(custom, "guider"), "model")
        else:
            continue
        preset = "off"
        while model["type"] not in ("FastAR_LoadARVideoModel", "UNETLoader"):  # through patches (ARVideoI2V's too)
            if model["type"] == "FastAR_Attention":
                preset = value(model, "preset")
            model = upstream(model, "model")
        name = value(model, "model_name" if model["type"] == "FastAR_LoadARVideoModel" else "unet_name")
        sizes = ({"sink_frames": SINK_FRAMES, "window_frames": WINDOW_FRAMES, "frames_per_block": 1} if own_sizes
                 else {k: value(sampler, k) for k in ("sink_frames", "window_frames", "frames_per_block")})
        assert not own_sizes or name == BUNDLED_DEMO_WORLD, "a live world other than the demo: its own chunk here"
        settings = resolve_settings(preset=preset, cache_policy=value(sampler, "cache_policy"),
                                    own_cache=own.get(name), **sizes)
        caches.append(settings.cache.describe())
    return caches


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_the_docs_name_the_cache_each_workflow_runs(path):
    """docs/nodes.md's table of workflows gives, for each, the cache its sampler runs, as the report states it."""
    docs = (ROOT / "docs" / "nodes.md").read_text().splitlines()
    rows = [line for line in docs if line.startswith(f"| `{path.name}`")]
    assert len(rows) == 1, f"{path.name}: one row in the docs' table of workflows"
    caches = sampler_caches(json.loads(path.read_text()))
    assert caches, path.name
    for cache in caches:
        assert f"`{cache}`" in rows[0], (path.name, cache, rows[0])
