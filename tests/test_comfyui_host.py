"""The pack inside real ComfyUIs (CPU), driven over HTTP like a user's browser would, on every host given.

Hosts: COMFYUI_DIR and/or COMFYUI_DIRS (several ComfyUI folders joined by ":"), each built by setup_comfyui.sh
(see docs/testing.md: it writes the tiny Wan models, the random Wan VAEs and the harness nodes used here). The
checkout under test is always this one, whatever the host's custom_nodes links to: each server runs with its own
--base-directory whose custom_nodes holds the host's helper nodes and this checkout (as ComfyUI-FastAR) and whose
models/ is the host's, so several checkouts can test against one host at once. Every test runs once per host with
the same assertions; a test that needs something only some versions have (core's AR nodes, Dynamic VRAM) skips on
the others because the feature is missing, never because of a version number. COMFYUI_PYTHON overrides the hosts'
interpreter (default: the venv beside each ComfyUI folder); servers listen on free ports, or from
COMFYUI_TEST_PORT up when it is set.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from comfyui_fastar.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS


def host_dirs() -> list[str]:
    dirs = [os.environ.get("COMFYUI_DIR", ""), *os.environ.get("COMFYUI_DIRS", "").split(":")]
    return list(dict.fromkeys(d for d in dirs if d))


HOST_DIRS = host_dirs()
pytestmark = [pytest.mark.comfyui, pytest.mark.slow,
              pytest.mark.skipif(not HOST_DIRS, reason="set COMFYUI_DIR (or COMFYUI_DIRS=a:b) to hosts built by "
                                                       "setup_comfyui.sh")]
ROOT = Path(__file__).resolve().parents[1]
PACK_NAME = "ComfyUI-FastAR"  # the folder a `git clone` into custom_nodes gives
TINY_MODEL = "tiny_wan_t2v.safetensors"
CAUSAL_MODEL = "tiny_wan_causal_ar_t2v.safetensors"  # written by setup_comfyui.sh where core has AR video
RANDOM_VAE = "random_wan21_vae.safetensors"
TINY_VAE = "tiny_wan21_vae.safetensors"  # where ComfyUI reads the VAE width from the file (0.2x)
WORKFLOWS = sorted((ROOT / "example_workflows").glob("*.json"))


def comfy_version(folder: str) -> str:
    text = (Path(folder) / "comfyui_version.py").read_text() if (Path(folder) / "comfyui_version.py").is_file() else ""
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return found.group(1) if found else Path(folder).name


@dataclass
class Host:
    dir: str
    version: str
    port: int | None  # None: a free one when the server starts

    @property
    def python(self) -> str:
        return os.environ.get("COMFYUI_PYTHON") or str(Path(self.dir).resolve().parent / "venv" / "bin" / "python")

    def stage(self, base: Path) -> Path:
        """A --base-directory for one server: the host's models and helper nodes, and this checkout as the pack."""
        nodes = base / "custom_nodes"
        nodes.mkdir(parents=True)
        (base / "models").symlink_to(Path(self.dir).resolve() / "models", target_is_directory=True)
        for entry in sorted((Path(self.dir) / "custom_nodes").iterdir()):
            # any FAST-AR checkout the host links (setup_comfyui.sh's PACK) is left out: this one is tested
            if entry.is_dir() and entry.name != "__pycache__" and not (entry / "fastar_core").is_dir():
                (nodes / entry.name).symlink_to(entry.resolve(), target_is_directory=True)
        (nodes / PACK_NAME).symlink_to(ROOT, target_is_directory=True)
        return nodes / PACK_NAME


