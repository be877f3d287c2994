"""Tests of course_utils.score_sde, score_sde_solvers and score_sde_fokker_planck (lesson 12): exact scores
against autograd, Langevin's known bias, score-matching objectives at their minimizers, the SDE steps against
diffusers' ScoreSdeVpScheduler / ScoreSdeVeScheduler on fresh inputs, samplers on a law with a known answer,
and the Fokker-Planck solver against the exact Ornstein-Uhlenbeck law."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import diffusion as dm
from course_utils import diffusion_metrics as metrics
from course_utils import diffusion_training as dtrain
from course_utils import score_sde as ss
from course_utils import score_sde_fokker_planck as sfp
from course_utils import score_sde_solvers as sv
from course_utils.checks import assert_close, tolerance_for


def fresh():
    return np.random.default_rng()


def test_mixture_score_is_the_gradient_of_its_log_density():
    rng = fresh()
    K, D = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    mix = ss.DiagMixture.of(rng.random(K) + 0.1, 3 * rng.standard_normal((K, D)), rng.uniform(0.05, 2, (K, D)))
    x = torch.tensor(5 * rng.standard_normal((200, D)), requires_grad=True)
    (grad,) = torch.autograd.grad(mix.log_prob(x).sum(), x)
    assert_close(mix.score(x.detach()), grad, name="score vs autograd")


def test_noised_mixtures_are_the_laws_of_the_forward_processes():
    mix, gen = ss.two_mode_mixture(separation=3.0, std=0.4), torch.Generator().manual_seed(0)
    x0 = mix.sample(200_000, gen)
    for law, xt in [(mix.ve_noised(0.7), x0 + 0.7 * torch.randn(x0.shape, generator=gen, dtype=torch.float64)),
                    (mix.vp_noised(0.3), math.sqrt(0.3) * x0 + math.sqrt(0.7) * torch.randn(x0.shape, generator=gen,
                                                                                             dtype=torch.float64))]:
        want = law.sample(200_000, gen)
        assert (xt.mean(0) - want.mean(0)).abs().max() < 0.02
        assert (xt.var(0) - want.var(0)).abs().max() < 0.03


def test_moons_mixture_is_lesson_11s_data():
    held = dtrain.make_data(1000, seed=1)
    floor = max(metrics.mmd_rbf(held, dtrain.make_data(1000, seed=s)) for s in range(2, 7))
    assert metrics.mmd_rbf(held, ss.moons_mixture().sample(1000, torch.Generator().manual_seed(0))) < floor


@pytest.mark.parametrize("tau", [0.1, 0.8])
def test_langevin_has_the_known_gaussian_bias(tau):
    gen = torch.Generator().manual_seed(0)
    x = ss.langevin_chain(lambda y: -y, torch.zeros(20_000, 1, dtype=torch.float64), tau, int(10 / tau) + 20, gen)
    assert abs(x.var().item() - 1 / (1 - tau / 2)) < 5 * math.sqrt(2 / 20_000) / (1 - tau / 2)


def test_annealed_langevin_recovers_mode_weights_plain_langevin_does_not():
    mix, gen = ss.two_mode_mixture(), torch.Generator().manual_seed(1)
    start = (torch.rand(2000, 2, generator=gen, dtype=torch.float64) - 0.5) * 16
    sigmas = torch.logspace(math.log10(6.0), math.log10(0.3), 10).tolist()
    plain = ss.langevin_chain(mix.score, start, 0.02, 300, gen)
    annealed = ss.annealed_langevin(lambda y, i: mix.ve_noised(sigmas[i]).score(y), start, sigmas, 0.01, 50, gen)
    assert abs((plain[:, 0] < 0).double().mean() - 0.5) < 0.06
    assert abs((annealed[:, 0] < 0).double().mean() - 0.8) < 0.05


def test_dsm_objective_is_minimized_by_the_score_of_the_perturbed_law():
    gen = torch.Generator().manual_seed(2)
    x, z = torch.randn(50_000, 2, generator=gen, dtype=torch.float64), torch.randn(50_000, 2, generator=gen, dtype=torch.float64)
    sigma = torch.full((50_000,), 0.8, dtype=torch.float64)
    loss = lambda c: ss.dsm_objective(lambda xt, s: -c * xt / (1 + s[:, None] ** 2), x, sigma, z).item()  # noqa: E731
    assert loss(1.0) < loss(0.9) and loss(1.0) < loss(1.1)


def test_sliced_objective_is_unbiased_for_the_implicit_one():
    rng = fresh()
    A = torch.tensor(rng.standard_normal((3, 3)))
    score = lambda x: x @ A  # noqa: E731  Jacobian A^T, trace tr(A)
    x = torch.tensor(rng.standard_normal((5, 3)))
    implicit = (torch.trace(A) + 0.5 * score(x).pow(2).sum(-1)).mean()
    gen = torch.Generator().manual_seed(3)
    vals = torch.stack([ss.sliced_score_objective(score, x, torch.randn(5, 3, generator=gen, dtype=torch.float64))
                        for _ in range(4000)])
    assert abs(vals.mean() - implicit) < 5 * vals.std() / math.sqrt(4000)


def test_vp_sde_is_the_limit_of_the_ddpm_schedule():
    gaps = []
    for T in (100, 1000):
        u = (torch.arange(T, dtype=torch.float64) + 1) / T
        gaps.append((dm.linear_schedule(T, 0.1 / T, 20 / T).alpha_bar.sqrt() - sv.vp_marginal(u)[0]).abs().max())
    assert 8 < gaps[0] / gaps[1] < 12


def test_reverse_step_matches_diffusers_vp_scheduler_on_fresh_inputs():
    from diffusers.schedulers.deprecated.scheduling_sde_vp import ScoreSdeVpScheduler

    rng = fresh()
    n = int(rng.integers(5, 200))
    ref = ScoreSdeVpScheduler(beta_min=sv.BETA_MIN, beta_max=sv.BETA_MAX)
    ref.set_timesteps(n)
    u = ref.timesteps[int(rng.integers(n))].double()
    x, eps = torch.tensor(rng.standard_normal((64, 2))).float(), torch.tensor(rng.standard_normal((64, 2))).float()
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    state = gen.get_state()
    want, _ = ref.step_pred(eps, x, u, generator=gen)
    z = torch.randn(x.shape, generator=torch.Generator().set_state(state))
    got = sv.reverse_sde_euler_maruyama(x, sv.score_from_eps(eps, sv.vp_marginal(u.item())[1]), u.item(), 1 / n, z)
    rtol, atol = tolerance_for(torch.float32)
    assert (got - want).abs().max() <= rtol * want.abs().max() + atol


def test_ve_steps_match_diffusers_ve_scheduler_on_fresh_inputs():
    from diffusers import ScoreSdeVeScheduler

    rng = fresh()
    n, snr = int(rng.integers(2, 200)), float(rng.uniform(0.05, 0.3))
    ref = ScoreSdeVeScheduler(num_train_timesteps=n, snr=snr, sigma_min=0.01, sigma_max=5.0)
    ref.set_timesteps(n)
    ref.set_sigmas(n)
    sig = sv.ve_discrete_sigmas(n, 0.01, 5.0)
    assert torch.equal(ref.discrete_sigmas, sig)
    i = int(rng.integers(n))
    j = n - 1 - i
    x, s = torch.tensor(rng.standard_normal((64, 2))).float(), torch.tensor(rng.standard_normal((64, 2))).float()
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    for which in ("correct", "pred"):
        state = gen.get_state()
        z = torch.randn(x.shape, generator=torch.Generator().set_state(state))
        if which == "correct":
            want, got = ref.step_correct(s, x, generator=gen).prev_sample, sv.snr_langevin_corrector(x, s, snr, z)
        else:
            want = ref.step_pred(s, ref.timesteps[i], x, generator=gen).prev_sample
            got = sv.ve_reverse_step(x, s, sig[j].item(), sig[j - 1].item() if j > 0 else 0.0, z)
        assert_close(got, want, n=64, name=which)


@pytest.mark.parametrize("method", ["sde", "ode_euler", "ode_heun", "pc"])
def test_samplers_reproduce_a_gaussian_law(method):
    c2 = 0.25  # data N(0, c2 I): every VP marginal is N(0, m^2 c2 + sigma^2), its score exact
    def score(x, u):
        m, std = sv.vp_marginal(u)
        return -x / (m**2 * c2 + std**2)
    x, nfe = sv.sample_vp(score, 5_000, 200, method=method, seed=0)   # variance to about 0.004 (1 sd): 0.02 is 5 sd
    assert nfe == {"sde": 200, "ode_euler": 200, "ode_heun": 399, "pc": 400}[method]
    assert abs(x.var().item() - c2) < 0.02


def test_ve_pc_sampler_reproduces_a_gaussian_law():
    x, nfe = sv.sample_ve_pc(lambda y, s: -y / (0.25 + s**2), 5_000, 200)
    assert nfe == 400 and abs(x.var().item() - 0.25) < 0.02


def test_fokker_planck_matches_the_ornstein_uhlenbeck_law():
    rng = fresh()
    theta, sigma, m0 = float(rng.uniform(0.5, 2)), float(rng.uniform(0.5, 1.5)), float(rng.uniform(-1, 1))
    x = np.linspace(-6, 6, 241)
    dt = 0.4 * (x[1] - x[0]) ** 2 / sigma**2
    steps = int(1.0 / dt)
    dens = sfp.solve_fokker_planck(sfp.gaussian_pdf(x, m0, 0.09), x, dt, steps, theta, sigma, steps)
    exact = sfp.gaussian_pdf(x, *sfp.ou_law(steps * dt, m0, 0.3, theta, sigma))
    assert np.abs(dens[-1] - exact).sum() * (x[1] - x[0]) < 2e-3


def test_kramers_moyal_of_ou_paths():
    rng = np.random.default_rng(0)
    paths = sfp.ou_euler_maruyama(rng.standard_normal(5000) * 0.7, 1.0, 1.0, 0.01, 300, rng)
    km = sfp.kramers_moyal(paths, 0.01, np.linspace(-1, 1, 9))
    centers = np.linspace(-0.875, 0.875, 8)
    assert np.abs(km[0] + centers).max() < 0.2 and np.abs(km[1] - 0.5).max() < 0.05
    assert np.abs(km[2:]).max() < 0.02


# ---------------------------------------------------------------- exact likelihood (section 7) and EDM (section 8)
def _gaussian_vp_score(v0):
    """Data N(0, v0 I): the VP marginal at u is N(0, m^2 v0 + 1 - m^2), whose score is -x / that variance."""
    def score(x, u):
        m, _ = sv.vp_marginal(u)
        return -x / (m * m * v0 + 1 - m * m)
    return score


def test_divergence_exact_equals_the_jacobian_trace():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 3, generator=g, dtype=torch.float64)
    field = lambda x: torch.tanh(x @ w)                                 # a nonlinear field, (n, 3) -> (n, 3)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    _, div = sv.divergence_exact(field, x)
    want = torch.stack([torch.autograd.functional.jacobian(lambda y: field(y[None])[0], xi).trace() for xi in x])
    assert_close(div, want, name="divergence")


def test_pf_ode_likelihood_of_a_gaussian_is_exact():
    v0 = 0.3
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    log_p, _ = sv.pf_ode_log_likelihood(_gaussian_vp_score(v0), x, n_steps=64)
    m, _ = sv.vp_marginal(1e-3)
    var = m * m * v0 + 1 - m * m                                        # the law at u0
    want = -0.5 * (x**2).sum(-1) / var - math.log(2 * math.pi * var)
    err = ((log_p - want).abs() / (1 + want.abs())).max()
    assert err < 3e-4
    coarse, _ = sv.pf_ode_log_likelihood(_gaussian_vp_score(v0), x, n_steps=16)
    assert ((coarse - want).abs() / (1 + want.abs())).max() > 4 * err  # second order: 4x fewer steps, ~16x the error


def test_ddpm_elbo_bounds_the_exact_likelihood_and_adds_up():
    torch.manual_seed(0)
    schedule = dtrain.CPU_PRESET.make_schedule()
    model = dtrain.TimeMLP().eval()                                     # an untrained network: a loose bound
    x = dtrain.make_data(32, seed=1)
    terms = sv.ddpm_elbo_per_dim(model, schedule, x)
    assert terms["bound"] == pytest.approx(terms["prior"] + terms["consistency"] + terms["reconstruction"])
    assert terms["bound"] > (-ss.moons_mixture().log_prob(x).mean() / 2).item()


def test_edm_preconditioning_gives_unit_variance_and_a_skip_at_low_noise():
    from course_utils import score_sde_edm as edm

    sigma = torch.tensor([1e-3, 0.5, 80.0])
    c_skip, c_out, c_in, c_noise = edm.edm_preconditioning(sigma, 0.5)
    assert_close(c_in**2 * (sigma**2 + 0.25), torch.ones(3), name="c_in: unit-variance input")
    assert_close((1 - c_skip) ** 2 * 0.25 + c_skip**2 * sigma**2, c_out**2, name="eq. (18): unit-variance effective target")
    assert c_skip[0] > 0.99 and c_skip[-1] < 1e-4                       # low noise: D ~ x; high noise: D ~ F
    assert_close(c_noise, 0.25 * sigma.log(), name="c_noise")


def test_edm_sigmas_and_the_heun_sampler_on_a_gaussian():
    from course_utils import score_sde_edm as edm

    sig = edm.edm_sigmas(10, 0.002, 80.0)
    assert sig[0].item() == pytest.approx(80.0) and sig[-2].item() == pytest.approx(0.002) and sig[-1] == 0
    assert (sig[:-1] > sig[1:]).all()
    v0 = 0.3                                                           # data N(0, v0): D(x; s) = v0 / (v0 + s^2) x exactly
    x, nfe = edm.edm_heun_sampler(lambda y, s: v0 / (v0 + s * s) * y, 20000, 32, seed=0)
    assert nfe == 2 * 32 - 1
    assert abs(x.var().item() - v0) < 0.02


def test_vp_network_denoiser_inverts_the_vp_time_map():
    from course_utils import score_sde_edm as edm

    seen = {}

    class Probe(torch.nn.Module):                                       # records the t it is given, predicts zero noise
        def forward(self, x, t):
            seen["t"] = t[0].item()
            return torch.zeros_like(x)

    den = edm.vp_network_denoiser(Probe())
    for u in (1e-3, 0.3, 1.0):
        m, std = sv.vp_marginal(u)
        x = torch.randn(4, 2)
        assert_close(den(x, std / m), x, name="zero noise -> D(x) = x")
        assert seen["t"] == pytest.approx(u * 1000 - 1, abs=1e-6)
