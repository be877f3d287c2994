"""Tests of course_utils.grading.score_sde: each check of the lesson-12 problem set passes the solution and a
right answer written differently, raises NotAttempted on a stub, names every listed mistake with its own hint,
rejects the course's shortcut as forbidden, and fails a hard-coded answer on fresh inputs."""
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
from _grading_helpers import fails_with  # noqa: E402
from _grading_helpers import each_mistake_is_named, right_answers_pass  # noqa: E402


# ---------------------------------------------------------------- solutions, as in solutions/12, and other right answers
def dsm_solution(score_fn, x, sigma, noise):
    sig = sigma[:, None]
    x_tilde = x + sig * noise
    target = -(x_tilde - x) / sig**2
    return (sig**2 * (score_fn(x_tilde, sigma) - target) ** 2).sum(-1).mean()


def dsm_other(score_fn, x, sigma, noise):  # sigma^2 |s - target|^2 = |sigma s + z|^2
    x_tilde = x + sigma[:, None] * noise
    return ((sigma[:, None] * score_fn(x_tilde, sigma) + noise) ** 2).sum() / x.shape[0]


def langevin_solution(x, score_fn, tau, noise):
    return x + tau * score_fn(x) + math.sqrt(2 * tau) * noise


def langevin_other(x, score_fn, tau, noise):
    return x + (2 * tau) ** 0.5 * (noise + (tau / 2) ** 0.5 * score_fn(x))


def reverse_solution(x, score, u, h, beta_min, beta_max, noise):
    beta = beta_min + u * (beta_max - beta_min)
    return x + h * (0.5 * beta * x + beta * score) + math.sqrt(beta * h) * noise


def reverse_other(x, score, u, h, beta_min, beta_max, noise):
    g = math.sqrt(beta_min + u * (beta_max - beta_min))
    f = -0.5 * g**2 * x
    return x - (f - g**2 * score) * h + g * math.sqrt(h) * noise


def pf_solution(x, score, u, beta_min, beta_max):
    beta = beta_min + u * (beta_max - beta_min)
    return -0.5 * beta * x - 0.5 * beta * score


def pf_other(x, score, u, beta_min, beta_max):
    g2 = beta_min + u * (beta_max - beta_min)
    return -(g2 / 2) * (x + score)


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


CASES = {
    "dsm": (gs.check_dsm_loss, dsm_solution, dsm_other),
    "langevin": (gs.check_langevin_step, langevin_solution, langevin_other),
    "reverse": (gs.check_reverse_sde_step, reverse_solution, reverse_other),
    "pf": (gs.check_probability_flow_drift, pf_solution, pf_other),
    "fp": (gs.check_fokker_planck_step, fp_solution, fp_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=10)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(gs, CASES[key][0], CASES[key][1], monkeypatch, trials=12)


@pytest.mark.parametrize("key", list(CASES))
def test_a_hard_coded_answer_fails_on_fresh_inputs(key):
    frozen = {}

    def hard_coded(*args):
        if "out" not in frozen:
            frozen["out"] = CASES[key][1](*args)
        return frozen["out"]

    with pytest.raises(CheckFailed) as info:
        CASES[key][0](hard_coded)
    assert not isinstance(info.value, NotAttempted)


SHORTCUTS = {
    "dsm": (ss.dsm_objective, "dsm_objective"),
    "langevin": (lambda x, score_fn, tau, noise: ss.ula_step(x, score_fn(x), tau, noise), "ula_step"),
    "reverse": (lambda x, score, u, h, bmin, bmax, noise: sv.reverse_sde_euler_maruyama(x, score, u, h, noise, bmin, bmax),
                "reverse_sde_euler_maruyama"),
    "pf": (sv.probability_flow_velocity, "probability_flow_velocity"),
    "fp": (sfp.fokker_planck_ftcs, "fokker_planck_ftcs"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_the_shortcut_is_forbidden(key):
    fn, fragment = SHORTCUTS[key]
    fails_with(CASES[key][0], fn, fragment)


def test_the_usual_mistakes_are_named():
    fails_with(gs.check_langevin_step, lambda x, s, tau, z: x + tau * s(x) + math.sqrt(tau) * z, "missing sqrt(2 tau)")
    fails_with(gs.check_reverse_sde_step,
               lambda x, s, u, h, a, b, z: reverse_solution(x, -s, u, h, a, b, z), "sign of the score")
    fails_with(gs.check_probability_flow_drift,
               lambda x, s, u, a, b: -0.5 * (a + u * (b - a)) * x - 0.5 * math.sqrt(a + u * (b - a)) * s, "g^2 vs g")


def test_diffusers_vp_step_is_forbidden_in_the_reverse_sde_exercise():
    from diffusers.schedulers.deprecated.scheduling_sde_vp import ScoreSdeVpScheduler

    def via_diffusers(x, score, u, h, bmin, bmax, noise):
        sched = ScoreSdeVpScheduler(beta_min=bmin, beta_max=bmax)
        sched.set_timesteps(round(1 / h))
        return sched.step_pred(score, x, torch.tensor(u))[0]

    fails_with(gs.check_reverse_sde_step, via_diffusers, "step_pred")