def free_port(port: int = 0) -> int:
    """``port`` if nothing listens there (0: any free one); another server answering there would fake a start."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            pytest.fail(f"port {port} (COMFYUI_TEST_PORT) is taken: {e}")
        return s.getsockname()[1]


FIXED_PORT = os.environ.get("COMFYUI_TEST_PORT")
HOSTS = [Host(d, comfy_version(d), int(FIXED_PORT) + i if FIXED_PORT else None) for i, d in enumerate(HOST_DIRS)]


@pytest.fixture(scope="module", params=HOSTS, ids=[f"comfyui-{h.version}" for h in HOSTS])
def host(request) -> Host:
    if not (Path(request.param.dir) / "main.py").is_file():
        pytest.fail(f"{request.param.dir} is not a ComfyUI folder (no main.py)")
    return request.param


class Server:
    def __init__(self, host: Host, port: int, log: Path, out: Path, pack_folder: Path):
        self.host, self.log, self.out, self.pack_folder = host, log, out, pack_folder
        self.url = f"http://127.0.0.1:{port}"
        self._info = None

    def http(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def object_info(self) -> dict:
        if self._info is None:
            status, self._info = self.http("GET", "/object_info")
            assert status == 200
        return self._info

    def need_nodes(self, *names):
        missing = [n for n in names if n not in self.object_info()]
        if missing:
            pytest.skip(f"ComfyUI {self.host.version} has no {', '.join(missing)}")

    def vae(self) -> str:
        """The fastest Wan2.1 VAE this host loads."""
        names = self.object_info()["VAELoader"]["input"]["required"]["vae_name"][0]
        return TINY_VAE if TINY_VAE in names else RANDOM_VAE


@pytest.fixture(scope="module")
def server(host, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"comfy_base_{host.version}")
    pack_folder = host.stage(base)
    out = base / "output"
    log_path = base / "server.log"
    log = open(log_path, "w")
    port = free_port(host.port or 0)
    # Models only some tests write (ComfyUI re-lists a folder whose files change), beside the host's own.
    extra = base / "extra_models"
    for folder in ("diffusion_models", "clip_vision", "vae", "text_encoders"):
        (extra / folder).mkdir(parents=True)
    extra_config = base / "extra_model_paths.yaml"
    extra_config.write_text(f"fastar_tests:\n  base_path: {extra}\n  diffusion_models: diffusion_models\n"
                            "  clip_vision: clip_vision\n  vae: vae\n  text_encoders: text_encoders\n")
    proc = subprocess.Popen([host.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--extra-model-paths-config", str(extra_config),
                             "--base-directory", str(base), "--output-directory", str(out),
                             "--database-url", f"sqlite:///{base / 'comfyui.db'}"],  # default: in the host's folder
                            cwd=host.dir, stdout=log, stderr=subprocess.STDOUT)
    srv = Server(host, port, log_path, out, pack_folder)
    srv.extra_models = extra
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail("ComfyUI exited at start-up:\n" + log_path.read_text()[-3000:])
            try:
                if srv.http("GET", "/object_info/FastAR_LongVideoSampler", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        else:
            pytest.fail("ComfyUI did not come up:\n" + log_path.read_text()[-3000:])
        yield srv
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def run_prompt(server, prompt, timeout=600, interrupt_when=None):
    """Queue a prompt and wait for its history entry; ``interrupt_when()`` turning true sends an interrupt."""
    status, queued = server.http("POST", "/prompt", {"prompt": prompt, "client_id": str(uuid.uuid4())})
    assert status == 200, json.dumps(queued)[:3000]
    prompt_id, start, interrupted = queued["prompt_id"], time.time(), False
    while time.time() - start < timeout:
        if interrupt_when is not None and not interrupted and interrupt_when():
            server.http("POST", "/interrupt", {})
            interrupted = True
        status, history = server.http("GET", f"/history/{prompt_id}")
        entry = (history or {}).get(prompt_id)
        if entry and entry["status"].get("status_str") in ("success", "error"):
            return entry
        time.sleep(0.5)
    pytest.fail(f"prompt {prompt_id} did not finish in {timeout} s")


def messages(entry, kind):
    return [m for name, m in entry["status"]["messages"] if name == kind]


def need_harness(server):
    server.need_nodes("HarnessRandomConditioning", "HarnessLatentInfo")


def long_video_prompt(length=25, seed=0, size=32, preset="balanced", vae=RANDOM_VAE):
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
        "5": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["4", 0], "vae": ["5", 0]}},
        "7": {"class_type": "CreateVideo", "inputs": {"images": ["6", 0], "fps": 16.0}},
        "8": {"class_type": "SaveVideo",
              "inputs": {"video": ["7", 0], "filename_prefix": "fastar/t2v", "format": "auto", "codec": "auto"}},
        "9": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        "10": {"class_type": "HarnessLatentInfo", "inputs": {"samples": ["4", 0], "slow_steps": 0, "fail": False}},
    }


def test_pack_imports_and_object_info_lists_the_nodes(server):
    log = server.log.read_text()
    folder = str(server.pack_folder)
    failed = [line for line in log.splitlines()
              if folder in line and ("IMPORT FAILED" in line or "Cannot import" in line)]
    assert not failed, failed
    assert any(folder in line and "seconds" in line for line in log.splitlines()), "the pack was not loaded"
    info = server.object_info()
    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        assert node_id in info, node_id
        assert info[node_id]["category"] == "FAST-AR"
        assert info[node_id]["display_name"] == NODE_DISPLAY_NAME_MAPPINGS[node_id]
        assert info[node_id]["output"] == list(cls.RETURN_TYPES)
    files = info["FastAR_LoadARVideoModel"]["input"]["required"]["model_name"][0]
    assert TINY_MODEL in files, "the loader lists models/diffusion_models"


def test_workflows_match_the_real_node_definitions_and_are_served_as_templates(server):
    info = server.object_info()
    widget_types = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
    checked = []
    for path in WORKFLOWS:
        wf = json.loads(path.read_text())
        types = {node["type"] for node in wf["nodes"]} - {"MarkdownNote", "Note"}
        assert types & set(NODE_CLASS_MAPPINGS) <= set(info), f"{path.name}: a pack node is missing"
        if not types <= set(info):  # a workflow for core nodes that only newer ComfyUIs have
            continue
        checked.append(path.name)
        for node in wf["nodes"]:
            if node["type"] not in types:
                continue
            spec = info[node["type"]]
            count = {}
            for section in ("required", "optional"):
                count[section] = 0
                for name in spec["input_order"].get(section, []):
                    kind, *rest = spec["input"][section][name]
                    opts = rest[0] if rest else {}
                    if isinstance(kind, list) or kind in widget_types:
                        count[section] += 1 + bool(kind == "INT" and (opts.get("control_after_generate")
                                                                     or name in ("seed", "noise_seed")))
                        count[section] += bool(opts.get("image_upload"))
            # Newer ComfyUIs add optional widgets at the end (0.2x: CreateVideo's bit_depth); editors fill those in
            # with their defaults, so a saved graph may lack them, but never a required one.
            values = len(node["widgets_values"])
            assert count["required"] <= values <= count["required"] + count["optional"], \
                f"{path.name} node {node['id']} {node['type']}: {values} values for {count}"
    assert len(checked) >= 6, checked
    status, templates = server.http("GET", "/workflow_templates")
    ours = templates.get(PACK_NAME, [])
    # listed once each (a second template folder, a copy or a link, would list every workflow twice), and only
    # those whose nodes this ComfyUI has: core's AR template is not offered where core has no AR nodes
    runnable = [p.stem for p in WORKFLOWS
                if {n["type"] for n in json.loads(p.read_text())["nodes"]} - {"MarkdownNote", "Note"} <= set(info)]
    assert sorted(ours) == sorted(runnable), templates
    assert ("fastar_core_ar_template" in ours) == ("ARVideoI2V" in info)
    status, served = server.http("GET", f"/api/workflow_templates/{PACK_NAME}/fastar_core_ar_template.json")
    assert status == 200 and served["nodes"], "the file itself is still served"


def test_tiny_wan_long_video_through_the_native_vae_decode(server):
    need_harness(server)
    entry = run_prompt(server, long_video_prompt(vae=server.vae()))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    latent_info = json.loads(outputs["10"]["text"][0])
    assert latent_info["shape"] == [1, 16, 7, 4, 4] and latent_info["finite"]
    report = outputs["9"]["text"][0]
    assert "FAST-AR long video report" in report and "tempcache" in report
    saved = outputs["8"]["images"][0]
    assert (server.out / saved["subfolder"] / saved["filename"]).stat().st_size > 0


def test_custom_sampling_image_to_video_and_streaming_save(server):
    need_harness(server)
    prompt = {k: v for k, v in long_video_prompt(vae=server.vae()).items() if k in ("1", "2", "3", "5")}
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
                                                                "cache_policy": "auto", "sink_frames": 1,
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
                          "cache_policy": "window", "sink_frames": 1, "window_frames": 7, "context_noise": 0.0}},
        "26": {"class_type": "PreviewAny", "inputs": {"source": ["25", 1]}},
    })
    entry = run_prompt(server, prompt)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    latent_info = json.loads(outputs["18"]["text"][0])
    assert latent_info["shape"] == [1, 16, 7, 4, 4] and latent_info["finite"]
    assert "1 from the start image, 3 generated" in outputs["23"]["text"][0]
    assert "causvid (3 steps" in outputs["26"]["text"][0]
    assert "window (7 frames attended, sink 1 " in outputs["26"]["text"][0], outputs["26"]["text"][0]
    video = outputs["22"]["images"][0]
    assert video["filename"].endswith(".mp4") and (server.out / video["subfolder"] / video["filename"]).is_file()


def test_interrupt_mid_rollout_ends_cleanly(server):
    need_harness(server)
    run_prompt(server, long_video_prompt(vae=server.vae()))  # the loader's output is cached from here on
    sampling_line = "FAST-AR: sampling 1 video(s) of 1001 latent frames"
    long_run = long_video_prompt(length=4001, seed=123)
    for node in ("5", "6", "7", "8"):  # no decode: an interrupt that is ignored fails fast, not after minutes
        del long_run[node]

    def sampler_is_running():
        return sampling_line in server.log.read_text()

    entry = run_prompt(server, long_run, interrupt_when=sampler_is_running)
    interrupted = messages(entry, "execution_interrupted")
    assert interrupted and interrupted[0]["node_type"] == "FastAR_LongVideoSampler", entry["status"]
    assert not messages(entry, "execution_error")
    after = run_prompt(server, long_video_prompt(seed=7, vae=server.vae()))
    assert after["status"]["status_str"] == "success", "the server keeps working after an interrupt"




def test_hostile_checkpoints_are_refused_and_the_server_keeps_serving(server, tmp_path):
    """Files shaped to crash the unpickler (a dict key nested 200,000 deep), to exhaust memory (an archive that
    declares a petabyte), tampered (a flipped byte, a duplicate header key) or carrying code each end as one
    error on the loader node, no code runs, and the same server then runs a video."""
    import torch
    from fuzz_hostile import hostile_checkpoint_cases
    from fuzz_inputs import RunsCode

    need_harness(server)
    folder = Path(server.host.dir) / "models" / "diffusion_models"
    marker = tmp_path / "CODE-RAN"
    RunsCode.marker = str(marker)
    sd = {f"blocks.0.w{i}": torch.zeros(4) for i in range(4)}
    good_pt = tmp_path / "good.pt"
    torch.save({"generator_ema": sd}, good_pt)
    cases = hostile_checkpoint_cases(tmp_path / "hostile", sd, {}, good_pt)
    chosen = {name: cases[name] for name in ("hostile-deep-tuple-key", "hostile-zip-declares-1pib",
                                             "hostile-flipped-byte", "hostile-st-duplicate-key")}
    evil = tmp_path / "evil.pt"
    torch.save({"generator_ema": sd, "x": RunsCode()}, evil)
    chosen["code"] = evil
    placed = []
    try:
        for name, path in chosen.items():
            target = folder / f"fastar-test-{name}{path.suffix}"
            target.write_bytes(path.read_bytes())
            placed.append(target)
        for target in placed:
            prompt = {"1": {"class_type": "FastAR_LoadARVideoModel",
                            "inputs": {"model_name": target.name, "weight_dtype": "default", "lora_name": "none",
                                       "shift": 5.0}},
                      "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}}
            entry = run_prompt(server, prompt, timeout=120)
            [error] = messages(entry, "execution_error")
            assert error["node_type"] == "FastAR_LoadARVideoModel"
            assert target.name in error["exception_message"] and "\n" not in error["exception_message"].strip()
    finally:
        for target in placed:
            target.unlink(missing_ok=True)
    assert not marker.exists(), "a pickle ran code inside ComfyUI"
    after = run_prompt(server, long_video_prompt(seed=11, vae=server.vae()))
    assert after["status"]["status_str"] == "success", "the server keeps working after the refusals"


def test_core_ar_template_with_the_pack_on_either_side(server):
    """Core's native AR graph (EmptyARVideoLatent, SamplerARVideo, ARVideoI2V) mixed with the pack's nodes."""
    need_harness(server)
    server.need_nodes("EmptyARVideoLatent", "SamplerARVideo", "ARVideoI2V")
    vae = server.vae()
    conditioning = {"class_type": "HarnessRandomConditioning", "inputs": {"seed": 1, "tokens": 16, "dim": 4096,
                                                                          "scale": 1.0}}
    empty = {"class_type": "HarnessRandomConditioning", "inputs": {"seed": 2, "tokens": 16, "dim": 4096,
                                                                   "scale": 0.0}}

    def custom(model, sampler, latent):
        return {"noise": ["n", 0], "guider": [f"g{model}", 0], "sampler": [sampler, 0],
                "sigmas": [f"s{model}", 0], "latent_image": latent}

    prompt = {
        "c": conditioning, "e": empty,
        "pack": {"class_type": "FastAR_LoadARVideoModel",
                 "inputs": {"model_name": TINY_MODEL, "weight_dtype": "default", "lora_name": "none", "shift": 5.0}},
        "core": {"class_type": "UNETLoader", "inputs": {"unet_name": CAUSAL_MODEL, "weight_dtype": "default"}},
        "vae": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "n": {"class_type": "RandomNoise", "inputs": {"noise_seed": 42}},
        "latent": {"class_type": "EmptyARVideoLatent", "inputs": {"width": 32, "height": 32, "length": 25,
                                                                  "batch_size": 1}},
        "core_sampler": {"class_type": "SamplerARVideo", "inputs": {"num_frame_per_block": 3}},
        "pack_sampler": {"class_type": "FastAR_SamplerARVideo",
                         "inputs": {"frames_per_block": 3, "mode": "auto", "cache_policy": "global", "sink_frames": 3,
                                    "window_frames": 12, "context_noise": 0.0}},
        "image": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1,
                                                         "color": 12345678}},
        "i2v_core": {"class_type": "ARVideoI2V", "inputs": {"model": ["core", 0], "vae": ["vae", 0],
                                                            "start_image": ["image", 0], "width": 32, "height": 32,
                                                            "length": 25, "batch_size": 1}},
        "i2v_pack": {"class_type": "FastAR_ImageToVideo",
                     "inputs": {"positive": ["c", 0], "vae": ["vae", 0], "start_image": ["image", 0], "width": 32,
                                "height": 32, "length": 25, "batch_size": 1}},
        # core's sampler on the pack's loader; the pack's sampler on core's loader and core's latent
        "1": {"class_type": "SamplerCustomAdvanced", "inputs": custom("pack", "core_sampler", ["latent", 0])},
        "2": {"class_type": "SamplerCustomAdvanced", "inputs": custom("core", "pack_sampler", ["latent", 0])},
        # core's start image into the pack's sampler; the pack's start image into core's sampler
        "3": {"class_type": "FastAR_LongVideoSampler",
              "inputs": {"model": ["i2v_core", 0], "positive": ["c", 0], "width": 32, "height": 32, "length": 25,
                         "frames_per_block": 3, "schedule": "Self-Forcing 4-step", "mode": "auto", "seed": 0,
                         "cache_policy": "global", "sink_frames": 3, "window_frames": 12, "context_noise": 0.0}},
        "4": {"class_type": "SamplerCustomAdvanced", "inputs": custom("i2v", "core_sampler", ["i2v_pack", 1])},
        "r3": {"class_type": "PreviewAny", "inputs": {"source": ["3", 1]}},
        "save": {"class_type": "FastAR_SaveLongVideo", "inputs": {"samples": ["3", 0], "vae": ["vae", 0], "fps": 16.0,
                                                                  "filename_prefix": "fastar/core_i2v",
                                                                  "frames_per_piece": 8}},
    }
    for key, model, positive in (("pack", ["pack", 0], ["c", 0]), ("core", ["core", 0], ["c", 0]),
                                 ("i2v", ["core", 0], ["i2v_pack", 0])):
        prompt[f"g{key}"] = {"class_type": "CFGGuider", "inputs": {"model": model, "positive": positive,
                                                                   "negative": ["e", 0], "cfg": 1.0}}
        prompt[f"s{key}"] = {"class_type": "BasicScheduler", "inputs": {"model": model, "scheduler": "simple",
                                                                        "steps": 4, "denoise": 1.0}}
    for node in ("1", "2", "4"):
        prompt[f"info{node}"] = {"class_type": "HarnessLatentInfo",
                                 "inputs": {"samples": [node, 0], "slow_steps": 0, "fail": False}}
    entry = run_prompt(server, prompt)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    for node in ("1", "2", "4"):
        info = json.loads(outputs[f"info{node}"]["text"][0])
        assert info["shape"] == [1, 16, 7, 4, 4] and info["finite"], (node, info)
    assert "1 from the start image, 6 generated" in outputs["r3"]["text"][0]
    video = outputs["save"]["images"][0]
    assert (server.out / video["subfolder"] / video["filename"]).stat().st_size > 0


WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def ui_to_api(workflow: dict, info: dict) -> dict:
    """The API prompt the editor makes of a UI workflow: widget values in the node's input order (a seed's
    control value and an upload button's skipped), links as [source id, output slot]; notes and muted nodes
    dropped."""
    links = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        if node["type"] in ("MarkdownNote", "Note") or node.get("mode") == 2:  # a muted node is not queued
            continue
        spec, values, inputs, i = info[node["type"]], list(node.get("widgets_values") or []), {}, 0
        linked = {slot["name"]: links[slot["link"]] for slot in node.get("inputs", []) if slot.get("link") is not None}
        for section in ("required", "optional"):
            for name in spec["input_order"].get(section, []):
                kind, *rest = spec["input"][section][name]
                opts = rest[0] if rest else {}
                widget = isinstance(kind, list) or kind in WIDGET_TYPES
                if name in linked:
                    inputs[name] = [str(linked[name][1]), linked[name][2]]
                elif widget and i < len(values):
                    inputs[name] = values[i]
                if widget:
                    seed = kind == "INT" and (opts.get("control_after_generate") or name in ("seed", "noise_seed"))
                    i += 1 + bool(seed) + bool(opts.get("image_upload"))
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt


def test_longlive2_workflow_runs_on_a_tiny_5b_model_and_a_random_wan22_vae(server):
    """The shipped LongLive 2.0 workflow, as the editor queues it, on a tiny Wan2.2 TI2V-5B-shaped model and a
    random Wan2.2 VAE (written into the host's models by tests/comfyui_wan22.py): the prompt comes from the harness
    instead of UMT5, and the video is made small."""
    need_harness(server)
    models = Path(server.host.dir) / "models"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    workflow = json.loads((ROOT / "example_workflows" / "fastar_longlive2_5b.json").read_text())
    prompt = ui_to_api(workflow, server.object_info())
    by_type = {node["class_type"]: key for key, node in prompt.items()}
    encode = by_type["CLIPTextEncode"]
    del prompt[by_type["CLIPLoader"]]
    prompt[encode] = {"class_type": "HarnessRandomConditioning",
                      "inputs": {"seed": 1, "tokens": 16, "dim": 4096, "scale": 1.0}}
    prompt[by_type["FastAR_LoadARVideoModel"]]["inputs"]["model_name"] = "tiny_wan22_ti2v_5b.safetensors"
    prompt[by_type["VAELoader"]]["inputs"]["vae_name"] = "random_wan22_vae.safetensors"
    sampler = prompt[by_type["FastAR_LongVideoSampler"]]["inputs"]
    assert (sampler["width"], sampler["height"], sampler["frames_per_block"], sampler["sink_frames"],
            sampler["window_frames"]) == (1280, 704, 8, 8, 32), "the workflow is LongLive 2.0's setting"
    sampler.update(width=64, height=64, length=65)  # 17 latent frames: two chunks of 8 and one frame
    written = [models / "diffusion_models" / "tiny_wan22_ti2v_5b.safetensors",
               models / "vae" / "random_wan22_vae.safetensors"]
    try:
        done = subprocess.run([server.host.python, str(ROOT / "tests" / "comfyui_wan22.py"), str(ROOT),
                               "--write-models", str(models)], cwd=server.host.dir, capture_output=True, text=True,
                              timeout=900, env=env)
        assert done.returncode == 0 and all(p.is_file() for p in written), done.stderr[-3000:]
        entry = run_prompt(server, prompt, timeout=900)
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    outputs = entry["outputs"]
    report = outputs[by_type["PreviewAny"]]["text"][0]
    assert "Wan2.2 TI2V dim 256" in report and "longlive2 (4 steps" in report and "64x64" in report, report
    assert "tempcache" in report, report
    video = outputs[by_type["FastAR_SaveLongVideo"]]["images"][0]
    assert video["filename"].endswith(".mp4") and (server.out / video["subfolder"] / video["filename"]).stat().st_size


@pytest.fixture(scope="module")
def in_process(host):
    """tests/comfyui_in_process.py run once per host with the host's python, in its ComfyUI folder."""
    return run_in_host(host, "comfyui_in_process.py", timeout=900)


def run_in_host(host, script: str, timeout: int, args=None) -> dict:
    """A script of tests/ run with the host's python in its ComfyUI folder (given ``args``, or the pack as this
    checkout); its last ``RESULT {json}`` line."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([host.python, str(ROOT / "tests" / script), *(args or [str(ROOT)])], cwd=host.dir,
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    print(json.dumps(result), file=sys.stderr)
    assert args is not None or result["host"] == "comfyui"  # the pack's scripts ran on ComfyUI's host
    return result


def figures(in_process, name):
    result = in_process[name]
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert "error" not in result, result["error"]
    return result


def test_runner_matches_comfyuis_wan_forward(in_process):
    r = figures(in_process, "forward")
    # One chunk with an empty cache is plain full attention over its frames: ComfyUI's own forward, fed the
    # 512-token context that ComfyUI's Wan text encoder gives.
    tolerance = 1e-4 * max(1.0, r["max_abs"])
    assert r["max_abs_diff"] <= tolerance, r
    # A 16-token context is zero-padded to 512 first (Wan's own forward does so; ComfyUI's does not, and its text
    # encoder never gives fewer): the same output. The zero rows matter, so this would see a missing pad.
    assert r["short_prompt_max_abs_diff"] <= tolerance, r
    assert r["unpadded_native_max_abs_diff"] > 100 * tolerance, r


def test_streaming_decode_equals_vae_decode_for_every_piece_size(in_process):
    r = figures(in_process, "streaming_decode")
    assert r["full_shape"] == [1, 17, 32, 48, 3]
    for piece, got in r["pieces"].items():
        assert got["shape"] == r["full_shape"] and got["max_abs_diff"] == 0.0, (piece, got)
    if r["decoder_calls"] == "pairs":  # the cut matters there: one frame per call is not VAE Decode
        assert r["one_frame_per_call_max_abs_diff"] > 0.01


def test_previews_show_the_chunks_newest_frame(in_process):
    assert figures(in_process, "preview") == ["JPEG", [6, 4]]


def test_long_sampler_reports_progress_through_comfyuis_progress_bar(in_process):
    calls = figures(in_process, "long_sampler_progress")["calls"]
    values, totals = [c[0] for c in calls], {c[1] for c in calls}
    assert len(calls) >= 2 and len(totals) == 1 and totals.pop() > 1, calls
    assert values == sorted(values) and values[-1] == calls[-1][1], "progress rises to its total"


def test_pack_loader_builds_cores_causal_class_where_the_host_has_one(in_process):
    r = figures(in_process, "loader_classes")
    causal = "CausalWanModel" if r["host_has_causal_class"] else "WanModel"
    assert r["unmarked"] == {"pack": causal, "core": "WanModel"}
    assert r["causal_marked"] == {"pack": causal, "core": causal}


def test_pack_model_survives_a_clone_out_of_dynamic_vram(in_process):
    r = figures(in_process, "dynamic_clone")
    assert r["clone_class"] == "ModelPatcher" and r["rebuilt"] and r["shift_kept"] == 5.0
    assert r["forward_max_abs_diff"] == 0.0
    assert "cached_patcher_init" in r["control_error"], "without the factory the same clone fails"


def test_core_sampler_runs_on_a_model_from_the_pack_loader(in_process):
    r = figures(in_process, "core_sampler_on_pack_loader")
    assert r["shape"] == [1, 16, 7, 4, 4] and r["finite"] and r["std"] > 0.1
    assert "init_kv_caches" in r["control_error"], "core's own loader gives a model core's sampler refuses"


def test_pack_samplers_run_on_core_loader_and_core_empty_latent(in_process):
    r = figures(in_process, "pack_on_core_loader_and_latent")
    assert r["model_class"] == "CausalWanModel" and r["finite"]
    assert r["latent_shape"] == r["custom_shape"] == r["long_shape"] == [1, 16, 7, 4, 4]


def test_core_start_image_is_honoured_by_the_pack_samplers(in_process):
    r = figures(in_process, "core_start_image_to_pack")
    tolerance = 1e-5 * max(1.0, r["start_abs_max"])
    for sampler in ("long", "custom", "core"):
        assert r[f"{sampler}_frame0_vs_start"] <= tolerance, (sampler, r)
        assert r[f"{sampler}_changed_by_image"] > 0.1, (sampler, r)


def test_pack_start_image_is_honoured_by_core_sampler(in_process):
    r = figures(in_process, "pack_start_image_to_core")
    tolerance = 1e-5 * max(1.0, r["start_abs_max"])
    assert r["core_frame0_vs_start"] <= tolerance and r["custom_frame0_vs_start"] <= tolerance
    assert r["core_changed_by_image"] > 0.1
    assert "two start images" in r["two_images_error"]


def test_pack_dense_sampler_agrees_with_core_sampler_where_both_see_the_same_noise(in_process):
    r = figures(in_process, "dense_agreement_one_step")
    # One step: both denoise the same NOISE once per chunk and cache the result.
    assert r["one_step_max_abs_diff"] <= 1e-5 * r["max_abs"]
    # More steps: core re-noises from torch's global RNG reseeded seed + 1000 * block + step, the pack from its own
    # per-(seed, chunk, step) generator, so the videos differ though both are draws of the same process.
    assert r["four_step_max_abs_diff"] > 0.1


def test_action_scripts_are_checked_when_queued_and_refused_by_a_text_model(server):
    need_harness(server)
    script = {"class_type": "FastAR_ActionScript",
              "inputs": {"variant": "universal", "fps": 12.0, "script": "0 W\n1.5 W L\n3 - mouse 0 0.05\n"}}
    entry = run_prompt(server, {"1": script, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}})
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    assert entry["outputs"]["2"]["text"][0].startswith("universal at 12 fps: 0 s (frame 0): W(forward); 1.5 s "
                                                       "(frame 18): W(forward) L(camera_r)")
    bad = {**script, "inputs": {**script["inputs"], "script": "0 W\n2 W Z\n"}}
    status, answer = server.http("POST", "/prompt", {"prompt": {
        "1": bad, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}}, "client_id": "actions"})
    assert status == 400 and answer["error"]["type"] == "prompt_outputs_failed_validation", answer
    [error] = answer["node_errors"]["1"]["errors"]  # once, not once per widget
    assert "line 2 (at 2 s): unknown key 'Z' for universal" in error["details"], error
    prompt = long_video_prompt(vae=server.vae())
    prompt["11"] = script
    prompt["4"]["inputs"]["actions"] = ["11", 0]
    entry = run_prompt(server, prompt)
    assert entry["status"]["status_str"] == "error"
    (error,) = messages(entry, "execution_error")
    assert error["node_type"] == "FastAR_LongVideoSampler"
    assert "'actions' (universal) steer a Matrix-Game 2.0 model" in error["exception_message"]


RANDOM_CLIP_VISION = "random_clip_vit_l.safetensors"
WORLD_WORKFLOWS = {"fastar_world_model_universal": "universal", "fastar_world_model_templerun": "templerun"}
SMALL_WORLD = {"width": 48, "height": 32, "length": 25}  # 7 latent frames: chunks 3 + 3 + 1


def browser_tools():
    node, chromium = shutil.which("node"), shutil.which("chromium") or "/usr/bin/chromium"
    modules = os.environ.get("FASTAR_PLAYWRIGHT_MODULES", "/tmp/editor-check/node_modules")
    if not node or not Path(chromium).is_file() or not (Path(modules) / "playwright-core").is_dir():
        pytest.skip("needs node, Chromium and playwright-core (FASTAR_PLAYWRIGHT_MODULES, default "
                    "/tmp/editor-check/node_modules)")
    return node, chromium, modules


def editor_prompt(server, workflow: Path, settings: dict) -> dict:
    """The workflow loaded into the server's own editor, ``settings`` ({node type: {widget: value}}) set there:
    what the editor showed and the prompt its Queue button sends (tools/editor_check/editor_prompt.cjs)."""
    node, chromium, modules = browser_tools()
    done = subprocess.run([node, str(ROOT / "tools" / "editor_check" / "editor_prompt.cjs"), server.url, str(workflow),
                           chromium, json.dumps(settings)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NODE_PATH": modules})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def world_models(server, tmp_path_factory):
    """Every file the world workflows name, where the docs say to put it: the Matrix-Game files at the top of
    diffusion_models under their released names (tiny models of each variant, which carry their sizes in their
    metadata, as a file of other sizes than the release's may; the released ones need nothing), a random ViT-L CLIP
    vision model as clip_vision/clip_vision_h.safetensors (ComfyUI has no smaller; its 1024-wide tokens are what the
    tiny models read), the host's Wan2.1 VAE as vae/wan_2.1_vae.safetensors, and input/example.png."""
    import dataclasses

    from matrix_game_models import tiny_config
    from PIL import Image

    from comfyui_fastar.fastar_core.families.matrix_game.checkpoint import save_matrix_game
    from comfyui_fastar.fastar_core.families.matrix_game.model import random_matrix_game

    for workflow, variant in WORLD_WORKFLOWS.items():
        wf = json.loads((ROOT / "example_workflows" / f"{workflow}.json").read_text())
        loader = next(n for n in wf["nodes"] if n["type"] == "FastAR_LoadARVideoModel")
        [entry] = loader["properties"]["models"]
        assert entry["directory"] == "diffusion_models" and "/" not in entry["name"], entry
        config = dataclasses.replace(tiny_config(variant), clip_dim=1024, text_dim=1024)
        save_matrix_game(random_matrix_game(config, seed=3), server.extra_models / "diffusion_models" / entry["name"],
                         config_in_file=True)
    cached = tmp_path_factory.getbasetemp() / RANDOM_CLIP_VISION
    if not cached.exists():
        run_in_host(server.host, "comfyui_tiny_clip_vision.py", timeout=600, args=[str(cached)])
    (server.extra_models / "clip_vision" / "clip_vision_h.safetensors").symlink_to(cached)
    vae_file = Path(server.host.dir) / "models" / "vae" / server.vae()
    (server.extra_models / "vae" / "wan_2.1_vae.safetensors").symlink_to(vae_file.resolve())
    inputs = server.out.parent / "input"
    inputs.mkdir(exist_ok=True)
    Image.new("RGB", (640, 352), (90, 140, 60)).save(inputs / "example.png")
    return server


@pytest.mark.parametrize("workflow", list(WORLD_WORKFLOWS))
def test_world_workflow_runs_from_the_editors_own_prompt(world_models, workflow):
    """The shipped world workflow in the server's own editor, with its files where the docs put them: no missing
    model or node, World Model Start set small there (the sampler's size and length follow through its links), and
    the prompt the editor's Queue would send runs; the report states the cache the docs give for the workflow."""
    server = world_models
    shown = editor_prompt(server, ROOT / "example_workflows" / f"{workflow}.json",
                          {"FastAR_WorldModelStart": SMALL_WORLD})
    assert not shown["overlays"] and not shown["combo_values_not_listed"] and not shown["unset"], shown
    prompt = shown["prompt"]
    by_type = {node["class_type"]: key for key, node in prompt.items()}
    sampler = prompt[by_type["FastAR_LongVideoSampler"]]["inputs"]
    for field, slot in (("width", 1), ("height", 2), ("length", 3)):
        assert sampler[field] == [by_type["FastAR_WorldModelStart"], slot], (field, sampler[field])
    entry = run_prompt(server, prompt, timeout=900)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    report = entry["outputs"][by_type["PreviewAny"]]["text"][0]
    assert "48x32" in report and "cache     : window (6 frames attended, sink 0 and the chunk included)" in report, \
        report
    video = entry["outputs"][by_type["SaveVideo"]]["images"][0]
    assert (server.out / video["subfolder"] / video["filename"]).stat().st_size > 0


def world_start_prompt(length, width=640, height=352, vae="wan_2.1_vae.safetensors"):
    size = {"width": width, "height": height}
    return {
        "img": {"class_type": "EmptyImage", "inputs": {**size, "batch_size": 1, "color": 6324384}},
        "cv": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "clip_vision_h.safetensors"}},
        "cve": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["cv", 0], "image": ["img", 0],
                                                             "crop": "none"}},
        "vae": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "start": {"class_type": "FastAR_WorldModelStart",
                  "inputs": {"clip_vision_output": ["cve", 0], "vae": ["vae", 0], "start_image": ["img", 0], **size,
                             "length": length}},
        "show": {"class_type": "PreviewAny", "inputs": {"source": ["start", 3]}},
    }


