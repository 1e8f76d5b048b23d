"""UniPC on flow predictions: LongLive 2.0's solver, rebuilt for every chunk.

LongLive 2.0 (Wan2.2 TI2V-5B) does not re-noise between steps as the Self-Forcing family does. Each chunk starts
from its own noise and takes ``num_steps`` multistep UniPC steps (Zhao et al., 2023: predictor UniP-p, corrector
UniC-p, the B(h) = e^h - 1 variant "bh2", order 2, lower orders at the start and at the last step) on the
model's x0 estimate ``x - sigma * flow``; the last step lands on sigma 0, i.e. on that estimate itself.

The step list is Wan's ``FlowUniPCMultistepScheduler.set_timesteps``: sigmas spaced evenly from the training
table's largest (float32 0.999) to 0, shifted, with the model fed the integer part of ``1000 * sigma``
(``[999, 937, 833, 624]`` for 4 steps at shift 5). The solver's scalars are float32 0-d tensors, as the
scheduler keeps its sigma table in float32, so the arithmetic matches it operation for operation.
"""

from __future__ import annotations

import torch

from ..errors import FastARError

SOLVER_VARIANTS = ("bh1", "bh2")


def unipc_steps(num_steps: int, shift: float, num_train_timesteps: int = 1000) -> tuple[tuple, tuple]:
    """(sigmas, model timesteps) of a UniPC run of ``num_steps``: sigmas as float32 values (the final 0 left
    out), timesteps the integer part of ``num_train_timesteps * sigma`` taken in float64."""
    if num_steps < 1:
        raise FastARError(f"a UniPC schedule needs at least one step, got {num_steps}")
    if not shift > 0:
        raise FastARError(f"the UniPC shift must be positive, got {shift}")
    # The training table's first sigma, 1 - 1/num_train_timesteps, as the scheduler stores it (float32).
    sigma_max = float(torch.tensor(1.0 - 1.0 / num_train_timesteps, dtype=torch.float32))
    step = (0.0 - sigma_max) / num_steps  # numpy.linspace(sigma_max, 0, num_steps + 1): start + i * step
    raw = [i * step + sigma_max for i in range(num_steps)]
    shifted = [shift * s / (1 + (shift - 1) * s) for s in raw]
    timesteps = tuple(float(int(s * num_train_timesteps)) for s in shifted)
    sigmas = tuple(float(v) for v in torch.tensor(shifted, dtype=torch.float64).float())
    return sigmas, timesteps


