"""Checks of the score/SDE problem set (``solutions/12_score_sde.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference and names the usual mistakes: the sign of the score, a missing :math:`\\sqrt{2\\tau}`, the VP marginal's
integral of :math:`\\beta`, :math:`g^2 = d\\sigma^2/du` for the VE SDE, the Karras noise ladder, and Heun's
second-order correction (EDM's sampler, which lesson 12 only cites). The formulas of the lesson are in
``notebooks/12_score_sde.ipynb``; exercises 2, 3, 5 and 6 ask for what it did not write.

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
BY_HAND_KARRAS_SIGMAS = {"modules": _LESSON,
                         "allowed_ops": _ELEMENTARY + ("aten.linspace", "aten.arange", "aten.cat", "aten.zeros",
                                                       "aten.new_zeros", "aten.flip"), "whole_result_ops": ()}
BY_HAND_EDM_HEUN_SAMPLER = {"modules": _LESSON, "allowed_ops": _ELEMENTARY + ("aten._local_scalar_dense", "aten.item"),
                            "whole_result_ops": ()}

_DIFFUSERS = "diffusers.schedulers."
_KARRAS_SHORTCUTS = (
    _DIFFUSERS + "scheduling_euler_discrete.EulerDiscreteScheduler._convert_to_karras",
    _DIFFUSERS + "scheduling_heun_discrete.HeunDiscreteScheduler._convert_to_karras",
    _DIFFUSERS + "scheduling_edm_euler.EDMEulerScheduler._compute_karras_sigmas",
)


class _AffineScore:
    """A fixed 'score network' s(x, c) = x @ W + b / c (or s(x) = x @ W + b), for checking losses and steps."""

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


# ---------------------------------------------------------------- exercise 1: a Langevin step (warm-up)
def _reference_langevin_step(x, score_fn, tau, noise):
    return ula_step(x, score_fn(x), tau, noise)


def _langevin_inputs(rng):
    B, D = int(rng.choice([1, int(rng.integers(2, 30))])), int(rng.choice([1, 2, 3]))
    tau = float(rng.choice([0.01, 0.1, round(float(rng.uniform(0.02, 0.8)), 4)]))
    return (torch.tensor(rng.standard_normal((B, D))), _AffineScore(rng, D, False), tau,
            torch.tensor(rng.standard_normal((B, D))))


def check_langevin_step(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
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
                   "course_utils.grading.score_sde._reference_langevin_step"),
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
    return (_AffineScore(rng, D, True), torch.tensor(rng.standard_normal((B, D)) * 2), u,
            torch.tensor(rng.standard_normal((B, D))), beta_min, beta_max)


def check_vp_dsm_loss(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
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


def check_ve_probability_flow_drift(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
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
                   "course_utils.grading.score_sde._ve_pf"),
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


def check_fokker_planck_step(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
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
    )


# ---------------------------------------------------------------- exercise 5: the Karras noise ladder (warm-up for 6)
def _karras(n, sigma_min, sigma_max, rho, *, denom=None, inverse=False, zero=True, increasing=False):
    ramp = torch.arange(n, dtype=torch.float64) / ((n - 1) if denom is None else denom(n))
    if inverse:
        lo, hi = sigma_min**rho, sigma_max**rho
        out = (hi + ramp * (lo - hi)) ** (1.0 / rho)
    else:
        lo, hi = sigma_min ** (1.0 / rho), sigma_max ** (1.0 / rho)
        out = (hi + ramp * (lo - hi)) ** rho
    if increasing:
        out = out.flip(0)
    return torch.cat([out, out.new_zeros(1)]) if zero else out


def _reference_karras_sigmas(n, sigma_min, sigma_max, rho):
    return _karras(n, sigma_min, sigma_max, rho)


def _karras_inputs(rng):
    n = int(rng.choice([2, int(rng.integers(3, 40)), int(rng.integers(40, 400))]))
    return n, float(rng.uniform(0.002, 0.1)), float(rng.uniform(5.0, 120.0)), float(rng.choice([7.0, rng.uniform(2.0, 10.0)]))


def check_karras_sigmas(fn: Callable, *, trials: int = 6, seed: int | None = None) -> None:
    """Exercise 5: ``fn(n, sigma_min, sigma_max, rho) -> (n + 1,) float64 tensor``, EDM's ladder with a final 0."""

    def variant(**kw):
        return lambda n, a, b, rho: _karras(n, a, b, rho, **kw)

    check_function(
        fn, _reference_karras_sigmas, _karras_inputs, name="karras_sigmas", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_KARRAS_SIGMAS),
        mistakes=[
            Mistake("no_zero", "append sigma_N = 0 after the n levels: the sampler's last step goes to the data.",
                    variant(zero=False)),
            Mistake("increasing", "the ladder runs from sigma_max down to sigma_min (then 0): sampling starts at "
                    "the largest noise.", variant(increasing=True)),
            Mistake("off_by_one", "the ramp is i / (n - 1) for i = 0..n-1, so that level n-1 is exactly sigma_min.",
                    variant(denom=lambda n: n)),
            Mistake("rho_inverted", "interpolate linearly between sigma^(1/rho), then raise to the power rho "
                    "(you swapped rho and 1/rho).", variant(inverse=True)),
        ],
        forbidden=_KARRAS_SHORTCUTS + ("course_utils.grading.score_sde._reference_karras_sigmas",
                                       "course_utils.grading.score_sde._karras"),
    )


