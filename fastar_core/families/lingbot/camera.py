"""Camera paths: what LingBot-World 2.0 is steered by, from poses per video frame to rays per latent pixel.

A path is a camera-to-world pose per video frame (``[N, 4, 4]``, OpenCV axes: x right, y down, z forward) and the
intrinsics ``fx, fy, cx, cy`` (``[N, 4]`` or ``[4]``; only the first row is read, as the release reads it), given
for a 480 x 832 video and scaled to the video's own size. The release's ``_generate_causal_fast`` turns a path
into the model's input in four steps, each written here from its description:

1. **To latent frames.** The ``N`` poses are resampled at ``T`` evenly spaced points from the first to the last
   (``numpy.linspace(0, N - 1, T)``): translations linearly, rotations by spherical interpolation along the
   shortest arc between neighbours. A video of ``T`` latent frames has ``P = 4 (T - 1) + 1`` frames; given those
   ``P`` poses, latent frame ``t`` takes the pose of video frame ``4 t`` exactly (``video_path``).
2. **Relative, frame by frame.** Each pose is expressed in the first one's camera (so frame 0 is the identity),
   then each frame after the first is replaced by its motion since the frame before (``inverse(R_{t-1}) R_t``).
3. **Normalised.** Every translation is divided by the largest translation's length over the whole path (when
   the camera moves at all), so only the direction of a move and its size relative to the path's largest count.
4. **Rays.** Per video pixel (``x + 0.5``, ``y + 0.5``) the unit direction ``((x - cx) / fx, (y - cy) / fy, 1)``
   normalised, turned by the frame's rotation, beside the frame's translation as its origin: 6 channels
   ``(origin, direction)`` (the release calls them Plücker embeddings; no moment ``o x d`` is formed).

The model reads the rays patch by patch: latent pixel (i, j) of a frame holds its 8 x 8 video pixels, channel
first (``channel, row, column``), and a token (1 x 2 x 2 latent pixels) its four latent pixels in row-major order
after them (``camera_tokens``). Steps 1-3 run once per rollout (``CameraPath.condition``); the rays of a pass's
frames are made when the pass runs (``CameraConditioning.tokens``), so a long rollout never holds a video's worth
of them. Numbers: interpolation in float64, the rest in float32, as the release computes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import FastARError
from ...memory import send_to_device
from .config import RAY_CHANNELS, VAE_STRIDE

REFERENCE_SIZE = (480, 832)  # height, width the intrinsics are given for (the release's own)
POSES_FILE = "poses.npy"
INTRINSICS_FILE = "intrinsics.npy"
MAX_POSES = 1 << 20


# -- rotations ----------------------------------------------------------------------------------------------------

def quaternions(rotations: np.ndarray) -> np.ndarray:
    """Unit quaternions ``[..., 4]`` (w, x, y, z) of rotation matrices ``[..., 3, 3]`` (the largest of the four
    diagonal combinations picked per matrix, so no division by a small number)."""
    r = rotations
    trace = r[..., 0, 0] + r[..., 1, 1] + r[..., 2, 2]
    candidates = np.stack([trace, r[..., 0, 0], r[..., 1, 1], r[..., 2, 2]], axis=-1)
    pick = np.argmax(candidates, axis=-1)
    q = np.empty(r.shape[:-2] + (4,))
    for case in range(4):
        m = pick == case
        if not m.any():
            continue
        a = r[m]
        if case == 0:
            s = 2.0 * np.sqrt(1.0 + a[:, 0, 0] + a[:, 1, 1] + a[:, 2, 2])
            q[m] = np.stack([s / 4, (a[:, 2, 1] - a[:, 1, 2]) / s, (a[:, 0, 2] - a[:, 2, 0]) / s,
                             (a[:, 1, 0] - a[:, 0, 1]) / s], axis=-1)
        else:
            i = case - 1
            j, k = (i + 1) % 3, (i + 2) % 3
            s = 2.0 * np.sqrt(1.0 + a[:, i, i] - a[:, j, j] - a[:, k, k])
            out = np.empty((a.shape[0], 4))
            out[:, 0] = (a[:, k, j] - a[:, j, k]) / s
            out[:, 1 + i] = s / 4
            out[:, 1 + j] = (a[:, j, i] + a[:, i, j]) / s
            out[:, 1 + k] = (a[:, k, i] + a[:, i, k]) / s
            q[m] = out
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def _multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    w1, x1, y1, z1 = np.moveaxis(a, -1, 0)
    w2, x2, y2, z2 = np.moveaxis(b, -1, 0)
    return np.stack([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2], axis=-1)


def _conjugate(q: np.ndarray) -> np.ndarray:
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def rotation_matrices(q: np.ndarray) -> np.ndarray:
    w, x, y, z = np.moveaxis(q / np.linalg.norm(q, axis=-1, keepdims=True), -1, 0)
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], axis=-1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], axis=-1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], axis=-1),
    ], axis=-2)


def _power(q: np.ndarray, fraction: np.ndarray) -> np.ndarray:
    """``q ** fraction`` for unit quaternions along the shortest arc (the sign of ``q`` chosen so w >= 0)."""
    q = np.where(q[..., :1] < 0, -q, q)
    half = np.arctan2(np.linalg.norm(q[..., 1:], axis=-1), q[..., 0])  # half the turn, in [0, pi/2]
    norm = np.linalg.norm(q[..., 1:], axis=-1, keepdims=True)
    axis = np.divide(q[..., 1:], norm, out=np.zeros_like(q[..., 1:]), where=norm > 0)
    angle = half * fraction
    return np.concatenate([np.cos(angle)[..., None], axis * np.sin(angle)[..., None]], axis=-1)


# -- step 1: latent frames ------------------------------------------------------------------------------------------

def resample_poses(poses: np.ndarray, count: int) -> np.ndarray:
    """``count`` poses ``[count, 4, 4]`` (float64) evenly spaced from the first of ``poses`` to the last:
    translations interpolated linearly, rotations along the shortest arc between the two neighbours."""
    poses = np.asarray(poses, dtype=np.float64)
    n = poses.shape[0]
    if n == 1:
        return np.repeat(key_poses(poses), count, axis=0)
    where = np.linspace(0, n - 1, count)
    left = np.clip(np.floor(where).astype(np.int64), 0, n - 2)
    fraction = where - left
    t0, t1 = poses[left, :3, 3], poses[left + 1, :3, 3]
    translation = t0 + fraction[:, None] * (t1 - t0)
    q = quaternions(poses[:, :3, :3])
    step = _multiply(_conjugate(q[left]), q[left + 1])  # the turn from one neighbour to the next
    rotation = rotation_matrices(_multiply(q[left], _power(step, fraction)))
    out = np.zeros((count, 4, 4))
    out[:, :3, :3] = rotation
    out[:, :3, 3] = translation
    out[:, 3, 3] = 1.0
    # A point on a pose takes that pose as ``key_poses`` gives it (a fraction of 0 gives the same rotation; the
    # path's last point, a fraction of 1, would differ by a rounding): so a path's poses never depend on where it
    # ends, and a live camera (``live.KeyCamera``) makes them frame by frame.
    on_pose = (fraction == 0.0) | (fraction == 1.0)
    out[on_pose] = key_poses(poses[left[on_pose] + (fraction[on_pose] == 1.0)])
    return out


def key_poses(poses: np.ndarray) -> np.ndarray:
    """Poses ``[F, 4, 4]`` (float64) as a resampled path holds a point on them: the rotation through its unit
    quaternion and back."""
    out = np.zeros((poses.shape[0], 4, 4))
    out[:, :3, :3] = rotation_matrices(quaternions(poses[:, :3, :3]))
    out[:, :3, 3] = poses[:, :3, 3]
    out[:, 3, 3] = 1.0
    return out


# -- steps 2 and 3: relative motion ---------------------------------------------------------------------------------

def _compose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` over the last two dimensions, summed in a fixed order by elementwise operations, so each product
    rounds alike however many are computed at once (a live camera makes a chunk's, a path all of its frames')."""
    out = a[..., :, :1] * b[..., :1, :]
    for k in range(1, a.shape[-1]):
        out = out + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return out


