"""Denoising step lists of the Wan2.1 AR family, as noise levels sigma in (0, 1].

The distilled models take a handful of steps. Self-Forcing, LongLive and Causal Forcing use the list
1000/750/500/250 *warped*: each entry indexes the shift-5 flow-matching training timesteps, giving
sigma = 1, 0.9375, 0.8333, 0.625. Rolling Forcing warps 1000/800/600/400/200 the same way. CausVid passes
1000/757/522 to the model unwarped. The model's timestep input is ``1000 * sigma``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import FastARError


def shift_sigma(sigma: float, shift: float) -> float:
    return shift * sigma / (1 + (shift - 1) * sigma)


def warp_steps(steps, shift: float, num_train_timesteps: int = 1000) -> list[float]:
    """Self-Forcing's ``warp_denoising_step``: step s picks training sigma ``1 - (1000 - s)/1000`` then shifts it."""
    return [shift_sigma(1.0 - (num_train_timesteps - s) / num_train_timesteps, shift) for s in steps]


@dataclass(frozen=True)
class DenoisingSchedule:
    name: str
    sigmas: tuple  # one per denoising step, decreasing, in (0, 1]
    shift: float | None = None

    def __post_init__(self):
        if not self.sigmas:
            raise FastARError("a denoising schedule needs at least one step")
        if any(not (0 < s <= 1) for s in self.sigmas):
            raise FastARError(f"schedule sigmas must lie in (0, 1]; got {list(self.sigmas)}")
        if any(b >= a for a, b in zip(self.sigmas, self.sigmas[1:])):
            raise FastARError(f"schedule sigmas must decrease; got {list(self.sigmas)}")

    @property
    def num_steps(self) -> int:
        return len(self.sigmas)

    def to_dict(self) -> dict:
        return {"name": self.name, "sigmas": [round(s, 6) for s in self.sigmas], "shift": self.shift}


SCHEDULE_PRESETS = {
    "self-forcing": DenoisingSchedule("self-forcing", tuple(warp_steps([1000, 750, 500, 250], 5.0)), 5.0),
    "rolling-forcing": DenoisingSchedule("rolling-forcing", tuple(warp_steps([1000, 800, 600, 400, 200], 5.0)), 5.0),
    "causvid": DenoisingSchedule("causvid", (1.0, 0.757, 0.522), 8.0),
}
SCHEDULE_ALIASES = {"longlive": "self-forcing", "causal-forcing": "self-forcing", "krea": "self-forcing"}


def get_schedule(name_or_sigmas) -> DenoisingSchedule:
    """A preset by name, or a custom schedule from sigmas (or timesteps in 0..1000, or a 1-D tensor)."""
    if isinstance(name_or_sigmas, DenoisingSchedule):
        return name_or_sigmas
    if isinstance(name_or_sigmas, str):
        key = SCHEDULE_ALIASES.get(name_or_sigmas, name_or_sigmas)
        if key in SCHEDULE_PRESETS:
            return SCHEDULE_PRESETS[key]
        try:
            values = [float(v) for v in name_or_sigmas.split(",")]
        except ValueError:
            valid = ", ".join([*SCHEDULE_PRESETS, *SCHEDULE_ALIASES])
            raise FastARError(
                f"schedule {name_or_sigmas!r} is not a preset ({valid}) nor a comma-separated list of sigmas"
            ) from None
        return custom_schedule(values)
    if isinstance(name_or_sigmas, torch.Tensor):
        return custom_schedule(name_or_sigmas.flatten().tolist())
    return custom_schedule(list(name_or_sigmas))


def custom_schedule(values) -> DenoisingSchedule:
    """Sigmas (or timesteps > 1, divided by 1000). A trailing 0, as ComfyUI's SIGMAS carry, is dropped."""
    values = [float(v) for v in values]
    if values and max(values) > 1.0:
        values = [v / 1000.0 for v in values]
    if values and values[-1] == 0.0:
        values = values[:-1]
    return DenoisingSchedule("custom", tuple(values))
