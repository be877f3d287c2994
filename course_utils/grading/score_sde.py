"""Checks of the score/SDE problem set (``solutions/12_score_sde.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference built from :mod:`course_utils.score_sde`, :mod:`course_utils.score_sde_solvers` and
:mod:`course_utils.score_sde_fokker_planck`, and names the usual mistakes: the sign of the score, a missing
:math:`\\sqrt{2\\tau}`, :math:`g` where :math:`g^2` belongs, a variance for a standard deviation, the missing
1/2 of the diffusion term. The formulas are derived in ``notebooks/12_score_sde.ipynb``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..score_sde import dsm_objective, ula_step
from ..score_sde_fokker_planck import fokker_planck_ftcs
from ..score_sde_solvers import probability_flow_velocity, reverse_sde_euler_maruyama, vp_beta


class _AffineScore:
    """A fixed 'score network' s(x, sigma) = x @ W + b / sigma (or s(x) = x @ W + b), for checking losses and steps."""

    def __init__(self, rng: np.random.Generator, dim: int, with_sigma: bool):
        self.W = torch.tensor(rng.standard_normal((dim, dim)) * 0.5)
        self.b = torch.tensor(rng.standard_normal(dim))
        self.with_sigma = with_sigma

    def __call__(self, x, sigma=None):
        out = x @ self.W
        if self.with_sigma:
            return out + self.b / sigma.unsqueeze(-1)
        return out + self.b

    def __repr__(self):
        return "score_fn"


# ---------------------------------------------------------------- exercise 1: the DSM loss
def _reference_dsm_loss(score_fn, x, sigma, noise):
    return dsm_objective(score_fn, x, sigma, noise)


def _dsm(score_fn, x, sigma, noise, *, target_sign=-1.0, power=2, weight_power=2, scale_noise=True, reduce="sum"):
    sig = sigma.unsqueeze(-1)
    x_tilde = x + (sig * noise if scale_noise else noise)
    target = target_sign * (x_tilde - x) / sig**power
    err = sig**weight_power * (score_fn(x_tilde, sigma) - target) ** 2  # (B, D)
    return err.sum(-1).mean() if reduce == "sum" else err.mean()


def _dsm_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 40))])), int(rng.choice([2, 3]))
    sigma = torch.tensor(np.exp(rng.uniform(math.log(0.05), math.log(3.0), B)))
    return (_AffineScore(rng, D, True), torch.tensor(rng.standard_normal((B, D))), sigma,
            torch.tensor(rng.standard_normal((B, D))))


def check_dsm_loss(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 1: ``fn(score_fn, x, sigma, noise) -> 0-d tensor``, the sigma^2-weighted DSM loss."""

    def variant(**kw):
        return lambda score_fn, x, sigma, noise: _dsm(score_fn, x, sigma, noise, **kw)

    check_function(
        fn, _reference_dsm_loss, _dsm_inputs, name="dsm_loss", trials=trials, seed=seed,
        mistakes=[
            Mistake("score_sign", "sign of the score: the score of N(x, sigma^2 I) at x_tilde points back toward x, "
                    "so the target is -(x_tilde - x) / sigma^2.", variant(target_sign=1.0)),
            Mistake("sigma", "the target divides by sigma^2 (a variance), not by sigma: -(x_tilde - x) / sigma^2.",
                    variant(power=1)),
            Mistake("no_weight", "weight each term by lambda(sigma) = sigma^2; without it the small noise levels "
                    "dominate the loss.", variant(weight_power=0)),
            Mistake("weight_sigma", "the weight is sigma^2, not sigma.", variant(weight_power=1)),
            Mistake("unscaled_noise", "perturb with x_tilde = x + sigma * noise; you added the noise unscaled.",
                    variant(scale_noise=False)),
            Mistake("mean_coords", "your loss is the right one divided by the dimension: sum the squared error over "
                    "the coordinates (a squared norm) and average over the batch.", variant(reduce="mean")),
        ],
        forbidden=("course_utils.score_sde.dsm_objective", "course_utils.grading.score_sde._reference_dsm_loss"),
    )


