"""What a ComfyUI user wires around the pack, checked with ComfyUI's own code on every host given (COMFYUI_DIR /
COMFYUI_DIRS, as tests/test_comfyui_host.py): a LATENT batch through SamplerCustomAdvanced's sampling and the
Long Video Sampler's batch_size (video 0 equals the batch-1 video bit for bit), TorchCompileModel's MODEL through
the Long Video Sampler (compiled with the inductor, equal to eager), ModelSamplingSD3's shift named in the
report, and a kohya-format LoRA merged by the pack's loader equal to ComfyUI's LoraLoaderModelOnly."""


import pytest
from test_comfyui_host import HOSTS, run_in_host

pytestmark = [pytest.mark.comfyui, pytest.mark.slow,
              pytest.mark.skipif(not HOSTS, reason="set COMFYUI_DIR (or COMFYUI_DIRS=a:b) to hosts built by "
                                                   "setup_comfyui.sh")]


@pytest.fixture(scope="module", params=HOSTS, ids=[f"comfyui-{h.version}" for h in HOSTS])
def host(request):
    """A host's ComfyUI folder and python; the pack is loaded from this checkout, no custom_nodes link needed."""
    return request.param


@pytest.fixture(scope="module")
def results(host):
    return run_in_host(host, "comfyui_user_features.py", timeout=1200)


def figures(results, name):
    assert "error" not in results[name], results[name]["error"]
    return results[name]


def test_a_latent_batch_gives_a_video_per_item(results):
    r = figures(results, "batch_custom_sampling")
    assert r["shape"][0] == 2 and r["item0_equal"] and r["items_differ"]
    r = figures(results, "batch_long_sampler")
    assert r["shape"][0] == 2 and r["item0_equal"] and r["items_differ"] and r["report_says"]


def test_torch_compile_model_compiles_the_pack_s_blocks(results):
    r = figures(results, "torch_compile_model")
    assert "backend" in r["compile_kwargs"] and r["report_says"]
    assert r["max_abs_diff"] <= 1e-4 * max(1.0, r["max_abs"])


def test_model_sampling_sd3_shift_is_named_on_the_long_sampler(results):
    r = figures(results, "model_sampling_sd3_shift")
    assert r["warned"] and r["plain_quiet"]


def test_a_kohya_lora_merges_as_comfyui_s_lora_loader_patches_it(results):
    r = figures(results, "lora_formats_match_comfyui_lora_loader")
    assert r["dtype"] == "torch.float32" and r["changed"] > 1e-3 and r["max_abs_diff"] <= 1e-6, r
