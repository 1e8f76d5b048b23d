"""Player actions for world models: keyboard and mouse per pixel frame, given up front or as the rollout goes.

A world model (Matrix-Game 2.0) is steered by what the player does in every *pixel* frame of the video: the VAE
packs 4 pixel frames into one latent frame after a first frame of its own, so ``T`` latent frames are
``1 + 4 (T - 1)`` pixel frames. Keyboard actions are multi-hot (one column per key); mouse actions are
``[pitch, yaw]`` camera deltas per frame, absent for keyboard-only variants.

``Actions`` holds what is known so far and can grow between chunks. A chunk ending at latent frame ``t`` needs
the actions of pixel frames ``0 .. 4 (t - 1)``; the sampler asks ``require(t)`` before it runs the chunk, and an
``Actions`` made with a ``source`` asks the source for what is missing (an interactive caller steers that way:
the callback sees which frames are wanted and returns their actions, or an iterator yields them chunk by chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..errors import FastARError
from ..memory import send_to_device

VAE_TIME_STRIDE = 4  # pixel frames per latent frame after the first (the Wan VAE's temporal compression)


def pixel_frames(latent_frames: int) -> int:
    """Pixel frames that ``latent_frames`` latent frames decode to."""
    return 0 if latent_frames <= 0 else 1 + VAE_TIME_STRIDE * (latent_frames - 1)


@dataclass(frozen=True)
class ActionLayout:
    """What a model's actions look like: keys per frame, and whether it takes mouse moves."""

    num_keys: int
    mouse: bool
    mouse_dims: int = 2


# A source gets (pixel frames known, pixel frames needed) and returns (keyboard, mouse) for frames
# ``known .. known + n`` with ``n >= 1``; it may return more than needed. An iterator yields such pairs.
ActionSource = Callable[[int, int], tuple] | Iterator


def _as_tensor(value, what: str, width: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float32)
        except (TypeError, ValueError) as e:
            raise FastARError(f"{what} actions must be a tensor [frames, {width}], got {type(value).__name__}") \
                from e
    if value.ndim == 1 and width == 1:
        value = value[:, None]
    if value.ndim != 2 or (width >= 0 and value.shape[1] != width) or value.shape[1] < 1:
        cols = width if width >= 0 else "keys"
        raise FastARError(f"{what} actions have shape {list(value.shape)}; expected [pixel_frames, {cols}]")
    if value.dtype.is_complex or value.dtype == torch.bool:
        value = value.float()
    value = value.detach().to("cpu", torch.float32)
    if not torch.isfinite(value).all():
        raise FastARError(f"{what} actions contain NaN or infinite values")
    return value


class Actions:
    """Keyboard ``[pixel_frames, num_keys]`` and mouse ``[pixel_frames, 2]`` (or None) actions, appendable.

    ``source``: where frames come from once those given run out (a callback or an iterator, see ``ActionSource``).
    """

    def __init__(self, keyboard, mouse=None, source: ActionSource | None = None):
        self.keyboard = _as_tensor(keyboard, "keyboard", _width(keyboard))
        self.mouse = None if mouse is None else _as_tensor(mouse, "mouse", 2)
        if self.mouse is not None and self.mouse.shape[0] != self.keyboard.shape[0]:
            raise FastARError(f"mouse actions cover {self.mouse.shape[0]} pixel frames but keyboard actions "
                              f"{self.keyboard.shape[0]}; give both for the same frames")
        self.source = source

    @property
    def num_frames(self) -> int:
        """Pixel frames known so far."""
        return self.keyboard.shape[0]

    @property
    def num_keys(self) -> int:
        return self.keyboard.shape[1]

    def check_layout(self, layout: ActionLayout) -> None:
        """Refuse actions that do not fit the model: wrong key count, mouse given or missing."""
        if self.num_keys != layout.num_keys:
            raise FastARError(f"keyboard actions have {self.num_keys} keys per frame; this model takes "
                              f"{layout.num_keys}")
        if layout.mouse and self.mouse is None:
            raise FastARError("this model is steered by keyboard and mouse: mouse actions [pixel_frames, 2] are "
                              "missing")
        if not layout.mouse and self.mouse is not None:
            raise FastARError("this model takes keyboard actions only: drop the mouse actions")

    def append(self, keyboard, mouse=None) -> None:
        """Add the actions of the next pixel frames (an interactive caller between chunks)."""
        kb = _as_tensor(keyboard, "keyboard", self.num_keys)
        if (mouse is None) != (self.mouse is None):
            raise FastARError("appended actions must have mouse moves exactly when the first ones did")
        ms = None if mouse is None else _as_tensor(mouse, "mouse", 2)
        if ms is not None and ms.shape[0] != kb.shape[0]:
            raise FastARError(f"appended mouse actions cover {ms.shape[0]} pixel frames but keyboard actions "
                              f"{kb.shape[0]}")
        self.keyboard = torch.cat([self.keyboard, kb])
        if ms is not None:
            assert self.mouse is not None
            self.mouse = torch.cat([self.mouse, ms])

    def require(self, latent_frames: int) -> None:
        """Make sure the actions cover the pixel frames of latent frames ``0 .. latent_frames - 1``, asking the
        source for more; raise naming what is missing when they cannot."""
        need = pixel_frames(latent_frames)
        while self.num_frames < need and self.source is not None:
            known = self.num_frames
            if isinstance(self.source, Iterator):
                step = next(self.source, None)
            else:
                step = self.source(known, need)
            if step is None:
                break
            keyboard, mouse = step
            self.append(keyboard, mouse)
            if self.num_frames == known:
                raise FastARError(f"the action source returned no frames when asked for pixel frames {known}.."
                                  f"{need - 1}")
        if self.num_frames < need:
            raise FastARError(f"the actions cover {self.num_frames} pixel frames; latent frame {latent_frames - 1} "
                              f"needs {need} (1 + 4 x {latent_frames - 1})")

    def upto(self, latent_frames: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(keyboard, mouse) of the pixel frames of latent frames ``0 .. latent_frames - 1``, batch-first
        ``[1, frames, width]`` (the same actions steer every batch item)."""
        self.require(latent_frames)
        n = pixel_frames(latent_frames)
        keyboard = send_to_device(self.keyboard[:n], device, dtype)[None]
        mouse = None if self.mouse is None else send_to_device(self.mouse[:n], device, dtype)[None]
        return keyboard, mouse


def _width(value) -> int:
    shape = getattr(value, "shape", None)
    if shape is None:
        try:
            shape = torch.as_tensor(value, dtype=torch.float32).shape
        except (TypeError, ValueError):
            return -1
    return int(shape[-1]) if len(shape) == 2 else -1
