"""Checks of the DDPM/DDIM problem set (``solutions/11_ddpm_ddim.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference built from :mod:`course_utils.diffusion` and names the likely mistake: a variance where a
standard deviation belongs, :math:`\\bar\\alpha_t` where :math:`\\alpha_t` belongs (alone and compounded),
a timestep off by one, a sign, a factor of two. The formulas are derived in ``notebooks/11_ddpm_ddim.ipynb``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..classroom.released import LinearDenoiser
from ..diffusion import cosine_alpha_bar_fn, cosine_schedule, linear_schedule, posterior_mean_variance
from ..diffusion_metrics import _sq_dists, mmd_rbf

# For the by-hand watch (passed as by_hand=ByHand.of(BY_HAND_X); "allowed_ops" only documents):
# per exercise, the elementary ops it needs and the ones
# that compute the whole result (diffusers' helpers are refused by name through ``forbidden=``).
_ELEMENTWISE = ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.pow", "aten.sqrt", "aten.exp", "aten.log",
                "aten.cumprod", "aten.sum", "aten.mean", "aten.index", "aten.unsqueeze", "aten.expand", "aten.view")
_LESSON = ("course_utils.diffusion",)  # lesson modules refused by hand (course_utils.diffusion_* too)
BY_HAND_ZERO_SNR_COSINE_ALPHA_BAR = {"modules": _LESSON,
                                     "allowed_ops": ("numpy elementwise", "np.cumprod"), "whole_result_ops": ()}
BY_HAND_POSTERIOR = {"modules": _LESSON, "allowed_ops": ("numpy elementwise",), "whole_result_ops": ()}
BY_HAND_DDIM_STEP_FROM_X0 = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": ()}
BY_HAND_FROM_V_PREDICTION = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": ()}
BY_HAND_DDPM_LOSS = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": ("aten.mse_loss",)}
BY_HAND_MMD = {"modules": _LESSON,
               "allowed_ops": _ELEMENTWISE + ("aten.diagonal", "aten.mm", "aten.cdist"), "whole_result_ops": ()}

_DIFFUSERS_SCHEDULES = ("diffusers.schedulers.scheduling_ddim.rescale_zero_terminal_snr",
                        "diffusers.schedulers.scheduling_ddpm.rescale_zero_terminal_snr",
                        "diffusers.schedulers.scheduling_ddim.betas_for_alpha_bar",
                        "diffusers.schedulers.scheduling_ddpm.betas_for_alpha_bar")


def _random_alpha_bar(rng: np.random.Generator, T: int) -> np.ndarray:
    kind = rng.integers(2)
    sched = linear_schedule(T, 1e-4 * 1000 / T, 0.02 * 1000 / T) if kind == 0 else cosine_schedule(T)
    return sched.alpha_bar.numpy()


# ---------------------------------------------------------------- exercise 1: a zero-terminal-SNR cosine schedule
def _capped_cosine_alpha_bar(T, s, max_beta, *, square=True, start=1):
    t = np.arange(T, dtype=np.float64)
    f = (lambda u: cosine_alpha_bar_fn(u, s)) if square else (lambda u: np.cos((u + s) / (1 + s) * math.pi / 2))
    betas = np.minimum(1.0 - f((t + start) / T) / f((t + start - 1) / T), max_beta)
    return np.cumprod(1.0 - betas)


def _rescale(alpha_bar, *, on_sqrt=True, keep_first=True):
    r = np.sqrt(alpha_bar) if on_sqrt else alpha_bar.copy()
    first, last = r[0], r[-1]
    r = (r - last) * (first if keep_first else 1.0) / (first - last)
    return r**2 if on_sqrt else r


def _reference_zero_snr_cosine_alpha_bar(T, s, max_beta):
    return _rescale(_capped_cosine_alpha_bar(T, s, max_beta))


def _zero_snr_inputs(rng):
    T = int(rng.choice([2, 3, int(rng.integers(4, 60)), int(rng.integers(60, 400))]))
    return T, float(rng.uniform(0.001, 0.1)), float(rng.choice([0.999, 0.99, 0.9, 0.5]))


def check_zero_snr_cosine_alpha_bar(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: ``fn(T, s, max_beta) -> alpha_bar`` (T,) float64: the capped cosine schedule, rescaled
    (Lin et al., Algorithm 1) so that sqrt(alpha_bar) keeps its first value and ends at exactly 0."""
    ref = _reference_zero_snr_cosine_alpha_bar
    mistakes = [
        Mistake("no_rescale", "that is the capped cosine schedule itself: shift sqrt(alpha_bar) so its last value is 0 "
                "and scale it so its first value is unchanged, then square.",
                lambda T, s, mb: _capped_cosine_alpha_bar(T, s, mb)),
        Mistake("rescaled_alpha_bar", "you shifted and scaled alpha_bar itself; Lin et al. rescale its square root "
                "(the signal's standard deviation), then square the result.",
                lambda T, s, mb: _rescale(_capped_cosine_alpha_bar(T, s, mb), on_sqrt=False)),
        Mistake("no_square", "your values are the square roots of the right ones: f(u) is the cosine SQUARED, "
                "and after rescaling sqrt(alpha_bar), square it to get alpha_bar.",
                lambda T, s, mb: np.sqrt(ref(T, s, mb))),
        Mistake("first_is_one", "your first value is 1: after the shift, scale by sqrt(alpha_bar[0]) / "
                "(sqrt(alpha_bar[0]) - sqrt(alpha_bar[-1])), not by 1 / (...), so that alpha_bar[0] is unchanged.",
                lambda T, s, mb: _rescale(_capped_cosine_alpha_bar(T, s, mb), keep_first=False)),
        Mistake("uncapped", "cap every beta at max_beta before the cumulative product: "
                "betas = min(1 - f((t+1)/T) / f(t/T), max_beta).",
                lambda T, s, mb: _rescale(_capped_cosine_alpha_bar(T, s, 1.0))),
        Mistake("off_by_one", "timestep t has already applied beta_0..beta_t: beta_t = 1 - f((t+1)/T) / f(t/T), "
                "so alpha_bar[0] < 1 before the rescaling (you used f(t/T) / f((t-1)/T)).",
                lambda T, s, mb: _rescale(_capped_cosine_alpha_bar(T, s, mb, start=0))),
        Mistake("cos_not_squared", "f(u) is the cosine SQUARED: cos((u + s) / (1 + s) * pi / 2) ** 2.",
                lambda T, s, mb: _rescale(_capped_cosine_alpha_bar(T, s, mb, square=False))),
        Mistake("betas", "you returned betas; alpha_bar is the cumulative product of (1 - betas), rescaled.",
                lambda T, s, mb: 1.0 - np.concatenate([ref(T, s, mb)[:1], ref(T, s, mb)[1:] / ref(T, s, mb)[:-1]])),
    ]
    check_function(fn, ref, _zero_snr_inputs, name="zero_snr_cosine_alpha_bar", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_ZERO_SNR_COSINE_ALPHA_BAR),
                   mistakes=mistakes,
                   forbidden=(*_DIFFUSERS_SCHEDULES, "course_utils.diffusion.cosine_schedule",
                              "course_utils.diffusion.cosine_alpha_bar_fn",
                              "course_utils.grading.diffusion._reference_zero_snr_cosine_alpha_bar"), quiet=quiet)