# ---------------------------------------------------------------- exercise 2: a Langevin step
def _reference_langevin_step(x, score_fn, tau, noise):
    return ula_step(x, score_fn(x), tau, noise)


def _langevin_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 30))])), int(rng.choice([1, 2, 3]))
    tau = float(rng.choice([0.01, 0.1, round(float(rng.uniform(0.02, 0.8)), 4)]))
    return (torch.tensor(rng.standard_normal((B, D))), _AffineScore(rng, D, False), tau,
            torch.tensor(rng.standard_normal((B, D))))


def check_langevin_step(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 2: ``fn(x, score_fn, tau, noise) -> x + tau * s(x) + sqrt(2 tau) * noise``."""

    def variant(drift, noise_coef):
        return lambda x, score_fn, tau, noise: x + drift(tau) * score_fn(x) + noise_coef(tau) * noise

    check_function(
        fn, _reference_langevin_step, _langevin_inputs, name="langevin_step", trials=trials, seed=seed,
        mistakes=[
            Mistake("score_sign", "sign of the score: Langevin climbs the log-density, x + tau * s(x) + ...",
                    variant(lambda t: -t, lambda t: math.sqrt(2 * t))),
            Mistake("sqrt_tau", "missing sqrt(2 tau): the noise is scaled by sqrt(2 tau), not sqrt(tau); with "
                    "sqrt(tau) the chain samples p^2 (half the variance), not p.",
                    variant(lambda t: t, lambda t: math.sqrt(t))),
            Mistake("variance", "missing sqrt(2 tau): you scaled the noise by 2 tau, a variance; its standard "
                    "deviation sqrt(2 tau) belongs there.", variant(lambda t: t, lambda t: 2 * t)),
            Mistake("tau_noise", "missing sqrt(2 tau): the noise is scaled by sqrt(2 tau), not by tau.",
                    variant(lambda t: t, lambda t: t)),
            Mistake("half_convention", "that is the other convention, x + (tau/2) s + sqrt(tau) z; this exercise "
                    "(and the lesson, eq. 3) uses x + tau * s(x) + sqrt(2 tau) z.",
                    variant(lambda t: t / 2, lambda t: math.sqrt(t))),
            Mistake("no_noise", "add the noise sqrt(2 tau) * noise: without it this is gradient ascent, which "
                    "collapses onto the modes.", variant(lambda t: t, lambda t: 0.0)),
        ],
        forbidden=("course_utils.score_sde.ula_step", "course_utils.score_sde.langevin_chain",
                   "course_utils.grading.score_sde._reference_langevin_step"),
    )


# ---------------------------------------------------------------- exercise 3: an Euler-Maruyama step of the reverse VP SDE
def _reference_reverse_sde_step(x, score, u, h, beta_min, beta_max, noise):
    return reverse_sde_euler_maruyama(x, score, u, h, noise, beta_min, beta_max)


def _vp_inputs(with_noise: bool):
    def make(rng):
        B, D = int(rng.choice([1, int(rng.integers(2, 30))])), int(rng.choice([1, 2, 3]))
        beta_min, beta_max = float(rng.uniform(0.05, 0.5)), float(rng.uniform(5.0, 25.0))
        n = int(rng.choice([10, 50, 1000]))
        h = 1.0 / n
        u = float(rng.choice([1.0, round(float(rng.uniform(h, 1.0)), 5)]))
        args = [torch.tensor(rng.standard_normal((B, D))), torch.tensor(rng.standard_normal((B, D)) * 3), u]
        if with_noise:
            return (*args, h, beta_min, beta_max, torch.tensor(rng.standard_normal((B, D))))
        return (*args, beta_min, beta_max)
    return make


def check_reverse_sde_step(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 3: ``fn(x, score, u, h, beta_min, beta_max, noise) -> x at u - h`` for the VP SDE."""

    def variant(score_coef=lambda b: b, x_sign=1.0, noise_coef=lambda b, h: math.sqrt(b * h), at_end=False):
        def wrong(x, score, u, h, bmin, bmax, noise):
            b = vp_beta(u - h if at_end else u, bmin, bmax)
            return x + h * (x_sign * 0.5 * b * x + score_coef(b) * score) + noise_coef(b, h) * noise
        return wrong

    check_function(
        fn, _reference_reverse_sde_step, _vp_inputs(True), name="reverse_sde_step", trials=trials, seed=seed,
        mistakes=[
            Mistake("score_sign", "sign of the score: the reverse drift is f - g^2 s, and stepping backwards in time "
                    "(du = -h) turns it into + h * g^2 * s.", variant(score_coef=lambda b: -b)),
            Mistake("g_not_g2", "g^2 vs g: the score is multiplied by g(u)^2 = beta(u), not by g = sqrt(beta(u)).",
                    variant(score_coef=lambda b: math.sqrt(b))),
            Mistake("half_g2", "that is the probability-flow drift (1/2 g^2 s) with noise added; the reverse SDE "
                    "has the full g^2 s.", variant(score_coef=lambda b: 0.5 * b)),
            Mistake("f_sign", "the forward drift is f = -1/2 beta x; a step back in time subtracts h f, so x gains "
                    "+ h * 1/2 beta x.", variant(x_sign=-1.0)),
            Mistake("no_sqrt_h", "Brownian increments over a step h have standard deviation sqrt(h): the noise term "
                    "is g sqrt(h) z = sqrt(beta h) z.", variant(noise_coef=lambda b, h: math.sqrt(b) * h)),
            Mistake("noise_g2", "g^2 vs g: the noise is scaled by g sqrt(h) = sqrt(beta h), not by beta sqrt(h).",
                    variant(noise_coef=lambda b, h: b * math.sqrt(h))),
            Mistake("beta_at_end", "Euler-Maruyama evaluates beta at the start of the step, beta(u), not at u - h.",
                    variant(at_end=True)),
        ],
        forbidden=("course_utils.score_sde_solvers.reverse_sde_euler_maruyama",
                   "diffusers.schedulers.deprecated.scheduling_sde_vp.ScoreSdeVpScheduler.step_pred",
                   "course_utils.grading.score_sde._reference_reverse_sde_step"),
    )


# ---------------------------------------------------------------- exercise 4: the probability-flow drift
def _reference_probability_flow_drift(x, score, u, beta_min, beta_max):
    return probability_flow_velocity(x, score, u, beta_min, beta_max)


def check_probability_flow_drift(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 4: ``fn(x, score, u, beta_min, beta_max) -> dx/du`` of the VP probability-flow ODE."""

    def variant(score_coef, x_coef=lambda b: -0.5 * b):
        return lambda x, score, u, bmin, bmax: (x_coef(vp_beta(u, bmin, bmax)) * x
                                                + score_coef(vp_beta(u, bmin, bmax)) * score)

    check_function(
        fn, _reference_probability_flow_drift, _vp_inputs(False), name="probability_flow_drift", trials=trials,
        seed=seed,
        mistakes=[
            Mistake("full_g2", "that is the reverse SDE's drift f - g^2 s; the probability-flow ODE has half of it: "
                    "f - 1/2 g^2 s (the other half was the noise's job).", variant(lambda b: -b)),
            Mistake("g_not_g2", "g^2 vs g: the score is multiplied by 1/2 g^2 = 1/2 beta(u), not by 1/2 sqrt(beta).",
                    variant(lambda b: -0.5 * math.sqrt(b))),
            Mistake("score_sign", "sign of the score: dx/du = f - 1/2 g^2 s (forward in time the flow moves down the "
                    "log-density).", variant(lambda b: 0.5 * b)),
            Mistake("backward", "you returned -dx/du (the velocity backwards in time); return dx/du = "
                    "-1/2 beta (x + s).", variant(lambda b: 0.5 * b, lambda b: 0.5 * b)),
            Mistake("no_f", "the drift includes f(x, u) = -1/2 beta(u) x.", variant(lambda b: -0.5 * b, lambda b: 0.0)),
        ],
        forbidden=("course_utils.score_sde_solvers.probability_flow_velocity",
                   "course_utils.grading.score_sde._reference_probability_flow_drift"),
    )


# ---------------------------------------------------------------- exercise 5: a finite-difference Fokker-Planck step
def _reference_fokker_planck_step(p, x, dt, theta, sigma):
    return fokker_planck_ftcs(p, x, dt, theta, sigma)


def _fp(p, x, dt, theta, sigma, *, drift_sign=1.0, diff_coef=None, advective=False, dx_power=2):
    dx = x[1] - x[0]
    pp = np.pad(p, 1)
    if advective:
        drift = theta * x * (pp[2:] - pp[:-2]) / (2 * dx)
    else:
        flux = np.pad(theta * x * p, 1)
        drift = (flux[2:] - flux[:-2]) / (2 * dx)
    d = 0.5 * sigma**2 if diff_coef is None else diff_coef(sigma)
    return p + dt * (drift_sign * drift + d * (pp[2:] - 2 * p + pp[:-2]) / dx**dx_power)


def _fp_inputs(rng):
    n = int(rng.choice([3, int(rng.integers(4, 30)), int(rng.integers(30, 300))]))
    half = float(rng.uniform(2.0, 6.0))
    x = np.linspace(-half, half, n)
    sigma = float(rng.uniform(0.3, 2.0))
    dt = float(rng.uniform(0.1, 0.9)) * (x[1] - x[0]) ** 2 / sigma**2
    p = rng.random(n) * np.exp(-0.5 * (x - rng.uniform(-1, 1)) ** 2)
    return p, x, dt, float(rng.uniform(0.2, 2.0)), sigma


def check_fokker_planck_step(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 5: ``fn(p, x, dt, theta, sigma) -> p`` one step later, for dX = -theta X dt + sigma dW."""

    def variant(**kw):
        return lambda p, x, dt, theta, sigma: _fp(p, x, dt, theta, sigma, **kw)

    check_function(
        fn, _reference_fokker_planck_step, _fp_inputs, name="fokker_planck_step", trials=trials, seed=seed,
        mistakes=[
            Mistake("drift_sign", "the drift term of Fokker-Planck is -d/dx(mu p) with mu = -theta x, i.e. "
                    "+ d/dx(theta x p): the density flows toward 0.", variant(drift_sign=-1.0)),
            Mistake("no_half", "the diffusion coefficient is sigma^2 / 2 (Kramers-Moyal's D2), not sigma^2.",
                    variant(diff_coef=lambda s: s**2)),
            Mistake("sigma", "the diffusion term has sigma^2 / 2, a variance rate; you used sigma / 2.",
                    variant(diff_coef=lambda s: s / 2)),
            Mistake("advective", "differentiate the flux theta x p as a whole (central difference of theta x p); "
                    "theta x dp/dx alone misses theta p, and probability is not conserved.", variant(advective=True)),
            Mistake("dx", "the second difference is divided by dx^2, not dx.", variant(dx_power=1)),
        ],
        forbidden=("course_utils.score_sde_fokker_planck.fokker_planck_ftcs",
                   "course_utils.score_sde_fokker_planck.solve_fokker_planck",
                   "course_utils.grading.score_sde._reference_fokker_planck_step"),
    )


__all__ = ["check_dsm_loss", "check_langevin_step", "check_reverse_sde_step", "check_probability_flow_drift",
           "check_fokker_planck_step"]
