"""Camera Path: a LingBot-World 2.0 camera path in the release's own format, a folder holding ``poses.npy``
(camera-to-world per video frame, OpenCV axes) and ``intrinsics.npy`` (fx, fy, cx, cy for a 480x832 video), read
from ComfyUI's input folder, for the Long Video Sampler's 'actions'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..fastar_core.errors import FastARError
from ..fastar_core.families.lingbot.camera import INTRINSICS_FILE, POSES_FILE, read_camera_folder
from .constants import ACTIONS, CATEGORY
from .host import get_host
from .inputs import combo

MAX_DEPTH = 3  # folders below input/ searched for camera paths
MAX_FOLDERS = 1000


def camera_folders(root: Path) -> list[str]:
    """Folders under ``root`` (at most ``MAX_DEPTH`` deep) holding both camera files, as paths relative to it."""
    found: list[str] = []
    if not root.is_dir():
        return found
    stack = [(root, 0)]
    while stack and len(found) < MAX_FOLDERS:
        folder, depth = stack.pop()
        try:
            children = sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")),
                              reverse=True)
        except OSError:
            continue
        if folder != root and (folder / POSES_FILE).is_file() and (folder / INTRINSICS_FILE).is_file():
            found.append(folder.relative_to(root).as_posix())
        if depth < MAX_DEPTH:
            stack.extend((child, depth + 1) for child in children)
    return sorted(found)


def camera_folder(name: str) -> Path:
    """The folder ``name`` under ComfyUI's input folder (never outside it)."""
    root = get_host().input_directory().resolve()
    if not isinstance(name, str) or not name:
        raise FastARError("folder: choose a folder of ComfyUI's input folder that holds poses.npy and intrinsics.npy")
    path = (root / name).resolve()
    if root not in path.parents:
        raise FastARError(f"folder {name!r} is not inside ComfyUI's input folder")
    return path


class CameraPathNode:
    DESCRIPTION = ("Steers LingBot-World 2.0 along a camera path in the release's format: a folder in ComfyUI's input "
                   "folder (e.g. input/cameras/03/) holding poses.npy (a camera-to-world matrix per video frame, "
                   "OpenCV axes) and intrinsics.npy (fx, fy, cx, cy for 480x832), as the release's examples/ folders "
                   "do. The Long Video Sampler reads the poses of the video's frames (latent frame t at video frame "
                   "4t), each as its move since the frame before, every translation divided by the longest: the "
                   "release's own maths. A path shorter than the video is refused; a longer one is cut.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "folder": combo(camera_folders(get_host().input_directory()),
                            "A folder of ComfyUI's input folder holding poses.npy [frames, 4, 4] and intrinsics.npy "
                            "[frames, 4] (e.g. the release's examples/03 copied to input/cameras/03)."),
        }}

    RETURN_TYPES = (ACTIONS, "STRING")
    RETURN_NAMES = ("actions", "summary")
    OUTPUT_TOOLTIPS = ("The camera path, for the Long Video Sampler's 'actions' (a LingBot-World 2.0 MODEL).",
                       "The path as read: its poses, the video frames they cover and its intrinsics.")
    FUNCTION = "read"
    CATEGORY = CATEGORY

    @classmethod
    def VALIDATE_INPUTS(cls, folder=None):
        if not isinstance(folder, str):
            return True
        try:
            read_camera_folder(camera_folder(folder))
        except FastARError as e:
            return str(e)
        return True

    def read(self, folder):
        path = read_camera_folder(camera_folder(folder))
        fx, fy, cx, cy = (float(v) for v in path.intrinsics)
        latent = (path.num_frames - 1) // 4 + 1
        summary = (f"{folder}: {path.num_frames} poses ({(path.num_frames - 1) / 16:g} s at 16 fps: up to {latent} "
                   f"latent frames); intrinsics fx {fx:g} fy {fy:g} cx {cx:g} cy {cy:g} (for 832x480)")
        return (replace(path, source=f"input/{folder}"), summary)
