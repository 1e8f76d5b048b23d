"""The pack inside a real ComfyUI (CPU), driven over HTTP like a user's browser would.

Needs COMFYUI_DIR: a ComfyUI built by tools/comfyui-host/setup_comfyui.sh with this checkout linked into
custom_nodes (it also writes the tiny Wan model, the random Wan VAE and the harness nodes used here).
COMFYUI_PYTHON overrides the host's interpreter (default: the venv beside COMFYUI_DIR).
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = [pytest.mark.comfyui, pytest.mark.slow,
              pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a host built by setup_comfyui.sh")]
ROOT = Path(__file__).resolve().parents[1]
PORT = int(os.environ.get("COMFYUI_TEST_PORT", "8199"))
SERVER = f"http://127.0.0.1:{PORT}"
TINY_MODEL = "tiny_wan_t2v.safetensors"
RANDOM_VAE = "random_wan21_vae.safetensors"


def host_python() -> str:
    return os.environ.get("COMFYUI_PYTHON") or str(Path(COMFYUI_DIR).resolve().parent / "venv" / "bin" / "python")


def pack_folder() -> Path | None:
    """The custom_nodes entry that points at this checkout."""
    custom_nodes = Path(COMFYUI_DIR).resolve() / "custom_nodes"
    for entry in custom_nodes.iterdir():
        if entry.resolve() == ROOT:
            return custom_nodes / entry.name
    return None


def http(method, path, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(SERVER + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if pack_folder() is None:
        pytest.skip(f"{COMFYUI_DIR}/custom_nodes has no link to {ROOT} (run setup_comfyui.sh with PACK=...)")
    out = tmp_path_factory.mktemp("comfy_out")
    log_path = out / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([host_python(), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(PORT),
                             "--output-directory", str(out)], cwd=COMFYUI_DIR, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail("ComfyUI exited at start-up:\n" + log_path.read_text()[-3000:])
            try:
                if http("GET", "/object_info/FastAR_LongVideoSampler", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        else:
            pytest.fail("ComfyUI did not come up:\n" + log_path.read_text()[-3000:])
        yield {"log": log_path, "out": out}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def run_prompt(prompt, timeout=600, interrupt_when=None):
    """Queue a prompt and wait for its history entry; ``interrupt_when()`` turning true sends an interrupt."""
    status, queued = http("POST", "/prompt", {"prompt": prompt, "client_id": str(uuid.uuid4())})
    assert status == 200, json.dumps(queued)[:3000]
    prompt_id, start, interrupted = queued["prompt_id"], time.time(), False
    while time.time() - start < timeout:
        if interrupt_when is not None and not interrupted and interrupt_when():
            http("POST", "/interrupt", {})
            interrupted = True
        status, history = http("GET", f"/history/{prompt_id}")
        entry = (history or {}).get(prompt_id)
        if entry and entry["status"].get("status_str") in ("success", "error"):
            return entry
        time.sleep(0.5)
    pytest.fail(f"prompt {prompt_id} did not finish in {timeout} s")


def messages(entry, kind):
    return [m for name, m in entry["status"]["messages"] if name == kind]


def need_harness():
    if http("GET", "/object_info/HarnessRandomConditioning")[1] == {}:
        pytest.skip("the harness nodes (HarnessRandomConditioning) are not installed in this host")


def long_video_prompt(length=25, seed=0, size=32, preset="balanced"):
    return {
        "1": {"class_type": "FastAR_LoadARVideoModel",
              "inputs": {"model_name": TINY_MODEL, "weight_dtype": "default", "lora_name": "none", "shift": 5.0}},
        "2": {"class_type": "FastAR_Attention",
              "inputs": {"model": ["1", 0], "preset": preset, "tempcache": "preset", "threshold": 0.0,
                         "capacity_frames": 0, "annca": "preset", "annsa": "preset", "bits": 0, "tables": 0,
                         "dense_warmup": -1.0, "layers": "all", "backend": "auto"}},
        "3": {"class_type": "HarnessRandomConditioning",
              "inputs": {"seed": 1, "tokens": 16, "dim": 4096, "scale": 1.0}},
        "4": {"class_type": "FastAR_LongVideoSampler",
              "inputs": {"model": ["2", 0], "positive": ["3", 0], "width": size, "height": size, "length": length,
                         "frames_per_block": 3, "schedule": "Self-Forcing 4-step", "mode": "auto", "seed": seed,
                         "cache_policy": "auto", "sink_frames": 3, "window_frames": 12, "context_noise": 0.0}},
        "5": {"class_type": "VAELoader", "inputs": {"vae_name": RANDOM_VAE}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["5", 0]}},
        "7": {"class_type": "CreateVideo", "inputs": {"images": ["6", 0], "fps": 16.0}},
        "8": {"class_type": "SaveVideo",
              "inputs": {"video": ["7", 0], "filename_prefix": "fastar/t2v", "format": "auto", "codec": "auto"}},
        "9": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        "10": {"class_type": "HarnessLatentInfo", "inputs": {"samples": ["4", 0], "slow_steps": 0, "fail": False}},
    }


def test_pack_imports_and_object_info_lists_the_nodes(server):
    log = server["log"].read_text()
    folder = str(pack_folder())
    failed = [line for line in log.splitlines()
              if folder in line and ("IMPORT FAILED" in line or "Cannot import" in line)]
    assert not failed, failed
    assert any(folder in line and "seconds" in line for line in log.splitlines()), "the pack was not loaded"
    status, info = http("GET", "/object_info")
    assert status == 200
    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        assert node_id in info, node_id
        assert info[node_id]["category"] == "FAST-AR"
        assert info[node_id]["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[node_id]
        assert info[node_id]["output"] == list(cls.RETURN_TYPES)
    files = info["FastAR_LoadARVideoModel"]["input"]["required"]["model_name"][0]
    assert TINY_MODEL in files, "the loader lists models/diffusion_models"


def test_workflows_match_the_real_node_definitions_and_are_served_as_templates(server):
    status, info = http("GET", "/object_info")
    widget_types = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
    for path in sorted((ROOT / "workflows").glob("*.json")):
        wf = json.loads(path.read_text())
        for node in wf["nodes"]:
            if node["type"] in ("MarkdownNote", "Note"):
                continue
            assert node["type"] in info, f"{path.name}: {node['type']} is not a node of this ComfyUI"
            spec = info[node["type"]]
            count = 0
            for section in ("required", "optional"):
                for name in spec["input_order"].get(section, []):
                    kind, *rest = spec["input"][section][name]
                    opts = rest[0] if rest else {}
                    if isinstance(kind, list) or kind in widget_types:
                        count += 1 + bool(kind == "INT" and (opts.get("control_after_generate")
                                                            or name in ("seed", "noise_seed")))
                        count += bool(opts.get("image_upload"))
            assert count == len(node["widgets_values"]), f"{path.name} node {node['id']} {node['type']}"
    status, templates = http("GET", "/workflow_templates")
    ours = templates.get(pack_folder().name, [])
    assert sorted(ours) == sorted(p.stem for p in (ROOT / "workflows").glob("*.json")), templates


def test_tiny_wan_long_video_through_the_native_vae_decode(server):
    need_harness()
    entry = run_prompt(long_video_prompt())
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    latent_info = json.loads(outputs["10"]["text"][0])
    assert latent_info["shape"] == [1, 16, 7, 4, 4] and latent_info["finite"]
    report = outputs["9"]["text"][0]
    assert "FAST-AR long video report" in report and "tempcache" in report
    saved = outputs["8"]["images"][0]
    assert (server["out"] / saved["subfolder"] / saved["filename"]).stat().st_size > 0


def test_custom_sampling_image_to_video_and_streaming_save(server):
    need_harness()
    prompt = {k: v for k, v in long_video_prompt().items() if k in ("1", "2", "3", "5")}
    prompt.update({
        "11": {"class_type": "HarnessRandomConditioning", "inputs": {"seed": 2, "tokens": 16, "dim": 4096,
                                                                    "scale": 0.0}},
        "12": {"class_type": "BasicScheduler", "inputs": {"model": ["2", 0], "scheduler": "simple", "steps": 4,
                                                         "denoise": 1.0}},
        "13": {"class_type": "RandomNoise", "inputs": {"noise_seed": 42}},
        "14": {"class_type": "CFGGuider", "inputs": {"model": ["2", 0], "positive": ["3", 0], "negative": ["11", 0],
                                                    "cfg": 1.0}},
        "15": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 32, "height": 32, "length": 25,
                                                                  "batch_size": 1}},
        "16": {"class_type": "FastAR_SamplerARVideo", "inputs": {"frames_per_block": 3, "mode": "auto",
                                                                "cache_policy": "window", "sink_frames": 1,
                                                                "window_frames": 3, "context_noise": 0.0}},
        "17": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["13", 0], "guider": ["14", 0],
                                                                "sampler": ["16", 0], "sigmas": ["12", 0],
                                                                "latent_image": ["15", 0]}},
        "18": {"class_type": "HarnessLatentInfo", "inputs": {"samples": ["17", 0], "slow_steps": 0, "fail": False}},
        "19": {"class_type": "EmptyImage", "inputs": {"width": 40, "height": 48, "batch_size": 1, "color": 8421504}},
        "20": {"class_type": "FastAR_ImageToVideo", "inputs": {"positive": ["3", 0], "vae": ["5", 0],
                                                              "start_image": ["19", 0], "width": 32, "height": 32,
                                                              "length": 13, "batch_size": 1}},
        "21": {"class_type": "FastAR_LongVideoSampler",
               "inputs": {"model": ["2", 0], "positive": ["20", 0], "width": 32, "height": 32, "length": 13,
                          "frames_per_block": 3, "schedule": "Self-Forcing 4-step", "mode": "auto", "seed": 0,
                          "cache_policy": "auto", "sink_frames": 3, "window_frames": 12, "context_noise": 0.0}},
        "22": {"class_type": "FastAR_SaveLongVideo", "inputs": {"samples": ["21", 0], "vae": ["5", 0], "fps": 16.0,
                                                               "filename_prefix": "fastar/i2v", "frames_per_piece": 2}},
        "23": {"class_type": "PreviewAny", "inputs": {"source": ["21", 1]}},
        # A MODEL from the stock Load Diffusion Model works as well.
        "24": {"class_type": "UNETLoader", "inputs": {"unet_name": TINY_MODEL, "weight_dtype": "default"}},
        "25": {"class_type": "FastAR_LongVideoSampler",
               "inputs": {"model": ["24", 0], "positive": ["3", 0], "width": 32, "height": 32, "length": 9,
                          "frames_per_block": 3, "schedule": "CausVid 3-step", "mode": "auto", "seed": 0,
                          "cache_policy": "window", "sink_frames": 1, "window_frames": 3, "context_noise": 0.0}},
        "26": {"class_type": "PreviewAny", "inputs": {"source": ["25", 1]}},
    })
    entry = run_prompt(prompt)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    latent_info = json.loads(outputs["18"]["text"][0])
    assert latent_info["shape"] == [1, 16, 7, 4, 4] and latent_info["finite"]
    assert "1 from the start image, 3 generated" in outputs["23"]["text"][0]
    assert "causvid (3 steps" in outputs["26"]["text"][0] and "window (sink 1" in outputs["26"]["text"][0]
    video = outputs["22"]["images"][0]
    assert video["filename"].endswith(".mp4") and (server["out"] / video["subfolder"] / video["filename"]).is_file()


def test_interrupt_mid_rollout_ends_cleanly(server):
    need_harness()
    run_prompt(long_video_prompt())  # the loader's output is cached from here on
    sampling_line = "FAST-AR: sampling 1001 latent frames"
    long_run = long_video_prompt(length=4001, seed=123)
    for node in ("5", "6", "7", "8"):  # no decode: an interrupt that is ignored fails fast, not after minutes
        del long_run[node]

    def sampler_is_running():
        return sampling_line in server["log"].read_text()

    entry = run_prompt(long_run, interrupt_when=sampler_is_running)
    interrupted = messages(entry, "execution_interrupted")
    assert interrupted and interrupted[0]["node_type"] == "FastAR_LongVideoSampler", entry["status"]
    assert not messages(entry, "execution_error")
    after = run_prompt(long_video_prompt(seed=7))
    assert after["status"]["status_str"] == "success", "the server keeps working after an interrupt"


IN_PROCESS_CHECK = r"""
import importlib.util, json, os, sys
pack, model_name, vae_name = sys.argv[1:4]
sys.path.insert(0, os.getcwd())
sys.argv = [sys.argv[0], "--cpu"]
from comfy.cli_args import args
args.cpu = True
import torch
import comfy.model_management as mm
import comfy.sd, comfy.utils, folder_paths
spec = importlib.util.spec_from_file_location("comfyui_fastar", os.path.join(pack, "__init__.py"),
                                              submodule_search_locations=[pack])