# ---------------------------------------------------------------- exercise 2: the one-step posterior
def _reference_posterior(x0, x_t, alpha_bar, t):
    ab_prev = alpha_bar[t - 1] if t > 0 else 1.0
    return posterior_mean_variance(x0, x_t, float(alpha_bar[t]), float(ab_prev))


def _posterior_inputs():
    """Trial 1 draws an interior t, trial 2 the edge t = 1, trial 3 the edge t = T - 1, later trials any t."""
    trial = [0]

    def make(rng):
        T = int(rng.integers(50, 300))
        alpha_bar = _random_alpha_bar(rng, T)
        n = int(rng.integers(1, 9))
        t = [int(rng.integers(2, T - 1)), 1, T - 1][trial[0]] if trial[0] < 3 else int(rng.integers(1, T))
        trial[0] += 1
        return (rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), alpha_bar, t)
    return make


def check_posterior(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``fn(x0, x_t, alpha_bar, t) -> (mean, variance)`` of q(x_{t-1} | x_t, x_0)."""

    def parts(ab, t):
        return float(ab[t]), float(ab[t - 1])

    def std_not_var(x0, x_t, ab, t):
        return _reference_posterior(x0, x_t, ab, t)[0], math.sqrt(_reference_posterior(x0, x_t, ab, t)[1])

    def beta_as_variance(x0, x_t, ab, t):
        return _reference_posterior(x0, x_t, ab, t)[0], 1.0 - ab[t] / ab[t - 1]

    def alpha_bar_on_xt(x0, x_t, ab, t):  # sqrt(alpha_bar_t) on x_t instead of sqrt(alpha_t)
        ab_t, ab_prev = parts(ab, t)
        a_t = ab_t / ab_prev
        mean = (math.sqrt(ab_prev) * (1 - a_t) * x0 + math.sqrt(ab_t) * (1 - ab_prev) * x_t) / (1 - ab_t)
        return mean, (1 - ab_prev) / (1 - ab_t) * (1 - a_t)

    def alpha_bar_everywhere(x0, x_t, ab, t):  # alpha_t -> alpha_bar_t and beta_t -> 1 - alpha_bar_t throughout
        ab_t, ab_prev = parts(ab, t)
        mean = (math.sqrt(ab_prev) * (1 - ab_t) * x0 + math.sqrt(ab_t) * (1 - ab_prev) * x_t) / (1 - ab_t)
        return mean, (1 - ab_prev) / (1 - ab_t) * (1 - ab_t)

    prev_is_t = lambda x0, x_t, ab, t: posterior_mean_variance(x0, x_t, float(ab[t]), float(ab[t]))  # noqa: E731
    one_step_late = lambda x0, x_t, ab, t: posterior_mean_variance(x0, x_t, float(ab[t + 1]), float(ab[t]))  # noqa: E731
    one_step_early = lambda x0, x_t, ab, t: posterior_mean_variance(  # noqa: E731
        x0, x_t, float(ab[t - 1]), float(ab[t - 2]) if t >= 2 else 1.0)
    swapped = lambda x0, x_t, ab, t: _reference_posterior(x_t, x0, ab, t)  # noqa: E731

    check_function(
        fn, _reference_posterior, _posterior_inputs(), name="posterior", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_POSTERIOR),
        mistakes=[
            Mistake("std", "the second result is the standard deviation; return the variance "
                    "(1 - alpha_bar_{t-1}) / (1 - alpha_bar_t) * beta_t, not its square root.", std_not_var),
            Mistake("beta", "the variance you returned is beta_t (DDPM's upper choice); the posterior variance is "
                    "smaller: multiply by (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t).", beta_as_variance),
            Mistake("prev_is_t", "you used alpha_bar[t] where alpha_bar[t-1] belongs: then alpha_t = 1 and beta_t = 0, "
                    "the mean is x_t and the variance 0; the previous step's alpha_bar is alpha_bar[t-1].", prev_is_t),
            Mistake("alpha_bar_everywhere", "you used alpha_bar_t where alpha_t belongs, throughout (beta_t = "
                    "1 - alpha_bar_t and sqrt(alpha_bar_t) on x_t): the one-step alpha_t = alpha_bar_t / alpha_bar_{t-1} "
                    "and beta_t = 1 - alpha_t.", alpha_bar_everywhere),
            Mistake("alpha_bar", "the x_t coefficient uses sqrt(alpha_bar_t); it should be sqrt(alpha_t) with "
                    "alpha_t = alpha_bar_t / alpha_bar_{t-1} (one step, not the whole chain).", alpha_bar_on_xt),
            Mistake("one_step_late", "you used alpha_bar[t+1] and alpha_bar[t]: off by one; the step from t to t-1 "
                    "uses alpha_bar[t] and alpha_bar[t-1].", one_step_late),
            Mistake("one_step_early", "you used alpha_bar[t-1] and alpha_bar[t-2]: off by one; the step from t to t-1 "
                    "uses alpha_bar[t] and alpha_bar[t-1].", one_step_early),
            Mistake("swapped", "the coefficients of x0 and x_t are swapped: x0 gets sqrt(alpha_bar_{t-1}) beta_t "
                    "/ (1 - alpha_bar_t).", swapped),
        ],
        forbidden=("course_utils.diffusion.posterior_mean_variance", "course_utils.diffusion.ddpm_step",
                   "course_utils.grading.diffusion._reference_posterior"), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 3: DDIM from an x0-prediction, from t to any s
def _ddim_x0(x_t, x0, ab_t, ab_s, eta, noise, *, eps_sign=-1.0, sigma_power=1, direction_sigma=True,
             eta_inside=False, beta_of_chain=False, noise_sign=1.0):
    eps = (x_t + eps_sign * math.sqrt(ab_t) * x0) / math.sqrt(1.0 - ab_t)
    jump = (1.0 - ab_t) if beta_of_chain else (1.0 - ab_t / ab_s)
    var = (1.0 - ab_s) / (1.0 - ab_t) * jump
    sigma = math.sqrt(eta * var) if eta_inside else eta * math.sqrt(var)
    direction = math.sqrt(max(1.0 - ab_s - (sigma**2 if direction_sigma else 0.0), 0.0))
    return math.sqrt(ab_s) * x0 + direction * eps + noise_sign * sigma**sigma_power * noise


def _alpha_bars(alpha_bar, t, s):
    return float(alpha_bar[t]), (1.0 if s < 0 else float(alpha_bar[s]))


def _reference_ddim_step_from_x0(x_t, x0_pred, alpha_bar, t, s, eta, noise):
    return _ddim_x0(x_t, x0_pred, *_alpha_bars(alpha_bar, t, s), eta, noise)


def _ddim_x0_inputs():
    """Trial 1 jumps to the data (s = -1) with alpha_bar given only up to index t, trial 2 to s = t - 1,
    trial 3 to an earlier s; later trials draw any of these, with the full schedule."""
    trial = [0]

    def make(rng):
        T = int(rng.integers(50, 300))
        alpha_bar = _random_alpha_bar(rng, T)
        t = int(rng.integers(2, T))
        kind = trial[0] if trial[0] < 3 else int(rng.integers(4))
        s = [-1, t - 1, int(rng.integers(0, t - 1)), -1][kind]  # s = -1: the data
        if trial[0] == 0:
            alpha_bar = alpha_bar[: t + 1]  # the schedule up to t: then alpha_bar[-1] is alpha_bar[t]
        trial[0] += 1
        n = int(rng.integers(1, 9))
        eta = float(rng.choice([0.0, 0.3, 0.5, 1.0, round(float(rng.uniform(0.05, 0.95)), 3)]))
        return (rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), alpha_bar, t, s, eta, rng.standard_normal((n, 2)))
    return make


def check_ddim_step_from_x0(fn: Callable, *, trials: int = 8, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``fn(x_t, x0_pred, alpha_bar, t, s, eta, noise) -> x_s``, one DDIM step from t to any s < t
    (s = -1: the data) for a network that predicts x0."""

    def variant(**kw):
        return lambda x_t, x0, ab, t, s, eta, noise: _ddim_x0(x_t, x0, *_alpha_bars(ab, t, s), eta, noise, **kw)

    def wraps(x_t, x0, ab, t, s, eta, noise):  # alpha_bar[-1] is the last (noisiest) entry, not the data
        return _ddim_x0(x_t, x0, float(ab[t]), float(ab[s]), eta, noise)

    def to_t_minus_1(x_t, x0, ab, t, s, eta, noise):
        return _ddim_x0(x_t, x0, *_alpha_bars(ab, t, t - 1), eta, noise)

    def eps_no_sqrt(x_t, x0, ab, t, s, eta, noise):
        ab_t, ab_s = _alpha_bars(ab, t, s)
        eps = (x_t - ab_t * x0) / (1.0 - ab_t)
        sigma = eta * math.sqrt((1.0 - ab_s) / (1.0 - ab_t) * (1.0 - ab_t / ab_s))
        return math.sqrt(ab_s) * x0 + math.sqrt(max(1.0 - ab_s - sigma**2, 0.0)) * eps + sigma * noise

    check_function(
        fn, _reference_ddim_step_from_x0, _ddim_x0_inputs(), name="ddim_step_from_x0", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_DDIM_STEP_FROM_X0),
        mistakes=[
            Mistake("negative_index", "for s = -1 you read alpha_bar[-1], which in Python is the LAST (noisiest) "
                    "entry; s = -1 means the clean data, alpha_bar_s = 1 (and the step returns x0_pred).", wraps),
            Mistake("to_t_minus_1", "you stepped to t-1; the jump goes from t to s, so use alpha_bar_s "
                    "(alpha_bar[s], or 1 for s = -1).", to_t_minus_1),
            Mistake("eps_sign", "recover the noise from eq. (4): eps = (x_t - sqrt(alpha_bar_t) x0) / "
                    "sqrt(1 - alpha_bar_t); you added sqrt(alpha_bar_t) x0.", variant(eps_sign=1.0)),
            Mistake("eps_no_sqrt", "eps = (x_t - sqrt(alpha_bar_t) x0) / sqrt(1 - alpha_bar_t): the coefficients are "
                    "standard deviations, take the square roots.", eps_no_sqrt),
            Mistake("variance", "the noise is scaled by sigma^2 (a variance); scale it by sigma, the standard deviation.",
                    variant(sigma_power=2)),
            Mistake("direction", "the direction term must shrink when noise is added: use "
                    "sqrt(1 - alpha_bar_s - sigma^2) * eps.", variant(direction_sigma=False)),
            Mistake("eta_sqrt", "eta multiplies the standard deviation, outside the square root: "
                    "sigma = eta * sqrt((1-abar_s)/(1-abar_t) * (1 - abar_t/abar_s)).", variant(eta_inside=True)),
            Mistake("alpha_bar", "sigma uses 1 - alpha_bar_t where it needs 1 - alpha_bar_t / alpha_bar_s "
                    "(the beta of the jump from t to s, not of the whole chain).", variant(beta_of_chain=True)),
            Mistake("sign", "the noise term has the wrong sign: x_s = ... + sigma * noise.", variant(noise_sign=-1.0)),
        ],
        forbidden=("course_utils.diffusion.ddim_step", "course_utils.diffusion.ddim_sigma",
                   "course_utils.diffusion.predict_x0", "diffusers.DDIMScheduler.step",
                   "course_utils.grading.diffusion._reference_ddim_step_from_x0"), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 4: from v-prediction to x0 and eps
def _reference_from_v_prediction(x_t, v, alpha_bar_t):
    a, s = math.sqrt(alpha_bar_t), math.sqrt(1 - alpha_bar_t)
    return a * x_t - s * v, s * x_t + a * v


def _v_inputs(rng):
    n = int(rng.integers(1, 9))
    return rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), float(rng.uniform(0.02, 0.98))


