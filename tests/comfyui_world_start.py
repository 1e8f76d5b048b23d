"""World Model Start with ComfyUI's own Wan2.1 VAE (``comfy.sd.VAE`` of the host's tiny or random ``models/vae``
file): its start video encoded a slice at a time equals VAE Encode of the whole video (the image, then blank
frames), bit for bit, past the point where the blank frames' latents stop changing; and its memory, measured in
this process, does not grow with the length. Run by tests/test_comfyui_host.py with a host's python, in its ComfyUI
folder:

    python tests/comfyui_world_start.py PACK                  # the equality checks; one line RESULT {json}
    python tests/comfyui_world_start.py PACK memory W H N     # the node's peak memory at N frames of WxH
    python tests/comfyui_world_start.py PACK memory W H N whole   # the same, VAE Encode of the whole video at once
"""

import resource
import sys
import time

from comfyui_boot import Skip, boot, recorder, report

ARGS = list(sys.argv)
boot()
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
import torch  # noqa: E402

from comfyui_fastar.nodes.host import get_host  # noqa: E402
from comfyui_fastar.nodes.node_world_start import WorldModelStart  # noqa: E402
from comfyui_fastar.nodes.streaming_encode import StartVideoEncoder  # noqa: E402

TINY_VAE = "tiny_wan21_vae.safetensors"  # on ComfyUI 0.2x, which reads the VAE's width from the file
RANDOM_VAE = "random_wan21_vae.safetensors"
CLIP_TOKENS = torch.zeros(1, 257, 1280)


def vae(name=None):
    names = folder_paths.get_filename_list("vae")
    name = name or next((n for n in (TINY_VAE, RANDOM_VAE) if n in names), None)
    if name not in names:
        raise Skip(f"no {name or 'tiny or random Wan2.1 VAE'} in models/vae")
    return comfy.sd.VAE(sd=comfy.utils.load_torch_file(folder_paths.get_full_path("vae", name)))


def start_image(height, width, seed=1):
    return torch.rand(1, height, width, 3, generator=torch.Generator().manual_seed(seed))


def whole_video(image, frames):
    video = torch.full((frames, *image.shape[1:]), 0.5)
    video[:1] = image
    return video


def equality():
    """The streamed start against VAE Encode of the whole video: 48x32 pixels (a 6x4 latent, which the random
    full-size VAE of 0.3.x encodes in about a minute), 161 frames (41 latent frames: the encoder's reach ends near
    latent frame 30). Below about 4x4 latent pixels ComfyUI's 1x1 output conv rounds a short tensor differently from a
    long one (by 1e-7), so the size is kept above that."""
    v = vae()
    results = {}
    for frames in (9, 161):
        image = start_image(32, 48, seed=frames)
        encoder = StartVideoEncoder(v, get_host())
        with torch.no_grad():
            distinct, index = encoder.encode(image, frames)
            whole = v.encode(whole_video(image, frames))
        streamed = distinct[:, :, index]
        results[str(frames)] = {
            "shape": list(streamed.shape), "whole_shape": list(whole.shape), "distinct": distinct.shape[2],
            "skipped_calls": encoder.skipped, "equal": bool(torch.equal(streamed, whole)),
            "max_abs_diff": float((streamed - whole).abs().max()),
            # negative control: the first blank frame's latent repeated, as if the image did not carry forward
            "first_blank_repeated_diff": float((distinct[:, :, index.clamp(max=1)] - whole).abs().max()),
        }
    return results


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak() -> None:
    """Linux keeps the peak resident size (VmHWM) since it was last reset; writing 5 to clear_refs resets it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def memory(width: int, height: int, frames: int, whole: bool) -> dict:
    """World Model Start (or, ``whole``, VAE Encode of the whole start video) at ``frames`` frames: the peak resident
    memory above what the process held before it, the VAE loaded."""
    v = vae(TINY_VAE)
    image = start_image(height, width)
    with torch.no_grad():
        v.encode(image)  # the VAE loaded and its kernels warmed on one frame, outside the measured span
    reset_peak()
    before, start = rss_bytes(), time.time()
    with torch.no_grad():
        if whole:
            latent = v.encode(whole_video(image, frames))
            shape = list(latent.shape)
        else:
            positive, *_ = WorldModelStart().encode({"penultimate_hidden_states": CLIP_TOKENS}, v, image, width,
                                                    height, frames)
            extras = positive[0][1]
            shape = [*extras["fastar_world_start"].shape[:2], int(extras["fastar_world_start_index"].shape[0]),
                     *extras["fastar_world_start"].shape[3:]]
    return {"frames": frames, "whole": whole, "latent_shape": shape, "peak_above_start": peak_bytes() - before,
            "seconds": round(time.time() - start, 1)}


if __name__ == "__main__":
    if len(ARGS) > 2 and ARGS[2] == "memory":
        print("RESULT " + __import__("json").dumps(memory(int(ARGS[3]), int(ARGS[4]), int(ARGS[5]),
                                                          len(ARGS) > 6 and ARGS[6] == "whole")))
    else:
        RESULTS = {"host": get_host().name}
        recorder(RESULTS)(equality)
        report(RESULTS)
