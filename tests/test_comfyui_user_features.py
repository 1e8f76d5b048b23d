"""What a ComfyUI user wires around the pack, checked with ComfyUI's own code on every host given (COMFYUI_DIR /
COMFYUI_DIRS, as tests/test_comfyui_host.py): a LATENT batch through SamplerCustomAdvanced's sampling and the
Long Video Sampler's batch_size (video 0 equals the batch-1 video bit for bit), TorchCompileModel's MODEL through
the Long Video Sampler (compiled with the inductor, equal to eager), ModelSamplingSD3's shift named in the
report, a kohya-format LoRA merged by the pack's loader equal to ComfyUI's LoraLoaderModelOnly, and a Wan2.2
TI2V-5B model (LongLive 2.0's) through the pack's loader and core's, the pack's samplers, the Wan2.2 VAE's streaming
decode against VAE Decode and a start image (tests/comfyui_wan22.py); the Long Video Sampler's VAE input with
ComfyUI's own Wan2.1 VAE for CausVid's restarts and Krea's re-encoded first frame (tests/comfyui_vae_loop.py)."""


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


@pytest.fixture(scope="module")
def wan22(host):
    """tests/comfyui_wan22.py: a tiny Wan2.2 TI2V-5B-shaped model and a random Wan2.2 VAE in this host."""
    return run_in_host(host, "comfyui_wan22.py", timeout=1800)


def test_wan22_5b_loads_as_comfyui_s_wan22_model_through_either_loader(wan22):
    """Whether this ComfyUI can load a 5B model: both loaders build its WAN22 (48-channel latent format)."""
    r = figures(wan22, "loaders")
    expected = {"model_base": "WAN22", "diffusion_model": "WanModel", "latent_channels": 48, "in_dim": 48}
    assert r["pack"] == expected and r["core"] == expected, r


def test_wan22_long_video_sampler_runs_longlive2_on_either_loader(wan22):
    r = figures(wan22, "long_sampler_on_both_loaders")
    assert r["shape"] == [1, 48, 24, 4, 4] and r["finite"] and r["report_says_unipc"], r
    assert r["report_model"].startswith("model     : Wan2.2 TI2V dim 256, 2 layers"), r
    assert r["pack_vs_core_max_abs_diff"] <= 1e-5 * max(1.0, r["max_abs"]), r  # the same weights, the same video
    assert r["prompt_changes_video"] > 1e-2, r


def test_wan22_custom_sampling_on_either_loader_and_core_s_5b_latent(wan22):
    r = figures(wan22, "custom_sampling_on_both_loaders")
    assert r["latent_shape"] == r["shape"] == [1, 48, 24, 4, 4] and r["finite"] and r["std"] > 0.1, r
    assert r["pack_vs_core_max_abs_diff"] <= 1e-5, r
    assert "16 channels but the MODEL takes 48" in r["wan21_latent_error"], r


def test_wan22_vae_streaming_decode_equals_vae_decode(wan22):
    r = figures(wan22, "wan22_vae_streaming_decode")
    assert r["kind"] == "wan2.2" and r["full_shape"] == [13, 32, 48, 3], r
    assert r["full_std"] > 0.05 and r["clamped_fraction"] < 0.5, "the random VAE must decode to varied pixels"
    # Equal to float rounding: one latent frame per call runs the decoder's convolutions on other input shapes,
    # for which the CPU's convolution library may pick kernels that sum in another order (bit-equal on some
    # machines, 2.6e-6 apart on others); a wrong cache or a skipped first chunk is off by far more than 1e-5.
    for piece, got in r["pieces"].items():
        assert got["shape"] == r["full_shape"] and got["max_abs_diff"] <= 1e-5, (piece, got)
    assert r["no_first_chunk"] == "refused", "frame 0 needs the decoder's first_chunk, as VAE Decode gives it"


def test_wan22_save_long_video_writes_every_frame_at_16_pixels_per_latent(wan22):
    assert figures(wan22, "save_long_video_with_the_wan22_vae") == {"frames": 9, "size": [32, 32]}


def test_wan22_start_image_is_frame_0_of_the_video(wan22):
    r = figures(wan22, "image_to_video_with_the_wan22_vae")
    assert r["latent_shape"] == [1, 48, 24, 4, 4] and r["start_shape"] == [1, 48, 1, 4, 4], r
    assert r["frame0_vs_start"] <= 1e-5 * max(1.0, r["start_abs_max"]) and r["changed_by_image"] > 0.1, r


@pytest.fixture(scope="module")
def vae_loop(host):
    return run_in_host(host, "comfyui_vae_loop.py", timeout=900)


def test_vae_input_runs_causvid_restarts_through_comfyui_s_vae(vae_loop):
    r = figures(vae_loop, "causvid_restarts_through_comfyui_s_vae")
    assert r["refused_without_vae"] and r["finite"] and r["report_says"], r
    assert r["shape"] == [1, 16, 12, 4, 4]
    assert r["first_rollout_equal"] and r["later_differ"], r  # the first rollout is a plain one; restarts change
    # Two restarts, each decoding its rollout up to latent 3 (4 latent frames) and encoding one 32x32 IMAGE frame.
    assert r["decode_calls"] == [[1, 16, 4, 4, 4]] * 2 and r["encode_calls"] == [[1, 32, 32, 3]] * 2, r


def test_vae_input_runs_krea_reencodes_through_comfyui_s_vae(vae_loop):
    r = figures(vae_loop, "krea_reencode_through_comfyui_s_vae")
    assert r["refused_without_vae"] and r["finite"], r
    assert r["first_two_chunks_equal"] and r["later_differ"], r  # keep_first_frame on and off agree until frame 6
    assert r["encode_calls"] == [[1, 32, 32, 3]] * 2, r  # chunks at 6 and 9 re-encode one frame each