def test_world_model_start_at_961_frames_stops_within_two_seconds_of_cancel(world_models):
    """Cancel while World Model Start encodes 961 frames at 640x352: the node checks before every VAE layer, so the
    run ends as interrupted within a layer's time (the server's own timestamp, against when Cancel was sent). Needs a
    VAE whose layers take well under a second on this CPU: the tiny Wan2.1 VAE of 0.2x hosts."""
    server = world_models
    if server.vae() != TINY_VAE:
        pytest.skip(f"needs {TINY_VAE} (ComfyUI 0.2x reads a VAE's width from the file; 0.3.x loads only full-size "
                    "ones, one of whose 640x352 layers takes seconds on a CPU)")
    run_prompt(server, world_start_prompt(5))  # the VAE and the CLIP vision model loaded
    started = "FAST-AR World Model Start: encoding 961 frames"
    sent = []

    def encoding():
        if started in server.log.read_text():
            sent.append(time.time())
            return True
        return False

    entry = run_prompt(server, world_start_prompt(961), interrupt_when=encoding)
    interrupted = messages(entry, "execution_interrupted")
    assert interrupted and interrupted[0]["node_type"] == "FastAR_WorldModelStart", entry["status"]
    seconds = interrupted[0]["timestamp"] / 1000 - sent[0]
    print(f"World Model Start ended {seconds:.2f} s after Cancel", file=sys.stderr)
    assert seconds < 2.0, seconds
    after = run_prompt(server, world_start_prompt(5))
    assert after["status"]["status_str"] == "success", "the server keeps working after an interrupt"


