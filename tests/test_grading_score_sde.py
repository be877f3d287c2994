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
from _grading_helpers import (SEED, each_mistake_is_named, fails, fails_with, forbidden, passes, pasted,  # noqa: E402
                              quiet_passes, right_answers_pass)


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


def churn_solution(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise):
    gamma = min(s_churn / n_steps, math.sqrt(2) - 1) if s_tmin <= sigma <= s_tmax else 0.0
    sigma_hat = sigma * (1 + gamma)
    return x + math.sqrt(sigma_hat**2 - sigma**2) * s_noise * noise, sigma_hat


def churn_other(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise):  # sqrt(gamma (2 + gamma)) sigma, tensors
    g = torch.tensor(s_churn / n_steps, dtype=torch.float64).clamp(max=2**0.5 - 1) * float(s_tmin <= sigma <= s_tmax)
    return x + s_noise * sigma * torch.sqrt(g * (2 + g)) * noise, float(sigma + g * sigma)


def sampler_solution(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):
    levels = sigmas.tolist()
    n = len(levels) - 1
    for i in range(n):
        x_hat, s_hat = churn_solution(x, levels[i], n, s_churn, s_tmin, s_tmax, s_noise, noise(i))
        d = (x_hat - denoiser(x_hat, s_hat)) / s_hat
        x = x_hat + (levels[i + 1] - s_hat) * d
        if levels[i + 1] > 0:
            d_next = (x - denoiser(x, levels[i + 1])) / levels[i + 1]
            x = x_hat + (levels[i + 1] - s_hat) * 0.5 * (d + d_next)
    return x


def sampler_other(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):  # on the denoiser, trapezoid form
    n = sigmas.shape[0] - 1
    gamma_max = min(s_churn / n, math.sqrt(2) - 1)
    for i in range(n):
        s, s1 = sigmas[i].item(), sigmas[i + 1].item()
        gamma = gamma_max if s_tmin <= s <= s_tmax else 0.0
        s_hat = s + gamma * s
        x = x + s_noise * math.sqrt(s_hat * s_hat - s * s) * noise(i)
        d0 = denoiser(x, s_hat)
        pred = d0 + (s1 / s_hat) * (x - d0)
        if i < n - 1:
            d1 = denoiser(pred, s1)
            pred = x + (s1 - s_hat) / 2 * ((x - d0) / s_hat + (pred - d1) / s1)
        x = pred
    return x


