"""Checks of the score/SDE problem set (``solutions/12_score_sde.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference and names the usual mistakes: the sign of the score, a missing :math:`\\sqrt{2\\tau}`, the VP marginal's
integral of :math:`\\beta`, :math:`g^2 = d\\sigma^2/du` for the VE SDE, and EDM's stochastic sampler (Karras et al.,
2022, Algorithm 2: the churn, then a Heun step), which lesson 12 only cites; the lesson writes the deterministic
Heun sampler. The formulas of the lesson are in ``notebooks/12_score_sde.ipynb``; exercises 2, 3, 5 and 6 ask for what
it did not write. The sampler checks use the exact denoiser of a random Gaussian mixture and a fixed noise per step,
``noise(i)``, so the learner's sample is compared exactly with the reference's.

``BY_HAND_*`` (passed as ``by_hand=ByHand.of(...)``) name, per by-hand exercise, the aten operations it needs and the
ones that would compute the whole result (none exist for most of these formulas: the shortcuts are the
course's and diffusers' functions, refused by name through ``forbidden=``).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..classroom.released import AffineScore, MixtureDenoiser, StepNoise
from ..score_sde import ula_step
from ..score_sde_fokker_planck import fokker_planck_ftcs

_ELEMENTARY = ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.neg", "aten.pow", "aten.sqrt", "aten.exp",
               "aten.log", "aten.sum", "aten.mean", "aten.unsqueeze", "aten.view", "aten.expand", "aten.select",
               "aten.slice", "aten.clone", "aten.copy_", "aten._to_copy", "aten.lift_fresh", "aten.scalar_tensor")
_LESSON = ("course_utils.score_sde",)  # lesson modules refused by hand (course_utils.score_sde_* too)
BY_HAND_LANGEVIN_STEP = {"modules": _LESSON, "allowed_ops": _ELEMENTARY, "whole_result_ops": ()}
BY_HAND_VP_DSM_LOSS = {"modules": _LESSON, "allowed_ops": _ELEMENTARY, "whole_result_ops": ("aten.mse_loss",)}
BY_HAND_VE_PROBABILITY_FLOW_DRIFT = {"modules": _LESSON, "allowed_ops": _ELEMENTARY, "whole_result_ops": ()}
BY_HAND_FOKKER_PLANCK_STEP = {"modules": _LESSON,
                              "allowed_ops": ("numpy elementwise arithmetic", "np.pad", "np.concatenate", "slicing"),
                              "whole_result_ops": ()}
# the sampler exercises: no single aten operator computes a sampler, so only the lesson's modules are refused (its
# edm_sigmas and edm_heun_sampler included), with course_utils.grading and diffusers, always refused
BY_HAND_CHURN_STEP = {"modules": _LESSON}
BY_HAND_EDM_STOCHASTIC_SAMPLER = {"modules": _LESSON}


# ---------------------------------------------------------------- exercise 1: a Langevin step (warm-up)
def _reference_langevin_step(x, score_fn, tau, noise):
    return ula_step(x, score_fn(x), tau, noise)


def _langevin_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 30))])), int(rng.choice([1, 2, 3]))
    tau = float(rng.choice([0.01, 0.1, round(float(rng.uniform(0.02, 0.8)), 4)]))
    return (torch.tensor(rng.standard_normal((B, D))), AffineScore(rng, D, False), tau,
            torch.tensor(rng.standard_normal((B, D))))


def check_langevin_step(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: ``fn(x, score_fn, tau, noise) -> x + tau * s(x) + sqrt(2 tau) * noise``."""

    def variant(drift, noise_coef):
        return lambda x, score_fn, tau, noise: x + drift(tau) * score_fn(x) + noise_coef(tau) * noise

    check_function(
        fn, _reference_langevin_step, _langevin_inputs, name="langevin_step", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_LANGEVIN_STEP),
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
                   "course_utils.score_sde.annealed_langevin", "course_utils.score_sde_solvers.snr_langevin_corrector",
                   "course_utils.grading.score_sde._reference_langevin_step"), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 2: DSM for the VP SDE (its marginal derived)
def _vp_log_mean(u, beta_min, beta_max):
    return -0.25 * u**2 * (beta_max - beta_min) - 0.5 * u * beta_min  # -1/2 * integral_0^u beta


