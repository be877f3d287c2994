"""Tests of course_utils.grading.diffusion: each check of the lesson-11 problem set passes the solution and
a right answer written differently, raises NotAttempted on a stub, names every listed mistake with its own
hint, rejects the course's and diffusers' shortcuts as forbidden, and a hard-coded answer on fresh inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import diffusion as dm
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.diffusion_metrics import mmd_rbf
from course_utils.grading import diffusion as gd
from _grading_helpers import fails_with  # noqa: E402
from _grading_helpers import each_mistake_is_named, right_answers_pass  # noqa: E402


# ---------------------------------------------------------------- solutions, as in solutions/11, and other right answers
def zero_snr_solution(T, s, max_beta):
    f = lambda u: np.cos((u + s) / (1 + s) * np.pi / 2) ** 2  # noqa: E731
    t = np.arange(T, dtype=np.float64)
    betas = np.minimum(1 - f((t + 1) / T) / f(t / T), max_beta)
    root = np.sqrt(np.cumprod(1 - betas))
    root = (root - root[-1]) * root[0] / (root[0] - root[-1])
    return root**2


def zero_snr_other(T, s, max_beta):
    alpha_bar, kept = np.empty(T), 1.0
    for t in range(T):
        ratio = math.cos(((t + 1) / T + s) / (1 + s) * math.pi / 2) ** 2 / math.cos((t / T + s) / (1 + s) * math.pi / 2) ** 2
        kept *= 1 - min(1 - ratio, max_beta)
        alpha_bar[t] = kept
    first, last = math.sqrt(alpha_bar[0]), math.sqrt(alpha_bar[-1])
    return (first * (np.sqrt(alpha_bar) - last) / (first - last)) ** 2


def posterior_solution(x0, x_t, alpha_bar, t):
    ab_t, ab_prev = float(alpha_bar[t]), float(alpha_bar[t - 1])
    alpha_t = ab_t / ab_prev
    mean = (math.sqrt(ab_prev) * (1 - alpha_t) * x0 + math.sqrt(alpha_t) * (1 - ab_prev) * x_t) / (1 - ab_t)
    return mean, (1 - ab_prev) / (1 - ab_t) * (1 - alpha_t)


def posterior_other(x0, x_t, alpha_bar, t):  # condition the joint Gaussian of (x_{t-1}, x_t) given x0
    ab_t, ab_prev = alpha_bar[t], alpha_bar[t - 1]
    cov = math.sqrt(ab_t / ab_prev) * (1 - ab_prev)
    mean = math.sqrt(ab_prev) * x0 + cov / (1 - ab_t) * (x_t - math.sqrt(ab_t) * x0)
    return mean, float((1 - ab_prev) - cov**2 / (1 - ab_t))


def ddim_x0_solution(x_t, x0_pred, alpha_bar, t, s, eta, noise):
    ab_t = float(alpha_bar[t])
    ab_s = float(alpha_bar[s]) if s >= 0 else 1.0
    eps = (x_t - math.sqrt(ab_t) * x0_pred) / math.sqrt(1 - ab_t)
    sigma = eta * math.sqrt((1 - ab_s) / (1 - ab_t) * (1 - ab_t / ab_s))
    return math.sqrt(ab_s) * x0_pred + math.sqrt(1 - ab_s - sigma**2) * eps + sigma * noise


def ddim_x0_other(x_t, x0_pred, alpha_bar, t, s, eta, noise):
    ab = np.concatenate([[1.0], alpha_bar])  # index shifted by one: ab[s + 1] is alpha_bar_s, s = -1 included
    a_t, a_s = ab[t + 1], ab[s + 1]
    var = eta**2 * (1 - a_s) / (1 - a_t) * (1 - a_t / a_s)
    eps = (x_t - a_t**0.5 * x0_pred) / (1 - a_t) ** 0.5
    return a_s**0.5 * x0_pred + (1 - a_s - var) ** 0.5 * eps + var**0.5 * noise


def from_v_solution(x_t, v, alpha_bar_t):
    a, s = math.sqrt(alpha_bar_t), math.sqrt(1 - alpha_bar_t)
    return a * x_t - s * v, s * x_t + a * v


def from_v_other(x_t, v, alpha_bar_t):
    phi = math.acos(math.sqrt(alpha_bar_t))  # a rotation by -phi undoes (x0, eps) -> (x_t, v)
    return math.cos(phi) * x_t - math.sin(phi) * v, math.sin(phi) * x_t + math.cos(phi) * v


def ddpm_loss_solution(model, x0, t, noise, betas):
    alpha_bar = torch.cumprod(1 - betas, dim=0)[t].unsqueeze(-1)
    x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
    return ((model(x_t, t) - noise) ** 2).mean()


def ddpm_loss_other(model, x0, t, noise, betas):
    log_ab = torch.cumsum(torch.log1p(-betas), dim=0)[t][:, None]
    x_t = torch.exp(0.5 * log_ab) * x0 + torch.sqrt(-torch.expm1(log_ab)) * noise
    return torch.square(model(x_t, t) - noise).mean()  # F.mse_loss is refused (aten::mse_loss)


def mmd_solution(a, b, sigma):
    def k(x, y):
        return torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / (2 * sigma**2))
    n, m = a.shape[0], b.shape[0]
    kaa, kbb = k(a, a), k(b, b)
    return (kaa.sum() - kaa.diagonal().sum()) / (n * (n - 1)) + (kbb.sum() - kbb.diagonal().sum()) / (m * (m - 1)) \
        - 2 * k(a, b).mean()


def mmd_other(a, b, sigma):
    def k(x, y):
        return torch.exp(-torch.cdist(x, y) ** 2 / (2 * sigma**2))
    n, m = len(a), len(b)
    off = lambda K: K.masked_fill(torch.eye(len(K), dtype=torch.bool), 0).sum()  # noqa: E731
    return off(k(a, a)) / (n * (n - 1)) + off(k(b, b)) / (m * (m - 1)) - 2 * k(a, b).sum() / (n * m)


CASES = {
    "zero_snr": (gd.check_zero_snr_cosine_alpha_bar, zero_snr_solution, zero_snr_other),
    "posterior": (gd.check_posterior, posterior_solution, posterior_other),
    "ddim_x0": (gd.check_ddim_step_from_x0, ddim_x0_solution, ddim_x0_other),
    "from_v": (gd.check_from_v_prediction, from_v_solution, from_v_other),
    "ddpm_loss": (gd.check_ddpm_loss, ddpm_loss_solution, ddpm_loss_other),
    "mmd": (gd.check_mmd, mmd_solution, mmd_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=10)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(gd, CASES[key][0], CASES[key][1], monkeypatch, trials=12, hints=SHARED_HINTS)


# Mistakes whose answers coincide with another's on most inputs: both hints name the cause.
SHARED_HINTS = {"cos_not_squared": "cosine SQUARED"}


@pytest.mark.parametrize("key", list(CASES))
def test_a_hard_coded_answer_fails_on_fresh_inputs(key):
    frozen = {}

    def hard_coded(*args):  # the answer to the first input it saw, returned forever after
        if "out" not in frozen:
            frozen["out"] = CASES[key][1](*args)
        return frozen["out"]

    with pytest.raises(CheckFailed) as info:
        CASES[key][0](hard_coded)
    assert not isinstance(info.value, NotAttempted)


def _diffusers_zero_snr(T, s, max_beta):
    from diffusers.schedulers.scheduling_ddim import rescale_zero_terminal_snr

    t = np.arange(T)
    f = lambda u: np.cos((u + s) / (1 + s) * np.pi / 2) ** 2  # noqa: E731
    betas = torch.tensor(np.minimum(1 - f((t + 1) / T) / f(t / T), max_beta))
    return torch.cumprod(1 - rescale_zero_terminal_snr(betas), 0).numpy()


def _course_ddim(x_t, x0_pred, alpha_bar, t, s, eta, noise):
    sched = dm.Schedule.from_betas(1 - np.concatenate([alpha_bar[:1], alpha_bar[1:] / alpha_bar[:-1]]))
    ab_t = float(alpha_bar[t])
    eps = (x_t - math.sqrt(ab_t) * x0_pred) / math.sqrt(1 - ab_t)
    return dm.ddim_step(sched, eps, t, s, x_t, eta, noise)


SHORTCUTS = {
    "zero_snr": (_diffusers_zero_snr, "rescale_zero_terminal_snr"),
    "posterior": (lambda x0, x_t, ab, t: dm.posterior_mean_variance(x0, x_t, float(ab[t]), float(ab[t - 1])),
                  "posterior_mean_variance"),
    "ddim_x0": (_course_ddim, "ddim_step"),
    "from_v": (gd._reference_from_v_prediction, "_reference_from_v_prediction"),
    "ddpm_loss": (lambda model, x0, t, noise, betas: ((model(dm.q_sample(dm.Schedule.from_betas(betas), x0, t, noise), t)
                                                        - noise) ** 2).mean(), "Schedule.from_betas"),
    "mmd": (lambda a, b, sigma: torch.tensor(mmd_rbf(a, b, (sigma,)), dtype=torch.float64), "mmd_rbf"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_the_shortcut_is_forbidden(key):
    fn, fragment = SHORTCUTS[key]
    fails_with(CASES[key][0], fn, fragment)


def test_zero_snr_names_the_wrong_rescaling():
    def rescale_alpha_bar(T, s, max_beta):
        f = lambda u: np.cos((u + s) / (1 + s) * np.pi / 2) ** 2  # noqa: E731
        t = np.arange(T)
        ab = np.cumprod(1 - np.minimum(1 - f((t + 1) / T) / f(t / T), max_beta))
        return (ab - ab[-1]) * ab[0] / (ab[0] - ab[-1])

    fails_with(gd.check_zero_snr_cosine_alpha_bar, rescale_alpha_bar, "rescale its square root")


def test_ddim_names_the_negative_index_and_the_posterior_the_compound_alpha_bar():
    def negative_index(x_t, x0_pred, alpha_bar, t, s, eta, noise):
        ab_t, ab_s = float(alpha_bar[t]), float(alpha_bar[s])
        eps = (x_t - math.sqrt(ab_t) * x0_pred) / math.sqrt(1 - ab_t)
        sigma = eta * math.sqrt((1 - ab_s) / (1 - ab_t) * (1 - ab_t / ab_s))
        return math.sqrt(ab_s) * x0_pred + math.sqrt(1 - ab_s - sigma**2) * eps + sigma * noise

    fails_with(gd.check_ddim_step_from_x0, negative_index, "LAST (noisiest)")

    def alpha_bar_everywhere(x0, x_t, alpha_bar, t):
        ab_t, ab_prev = float(alpha_bar[t]), float(alpha_bar[t - 1])
        beta_t = 1 - ab_t
        mean = (math.sqrt(ab_prev) * beta_t * x0 + math.sqrt(ab_t) * (1 - ab_prev) * x_t) / (1 - ab_t)
        return mean, (1 - ab_prev) / (1 - ab_t) * beta_t

    fails_with(gd.check_posterior, alpha_bar_everywhere, "throughout")


def test_ddpm_loss_names_the_factors_of_two_and_v_the_single_sign_errors():
    def per_point_sum(model, x0, t, noise, betas):
        ab = torch.cumprod(1 - betas, 0)[t].unsqueeze(-1)
        return ((model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t) - noise) ** 2).sum(-1).mean()

    fails_with(gd.check_ddpm_loss, per_point_sum, "twice the right one")
    fails_with(gd.check_ddpm_loss, lambda *a: 0.5 * ddpm_loss_solution(*a), "half the right one")
    fails_with(gd.check_from_v_prediction, lambda x_t, v, ab: (math.sqrt(ab) * x_t + math.sqrt(1 - ab) * v,
                                                               math.sqrt(1 - ab) * x_t + math.sqrt(ab) * v), "x0 has the wrong sign")


# ---------------------------------------------------------------- exercise 7: DPM-Solver++(2M)
from course_utils.checks import ForbiddenCall  # noqa: E402
from course_utils.grading import diffusion_sampler as gds  # noqa: E402
from _grading_helpers import SEED, fails, forbidden  # noqa: E402


def dpm_solution(eps_model, x, alpha_bar, timesteps):
    alpha = lambda t: math.sqrt(alpha_bar[t])  # noqa: E731
    sigma = lambda t: math.sqrt(1 - alpha_bar[t])  # noqa: E731
    lam = lambda t: math.log(alpha(t) / sigma(t))  # noqa: E731
    x0_prev = h_prev = None
    for i, t in enumerate(timesteps):
        x0 = (x - sigma(t) * eps_model(x, t)) / alpha(t)
        if i == len(timesteps) - 1:
            return x0
        t_next = timesteps[i + 1]
        h = lam(t_next) - lam(t)
        d = x0 if x0_prev is None else (1 + h / (2 * h_prev)) * x0 - h / (2 * h_prev) * x0_prev
        x = sigma(t_next) / sigma(t) * x - alpha(t_next) * math.expm1(-h) * d
        x0_prev, h_prev = x0, h


def dpm_other(eps_model, x, alpha_bar, timesteps):
    """Written with the log-SNR and noise-form coefficients: alpha_next (1 - e^{-h}) = alpha_next - sigma_next alpha / sigma."""
    ab = np.asarray(alpha_bar, dtype=np.float64)
    preds, lams = [], []
    for i, t in enumerate(timesteps):
        a, s = ab[t] ** 0.5, (1 - ab[t]) ** 0.5
        preds.append((x - s * eps_model(x, t)) / a)
        lams.append(0.5 * math.log(ab[t] / (1 - ab[t])))
        if i + 1 == len(timesteps):
            break
        nxt = timesteps[i + 1]
        a_n, s_n = ab[nxt] ** 0.5, (1 - ab[nxt]) ** 0.5
        lam_n = 0.5 * math.log(ab[nxt] / (1 - ab[nxt]))
        if i == 0:
            d = preds[-1]
        else:
            half_ratio = 0.5 * (lam_n - lams[-1]) / (lams[-1] - lams[-2])
            d = preds[-1] + half_ratio * (preds[-1] - preds[-2])
        x = (s_n / s) * x + (a_n - s_n * a / s) * d
    return preds[-1]


def test_dpm_right_answers_pass_and_the_stub_is_not_attempted(capsys):
    right_answers_pass(gd.check_dpm_solver_2m, dpm_solution, dpm_other, capsys, trials=8)


def test_dpm_every_listed_mistake_is_named(monkeypatch):
    each_mistake_is_named(gds, gd.check_dpm_solver_2m, dpm_solution, monkeypatch, trials=6)


def test_dpm_a_hard_coded_answer_fails():
    table = {}

    def hard_coded(*args):
        table.setdefault("out", dpm_solution(*args))
        return table["out"]

    fails(gd.check_dpm_solver_2m, hard_coded, "dpm_solver_2m")


def test_dpm_ddim_is_named_first_order():
    def ddim(eps_model, x, alpha_bar, timesteps):
        for t, t_next in zip(timesteps[:-1], timesteps[1:]):
            eps = eps_model(x, t)
            x0 = (x - math.sqrt(1 - alpha_bar[t]) * eps) / math.sqrt(alpha_bar[t])
            x = math.sqrt(alpha_bar[t_next]) * x0 + math.sqrt(1 - alpha_bar[t_next]) * eps
        t = timesteps[-1]
        return (x - math.sqrt(1 - alpha_bar[t]) * eps_model(x, t)) / math.sqrt(alpha_bar[t])

    fails(gd.check_dpm_solver_2m, ddim, "that is DDIM")


def _dpm_via_diffusers(eps_model, x, alpha_bar, timesteps):
    from diffusers import DPMSolverMultistepScheduler

    ab = np.asarray(alpha_bar, dtype=np.float64)
    betas = 1 - ab / np.concatenate([[1.0], ab[:-1]])
    sched = DPMSolverMultistepScheduler(num_train_timesteps=len(ab), trained_betas=betas.tolist(),
                                        algorithm_type="dpmsolver++", solver_order=2, final_sigmas_type="zero")
    sched.set_timesteps(timesteps=list(timesteps))
    for t in sched.timesteps:
        x = sched.step(eps_model(x, int(t)), t, x).prev_sample
    return x


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_dpm_shortcuts_are_forbidden():
    forbidden(gd.check_dpm_solver_2m, _dpm_via_diffusers, "diffusers")
    with pytest.raises(ForbiddenCall):
        gd.check_dpm_solver_2m(lambda *a: gds._reference_dpm_solver_2m(*a), seed=SEED, trials=2)
    with pytest.raises(ForbiddenCall):
        gd.check_dpm_solver_2m(lambda *a: gds._dpm2m(*a), seed=SEED, trials=2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_dpm_reference_agrees_with_diffusers_to_its_float32_schedule():
    for seed in range(3):
        model, x, ab, ts = gds._dpm_inputs(np.random.default_rng(seed))
        want = gds._reference_dpm_solver_2m(model, x, ab, ts)
        got = _dpm_via_diffusers(model, x, ab, ts)
        assert ((got - want).abs() / (1 + want.abs())).max().item() < 2e-3


# ---------------------------------------------------------------- BY_HAND_* wired: the operator-level watch
def test_ddpm_loss_mse_through_a_module_is_refused_and_the_right_answer_passes():
    def via_module(model, x0, t, noise, betas):
        alpha_bar = torch.cumprod(1 - betas, dim=0)[t].unsqueeze(-1)
        x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
        return torch.nn.MSELoss()(model(x_t, t), noise)  # nn.MSELoss reaches aten::mse_loss

    forbidden(gd.check_ddpm_loss, via_module, "aten::mse_loss")
    gd.check_ddpm_loss(ddpm_loss_solution, seed=SEED, trials=2)


def test_from_v_prediction_refuses_the_lesson_module_after_a_rearrangement():
    x0_from_eps = getattr(dm, "predict_" + "x0")  # reached by name lookup: the watch tests the callee's module

    def via_lesson(*args):
        x0_from_eps(torch.zeros(1), torch.zeros(1), 0.5)
        return from_v_solution(*args)

    forbidden(gd.check_from_v_prediction, via_lesson, "course_utils.diffusion.predict_x0")
