"""Denoising step lists of the Wan2.1 AR family, as noise levels sigma in (0, 1].

The distilled models take a handful of steps. Self-Forcing, LongLive and Causal Forcing use the list
1000/750/500/250 *warped*: each entry indexes the shift-5 flow-matching training timesteps, giving
sigma = 1, 0.9375, 0.8333, 0.625. Rolling Forcing warps 1000/800/600/400/200 the same way. The model's timestep
input is ``1000 * sigma`` unless a schedule says otherwise: CausVid passes 1000/757/522 to the model unwarped and
its sampler converts with the sigma of the nearest entry of the shift-8 training table; Krea Realtime's server
ends its list with a step at timestep 0, whose sigma is the table's smallest (about 0.005).

LingBot-World 2.0 picks four entries (0, 250, 500, 750: ``generate()``'s default, which its ``generate.py`` never
overrides) of Wan's 1000-step UniPC table at its config's shift 10, whose model timesteps are integers
(``int(1000 sigma)``, several entries sharing one near the top): it converts a flow at the sigma of the first
entry with that timestep, and re-noises to the second (diffusers' ``index_for_timestep``), so its re-noise levels
(``renoise_sigmas``) are not its conversion levels: preset ``lingbot``.

LongLive 2.0 (Wan2.2 TI2V-5B) solves each chunk with UniPC instead (``solver="unipc"``, ``unipc.py``): preset
``longlive2``, 4 steps at shift 5, the model fed the integer timesteps 999/937/833/624.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import FastARError
from .unipc import unipc_steps

SOLVERS = ("dmd", "unipc")


def shift_sigma(sigma: float, shift: float) -> float:
    return shift * sigma / (1 + (shift - 1) * sigma)


def warp_steps(steps, shift: float, num_train_timesteps: int = 1000) -> list[float]:
    """Self-Forcing's ``warp_denoising_step``: step s picks entry ``1000 - s`` of the float32 shifted training table
    (sigma ``s / 1000`` shifted), as the references index it; computed in float64 instead, some levels (two of
    Rolling Forcing's five) land one float32 ulp away. A step that is not a whole table index is shifted
    exactly."""
    sigmas, _ = training_table(shift, num_train_timesteps)
    table = torch.cat([sigmas, torch.zeros(1)]).double()
    out = []
    for s in steps:
        index = num_train_timesteps - s
        whole = float(index).is_integer() and 0 <= index < num_train_timesteps
        out.append(float(table[int(index)]) if whole else shift_sigma(1.0 - index / num_train_timesteps, shift))
    return out


def training_table(shift: float, num_train_timesteps: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """The references' ``FlowMatchScheduler(shift, sigma_min=0, extra_one_step=True)`` table, in float32 as
    they build it: (sigmas, timesteps), from 1 down to the smallest non-zero level."""
    sigmas = torch.linspace(1.0, 0.0, num_train_timesteps + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return sigmas, sigmas * num_train_timesteps


def table_sigma(timestep: float, shift: float) -> float:
    """The sigma the references convert with at ``timestep``: the nearest training-table entry's."""
    sigmas, timesteps = training_table(shift)
    return float(sigmas.double()[torch.argmin((timesteps.double() - timestep).abs())])


@dataclass(frozen=True)
class DenoisingSchedule:
    name: str
    sigmas: tuple  # one per denoising step, decreasing, in (0, 1]
    shift: float | None = None
    model_timesteps: tuple | None = None  # what the model is fed per step, when not 1000 * sigma
    # "dmd": x0 then fresh noise to the next sigma (the Self-Forcing family); "unipc": LongLive 2.0's multistep
    # UniPC on flow predictions, no re-noising (fastar_core/rollout/unipc.py)
    solver: str = "dmd"
    # dmd: the level each step's x0 is re-noised to before step i + 1 (None: the sigma of step i + 1)
    renoise_sigmas: tuple | None = None

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise FastARError(f"schedule solver {self.solver!r} is not one of {', '.join(SOLVERS)}")
        if not self.sigmas:
            raise FastARError("a denoising schedule needs at least one step")
        if any(not (0 < s <= 1) for s in self.sigmas):
            raise FastARError(f"schedule sigmas must lie in (0, 1]; got {list(self.sigmas)}")
        if any(b >= a for a, b in zip(self.sigmas, self.sigmas[1:])):
            raise FastARError(f"schedule sigmas must decrease; got {list(self.sigmas)}")
        if self.model_timesteps is not None and len(self.model_timesteps) != len(self.sigmas):
            raise FastARError(f"a schedule needs one model timestep per sigma; got {len(self.model_timesteps)} for "
                              f"{len(self.sigmas)}")
        if self.renoise_sigmas is not None and (len(self.renoise_sigmas) != len(self.sigmas) - 1
                                                or any(not (0 < s <= 1) for s in self.renoise_sigmas)):
            raise FastARError(f"a schedule's re-noise levels are one per step after the first, in (0, 1]; got "
                              f"{list(self.renoise_sigmas)} for {len(self.sigmas)} steps")

    def renoise_sigma(self, step: int) -> float:
        """The level step ``step``'s input is noised to from the previous step's x0 (``step >= 1``)."""
        return self.sigmas[step] if self.renoise_sigmas is None else self.renoise_sigmas[step - 1]

    @property
    def num_steps(self) -> int:
        return len(self.sigmas)

    @property
    def timesteps(self) -> list[float]:
        """The model's timestep input per step."""
        if self.model_timesteps is not None:
            return [float(t) for t in self.model_timesteps]
        return [1000.0 * s for s in self.sigmas]

    def to_dict(self) -> dict:
        out = {"name": self.name, "sigmas": [round(s, 6) for s in self.sigmas], "shift": self.shift}
        if self.model_timesteps is not None:
            out["timesteps"] = [round(t, 4) for t in self.timesteps]
        if self.solver != "dmd":
            out["solver"] = self.solver
        if self.renoise_sigmas is not None:
            out["renoise_sigmas"] = [round(s, 6) for s in self.renoise_sigmas]
        return out


def reference_table_schedule(name: str, timesteps, shift: float) -> DenoisingSchedule:
    """Steps given as model timesteps, converted as the references do (nearest training-table sigma)."""
    return DenoisingSchedule(name, tuple(table_sigma(t, shift) for t in timesteps), shift, tuple(timesteps))


def _krea_server_schedule(steps: int = 5, shift: float = 5.0) -> DenoisingSchedule:
    """Krea's ``get_denoising_schedule``: ``linspace(1000, 0, steps)`` as integers, warped through the table
    with a 0 appended, so its last step runs the model at timestep 0 (server default: 5 steps)."""
    _, timesteps = training_table(shift)
    padded = torch.cat([timesteps, torch.zeros(1)])
    picks = torch.linspace(1000, 0, steps, dtype=torch.float32).to(torch.long)
    return reference_table_schedule("krea", [float(padded[1000 - int(p)]) for p in picks], shift)


def unipc_schedule(name: str, steps: int, shift: float) -> DenoisingSchedule:
    """A UniPC run of ``steps`` at ``shift``: its sigmas and the integer timesteps the model is fed."""
    sigmas, timesteps = unipc_steps(steps, shift)
    return DenoisingSchedule(name, sigmas, shift, timesteps, solver="unipc")


def indexed_table_schedule(name: str, indices, shift: float, num_train_timesteps: int = 1000) -> DenoisingSchedule:
    """Entries ``indices`` of the ``num_train_timesteps``-step UniPC table at ``shift``, as LingBot-World 2.0 runs
    them: the model fed each entry's integer timestep, its flow converted at the first table entry of that
    timestep (``argmin |t - timestep|``), the step before it re-noised to the second (the first when alone)."""
    sigmas, timesteps = unipc_steps(num_train_timesteps, shift, num_train_timesteps)
    picked = [timesteps[i] for i in indices]
    same = [[j for j, t in enumerate(timesteps) if t == p] for p in picked]
    convert = tuple(sigmas[s[0]] for s in same)
    renoise = tuple(sigmas[s[1] if len(s) > 1 else s[0]] for s in same[1:])
    return DenoisingSchedule(name, convert, shift, tuple(picked), renoise_sigmas=renoise)


SCHEDULE_PRESETS = {
    "self-forcing": DenoisingSchedule("self-forcing", tuple(warp_steps([1000, 750, 500, 250], 5.0)), 5.0),
    "rolling-forcing": DenoisingSchedule("rolling-forcing", tuple(warp_steps([1000, 800, 600, 400, 200], 5.0)), 5.0),
    "causvid": reference_table_schedule("causvid", (1000.0, 757.0, 522.0), 8.0),
    "krea": _krea_server_schedule(),
    # Causal Forcing++ (frame-wise): 1 or 2 steps per frame; the first frame takes the 4-step list (below).
    "causal-forcing++-1step": DenoisingSchedule("causal-forcing++-1step", tuple(warp_steps([1000], 5.0)), 5.0),
    "causal-forcing++-2step": DenoisingSchedule("causal-forcing++-2step", tuple(warp_steps([1000, 500], 5.0)), 5.0),
    # Matrix-Game 2.0 universal and gta_drive: 1000/666/333 warped at shift 5 (templerun takes self-forcing's).
    "matrix-game": DenoisingSchedule("matrix-game", tuple(warp_steps([1000, 666, 333], 5.0)), 5.0),
    # LongLive 2.0 (Wan2.2 TI2V-5B): 4 UniPC steps at shift 5, the model fed [999, 937, 833, 624].
    "longlive2": unipc_schedule("longlive2", 4, 5.0),
    # LingBot-World 2.0 (causal fast, as generate.py runs it): entries 0, 250, 500, 750 of the 1000-step table at
    # shift 10, the model fed [999, 967, 908, 768].
    "lingbot": indexed_table_schedule("lingbot", (0, 250, 500, 750), 10.0),
}
# Presets whose first chunk is denoised with another list (Causal Forcing++'s denoising_step_list_first_chunk).
FIRST_CHUNK_SCHEDULES = {"causal-forcing++-1step": "self-forcing", "causal-forcing++-2step": "self-forcing"}
SCHEDULE_ALIASES = {"longlive": "self-forcing", "causal-forcing": "self-forcing",
                    "matrix-game-templerun": "self-forcing"}


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