def check_from_v_prediction(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: ``fn(x_t, v, alpha_bar_t) -> (x0, eps)`` for v = sqrt(abar) eps - sqrt(1-abar) x0."""

    def signs(sx, se):  # sx: sign of v in x0; se: sign of v in eps
        def wrong(x_t, v, ab):
            a, s = math.sqrt(ab), math.sqrt(1 - ab)
            return a * x_t + sx * s * v, s * x_t + se * a * v
        return wrong

    swapped_outputs = lambda x_t, v, ab: _reference_from_v_prediction(x_t, v, ab)[::-1]  # noqa: E731
    no_sqrt = lambda x_t, v, ab: (ab * x_t - (1 - ab) * v, (1 - ab) * x_t + ab * v)  # noqa: E731
    swapped_coefs = lambda x_t, v, ab: _reference_from_v_prediction(x_t, v, 1 - ab)  # noqa: E731

    check_function(
        fn, _reference_from_v_prediction, _v_inputs, name="from_v_prediction", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_FROM_V_PREDICTION),
        mistakes=[
            Mistake("order", "return (x0, eps) in that order.", swapped_outputs),
            Mistake("sign_both", "the signs of v are flipped in both: x0 = sqrt(abar) x_t - sqrt(1-abar) v and "
                    "eps = sqrt(1-abar) x_t + sqrt(abar) v.", signs(+1.0, -1.0)),
            Mistake("sign_x0", "your eps is right but x0 has the wrong sign on v: x0 = sqrt(abar) x_t - sqrt(1-abar) v "
                    "(v points from x0 toward eps).", signs(+1.0, +1.0)),
            Mistake("sign_eps", "your x0 is right but eps has the wrong sign on v: eps = sqrt(1-abar) x_t + sqrt(abar) v.",
                    signs(-1.0, -1.0)),
            Mistake("variance", "you used alpha_bar and 1 - alpha_bar (variances) as coefficients; use their square "
                    "roots (standard deviations).", no_sqrt),
            Mistake("coefs", "the coefficients are swapped: x0 takes sqrt(alpha_bar) on x_t, eps takes sqrt(1 - alpha_bar).",
                    swapped_coefs),
        ],
        forbidden=("course_utils.grading.diffusion._reference_from_v_prediction",), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 5: the DDPM training loss
def _reference_ddpm_loss(model, x0, t, noise, betas):
    alpha_bar = torch.cumprod(1 - betas, dim=0)[t].unsqueeze(-1)  # (B, 1)
    x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
    return ((model(x_t, t) - noise) ** 2).mean()


def _loss_inputs():
    """The first trial has a batch of 4-15 with the first and last timesteps drawn; later trials also a batch of 1
    (whose timestep is never 0, where alpha_0 = alpha_bar_0 would hide the alpha-for-alpha_bar mistake)."""
    trial = [0]

    def make(rng):
        T = int(rng.integers(50, 300))
        B = int(rng.integers(4, 16)) if trial[0] == 0 else int(rng.choice([1, int(rng.integers(2, 16))]))
        trial[0] += 1
        betas = linear_schedule(T, 1e-4 * 1000 / T, 0.02 * 1000 / T).betas
        t = rng.integers(1 if B == 1 else 0, T, B)
        if B > 1:
            t[0] = int(rng.choice([0, T - 1, t[0]]))  # the first and last timesteps are drawn too
        return (LinearDenoiser(rng, T), torch.tensor(rng.standard_normal((B, 2))), torch.tensor(t),
                torch.tensor(rng.standard_normal((B, 2))), betas)
    return make


def check_ddpm_loss(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: ``fn(model, x0, t, noise, betas) -> scalar tensor``, the DDPM simple loss."""

    def with_ab(ab_fn, target="noise", reduce="mean", sqrt=True):
        def wrong(model, x0, t, noise, betas):
            ab = ab_fn(betas, t).unsqueeze(-1)
            x_t = (ab.sqrt() * x0 + (1 - ab).sqrt() * noise) if sqrt else (ab * x0 + (1 - ab) * noise)
            err = (model(x_t, t) - (noise if target == "noise" else x0)) ** 2  # (B, 2)
            return {"mean": err.mean(), "sum": err.sum(), "sum_coords": err.sum(-1).mean(), "half": 0.5 * err.mean()}[reduce]
        return wrong

    bar = lambda b, t: torch.cumprod(1 - b, 0)[t]  # noqa: E731
    alpha = lambda b, t: (1 - b)[t]  # noqa: E731
    shifted = lambda b, t: torch.cat([torch.ones(1, dtype=b.dtype), torch.cumprod(1 - b, 0)])[t]  # noqa: E731

    check_function(
        fn, _reference_ddpm_loss, _loss_inputs(), name="ddpm_loss", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_DDPM_LOSS),
        mistakes=[
            Mistake("alpha", "you used alpha_t = 1 - beta_t; x_t needs alpha_bar_t = cumprod(1 - betas)[t].", with_ab(alpha)),
            Mistake("alpha_no_sqrt", "two mistakes: alpha_t = 1 - beta_t where alpha_bar_t = cumprod(1 - betas)[t] "
                    "belongs, and variances where x_t needs standard deviations (square roots).",
                    with_ab(alpha, sqrt=False)),
            Mistake("off_by_one", "off by one timestep: alpha_bar_t includes beta_t itself, "
                    "so alpha_bar = torch.cumprod(1 - betas, 0)[t], with no leading 1.", with_ab(shifted)),
            Mistake("variance", "x_t = sqrt(alpha_bar) x0 + sqrt(1 - alpha_bar) noise: the coefficients are standard "
                    "deviations, so take square roots.", with_ab(bar, sqrt=False)),
            Mistake("target", "the network predicts the noise, so compare its output with `noise`, not with x0.",
                    with_ab(bar, target="x0")),
            Mistake("sum_coords", "your loss is twice the right one: you summed the squared error over the two "
                    "coordinates and averaged over the batch; the loss averages over both (.mean()), 1/(2B) in the formula.",
                    with_ab(bar, reduce="sum_coords")),
            Mistake("half", "your loss is half the right one: the DDPM simple loss has no factor 1/2; "
                    "it is the plain mean of the squared error.", with_ab(bar, reduce="half")),
            Mistake("sum", "average the squared error over the batch and the coordinates (.mean()), do not sum it.",
                    with_ab(bar, reduce="sum")),
        ],
        forbidden=("course_utils.diffusion.q_sample", "diffusers.DDPMScheduler.add_noise",
                   "course_utils.grading.diffusion._reference_ddpm_loss"), quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 6: the unbiased RBF MMD^2
def _mmd_inputs(rng):
    n = int(rng.choice([2, int(rng.integers(3, 60)), int(rng.integers(3, 60))]))
    m = int(rng.choice([2, int(rng.integers(3, 60)), int(rng.integers(3, 60))]))
    shift = float(rng.uniform(0, 1))
    a = torch.tensor(rng.standard_normal((n, 2)))
    b = torch.tensor(rng.standard_normal((m, 2)) + shift)
    return a, b, float(rng.choice([0.3, 0.5, 1.0, round(float(rng.uniform(0.2, 2.0)), 3)]))


def _reference_mmd_unbiased(a, b, sigma):
    return torch.tensor(mmd_rbf(a, b, (sigma,)), dtype=torch.float64)


def check_mmd(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: ``fn(a, b, sigma) -> 0-d tensor``, unbiased MMD^2 with k = exp(-|x-y|^2 / (2 sigma^2))."""

    def kernel(x, y, sigma):
        return torch.exp(-_sq_dists(x, y) / (2 * sigma**2))

    def biased(a, b, sigma):
        return kernel(a, a, sigma).mean() + kernel(b, b, sigma).mean() - 2 * kernel(a, b, sigma).mean()

    no_two = lambda a, b, sigma: _reference_mmd_unbiased(a, b, sigma / math.sqrt(2))  # noqa: E731
    sigma_not_squared = lambda a, b, sigma: _reference_mmd_unbiased(a, b, math.sqrt(sigma))  # noqa: E731

    def diag_wrong_count(a, b, sigma):  # diagonal removed but still divided by n^2
        n, m = a.shape[0], b.shape[0]
        kaa, kbb = kernel(a, a, sigma), kernel(b, b, sigma)
        return (kaa.sum() - n) / n**2 + (kbb.sum() - m) / m**2 - 2 * kernel(a, b, sigma).mean()

    def cross_once(a, b, sigma):
        return _reference_mmd_unbiased(a, b, sigma) + kernel(a, b, sigma).mean()

    check_function(
        fn, _reference_mmd_unbiased, _mmd_inputs, name="mmd", by_hand=ByHand.of(BY_HAND_MMD), trials=trials, seed=seed,
        rtol=1e-8, atol=1e-10,  # MMD^2 is a small difference of sums of up to 3600 kernel values: float64 cancellation
        mistakes=[
            Mistake("biased", "this is the biased estimator: leave the diagonal k(x_i, x_i) out of the within-sample "
                    "means and divide by n(n-1).", biased),
            Mistake("count", "after removing the diagonal there are n(n-1) pairs, not n^2: divide by n(n-1).", diag_wrong_count),
            Mistake("cross_once", "the cross term enters twice: - (2 / nm) sum_ij k(a_i, b_j).", cross_once),
            Mistake("two", "the RBF kernel divides the squared distance by 2 sigma^2, not sigma^2.", no_two),
            Mistake("sigma", "divide by sigma squared (a variance), not by sigma.", sigma_not_squared),
        ],
        forbidden=("course_utils.diffusion_metrics.mmd_rbf", "course_utils.grading.diffusion._reference_mmd_unbiased"),
        quiet=quiet,
    )


__all__ = ["check_zero_snr_cosine_alpha_bar", "check_posterior", "check_ddim_step_from_x0", "check_from_v_prediction",
           "check_ddpm_loss", "check_mmd"]


# ---------------------------------------------------------------- exercise 7: DPM-Solver++(2M)
from .diffusion_sampler import check_dpm_solver_2m  # noqa: E402,F401