def test_world_model_start_streams_exactly_what_vae_encode_gives(host):
    """ComfyUI's own Wan2.1 VAE: the start video a slice at a time, the steady state found and its slices skipped,
    equals VAE Encode of the whole video bit for bit (tests/comfyui_world_start.py)."""
    result = run_in_host(host, "comfyui_world_start.py", timeout=1200)
    r = figures(result, "equality")
    for frames, got in r.items():
        assert got["equal"] and got["shape"] == got["whole_shape"], (frames, got)
    assert r["161"]["skipped_calls"] > 0 and r["161"]["distinct"] < r["161"]["shape"][2], r["161"]
    assert r["161"]["first_blank_repeated_diff"] > 1e-3, "the blank frames' latents do carry the image forward"


def test_world_model_start_memory_does_not_grow_with_the_length(host):
    """World Model Start at 640x352: its peak memory at 961 frames is within 10 % of its peak at 121, each measured in
    a fresh process of the host's python (the two run side by side, one thread each). Control, at 320x176 to keep it
    short: VAE Encode of the whole start video, what the node did before, grows with the length (0.2x hosts: about
    20 minutes on two busy cores, most of it the two 640x352 encodes of the ~30 latent frames before the steady
    state)."""
    names = {p.name for p in (Path(host.dir) / "models" / "vae").iterdir()}
    if TINY_VAE not in names:
        pytest.skip(f"needs {TINY_VAE}: encoding 640x352 with the full-size VAE takes hours on a CPU")
    # A fixed mmap threshold: glibc otherwise raises it as large blocks are freed, so later large tensors land in
    # the heap, whose freed pages stay resident, and the peak measures the allocator's history, not what was live.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    runs = {(frames, size, whole): subprocess.Popen(
        [host.python, str(ROOT / "tests" / "comfyui_world_start.py"), str(ROOT), "memory", *size.split("x"),
         str(frames), *(["whole"] if whole else [])], cwd=host.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env)
        for frames, size, whole in ((121, "640x352", False), (961, "640x352", False), (121, "320x176", True),
                                    (241, "320x176", True))}
    peaks = {}
    for key, proc in runs.items():
        out, err = proc.communicate(timeout=3000)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, out[-2000:] + err[-3000:]
        r = json.loads(lines[-1][len("RESULT "):])
        width, height = (int(v) for v in key[1].split("x"))
        assert r["latent_shape"] == [1, 16, (key[0] - 1) // 4 + 1, height // 8, width // 8], r
        peaks[key] = r["peak_above_start"]
    print(json.dumps({f"{k[0]} frames {k[1]}{' whole' if k[2] else ''}": f"{v / 2**30:.2f} GiB"
                      for k, v in peaks.items()}), file=sys.stderr)
    assert peaks[(961, "640x352", False)] <= 1.10 * peaks[(121, "640x352", False)], peaks
    # the control fails the same bound: the whole video's pixels and their copy grow with it
    assert peaks[(241, "320x176", True)] > 1.10 * peaks[(121, "320x176", True)], "the control: the whole encode grows"


LINGBOT_WORKFLOW = ROOT / "example_workflows" / "fastar_world_model_lingbot.json"
SMALL_LINGBOT = {"width": 48, "height": 32, "length": 29}  # 8 latent frames: two chunks of 4


@pytest.fixture(scope="module")
def lingbot_models(world_models):
    """Every file the LingBot workflow names, where the docs put them: its shards at the top of diffusion_models
    under the names their download gives (a tiny model, which carries its sizes in the shards' metadata; the
    released sizes need nothing), the UMT5 text encoder's name (an empty file: the tests swap the text nodes for the
    harness's random prompt, since no host has a UMT5), the Wan2.1 VAE and input/example.png (World Model Start's
    fixture), and input/cameras/03 (a camera folder for the muted Camera Path)."""
    import numpy as np
    from test_lingbot import TINY

    from comfyui_fastar.fastar_core.families.lingbot.checkpoint import save_lingbot
    from comfyui_fastar.fastar_core.families.lingbot.model import random_lingbot
    from comfyui_fastar.fastar_core.rollout.action_script import parse_text

    server = world_models
    wf = json.loads(LINGBOT_WORKFLOW.read_text())
    by_type = {n["type"]: n for n in wf["nodes"]}
    names = [m["name"] for m in by_type["FastAR_LoadARVideoModel"]["properties"]["models"]]
    assert all("/" not in n for n in names) and by_type["FastAR_LoadARVideoModel"]["widgets_values"][0] == names[0]
    folder = server.extra_models / "diffusion_models"
    save_lingbot(random_lingbot(TINY, seed=3), folder, shards=len(names), config_in_files=True)
    assert sorted(p.name for p in folder.glob("diffusion_pytorch_model-*")) == names
    for entry in by_type["CLIPLoader"]["properties"]["models"]:
        (server.extra_models / entry["directory"] / entry["name"]).touch()
    camera = server.out.parent / "input" / by_type["FastAR_CameraPath"]["widgets_values"][0]
    camera.mkdir(parents=True, exist_ok=True)
    script = parse_text("variant lingbot\n0 W\n1 W L\n2 up\n")
    np.save(camera / "poses.npy", script.to_poses(401).astype(np.float32))
    np.save(camera / "intrinsics.npy", np.tile(script.intrinsics(), (401, 1)).astype(np.float32))
    return server


def with_harness_prompt(prompt: dict) -> dict:
    """The prompt with CLIPLoader + CLIP Text Encode swapped for the harness's random [1, 16, 4096] prompt."""
    by_type = {node["class_type"]: key for key, node in prompt.items()}
    del prompt[by_type["CLIPLoader"]]
    prompt[by_type["CLIPTextEncode"]] = {"class_type": "HarnessRandomConditioning",
                                         "inputs": {"seed": 1, "tokens": 16, "dim": 4096, "scale": 1.0}}
    return prompt


def check_lingbot_run(server, entry, by_type):
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    report = entry["outputs"][by_type["PreviewAny"]]["text"][0]
    assert "48x32" in report and "lingbot (4 steps" in report, report
    assert "cache     : window (18 frames attended, sink 6 and the chunk included)" in report, report
    assert "keys lingbot at 16 fps: 0 s (frame 0): W(forward)" in report, report
    video = entry["outputs"][by_type["SaveVideo"]]["images"][0]
    assert (server.out / video["subfolder"] / video["filename"]).stat().st_size > 0


def test_lingbot_workflow_runs_from_the_editors_own_prompt(lingbot_models):
    """The shipped LingBot workflow in the server's own editor, with its files where the docs put them: no missing
    model or node and every value listed (the muted Camera Path's folder too), LingBot World Start set small there
    (the sampler's size and length follow through its links), and the prompt the editor's Queue would send runs
    (its text nodes swapped for the harness's prompt); the report states the cache the docs give."""
    server = lingbot_models
    need_harness(server)
    shown = editor_prompt(server, LINGBOT_WORKFLOW, {"FastAR_LingBotWorldStart": SMALL_LINGBOT})
    assert not shown["overlays"] and not shown["combo_values_not_listed"] and not shown["unset"], shown
    prompt = with_harness_prompt(shown["prompt"])
    by_type = {node["class_type"]: key for key, node in prompt.items()}
    assert "FastAR_CameraPath" not in by_type, "a muted node is not queued"
    sampler = prompt[by_type["FastAR_LongVideoSampler"]]["inputs"]
    for field, slot in (("width", 1), ("height", 2), ("length", 3)):
        assert sampler[field] == [by_type["FastAR_LingBotWorldStart"], slot], (field, sampler[field])
    check_lingbot_run(server, run_prompt(server, prompt, timeout=900), by_type)


def test_lingbot_workflow_runs_steered_by_a_camera_folder_and_stops_on_cancel(lingbot_models):
    """The LingBot workflow as the editor would queue it (no browser needed): with the Action Script, then with
    the Camera Path in its place on the sampler's 'actions'; then a long run cancelled while the sampler runs ends
    as interrupted there, and the server keeps working."""
    server = lingbot_models
    need_harness(server)
    prompt = with_harness_prompt(ui_to_api(json.loads(LINGBOT_WORKFLOW.read_text()), server.object_info()))
    by_type = {node["class_type"]: key for key, node in prompt.items()}
    prompt[by_type["FastAR_LingBotWorldStart"]]["inputs"].update(SMALL_LINGBOT)
    check_lingbot_run(server, run_prompt(server, prompt, timeout=900), by_type)

    folder = {"class_type": "FastAR_CameraPath", "inputs": {"folder": "cameras/03"}}
    steered = {**prompt, "cam": folder}
    steered[by_type["FastAR_LongVideoSampler"]] = json.loads(json.dumps(prompt[by_type["FastAR_LongVideoSampler"]]))
    steered[by_type["FastAR_LongVideoSampler"]]["inputs"]["actions"] = ["cam", 0]
    entry = run_prompt(server, steered, timeout=900)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:3000]
    assert "camera path input/cameras/03 (401 poses)" in entry["outputs"][by_type["PreviewAny"]]["text"][0]

    long_run = {k: json.loads(json.dumps(v)) for k, v in prompt.items()
                if v["class_type"] not in ("VAEDecode", "CreateVideo", "SaveVideo")}
    long_run[by_type["FastAR_LingBotWorldStart"]]["inputs"]["length"] = 1601

    def sampler_is_running():
        return "FAST-AR: sampling 1 video(s) of 401 latent frames" in server.log.read_text()

    entry = run_prompt(server, long_run, interrupt_when=sampler_is_running)
    interrupted = messages(entry, "execution_interrupted")
    assert interrupted and interrupted[0]["node_type"] == "FastAR_LongVideoSampler", entry["status"]
    assert not messages(entry, "execution_error")
    after = run_prompt(server, prompt, timeout=900)
    assert after["status"]["status_str"] == "success", "the server keeps working after an interrupt"


def test_lingbot_nodes_run_the_engines_rollout_with_comfyuis_progress_bar(in_process):
    """On each host: the LingBot nodes' video equals the engine's own rollout of the same inputs in ComfyUI's Wan21
    latent space, bit for bit, and the sampler's progress rises through ComfyUI's own progress hook."""
    r = figures(in_process, "lingbot_nodes")
    assert r["info_family"] == "LingBot-World 2.0" and r["latent_format"] == "Wan21" and r["report_has_camera"], r
    assert r["shape"] == [1, 16, 8, 4, 6] and r["max_abs_diff"] == 0.0, r
    values, totals = [c[0] for c in r["calls"]], {c[1] for c in r["calls"]}
    assert len(values) >= 2 and len(totals) == 1 and values == sorted(values) and values[-1] == r["calls"][-1][1]
