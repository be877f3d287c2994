"""Exercise 7 of the DDPM/DDIM problem set (``solutions/11_ddpm_ddim.ipynb``): DPM-Solver++(2M), a second-order
multistep sampler that lesson 11 did not write (Lu et al., 2022, "DPM-Solver++"; diffusers'
``DPMSolverMultistepScheduler`` with ``algorithm_type="dpmsolver++"``, ``solver_order=2``).

In the half log-SNR :math:`\\lambda_t = \\log(\\alpha_t/\\sigma_t)` (:math:`\\alpha_t = \\sqrt{\\bar\\alpha_t}`,
:math:`\\sigma_t = \\sqrt{1-\\bar\\alpha_t}`) the probability-flow ODE of a data-predicting model is solved exactly
in its linear part; the multistep form extrapolates the data prediction linearly in :math:`\\lambda` from the last
two steps.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..classroom.released import EpsModel
from ..diffusion import cosine_schedule, linear_schedule

_LESSON = ("course_utils.diffusion",)  # lesson modules refused by hand (course_utils.diffusion_* too)
BY_HAND_DPM_SOLVER_2M = {"modules": _LESSON,
    "allowed_ops": ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.neg", "aten.exp", "aten.expm1",
                    "aten.log", "aten.sqrt", "aten.clone", "aten.copy_"),
    "whole_result_ops": (),
}
_DIFFUSERS = "diffusers.schedulers.scheduling_dpmsolver_multistep.DPMSolverMultistepScheduler."


def _dpm2m(eps_model, x, alpha_bar, timesteps, *, first_order=False, r_inverted=False, log_snr=False,
           final="x0", sign=1.0):
    ts = [int(t) for t in timesteps]
    a = lambda t: math.sqrt(float(alpha_bar[t]))                        # noqa: E731
    s = lambda t: math.sqrt(1.0 - float(alpha_bar[t]))                  # noqa: E731
    lam = lambda t: (2.0 if log_snr else 1.0) * math.log(a(t) / s(t))   # noqa: E731
    x0_prev, h_prev = None, None
    for i, t in enumerate(ts):
        x0 = (x - s(t) * eps_model(x, t)) / a(t)                        # the data prediction
        if i == len(ts) - 1:
            return x0 if final == "x0" else x
        t_next = ts[i + 1]
        h = lam(t_next) - lam(t)
        if first_order or x0_prev is None:
            d = x0
        else:
            r = h / h_prev if r_inverted else h_prev / h
            d = (1 + 1 / (2 * r)) * x0 - 1 / (2 * r) * x0_prev
        x = (s(t_next) / s(t)) * x - sign * a(t_next) * math.expm1(-h) * d
        x0_prev, h_prev = x0, h
    return x


def _reference_dpm_solver_2m(eps_model, x, alpha_bar, timesteps):
    return _dpm2m(eps_model, x, alpha_bar, timesteps)


def _dpm_inputs(rng):
    T = int(rng.integers(100, 1000))
    sched = linear_schedule(T, 1e-4 * 1000 / T, 0.02 * 1000 / T) if rng.integers(2) == 0 else cosine_schedule(T)
    n = int(rng.choice([3, int(rng.integers(4, 12)), int(rng.integers(12, 40))]))
    ts = np.unique(np.round(np.linspace(0, T - 1, n)).astype(int))[::-1]
    if rng.random() < 0.5:                                              # uneven spacing: the ratio r matters
        ts = np.unique(np.concatenate([[0, T - 1], rng.choice(T, n - 2, replace=False)]))[::-1]
    B = int(rng.integers(10, 120))
    return EpsModel(rng, T), torch.tensor(rng.standard_normal((B, 2))), sched.alpha_bar.numpy(), [int(t) for t in ts]


def check_dpm_solver_2m(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``fn(eps_model, x, alpha_bar, timesteps) -> samples``, DPM-Solver++(2M) then the final denoising."""

    def variant(**kw):
        return lambda *args: _dpm2m(*args, **kw)

    check_function(
        fn, _reference_dpm_solver_2m, _dpm_inputs, name="dpm_solver_2m", trials=trials, seed=seed, n=40,
        by_hand=ByHand.of(BY_HAND_DPM_SOLVER_2M),
        mistakes=[
            Mistake("first_order", "that is DDIM (first order): from the second step on, extrapolate the data "
                    "prediction with D = (1 + 1/(2r)) x0_i - 1/(2r) x0_(i-1), r = h_(i-1) / h_i.",
                    variant(first_order=True)),
            Mistake("r_inverted", "r is the previous step's h over this step's: r = h_(i-1) / h_i.",
                    variant(r_inverted=True)),
            Mistake("log_snr", "lambda is half the log-SNR: log(alpha/sigma) = 1/2 log(alpha_bar / (1 - alpha_bar)).",
                    variant(log_snr=True)),
            Mistake("sign", "sign of the update: x_next = (sigma_next/sigma) x - alpha_next (exp(-h) - 1) D; "
                    "exp(-h) - 1 is negative, so the data prediction is pulled in.", variant(sign=-1.0)),
            Mistake("no_final", "after the last timestep, return the model's data prediction x0 there (the "
                    "step to alpha_bar = 1).", variant(final="x")),
        ],
        forbidden=(_DIFFUSERS + "step", _DIFFUSERS + "multistep_dpm_solver_second_order_update",
                   _DIFFUSERS + "dpm_solver_first_order_update", _DIFFUSERS + "convert_model_output",
                   "course_utils.diffusion.ddim_step", "course_utils.diffusion.sample",
                   "course_utils.grading.diffusion_sampler._reference_dpm_solver_2m",
                   "course_utils.grading.diffusion_sampler._dpm2m"), quiet=quiet,
    )


__all__ = ["check_dpm_solver_2m"]