def _vp_dsm(score_fn, x0, u, noise, beta_min, beta_max, *, log_m=_vp_log_mean, std=lambda m: (1 - m**2).sqrt(),
            target_sign=-1.0, weight_power=2, reduce="sum"):
    m = log_m(u, beta_min, beta_max).exp().unsqueeze(-1)                 # (B, 1)
    sig = std(m)
    x_u = m * x0 + sig * noise
    err = sig**weight_power * (score_fn(x_u, u) - target_sign * noise / sig) ** 2   # (B, D)
    return err.sum(-1).mean() if reduce == "sum" else err.mean()


def _reference_vp_dsm_loss(score_fn, x0, u, noise, beta_min, beta_max):
    return _vp_dsm(score_fn, x0, u, noise, beta_min, beta_max)


def _vp_dsm_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 60))])), int(rng.choice([2, 3, 5]))
    u = torch.tensor(rng.uniform(0.02, 1.0, B))
    beta_min, beta_max = float(rng.uniform(0.05, 0.5)), float(rng.uniform(5.0, 25.0))
    return (AffineScore(rng, D, True), torch.tensor(rng.standard_normal((B, D)) * 2), u,
            torch.tensor(rng.standard_normal((B, D))), beta_min, beta_max)


def check_vp_dsm_loss(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``fn(score_fn, x0, u, noise, beta_min, beta_max) -> 0-d tensor``, DSM at the VP marginal of eq. (8)."""

    def variant(**kw):
        return lambda *args: _vp_dsm(*args, **kw)

    check_function(
        fn, _reference_vp_dsm_loss, _vp_dsm_inputs, name="vp_dsm_loss", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_VP_DSM_LOSS),
        mistakes=[
            Mistake("no_half", "m(u) = exp(-1/2 * integral of beta); you dropped the 1/2 (that is m(u)^2, the "
                    "variance's factor).", variant(log_m=lambda u, a, b: 2 * _vp_log_mean(u, a, b))),
            Mistake("rectangle", "integrate beta(v) = beta_min + v (beta_max - beta_min) from 0 to u: "
                    "u beta_min + u^2 (beta_max - beta_min) / 2, not u * beta(u).",
                    variant(log_m=lambda u, a, b: -0.5 * u * (a + u * (b - a)))),
            Mistake("var_for_std", "sigma(u) is a standard deviation, sqrt(1 - m^2); you used the variance 1 - m^2.",
                    variant(std=lambda m: 1 - m**2)),
            Mistake("one_minus_m", "sigma(u)^2 = 1 - m(u)^2 (the variance is preserved), not 1 - m(u).",
                    variant(std=lambda m: (1 - m).sqrt())),
            Mistake("score_sign", "sign of the score: the target is -noise / sigma(u), pointing back toward m(u) x0.",
                    variant(target_sign=1.0)),
            Mistake("no_weight", "weight each term by lambda(u) = sigma(u)^2; the loss is then "
                    "mean |sigma s + noise|^2.", variant(weight_power=0)),
            Mistake("mean_coords", "your loss is the right one divided by the dimension: sum the squared error over "
                    "the coordinates (a squared norm) and average over the batch.", variant(reduce="mean")),
        ],
        forbidden=("course_utils.score_sde.dsm_objective", "course_utils.score_sde_solvers.vp_marginal",
                   "course_utils.grading.score_sde._reference_vp_dsm_loss", "course_utils.grading.score_sde._vp_dsm"),
                   quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 3: the VE probability-flow drift (g^2 derived)
def _ve_pf(x, score, u, smin, smax, *, coef=lambda s2, lr: s2 * lr):
    sigma2 = (smin * (smax / smin) ** u) ** 2
    return -coef(sigma2, math.log(smax / smin)) * score


def _reference_ve_probability_flow_drift(x, score, u, sigma_min, sigma_max):
    return _ve_pf(x, score, u, sigma_min, sigma_max)


def _ve_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 40))])), int(rng.choice([1, 2, 3]))
    u = float(rng.choice([1.0, round(float(rng.uniform(0.01, 1.0)), 5)]))
    smin, smax = float(rng.uniform(0.005, 0.1)), float(rng.uniform(3.0, 80.0))
    return (torch.tensor(rng.standard_normal((B, D)) * smax), torch.tensor(rng.standard_normal((B, D))),
            u, smin, smax)


def check_ve_probability_flow_drift(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``fn(x, score, u, sigma_min, sigma_max) -> dx/du`` of the VE probability-flow ODE."""

    def variant(coef):
        return lambda x, score, u, a, b: _ve_pf(x, score, u, a, b, coef=coef)

    check_function(
        fn, _reference_ve_probability_flow_drift, _ve_inputs, name="ve_probability_flow_drift", trials=trials,
        by_hand=ByHand.of(BY_HAND_VE_PROBABILITY_FLOW_DRIFT),
        seed=seed,
        mistakes=[
            Mistake("g2_is_sigma2", "g(u)^2 is the rate d sigma(u)^2 / du = 2 ln(sigma_max/sigma_min) sigma(u)^2, "
                    "not sigma(u)^2 itself.", variant(lambda s2, lr: 0.5 * s2)),
            Mistake("no_half", "that is the reverse SDE's drift -g^2 s; the probability-flow ODE has half of it, "
                    "-1/2 g^2 s.", variant(lambda s2, lr: 2 * s2 * lr)),
            Mistake("dsigma", "g^2 = d(sigma^2)/du = 2 sigma sigma' with sigma' = ln(sigma_max/sigma_min) sigma; you "
                    "differentiated sigma, not sigma^2.", variant(lambda s2, lr: 0.5 * math.sqrt(s2) * lr)),
            Mistake("no_two", "d(sigma^2)/du = 2 ln(sigma_max/sigma_min) sigma^2: the chain rule brings a factor 2.",
                    variant(lambda s2, lr: 0.5 * s2 * lr)),
            Mistake("score_sign", "sign of the score: dx/du = f - 1/2 g^2 s with f = 0, so -1/2 g^2 s.",
                    variant(lambda s2, lr: -s2 * lr)),
        ],
        forbidden=("course_utils.score_sde_solvers.probability_flow_velocity",
                   "course_utils.score_sde_solvers.ve_reverse_step",
                   "course_utils.score_sde_solvers.reverse_sde_euler_maruyama",
                   "course_utils.grading.score_sde._reference_ve_probability_flow_drift",
                   "course_utils.grading.score_sde._ve_pf"), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 4: a finite-difference Fokker-Planck step
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


def check_fokker_planck_step(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: ``fn(p, x, dt, theta, sigma) -> p`` one step later, for dX = -theta X dt + sigma dW."""

    def variant(**kw):
        return lambda p, x, dt, theta, sigma: _fp(p, x, dt, theta, sigma, **kw)

    check_function(
        fn, _reference_fokker_planck_step, _fp_inputs, name="fokker_planck_step", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_FOKKER_PLANCK_STEP),
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
                   "course_utils.grading.score_sde._reference_fokker_planck_step", "course_utils.grading.score_sde._fp"),
                   quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 5: EDM's churn (warm-up for 6)
def _ladder(n, sigma_min, sigma_max, rho):
    """The inputs' noise ladder (EDM's rho-spacing, then 0); the learner receives it, never writes it."""
    ramp = torch.arange(n, dtype=torch.float64) / (n - 1)
    lo, hi = sigma_min ** (1.0 / rho), sigma_max ** (1.0 / rho)
    return torch.cat([(hi + ramp * (lo - hi)) ** rho, torch.zeros(1, dtype=torch.float64)])


def _gamma(sigma, n_steps, s_churn, s_tmin, s_tmax, *, clip=True, per_step=True, in_range=True):
    if in_range and not s_tmin <= sigma <= s_tmax:
        return 0.0
    g = s_churn / n_steps if per_step else s_churn
    return min(g, math.sqrt(2.0) - 1.0) if clip else g


def _churn(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise, *, added=None, use_s_noise=True, **gamma_kw):
    sigma_hat = sigma * (1.0 + _gamma(sigma, n_steps, s_churn, s_tmin, s_tmax, **gamma_kw))
    std = math.sqrt(sigma_hat**2 - sigma**2) if added is None else added(sigma_hat, sigma)   # variances add
    return x + std * (s_noise if use_s_noise else 1.0) * noise, sigma_hat


def _reference_churn_step(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise):
    return _churn(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise)


def _churn_settings(rng):
    """EDM's churn settings, drawn so that the clip at sqrt(2) - 1 binds on some trials and not on others."""
    n_steps = int(rng.integers(4, 60))
    s_churn = float(rng.uniform(0.5, 1.5) * n_steps if rng.random() < 0.5 else rng.uniform(0.05, 0.35) * n_steps)
    s_tmin, s_tmax = float(rng.uniform(0.01, 0.5)), float(rng.uniform(5.0, 50.0))
    return n_steps, s_churn, s_tmin, s_tmax, float(rng.uniform(1.0, 1.01) if rng.random() < 0.5 else rng.uniform(0.5, 1.5))


def _churn_inputs(rng):
    B, D = int(rng.integers(1, 40)), int(rng.choice([1, 2, 3]))
    n_steps, s_churn, s_tmin, s_tmax, s_noise = _churn_settings(rng)
    sigma = float(rng.uniform(s_tmin, s_tmax) if rng.random() < 0.7 else rng.choice([rng.uniform(0.002, s_tmin),
                                                                                     rng.uniform(s_tmax, 80.0)]))
    return (torch.tensor(rng.standard_normal((B, D)) * max(sigma, 1.0)), sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise,
            torch.tensor(rng.standard_normal((B, D))))


def check_churn_step(fn: Callable, *, trials: int = 8, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: ``fn(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise) -> (x_hat, sigma_hat)``."""

    def variant(**kw):
        return lambda x, sigma, n, c, lo, hi, sn, z: _churn(x, sigma, n, c, lo, hi, sn, z, **kw)

    check_function(
        fn, _reference_churn_step, _churn_inputs, name="churn_step", trials=trials, seed=seed,
        mistakes=[
            Mistake("no_sqrt", "no sqrt in the added noise: its standard deviation is sqrt(sigma_hat^2 - sigma^2) "
                    "(variances add), not sigma_hat - sigma.", variant(added=lambda sh, s: sh - s)),
            Mistake("variance", "no sqrt in the added noise: sigma_hat^2 - sigma^2 is the variance to add; scale the "
                    "noise by its square root.", variant(added=lambda sh, s: sh**2 - s**2)),
            Mistake("no_clip", "clip gamma at sqrt(2) - 1 (gamma = min(S_churn / N, sqrt(2) - 1)): beyond that the "
                    "churn adds more noise than the level already holds.", variant(clip=False)),
            Mistake("per_step", "S_churn is the churn of the whole run: each step uses S_churn / N (N = n_steps).",
                    variant(per_step=False)),
            Mistake("range", "churn only where S_tmin <= sigma <= S_tmax; outside that range gamma = 0 and x is "
                    "returned unchanged.", variant(in_range=False)),
            Mistake("s_noise", "scale the fresh noise by S_noise as well: x + sqrt(sigma_hat^2 - sigma^2) * S_noise * "
                    "noise.", variant(use_s_noise=False)),
        ],
        by_hand=ByHand.of(BY_HAND_CHURN_STEP), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 6: EDM's stochastic sampler
def _stochastic(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise, *, churn_after=False, heun_last=False,
                euler=False, from_sigma=False, n_is_levels=False, **churn_kw):
    sig = [float(s) for s in sigmas]
    n = len(sig) if n_is_levels else len(sig) - 1
    for i, (s, s_next) in enumerate(zip(sig[:-1], sig[1:])):
        if churn_after:
            x_hat, s_hat = x, s
        else:
            x_hat, s_hat = _churn(x, s, n, s_churn, s_tmin, s_tmax, s_noise, noise(i), **churn_kw)
            if from_sigma:
                s_hat = s
        d = (x_hat - denoiser(x_hat, s_hat)) / s_hat
        x = x_hat + (s_next - s_hat) * d
        if not euler and (s_next > 0.0 or heun_last):
            d_next = (x - denoiser(x, s_next)) / s_next
            x = x_hat + (s_next - s_hat) * 0.5 * (d + d_next)
        if churn_after and s_next > 0.0:
            x = _churn(x, s_next, n, s_churn, s_tmin, s_tmax, s_noise, noise(i), **churn_kw)[0]
    return x


def _reference_edm_stochastic_sampler(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):
    return _stochastic(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise)


def _sampler_inputs(rng):
    B, D = int(rng.integers(20, 200)), int(rng.choice([1, 2, 3]))
    n = int(rng.choice([int(rng.integers(3, 8)), int(rng.integers(8, 30))]))
    smax = float(rng.uniform(5.0, 80.0))
    sigmas = _ladder(n, float(rng.uniform(0.002, 0.05)), smax, float(rng.uniform(3.0, 9.0)))
    s_churn = float(rng.uniform(0.5, 1.5) * n if rng.random() < 0.5 else rng.uniform(0.05, 0.35) * n)
    # churn on part of the ladder: sigma_0 above S_tmax, sigma_1 inside, the last levels below S_tmin
    s_tmin, s_tmax = float(rng.uniform(0.01, 0.3)), float(rng.uniform(sigmas[1].item(), 0.95 * smax))
    s_noise = float(rng.uniform(1.0, 1.01) if rng.random() < 0.5 else rng.uniform(0.8, 1.2))
    return (MixtureDenoiser(rng, D), torch.tensor(rng.standard_normal((B, D)) * smax), sigmas, s_churn, s_tmin, s_tmax,
            s_noise, StepNoise(torch.tensor(rng.standard_normal((n, B, D)))))


def check_edm_stochastic_sampler(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: ``fn(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise) -> x at sigma = 0``."""

    def variant(**kw):
        return lambda d, x, sig, c, lo, hi, sn, z: _stochastic(d, x, sig, c, lo, hi, sn, z, **kw)

    check_function(
        fn, _reference_edm_stochastic_sampler, _sampler_inputs, name="edm_stochastic_sampler", trials=trials,
        seed=seed,
        mistakes=[
            Mistake("euler", "that is Euler's method: after the Euler step from (x_hat, sigma_hat), evaluate the "
                    "slope at the new point and sigma_{i+1}, and step from x_hat with the average of the two slopes.",
                    variant(euler=True)),
            Mistake("churn_after", "churn first: raise sigma_i to sigma_hat and add the noise before the step, then "
                    "step from (x_hat, sigma_hat) down to sigma_{i+1}; you added it after the step.",
                    variant(churn_after=True)),
            Mistake("no_sqrt", "no sqrt in the added noise: its standard deviation is sqrt(sigma_hat^2 - sigma_i^2) "
                    "(variances add), not sigma_hat - sigma_i.", variant(added=lambda sh, s: sh - s)),
            Mistake("no_clip", "clip gamma at sqrt(2) - 1: gamma_i = min(S_churn / N, sqrt(2) - 1) inside "
                    "[S_tmin, S_tmax].", variant(clip=False)),
            Mistake("heun_last", "the last step goes to sigma = 0, where the slope (x - D) / sigma is undefined: "
                    "take a plain Euler step there.", variant(heun_last=True)),
            Mistake("from_sigma", "after the churn, x_hat sits at noise level sigma_hat: evaluate the denoiser at "
                    "sigma_hat and step over sigma_{i+1} - sigma_hat, not from sigma_i.", variant(from_sigma=True)),
            Mistake("n_levels", "N in S_churn / N is the number of steps, len(sigmas) - 1 (the ladder ends with 0).",
                    variant(n_is_levels=True)),
            Mistake("range", "churn only where S_tmin <= sigma_i <= S_tmax; outside that range gamma_i = 0.",
                    variant(in_range=False)),
            Mistake("s_noise", "scale the fresh noise by S_noise: sqrt(sigma_hat^2 - sigma_i^2) * S_noise * noise(i).",
                    variant(use_s_noise=False)),
        ],
        by_hand=ByHand.of(BY_HAND_EDM_STOCHASTIC_SAMPLER), quiet=quiet,
    )


__all__ = ["check_langevin_step", "check_vp_dsm_loss", "check_ve_probability_flow_drift", "check_fokker_planck_step",
           "check_churn_step", "check_edm_stochastic_sampler"]