CASES = {
    "langevin": (gs.check_langevin_step, langevin_solution, langevin_other),
    "vp_dsm": (gs.check_vp_dsm_loss, vp_dsm_solution, vp_dsm_other),
    "ve_pf": (gs.check_ve_probability_flow_drift, ve_solution, ve_other),
    "fp": (gs.check_fokker_planck_step, fp_solution, fp_other),
    "churn": (gs.check_churn_step, churn_solution, churn_other),
    "sampler": (gs.check_edm_stochastic_sampler, sampler_solution, sampler_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=8)


@pytest.mark.parametrize("key", list(CASES))
def test_quiet_prints_nothing_on_a_right_answer(key):
    quiet_passes(CASES[key][0], CASES[key][1], seed=SEED)


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


def _sampler_via_lessons_heun(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):
    """The lesson's deterministic sampler called in place of the stochastic one (it draws its own start)."""
    from course_utils import score_sde_edm as edm

    out, _ = edm.edm_heun_sampler(lambda y, s: denoiser(y.double(), s), x.shape[0], sigmas.shape[0] - 1,
                                  sigma_min=sigmas[-2].item(), sigma_max=sigmas[0].item(), dim=x.shape[1])
    return out


def _churn_via_edm_sigmas(x, sigma, n_steps, s_churn, s_tmin, s_tmax, s_noise, noise):
    from course_utils import score_sde_edm as edm

    gamma = min(s_churn / n_steps, math.sqrt(2) - 1) if s_tmin <= sigma <= s_tmax else 0.0
    sigma_hat = edm.edm_sigmas(2, sigma, sigma * (1 + gamma))[0].item()
    return x + math.sqrt(sigma_hat**2 - sigma**2) * s_noise * noise, sigma_hat


def _sampler_via_diffusers(scheduler_class):
    """A learner's sampler handing each step to a diffusers scheduler built beforehand (outside the watch)."""
    import warnings

    with warnings.catch_warnings():                                      # diffusers' own NumPy-2 deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)
        sched = scheduler_class(use_karras_sigmas=True)

    def fn(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):
        sched.sigmas = torch.cat([sigmas, sigmas.new_zeros(1)]).float()
        sched.timesteps = torch.arange(sigmas.shape[0] - 1, dtype=torch.float32)
        for i, t in enumerate(sched.timesteps):
            x = sched.step((x - denoiser(x, sigmas[i].item())) / sigmas[i].item(), t, x).prev_sample
        return x

    return fn


SHORTCUTS = {
    "langevin": (lambda x, score_fn, tau, noise: ss.ula_step(x, score_fn(x), tau, noise), "ula_step"),
    "vp_dsm": (_dsm_through_course, "vp_marginal"),
    "ve_pf": (_ve_through_vp_velocity, "probability_flow_velocity"),
    "fp": (sfp.fokker_planck_ftcs, "fokker_planck_ftcs"),
    "churn": (lambda *a: gs._reference_churn_step(*a), "_reference_churn_step"),
    "sampler": (lambda *a: gs._reference_edm_stochastic_sampler(*a), "_reference_edm_stochastic_sampler"),
}


@pytest.mark.parametrize("key", list(SHORTCUTS))
def test_the_shortcut_is_forbidden(key):
    fn, fragment = SHORTCUTS[key]
    forbidden(CASES[key][0], fn, fragment)


def test_the_private_helpers_behind_the_references_are_forbidden():
    forbidden(gs.check_churn_step, lambda *a: gs._churn(*a), "_churn")
    forbidden(gs.check_edm_stochastic_sampler, lambda *a: gs._stochastic(*a), "_stochastic")
    forbidden(gs.check_vp_dsm_loss, lambda *a: gs._vp_dsm(*a), "_vp_dsm")
    forbidden(gs.check_ve_probability_flow_drift, lambda *a: gs._ve_pf(*a), "_ve_pf")


def test_the_lessons_edm_sampler_and_ladder_are_refused_in_the_sampler_exercises():
    forbidden(gs.check_edm_stochastic_sampler, _sampler_via_lessons_heun, "edm_heun_sampler")
    forbidden(gs.check_churn_step, _churn_via_edm_sigmas, "edm_sigmas")


def test_diffusers_schedulers_are_refused_in_the_sampler_exercise():
    from diffusers import EulerDiscreteScheduler, HeunDiscreteScheduler

    forbidden(gs.check_edm_stochastic_sampler, _sampler_via_diffusers(EulerDiscreteScheduler), "EulerDiscreteScheduler")
    forbidden(gs.check_edm_stochastic_sampler, _sampler_via_diffusers(HeunDiscreteScheduler), "HeunDiscreteScheduler")


def test_the_samplers_mistakes_written_by_a_learner_are_named():
    """Each named mistake, written from the solution with one change, gets its hint (the guard on: written by hand)."""
    def sampler(churn_after=False, euler=False, heun_last=False, added=None, clip=True):
        def fn(denoiser, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise):
            lv = sigmas.tolist()
            n = len(lv) - 1
            for i in range(n):
                gamma = min(s_churn / n, math.sqrt(2) - 1) if clip else s_churn / n
                gamma = gamma if s_tmin <= lv[i] <= s_tmax else 0.0
                s_hat = lv[i] * (1 + gamma)
                step_noise = (added or (lambda a, b: math.sqrt(a * a - b * b)))(s_hat, lv[i]) * s_noise * noise(i)
                x_hat = x if churn_after else x + step_noise
                s_hat = lv[i] if churn_after else s_hat
                d = (x_hat - denoiser(x_hat, s_hat)) / s_hat
                x = x_hat + (lv[i + 1] - s_hat) * d
                if not euler and (lv[i + 1] > 0 or heun_last):
                    x = x_hat + (lv[i + 1] - s_hat) * 0.5 * (d + (x - denoiser(x, lv[i + 1])) / lv[i + 1])
                if churn_after and lv[i + 1] > 0:
                    g1 = min(s_churn / n, math.sqrt(2) - 1) if s_tmin <= lv[i + 1] <= s_tmax else 0.0
                    x = x + math.sqrt((lv[i + 1] * (1 + g1)) ** 2 - lv[i + 1] ** 2) * s_noise * noise(i)
            return x
        return fn

    fails(gs.check_edm_stochastic_sampler, sampler(euler=True), "Euler's method")
    fails(gs.check_edm_stochastic_sampler, sampler(churn_after=True), "churn first")
    fails(gs.check_edm_stochastic_sampler, sampler(added=lambda a, b: a - b), "no sqrt")
    fails(gs.check_edm_stochastic_sampler, sampler(clip=False), "clip gamma")
    fails(gs.check_edm_stochastic_sampler, sampler(heun_last=True), "plain Euler step there")


def test_the_reference_is_right_when_pasted_and_passes_the_guard():
    """The course's reference, pasted into the learner's cell, is the learner's own code and passes."""
    mine = pasted(gs)
    passes(gs.check_churn_step, mine._reference_churn_step)
    passes(gs.check_edm_stochastic_sampler, mine._reference_edm_stochastic_sampler)


def test_without_churn_the_sampler_is_the_lessons_deterministic_heun():
    """S_churn = 0 reduces Algorithm 2 to the lesson's Heun sampler (eq. 20), started from the same point."""
    from course_utils import score_sde_edm as edm

    v0 = 0.3
    den = lambda y, s: v0 / (v0 + s * s) * y                            # noqa: E731 (data N(0, v0): exact denoiser)
    want, _ = edm.edm_heun_sampler(den, 500, 12, seed=3)
    start = 80.0 * torch.randn(500, 2, generator=torch.Generator().manual_seed(3))
    got = sampler_solution(den, start, edm.edm_sigmas(12), 0.0, 0.0, float("inf"), 1.0, lambda i: torch.zeros(500, 2))
    torch.testing.assert_close(got, want)


def test_the_usual_mistakes_are_named():
    fails_with(gs.check_langevin_step, lambda x, s, tau, z: x + tau * s(x) + math.sqrt(tau) * z, "missing sqrt(2 tau)")
    fails_with(gs.check_ve_probability_flow_drift,
               lambda x, s, u, a, b: -math.log(b / a) * (a * (b / a) ** u) ** 2 * s * 2, "reverse SDE's drift")


def test_the_mixture_denoiser_is_tweedie_on_the_lessons_mixture():
    rng = np.random.default_rng(0)
    den, x = gs._sampler_inputs(rng)[:2]
    mix = ss.DiagMixture.of(np.exp(den.log_w), den.means, np.repeat(den.var[:, None], den.means.shape[1], 1))
    for sigma in (0.01, 1.0, 30.0):
        torch.testing.assert_close(den(x, sigma), x + sigma**2 * mix.ve_noised(sigma).score(x))


def test_the_sampler_check_needs_enough_levels_and_churns_on_part_of_the_ladder():
    """Every trial has 3 or more steps, 20 or more points, a ladder ending with 0, and churn on some but not all levels."""
    for seed in range(20):
        den, x, sigmas, s_churn, s_tmin, s_tmax, s_noise, noise = gs._sampler_inputs(np.random.default_rng(seed))
        inside = [s_tmin <= s <= s_tmax for s in sigmas.tolist()]
        assert sigmas.shape[0] >= 4 and x.shape[0] >= 20 and sigmas[-1] == 0 and s_churn > 0
        assert any(inside) and not all(inside)


def test_the_noise_is_the_same_on_every_call_and_refuses_a_step_out_of_range():
    *_, noise = gs._sampler_inputs(np.random.default_rng(0))
    torch.testing.assert_close(noise(1), noise(1))
    with pytest.raises(IndexError, match="one draw per step"):
        noise(noise.z.shape[0])


# ---------------------------------------------------------------- BY_HAND_* wired: the operator-level watch
def test_vp_dsm_mse_loss_under_an_alias_is_refused_and_the_right_answer_passes():
    from torch.nn.functional import mse_loss as squared_error  # another name: the watch sees aten::mse_loss anyway

    def via_mse_loss(score_fn, x0, u, noise, beta_min, beta_max):
        m = (-0.25 * u**2 * (beta_max - beta_min) - 0.5 * u * beta_min).exp()[:, None]
        sig = (1 - m**2).sqrt()
        return squared_error(sig * score_fn(m * x0 + sig * noise, u), -noise, reduction="sum") / x0.shape[0]

    forbidden(gs.check_vp_dsm_loss, via_mse_loss, "aten::mse_loss")
    gs.check_vp_dsm_loss(vp_dsm_solution, seed=SEED, trials=2)