def _inverse(poses: torch.Tensor) -> torch.Tensor:
    """Inverses of rigid poses ``[F, 4, 4]``: transposed rotation, the translation turned back."""
    rotation_t = poses[:, :3, :3].transpose(1, 2)
    out = torch.zeros_like(poses)
    out[:, :3, :3] = rotation_t
    out[:, :3, 3:] = -_compose(rotation_t, poses[:, :3, 3:])
    out[:, 3, 3] = 1.0
    return out


def in_camera_of(first: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
    """Poses ``[F, 4, 4]`` expressed in the camera of pose ``first`` (``[1, 4, 4]``), float32."""
    return _compose(_inverse(first.float()), poses.float())


def steps_between(previous: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
    """Each of ``poses`` ``[F, 4, 4]`` as its motion since the pose before it (``previous`` ``[1, 4, 4]`` for the
    first), translations not yet divided."""
    chain = torch.cat([previous, poses])
    return _compose(_inverse(chain[:-1]), chain[1:])


def divide_translations(motion: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Every translation of ``motion`` divided by ``scale`` (a float32 scalar tensor, > 0)."""
    out = motion.clone()
    out[:, :3, 3] = motion[:, :3, 3] / scale
    return out


def frame_motion(poses: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Per frame its motion since the frame before (frame 0: the identity), in the first frame's camera, with
    translations divided by the path's longest (float32 ``[F, 4, 4]``). ``scale``: divide by it instead (a live
    camera's fixed scale, ``live.KeyCamera``, which makes the same numbers frame by frame)."""
    in_first = in_camera_of(poses[:1], poses)
    in_first[0] = torch.eye(4)
    motion = torch.cat([in_first[:1], steps_between(in_first[:1], in_first[1:])])
    if scale is not None:
        return divide_translations(motion, torch.tensor(float(scale)))
    longest = motion[:, :3, 3].norm(dim=-1).max()
    if longest > 0:  # a camera that never moves keeps its zero translations
        motion = divide_translations(motion, longest)
    return motion


# -- step 4: rays -------------------------------------------------------------------------------------------------

def scaled_intrinsics(intrinsics: torch.Tensor, height: int, width: int) -> tuple:
    """``(fx, fy, cx, cy)`` of the first row, from the 480 x 832 video they are given for to ``height x width``."""
    fx, fy, cx, cy = intrinsics.reshape(-1, 4)[0].float()
    sx, sy = width / REFERENCE_SIZE[1], height / REFERENCE_SIZE[0]
    return fx * sx, fy * sy, cx * sx, cy * sy


def rays(motion: torch.Tensor, intrinsics: tuple, height: int, width: int) -> torch.Tensor:
    """``[F, height, width, 6]``: per video pixel the frame's translation and its unit ray direction turned by the
    frame's rotation."""
    fx, fy, cx, cy = intrinsics
    device = motion.device
    ys = torch.arange(height, dtype=torch.float32, device=device) + 0.5
    xs = torch.arange(width, dtype=torch.float32, device=device) + 0.5
    ys, xs = torch.meshgrid(ys, xs, indexing="ij")
    direction = torch.stack([(xs - cx) / fx, (ys - cy) / fy, torch.ones_like(xs)], dim=-1).reshape(-1, 3)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    turned = (motion[:, :3, :3] @ direction.T).transpose(1, 2)  # [F, H*W, 3]
    origin = motion[:, None, :3, 3].expand_as(turned)
    return torch.cat([origin, turned], dim=-1).reshape(motion.shape[0], height, width, RAY_CHANNELS)


def camera_tokens(ray_image: torch.Tensor, patch_size=(1, 2, 2), stride: int = VAE_STRIDE) -> torch.Tensor:
    """Rays ``[F, H, W, 6]`` as the model's tokens ``[F * gh * gw, 6 * stride^2 * ph * pw]``: a token's latent
    pixels in row-major order, each its ``stride x stride`` video pixels, channel first."""
    frames, height, width, channels = ray_image.shape
    _, ph, pw = patch_size
    gh, gw = height // (stride * ph), width // (stride * pw)
    x = ray_image.reshape(frames, gh, ph, stride, gw, pw, stride, channels)
    # token (f, i, j); feature (channel, row in the latent pixel, column in it, latent row in the token, column)
    x = x.permute(0, 1, 4, 7, 3, 6, 2, 5)
    return x.reshape(frames * gh * gw, channels * stride * stride * ph * pw)


# -- paths ----------------------------------------------------------------------------------------------------------

# A camera source: (latent frames known, latent frames needed) -> the motion ``[n, 4, 4]`` of the next n >= 1 frames.
CameraSource = Callable[[int, int], torch.Tensor]


@dataclass
class CameraConditioning:
    """A rollout's camera: one relative motion per latent frame (``[T, 4, 4]`` float32) and the intrinsics at the
    video's size; the rays of any latent frames on demand. With a ``source`` (a live camera, ``live.KeyCamera``)
    the motion grows as the rollout asks for frames (``require``, before every chunk)."""

    motion: torch.Tensor
    intrinsics: tuple  # fx, fy, cx, cy in video pixels
    height: int  # video pixels
    width: int
    source: CameraSource | None = None

    @property
    def num_frames(self) -> int:
        return self.motion.shape[0]

    def require(self, latent_frames: int) -> None:
        """Make sure the motion covers latent frames ``0 .. latent_frames - 1``, asking the source for the rest."""
        while self.num_frames < latent_frames and self.source is not None:
            known = self.num_frames
            rows = self.source(known, latent_frames)
            if not torch.is_tensor(rows) or rows.ndim != 3 or rows.shape[1:] != (4, 4) or rows.shape[0] < 1:
                got = list(rows.shape) if torch.is_tensor(rows) else type(rows).__name__
                raise FastARError(f"the camera source gave {got} for latent frames {known}..{latent_frames - 1}; "
                                  "it must give the motion [frames >= 1, 4, 4] of the next frames")
            if not bool(rows.isfinite().all()):
                raise FastARError(f"the camera source gave NaN or infinite motion for latent frames {known}..")
            self.motion = torch.cat([self.motion, rows.float().cpu()])
        if self.num_frames < latent_frames:
            raise FastARError(f"the camera path covers {self.num_frames} latent frames; the rollout reached frame "
                              f"{latent_frames - 1}: give a pose for every frame generated")

    def tokens(self, frame_start: int, frames: int, patch_size, device, dtype) -> torch.Tensor:
        """``[1, frames * tokens per frame, camera_dim]`` for latent frames ``frame_start ..``."""
        self.require(frame_start + frames)
        motion = send_to_device(self.motion[frame_start:frame_start + frames], device)
        image = rays(motion, tuple(float(v) for v in self.intrinsics), self.height, self.width)
        return camera_tokens(image, patch_size)[None].to(dtype)


@dataclass(frozen=True)
class CameraPath:
    """Poses per video frame (camera-to-world, OpenCV axes) and intrinsics at 480 x 832, as the release's example
    folders hold them (``poses.npy`` ``[N, 4, 4]``, ``intrinsics.npy`` ``[N, 4]``)."""

    poses: np.ndarray  # [N, 4, 4] float64
    intrinsics: np.ndarray  # [4] fx, fy, cx, cy (the first row of the file's)
    source: str = "camera path"

    @property
    def num_frames(self) -> int:
        return self.poses.shape[0]

    def latent_motion(self, latent_frames: int, span: int | None = None, scale: float | None = None) -> torch.Tensor:
        """Steps 1-3 for ``latent_frames`` over the first ``span`` poses (default: all of them); ``scale``: divide
        translations by it, not by the path's longest (``frame_motion``)."""
        span = self.num_frames if span is None else span
        if not 1 <= span <= self.num_frames:
            raise FastARError(f"{self.source}: span {span} is not within its {self.num_frames} poses")
        resampled = torch.from_numpy(resample_poses(self.poses[:span], latent_frames)).float()
        return frame_motion(resampled, scale)

    def condition(self, latent_frames: int, height: int, width: int,
                  scale: float | None = None) -> CameraConditioning:
        """The camera of a video of ``latent_frames`` latent frames (``4 (T - 1) + 1`` video frames) at ``height x
        width`` pixels: its video frames' poses, latent frame ``t`` at video frame ``4 t``. A path shorter than
        the video is refused; a longer one is cut at the video's end. ``scale``: a fixed translation scale (a
        live camera's replay), not the path's longest move."""
        video = 4 * (latent_frames - 1) + 1
        if self.num_frames < video:
            most = (self.num_frames - 1) // 4 + 1
            raise FastARError(f"{self.source} holds {self.num_frames} poses; {latent_frames} latent frames are "
                              f"{video} video frames (4 (T - 1) + 1): give a longer path, or at most {most} frames")
        if height % VAE_STRIDE or width % VAE_STRIDE:
            raise FastARError(f"video size {height}x{width} is not a multiple of the VAE's {VAE_STRIDE} pixels")
        return self.conditioning_over(latent_frames, video, height, width, scale)

    def conditioning_over(self, latent_frames: int, span: int, height: int, width: int,
                          scale: float | None = None) -> CameraConditioning:
        """``latent_frames`` resampled over the first ``span`` poses (the release stretches a path this way when
        its length is not the video's)."""
        intrinsics = scaled_intrinsics(torch.from_numpy(self.intrinsics), height, width)
        return CameraConditioning(self.latent_motion(latent_frames, span, scale), tuple(float(v) for v in intrinsics),
                                  height, width)


def check_path(poses, intrinsics, source: str = "camera path") -> CameraPath:
    """A ``CameraPath`` from arrays, refusing what is not one (shapes, non-finite values, rotations that are not)."""
    poses = np.asarray(poses)
    intrinsics = np.asarray(intrinsics)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or not 1 <= poses.shape[0] <= MAX_POSES:
        raise FastARError(f"{source}: poses have shape {list(poses.shape)}; expected [frames, 4, 4] camera-to-world "
                          "matrices (OpenCV axes), one per video frame")
    if intrinsics.shape not in ((4,),) and not (intrinsics.ndim == 2 and intrinsics.shape[1] == 4
                                                 and intrinsics.shape[0] >= 1):
        raise FastARError(f"{source}: intrinsics have shape {list(intrinsics.shape)}; expected [frames, 4] or [4] "
                          "rows of fx, fy, cx, cy (pixels of a 480x832 video)")
    if not np.issubdtype(poses.dtype, np.floating) or not np.issubdtype(intrinsics.dtype, np.floating):
        raise FastARError(f"{source}: poses and intrinsics must hold floating-point numbers, got {poses.dtype} and "
                          f"{intrinsics.dtype}")
    poses, first = poses.astype(np.float64), intrinsics.reshape(-1, 4)[0].astype(np.float64)
    if not np.isfinite(poses).all() or not np.isfinite(first).all():
        raise FastARError(f"{source}: poses or intrinsics contain NaN or infinite values")
    if first[0] <= 0 or first[1] <= 0:
        raise FastARError(f"{source}: focal lengths fx {first[0]:g} and fy {first[1]:g} must be positive (pixels)")
    rotation = poses[:, :3, :3]
    error = np.abs(rotation @ rotation.transpose(0, 2, 1) - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero((error > 1e-3) | (np.linalg.det(rotation) < 0))
    if bad.size:
        raise FastARError(f"{source}: pose {int(bad[0])} is not a rigid camera-to-world matrix (its 3x3 part must be "
                          f"a rotation; {bad.size} poses are not)")
    if not np.allclose(poses[:, 3], [0.0, 0.0, 0.0, 1.0]):
        raise FastARError(f"{source}: the last row of every pose must be 0 0 0 1")
    return CameraPath(poses, first, source)


def read_camera_folder(folder) -> CameraPath:
    """The release's camera format: a folder holding ``poses.npy`` and ``intrinsics.npy`` (no pickles read)."""
    root = Path(folder)
    if not root.is_dir():
        raise FastARError(f"{folder}: {'no such folder' if not root.exists() else 'not a folder'}; a camera path is a "
                          f"folder holding {POSES_FILE} and {INTRINSICS_FILE}")
    arrays = []
    for name in (POSES_FILE, INTRINSICS_FILE):
        path = root / name
        if not path.is_file():
            raise FastARError(f"{folder}: {name} is missing (a camera path holds {POSES_FILE} [frames, 4, 4] and "
                              f"{INTRINSICS_FILE} [frames, 4])")
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except (ValueError, OSError, EOFError) as e:
            raise FastARError(f"{path}: not a NumPy array file ({str(e).splitlines()[0][:200]})") from None
    return check_path(arrays[0], arrays[1], source=str(folder))