module = importlib.util.module_from_spec(spec)
sys.modules["comfyui_fastar"] = module
spec.loader.exec_module(module)
from comfyui_fastar.nodes.host import get_host
from comfyui_fastar.nodes.model_access import resolve_model
from comfyui_fastar.fastar_core.attention import PassInfo
from comfyui_fastar.nodes.streaming_decode import WanCausalStream
out = {"host": get_host().name}
with torch.no_grad():
    patcher = comfy.sd.load_diffusion_model(folder_paths.get_full_path("diffusion_models", model_name))
    mm.load_models_gpu([patcher])
    model = resolve_model(patcher)
    runner = model.runner()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 3, 8, 8, generator=g)
    context = torch.randn(1, 16, 4096, generator=g)
    t = torch.tensor([[900.0, 500.0, 100.0]])
    info = PassInfo(chunk=0, step=0, num_steps=1, frame_start=0, num_frames=3, tokens_per_frame=16)
    ours = runner.forward(x, t, runner.encode_text(context), None, info)
    native = model.diffusion_model(x, t, context).float()
    out["forward_max_abs_diff"] = float((ours - native).abs().max())
    out["forward_max_abs"] = float(native.abs().max())
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(folder_paths.get_full_path("vae", vae_name)))
    z = torch.randn(1, 16, 5, 4, 6, generator=g)
    full = vae.decode(z)
    stream = WanCausalStream(vae)
    streamed = torch.cat([stream.decode(z[:, :, i:i + 2]) for i in range(0, 5, 2)], 2).movedim(1, -1)
    out["decode_shapes"] = [list(full.shape), list(streamed.shape)]
    out["decode_max_abs_diff"] = float((full.float() - streamed.float()).abs().max())
    from comfy.cli_args import LatentPreviewMethod
    args.preview_method = LatentPreviewMethod.Latent2RGB  # what --preview-method auto selects
    kind, image, _ = get_host().previewer(patcher)(torch.randn(1, 16, 1, 4, 6, generator=g))
    out["preview"] = [kind, list(image.size)]
print("RESULT " + json.dumps(out))
"""


def test_runner_matches_comfyuis_wan_forward_streaming_decode_is_exact_previews_work(tmp_path):
    script = tmp_path / "in_process_check.py"
    script.write_text(IN_PROCESS_CHECK)
    done = subprocess.run([host_python(), str(script), str(ROOT), TINY_MODEL, RANDOM_VAE], cwd=COMFYUI_DIR,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    print(result, file=sys.stderr)
    assert result["host"] == "comfyui"
    # One chunk with an empty cache is plain full attention over its frames: ComfyUI's own forward.
    assert result["forward_max_abs_diff"] <= 1e-4 * max(1.0, result["forward_max_abs"])
    assert result["decode_shapes"][0] == result["decode_shapes"][1] == [1, 17, 32, 48, 3]
    assert result["decode_max_abs_diff"] == 0.0
    assert result["preview"] == ["JPEG", [6, 4]], "a finished chunk's preview image"
