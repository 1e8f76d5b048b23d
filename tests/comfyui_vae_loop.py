"""The Long Video Sampler's VAE input with ComfyUI's own Wan2.1 VAE (``comfy.sd.VAE`` from the host's
``models/vae``): CausVid's long-video restarts and Krea's recompute without its first frame decode and re-encode
through it. Run by tests/test_comfyui_user_features.py with a host's python, in its ComfyUI folder; prints one
line ``RESULT {json}``.
"""

from comfyui_boot import Skip, boot, recorder, report

boot()
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import torch  # noqa: E402

from comfyui_fastar.fastar_core.errors import FastARError  # noqa: E402
from comfyui_fastar.nodes.host import get_host  # noqa: E402
from comfyui_fastar.nodes.node_loader import LoadARVideoModel  # noqa: E402
from comfyui_fastar.nodes.node_long_sampler import LongVideoSampler  # noqa: E402

TINY = "tiny_wan_t2v.safetensors"
RESULTS = {"host": get_host().name}
check = recorder(RESULTS)
LATENT_FRAMES = 12  # CausVid restarting every 6: a 6-frame rollout, then two of 3 new frames
LENGTH = 1 + 4 * (LATENT_FRAMES - 1)


def counted_vae():
    """ComfyUI's VAE of the host's tiny (or random) Wan2.1 VAE file, its encode and decode calls counted."""
    names = folder_paths.get_filename_list("vae")
    name = next((n for n in ("tiny_wan21_vae.safetensors", "random_wan21_vae.safetensors") if n in names), None)
    if name is None:
        raise Skip("no tiny or random Wan2.1 VAE in models/vae")
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(folder_paths.get_full_path("vae", name)))
    calls = {"encode": [], "decode": []}
    for method in calls:
        original = getattr(vae, method)

        def counted(x, original=original, method=method):
            calls[method].append(list(x.shape))
            return original(x)

        setattr(vae, method, counted)
    return vae, calls


def cond():
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(1, 16, 4096, generator=g), {}]]


def sample(model, **kw):
    args = dict(width=32, height=32, length=LENGTH, seed=3)
    args.update(kw)
    return LongVideoSampler().sample(model, cond(), **args)


@check
def causvid_restarts_through_comfyui_s_vae():
    model = LoadARVideoModel().load(TINY)[0]
    vae, calls = counted_vae()
    causvid = dict(schedule="CausVid 3-step", cache_policy="global")
    try:
        sample(model, restart_every=6, **causvid)
        refused = ""
    except FastARError as e:
        refused = str(e)
    restarted, report = sample(model, restart_every=6, vae=vae, **causvid)
    plain, _ = sample(model, **causvid)
    a, b = restarted["samples"], plain["samples"]
    return {"refused_without_vae": "'vae' input" in refused, "shape": list(a.shape), "finite": bool(a.isfinite().all()),
            "first_rollout_equal": bool(torch.equal(a[:, :, :6], b[:, :, :6])),
            "later_differ": bool((a[:, :, 6:] - b[:, :, 6:]).abs().max() > 1e-4),
            "encode_calls": calls["encode"], "decode_calls": calls["decode"],
            "report_says": "a fresh rollout every 6 latent frames" in report}


@check
def krea_reencode_through_comfyui_s_vae():
    model = LoadARVideoModel().load(TINY)[0]
    vae, calls = counted_vae()
    krea = dict(schedule="Krea Realtime 5-step", cache_policy="recompute", sink_frames=0, window_frames=6)
    try:
        sample(model, **krea)
        refused = ""
    except FastARError as e:
        refused = str(e)
    off, _ = sample(model, vae=vae, **krea)
    on, _ = sample(model, **{**krea, "sink_frames": 1})
    a, b = off["samples"], on["samples"]
    return {"refused_without_vae": "keep_first_frame off" in refused, "finite": bool(a.isfinite().all()),
            "first_two_chunks_equal": bool(torch.equal(a[:, :, :6], b[:, :, :6])),
            "later_differ": bool((a[:, :, 6:] - b[:, :, 6:]).abs().max() > 1e-4),
            "encode_calls": calls["encode"]}


report(RESULTS)
