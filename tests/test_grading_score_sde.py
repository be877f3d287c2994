"""Tests of course_utils.grading.score_sde: each check of the lesson-12 problem set passes the solution and a
right answer written differently, raises NotAttempted on a stub, names every listed mistake with its own hint,
rejects the course's and diffusers' shortcuts as forbidden, and fails a hard-coded answer on fresh inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import score_sde as ss
from course_utils import score_sde_fokker_planck as sfp
from course_utils import score_sde_solvers as sv
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.grading import score_sde as gs
from _grading_helpers import SEED, each_mistake_is_named, fails_with, forbidden, right_answers_pass  # noqa: E402


# ---------------------------------------------------------------- solutions, as in solutions/12, and other right answers
def langevin_solution(x, score_fn, tau, noise):
    return x + tau * score_fn(x) + math.sqrt(2 * tau) * noise


def langevin_other(x, score_fn, tau, noise):
    return x + (2 * tau) ** 0.5 * (noise + (tau / 2) ** 0.5 * score_fn(x))


def vp_dsm_solution(score_fn, x0, u, noise, beta_min, beta_max):
    log_m = -0.25 * u**2 * (beta_max - beta_min) - 0.5 * u * beta_min
    m = log_m.exp()[:, None]
    sig = (1 - m**2).sqrt()
    return ((sig * score_fn(m * x0 + sig * noise, u) + noise) ** 2).sum(-1).mean()


def vp_dsm_other(score_fn, x0, u, noise, beta_min, beta_max):  # the integral by the trapezoid rule (exact: beta is linear)
    integral = u * 0.5 * (beta_min + (beta_min + u * (beta_max - beta_min)))
    alpha_bar = torch.exp(-integral)[:, None]                   # m^2
    std = torch.sqrt(1 - alpha_bar)
    x_u = alpha_bar.sqrt() * x0 + std * noise
    target = -noise / std
    return (std**2 * (score_fn(x_u, u) - target) ** 2).sum() / x0.shape[0]


def ve_solution(x, score, u, sigma_min, sigma_max):
    sigma = sigma_min * (sigma_max / sigma_min) ** u
    return -0.5 * 2 * math.log(sigma_max / sigma_min) * sigma**2 * score


def ve_other(x, score, u, sigma_min, sigma_max):  # sigma^2 = exp(2 (ln smin + u ln(smax/smin)))
    log_ratio = math.log(sigma_max) - math.log(sigma_min)
    return -log_ratio * math.exp(2 * (math.log(sigma_min) + u * log_ratio)) * score + 0 * x


def fp_solution(p, x, dt, theta, sigma):
    dx = x[1] - x[0]
    q = np.concatenate([[0.0], theta * x * p, [0.0]])
    pp = np.concatenate([[0.0], p, [0.0]])
    return p + dt * ((q[2:] - q[:-2]) / (2 * dx) + 0.5 * sigma**2 * (pp[2:] - 2 * p + pp[:-2]) / dx**2)


def fp_other(p, x, dt, theta, sigma):  # product rule: theta p + theta x dp/dx, written as a matrix
    n, dx = len(p), x[1] - x[0]
    first = (np.eye(n, k=1) - np.eye(n, k=-1)) / (2 * dx)
    second = (np.eye(n, k=1) - 2 * np.eye(n) + np.eye(n, k=-1)) / dx**2
    return p + dt * (theta * first @ (x * p) + sigma**2 / 2 * second @ p)


def karras_solution(n, sigma_min, sigma_max, rho):
    ramp = torch.arange(n, dtype=torch.float64) / (n - 1)
    hi, lo = sigma_max ** (1 / rho), sigma_min ** (1 / rho)
    return torch.cat([(hi + ramp * (lo - hi)) ** rho, torch.zeros(1, dtype=torch.float64)])


def karras_other(n, sigma_min, sigma_max, rho):  # a Python loop over the levels, in reverse order then flipped
    levels = [0.0]
    for i in range(n - 1, -1, -1):
        t = i / (n - 1)
        levels.insert(0, ((1 - t) * sigma_max ** (1 / rho) + t * sigma_min ** (1 / rho)) ** rho)
    return torch.tensor(levels, dtype=torch.float64)


def heun_solution(denoiser, x, sigmas):
    levels = sigmas.tolist()
    for s, s_next in zip(levels[:-1], levels[1:]):
        d = (x - denoiser(x, s)) / s
        x_next = x + (s_next - s) * d
        if s_next > 0:
            d_next = (x_next - denoiser(x_next, s_next)) / s_next
            x_next = x + (s_next - s) * 0.5 * (d + d_next)
        x = x_next
    return x


def heun_other(denoiser, x, sigmas):  # the trapezoid rule written on the denoiser (x - D)/sigma, index by index
    n = sigmas.shape[0] - 1
    for i in range(n):
        s0, s1 = sigmas[i].item(), sigmas[i + 1].item()
        d0 = denoiser(x, s0)
        if i == n - 1:
            x = d0 + (s1 / s0) * (x - d0)
        else:
            pred = d0 + (s1 / s0) * (x - d0)
            d1 = denoiser(pred, s1)
            x = x + (s1 - s0) / 2 * ((x - d0) / s0 + (pred - d1) / s1)
    return x


CASES = {
    "langevin": (gs.check_langevin_step, langevin_solution, langevin_other),
    "vp_dsm": (gs.check_vp_dsm_loss, vp_dsm_solution, vp_dsm_other),
    "ve_pf": (gs.check_ve_probability_flow_drift, ve_solution, ve_other),
    "fp": (gs.check_fokker_planck_step, fp_solution, fp_other),
    "karras": (gs.check_karras_sigmas, karras_solution, karras_other),
    "heun": (gs.check_edm_heun_sampler, heun_solution, heun_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=8)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(gs, CASES[key][0], CASES[key][1], monkeypatch, trials=8)


@pytest.mark.parametrize("key", list(CASES))
def test_a_hard_coded_answer_fails_on_fresh_inputs(key):
    frozen = {}

    def hard_coded(*args):
        if "out" not in frozen:
            frozen["out"] = CASES[key][1](*args)
        return frozen["out"]

    with pytest.raises(CheckFailed) as info:
        CASES[key][0](hard_coded, seed=SEED)
    assert not isinstance(info.value, NotAttempted)


def _ve_through_vp_velocity(x, score, u, smin, smax):  # a one-line rearrangement of the course's VP drift
    g2 = 2 * math.log(smax / smin) * (smin * (smax / smin) ** u) ** 2
    return sv.probability_flow_velocity(torch.zeros_like(x), score, 0.0, g2, g2)


def _dsm_through_course(score_fn, x0, u, noise, bmin, bmax):
    m, sig = sv.vp_marginal(u, bmin, bmax)
    return ((sig[:, None] * score_fn(m[:, None] * x0 + sig[:, None] * noise, u) + noise) ** 2).sum(-1).mean()


def _karras_via_diffusers(n, smin, smax, rho):
    from diffusers import EulerDiscreteScheduler

    sched = EulerDiscreteScheduler(use_karras_sigmas=True)
    sched.config.sigma_min, sched.config.sigma_max = smin, smax
    out = sched._convert_to_karras(torch.tensor([smax, smin], dtype=torch.float64), n)
    return torch.cat([torch.as_tensor(out, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])


def _heun_via_diffusers(denoiser, x, sigmas):
    from diffusers.schedulers.deprecated.scheduling_karras_ve import KarrasVeScheduler

    sched = KarrasVeScheduler()
    for s, s_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
        model_output = (denoiser(x, s) - x) / s                          # in KarrasVe's convention D = x + sigma * out
        x = sched.step(model_output, s, s_next, x).prev_sample
    return x


SHORTCUTS = {
    "langevin": (lambda x, score_fn, tau, noise: ss.ula_step(x, score_fn(x), tau, noise), "ula_step"),
    "vp_dsm": (_dsm_through_course, "vp_marginal"),
    "ve_pf": (_ve_through_vp_velocity, "probability_flow_velocity"),
    "fp": (sfp.fokker_planck_ftcs, "fokker_planck_ftcs"),
    "karras": (gs._reference_karras_sigmas, "_reference_karras_sigmas"),
    "heun": (gs._reference_edm_heun_sampler, "_reference_edm_heun_sampler"),
}


@pytest.mark.parametrize("key", list(SHORTCUTS))
def test_the_shortcut_is_forbidden(key):
    fn, fragment = SHORTCUTS[key]
    forbidden(CASES[key][0], fn, fragment)


def test_the_private_helpers_behind_the_references_are_forbidden():
    forbidden(gs.check_karras_sigmas, lambda n, a, b, rho: gs._karras(n, a, b, rho), "_karras")
    forbidden(gs.check_edm_heun_sampler, lambda d, x, s: gs._heun(d, x, s), "_heun")
    forbidden(gs.check_vp_dsm_loss, lambda *a: gs._vp_dsm(*a), "_vp_dsm")
    forbidden(gs.check_ve_probability_flow_drift, lambda *a: gs._ve_pf(*a), "_ve_pf")


def test_diffusers_karras_ladder_is_forbidden():
    forbidden(gs.check_karras_sigmas, _karras_via_diffusers, "diffusers")


def test_diffusers_karras_ve_step_is_forbidden_in_the_heun_exercise():
    forbidden(gs.check_edm_heun_sampler, _heun_via_diffusers, "KarrasVeScheduler")


def test_the_usual_mistakes_are_named():
    fails_with(gs.check_langevin_step, lambda x, s, tau, z: x + tau * s(x) + math.sqrt(tau) * z, "missing sqrt(2 tau)")
    fails_with(gs.check_ve_probability_flow_drift,
               lambda x, s, u, a, b: -math.log(b / a) * (a * (b / a) ** u) ** 2 * s * 2, "reverse SDE's drift")

    def euler(denoiser, x, sigmas):
        for s, s_next in zip(sigmas[:-1].tolist(), sigmas[1:].tolist()):
            x = x + (s_next - s) * (x - denoiser(x, s)) / s
        return x

    fails_with(gs.check_edm_heun_sampler, euler, "Euler's method")


def test_the_mixture_denoiser_is_tweedie_on_the_lessons_mixture():
    rng = np.random.default_rng(0)
    den, x, _ = gs._edm_inputs(rng)
    mix = ss.DiagMixture.of(np.exp(den.log_w), den.means, np.repeat(den.var[:, None], den.means.shape[1], 1))
    for sigma in (0.01, 1.0, 30.0):
        torch.testing.assert_close(den(x, sigma), x + sigma**2 * mix.ve_noised(sigma).score(x))


def test_the_heun_check_needs_enough_levels_that_euler_differs_visibly():
    """Every trial of the sampler check has at least 2 levels and a batch of 20 or more points."""
    for seed in range(20):
        den, x, sigmas = gs._edm_inputs(np.random.default_rng(seed))
        assert sigmas.shape[0] >= 3 and x.shape[0] >= 20 and sigmas[-1] == 0


# ---------------------------------------------------------------- BY_HAND_* wired: the operator-level watch
def test_vp_dsm_mse_loss_under_an_alias_is_refused_and_the_right_answer_passes():
    from torch.nn.functional import mse_loss as squared_error  # another name: the watch sees aten::mse_loss anyway

    def via_mse_loss(score_fn, x0, u, noise, beta_min, beta_max):
        m = (-0.25 * u**2 * (beta_max - beta_min) - 0.5 * u * beta_min).exp()[:, None]
        sig = (1 - m**2).sqrt()
        return squared_error(sig * score_fn(m * x0 + sig * noise, u), -noise, reduction="sum") / x0.shape[0]

    forbidden(gs.check_vp_dsm_loss, via_mse_loss, "aten::mse_loss")
    gs.check_vp_dsm_loss(vp_dsm_solution, seed=SEED, trials=2)