class UniPCSolver:
    """One chunk's multistep state: call ``step(flow, x)`` once per sigma, in order; it returns the next sample.

    ``sigmas`` are the run's noise levels without the final 0. ``order`` 2 with ``lower_order_final`` and the
    corrector on is LongLive 2.0's setting (Wan's defaults)."""

    def __init__(self, sigmas, order: int = 2, variant: str = "bh2", corrector: bool = True,
                 lower_order_final: bool = True):
        if order < 1:
            raise FastARError(f"the UniPC order must be >= 1, got {order}")
        if variant not in SOLVER_VARIANTS:
            raise FastARError(f"UniPC variant {variant!r} is not one of {', '.join(SOLVER_VARIANTS)}")
        self.sigmas = torch.tensor([*sigmas, 0.0], dtype=torch.float32)
        self.num_steps = len(sigmas)
        self.order = order
        self.variant = variant
        self.corrector = corrector
        self.lower_order_final = lower_order_final
        self.index = 0
        self.x0_history: list = []  # the model's x0 estimates, oldest first (at most ``order``)
        self.last_sample: torch.Tensor | None = None
        self.last_order = 0

    def _alpha_sigma_lambda(self, i: int):
        sigma = self.sigmas[i]
        alpha = 1 - sigma
        return alpha, sigma, torch.log(alpha) - torch.log(sigma)

    def _coefficients(self, lam_t, lam_s0, earlier: list, order: int):
        """h, the ratios r_k of the earlier steps' log-SNR gaps to h, and the B(h)-scaled phi terms."""
        h = lam_t - lam_s0
        ratios = [(lam - lam_s0) / h for lam in earlier]
        rks = torch.tensor([*ratios, 1.0])
        hh = -h  # the x0-predicting form
        h_phi_1 = torch.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        b_h = hh if self.variant == "bh1" else torch.expm1(hh)
        rows, rhs = [], []
        factorial = 1
        for i in range(1, order + 1):
            rows.append(torch.pow(rks, i - 1))
            rhs.append(h_phi_k * factorial / b_h)
            factorial *= i + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        return ratios, h_phi_1, b_h, torch.stack(rows), torch.tensor(rhs)

    def _differences(self, m0, ratios):
        """(x0 of an earlier step - x0 of the latest) / r_k, newest earlier step first."""
        return [(self.x0_history[-(k + 2)] - m0) / r for k, r in enumerate(ratios)]

    def _predict(self, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniP: from ``x`` at sigma[index] to sigma[index + 1]."""
        i = self.index
        m0 = self.x0_history[-1]
        alpha_t, sigma_t, lam_t = self._alpha_sigma_lambda(i + 1)
        _, sigma_s0, lam_s0 = self._alpha_sigma_lambda(i)
        earlier = [self._alpha_sigma_lambda(i - k)[2] for k in range(1, order)]
        ratios, h_phi_1, b_h, rows, rhs = self._coefficients(lam_t, lam_s0, earlier, order)
        out = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0
        if ratios:
            diffs = self._differences(m0, ratios)
            if order == 2:
                rhos = torch.tensor([0.5], dtype=x.dtype)
            else:
                rhos = torch.linalg.solve(rows[:-1, :-1], rhs[:-1]).to(x.dtype)
            out = out - alpha_t * b_h * _weighted(rhos, diffs)
        return out.to(x.dtype)

    def _correct(self, x0_now: torch.Tensor, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniC: redo the last predictor step from ``last_sample`` with the model's estimate at its result."""
        i = self.index
        m0 = self.x0_history[-1]
        alpha_t, sigma_t, lam_t = self._alpha_sigma_lambda(i)
        _, sigma_s0, lam_s0 = self._alpha_sigma_lambda(i - 1)
        earlier = [self._alpha_sigma_lambda(i - k - 1)[2] for k in range(1, order)]
        ratios, h_phi_1, b_h, rows, rhs = self._coefficients(lam_t, lam_s0, earlier, order)
        if order == 1:
            rhos = torch.tensor([0.5], dtype=x.dtype)
        else:
            rhos = torch.linalg.solve(rows, rhs).to(x.dtype)
        last = self.last_sample
        assert last is not None
        out = sigma_t / sigma_s0 * last - alpha_t * h_phi_1 * m0
        residual = _weighted(rhos[:-1], self._differences(m0, ratios)) if ratios else 0
        out = out - alpha_t * b_h * (residual + rhos[-1] * (x0_now - m0))
        return out.to(last.dtype)

    def step(self, flow: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.index >= self.num_steps:
            raise FastARError(f"the UniPC solver has taken all its {self.num_steps} steps")
        x0 = x - self.sigmas[self.index] * flow
        if self.corrector and self.index > 0 and self.last_sample is not None:
            x = self._correct(x0, x, self.last_order)
        self.x0_history = [*self.x0_history, x0][-self.order:]
        order = self.order
        if self.lower_order_final:
            order = min(order, self.num_steps - self.index)
        order = min(order, len(self.x0_history))  # warm-up: as many earlier estimates as exist
        self.last_order = order
        self.last_sample = x
        out = self._predict(x, order)
        self.index += 1
        return out


def _weighted(rhos: torch.Tensor, diffs: list) -> torch.Tensor:
    """sum_k rhos[k] * diffs[k], contracted as one einsum over a stacked k axis (one term: a plain product)."""
    return torch.einsum("k,bk...->b...", rhos, torch.stack(diffs, dim=1))


def solve_chunk_unipc(loop, chunk: int, schedule, x: torch.Tensor, position: int) -> torch.Tensor:
    """Denoise one chunk of a rollout (``sampler.RolloutLoop``) from its noise ``x`` with a fresh solver: one
    forward per step against the cache as it stands (the clean pass after it writes the chunk's keys).

    Image-to-video (``loop.first_frame``): the first chunk's frame 0 is the image latent before and after every
    step and is fed at timestep 0, as LongLive 2.0 clamps it; the solver still steps it, and it is overwritten."""
    frames = x.shape[2]
    image = loop.first_frame if chunk == 0 else None
    solver = UniPCSolver(schedule.sigmas)
    for s in range(schedule.num_steps):
        loop._check_cancel()
        info = loop._info(chunk, s, position, frames, num_steps=schedule.num_steps)
        assert loop.text is not None, "the prompt is encoded before the first forward"
        times = loop._times(schedule, [s], [frames])
        if image is not None:
            x, times = _hold_first_frame(x, image), times.clone()
            times[:, 0] = 0
        flow = loop.runner.forward(x, times, loop.text, loop.cache, info)
        x = solver.step(flow, x)
        if image is not None:
            x = _hold_first_frame(x, image)
        loop._tick()
    return x


def _hold_first_frame(x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    out[:, :, :1] = image.to(out.dtype)
    return out