# ---------------------------------------------------------------- exercise 6: EDM's deterministic Heun sampler
class _MixtureDenoiser:
    """The exact denoiser D(x; sigma) = E[x0 | x0 + sigma z = x] of a random isotropic Gaussian mixture.

    Written in NumPy (tiny matrices: torch's intra-op threads only add contention on a loaded machine)."""

    def __init__(self, rng: np.random.Generator, dim: int):
        k = int(rng.integers(2, 6))
        self.log_w = np.log(rng.dirichlet(np.ones(k)))                   # (K,)
        self.means = rng.standard_normal((k, dim)) * 2.0                 # (K, D)
        self.var = rng.uniform(0.05, 0.6, k)                             # (K,) isotropic component variances

    def __call__(self, x, sigma):
        sigma = float(sigma)
        xn = x.detach().cpu().numpy()                                    # (B, D)
        v = self.var + sigma**2                                          # variances of the noised components
        sq = ((xn[:, None, :] - self.means[None]) ** 2).sum(-1)          # (B, K)
        logits = self.log_w - 0.5 * xn.shape[1] * np.log(v) - 0.5 * sq / v
        r = np.exp(logits - logits.max(-1, keepdims=True))
        r /= r.sum(-1, keepdims=True)                                    # responsibilities
        post = (self.var[None, :, None] * xn[:, None, :] + sigma**2 * self.means[None]) / v[None, :, None]
        return torch.from_numpy((r[:, :, None] * post).sum(1)).to(x.dtype)   # sum_k r_k E[x0 | x, k]

    def __repr__(self):
        return "denoiser"


def _heun(denoiser, x, sigmas, *, heun_last=False, slope=lambda x, d, s: (x - d) / s, combine="average",
          corrector_at_x=False, euler=False):
    sig = [float(s) for s in sigmas]
    for s, s_next in zip(sig[:-1], sig[1:]):
        d = slope(x, denoiser(x, s), s)
        x_euler = x + (s_next - s) * d
        if euler or (s_next == 0.0 and not heun_last):
            x = x_euler
            continue
        at = x if corrector_at_x else x_euler
        d_next = slope(at, denoiser(at, s_next), s_next)
        x = x + (s_next - s) * (0.5 * (d + d_next) if combine == "average" else d_next)
    return x


def _reference_edm_heun_sampler(denoiser, x, sigmas):
    return _heun(denoiser, x, sigmas)


def _edm_inputs(rng):
    B, D = int(rng.integers(20, 200)), int(rng.choice([1, 2, 3]))
    n = int(rng.choice([int(rng.integers(2, 8)), int(rng.integers(8, 40))]))
    smax = float(rng.uniform(5.0, 80.0))
    sigmas = _karras(n, float(rng.uniform(0.002, 0.05)), smax, float(rng.uniform(3.0, 9.0)))
    return _MixtureDenoiser(rng, D), torch.tensor(rng.standard_normal((B, D)) * smax), sigmas


def check_edm_heun_sampler(fn: Callable, *, trials: int = 4, seed: int | None = None) -> None:
    """Exercise 6: ``fn(denoiser, x, sigmas) -> x at sigma = 0`` by EDM's Heun steps (Euler on the last one)."""

    def variant(**kw):
        return lambda denoiser, x, sigmas: _heun(denoiser, x, sigmas, **kw)

    check_function(
        fn, _reference_edm_heun_sampler, _edm_inputs, name="edm_heun_sampler", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_EDM_HEUN_SAMPLER),
        mistakes=[
            Mistake("euler", "that is Euler's method: after the Euler step, evaluate the slope again at the new "
                    "point and sigma_{i+1}, and step with the average of the two slopes.", variant(euler=True)),
            Mistake("heun_last", "the last step goes to sigma = 0, where the slope (x - D) / sigma is undefined: "
                    "take a plain Euler step there.", variant(heun_last=True)),
            Mistake("slope_sign", "sign of the slope: dx/dsigma = (x - D(x; sigma)) / sigma; as sigma decreases x "
                    "moves toward the denoised D.", variant(slope=lambda x, d, s: (d - x) / s)),
            Mistake("sigma2", "the slope is (x - D) / sigma, not / sigma^2 (with sigma(t) = t, dx/dt = -t s = "
                    "(x - D) / t).", variant(slope=lambda x, d, s: (x - d) / s**2)),
            Mistake("end_slope", "Heun steps with the average of the two slopes, 0.5 (d_i + d_{i+1}), not the "
                    "second slope alone.", variant(combine="end")),
            Mistake("corrector_at_x", "evaluate the second slope at the Euler prediction x + (sigma_{i+1} - "
                    "sigma_i) d_i, not at the old x.", variant(corrector_at_x=True)),
        ],
        forbidden=(_DIFFUSERS + "scheduling_heun_discrete.HeunDiscreteScheduler.step",
                   _DIFFUSERS + "scheduling_edm_euler.EDMEulerScheduler.step",
                   _DIFFUSERS + "deprecated.scheduling_karras_ve.KarrasVeScheduler.step",
                   _DIFFUSERS + "deprecated.scheduling_karras_ve.KarrasVeScheduler.step_correct",
                   "course_utils.score_sde_solvers.sample_vp", "course_utils.score_sde_solvers.sample_ve_pc",
                   "course_utils.grading.score_sde._reference_edm_heun_sampler", "course_utils.grading.score_sde._heun"),
    )


__all__ = ["check_langevin_step", "check_vp_dsm_loss", "check_ve_probability_flow_drift", "check_fokker_planck_step",
           "check_karras_sigmas", "check_edm_heun_sampler"]
