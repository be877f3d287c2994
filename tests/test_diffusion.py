"""Tests of course_utils.diffusion: schedules, forward process, DDPM/DDIM steps (against diffusers'
DDPMScheduler and DDIMScheduler, step by step)."""
from __future__ import annotations

import math

import pytest
import torch

from course_utils import diffusion as dm

diffusers = pytest.importorskip("diffusers")
T = 1000


# ---------------------------------------------------------------- diffusers configured like ours
def ddpm_scheduler(beta_schedule="linear"):
    """DDPMScheduler built from arguments only (nothing downloaded), configured to match our sampler."""
    return diffusers.DDPMScheduler(
        num_train_timesteps=T, beta_schedule=beta_schedule, variance_type="fixed_small",
        clip_sample=False, prediction_type="epsilon", timestep_spacing="trailing",
    )


def ddim_scheduler(beta_schedule="linear"):
    return diffusers.DDIMScheduler(
        num_train_timesteps=T, beta_schedule=beta_schedule, clip_sample=False, prediction_type="epsilon",
        timestep_spacing="trailing", set_alpha_to_one=True, steps_offset=0,
    )


def gaussian_denoiser(schedule):
    """The exact noise predictor for N(0, I) data: E[eps | x_t] = sqrt(1 - alpha_bar_t) x_t (keeps x at O(1))."""
    return lambda x, t: math.sqrt(1 - schedule.alpha_bar_at(t)) * x


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_schedules_match_diffusers(kind):
    ours = dm.linear_schedule(T) if kind == "linear" else dm.cosine_schedule(T)
    ref = ddpm_scheduler("linear" if kind == "linear" else "squaredcos_cap_v2")
    # diffusers stores betas in float32 and multiplies 1000 of them in float32: relative error ~1000 ulps
    torch.testing.assert_close(ours.betas, ref.betas.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.alpha_bar, ref.alphas_cumprod.double(), rtol=5e-5, atol=1e-9)
    assert float(ours.alpha_bar[-1]) < 1e-4  # both end (almost) at pure noise
    assert torch.all(ours.snr[1:] < ours.snr[:-1])  # the SNR falls monotonically


@pytest.mark.parametrize("n_steps", [1, 10, 50, 1000])
def test_sampling_timesteps_match_diffusers_trailing(n_steps):
    ours = dm.sampling_timesteps(T, n_steps)
    assert ours[0] == T - 1 and len(ours) == n_steps and all(a > b for a, b in zip(ours, ours[1:]))
    for sched in (ddpm_scheduler(), ddim_scheduler()):
        sched.set_timesteps(n_steps)
        assert sched.timesteps.tolist() == ours


@pytest.mark.parametrize("n_steps", [10, 1000])
def test_ddpm_step_matches_diffusers_step_by_step(n_steps):
    ref = ddpm_scheduler()
    ref.set_timesteps(n_steps)
    sched = dm.Schedule(betas=ref.betas.double(), alpha_bar=ref.alphas_cumprod.double())  # same numbers
    model = gaussian_denoiser(sched)
    steps = dm.sampling_timesteps(T, n_steps)
    x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    for i, t in enumerate(steps):
        eps = model(x, t)
        state = gen.get_state()
        want = ref.step(eps, t, x, generator=gen).prev_sample
        noise = torch.randn(x.shape, generator=torch.Generator().set_state(state))  # the noise diffusers drew
        got = dm.ddpm_step(sched, eps, t, steps[i + 1] if i + 1 < len(steps) else -1, x, noise)
        # diffusers forms beta = 1 - abar_t / abar_prev in float32: for beta ~ 1e-4 that is ~1e-3 relative,
        # so the noise term agrees to ~1e-3 * sqrt(beta); we compute it in float64.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-4)
        x = want  # step by step: both start every step from the same x_t
    assert x.abs().max() < 10


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("n_steps", [10, 50, 1000])
def test_ddim_step_matches_diffusers_step_by_step(eta, n_steps):
    ref = ddim_scheduler()
    ref.set_timesteps(n_steps)
    sched = dm.Schedule(betas=ref.betas.double(), alpha_bar=ref.alphas_cumprod.double())
    model = gaussian_denoiser(sched)
    steps = dm.sampling_timesteps(T, n_steps)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(256, 2, generator=gen)
    for i, t in enumerate(steps):
        eps, noise = model(x, t), torch.randn(x.shape, generator=gen)
        want = ref.step(eps, t, x, eta=eta, variance_noise=noise).prev_sample
        got = dm.ddim_step(sched, eps, t, steps[i + 1] if i + 1 < len(steps) else -1, x, eta, noise)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # float32 arithmetic in a different order
        x = want


def test_ddim_eta_one_is_ddpm_and_eta_zero_is_deterministic():
    sched = dm.cosine_schedule(200)
    rng = torch.Generator().manual_seed(0)
    x, eps, noise = (torch.randn(50, 2, generator=rng, dtype=torch.float64) for _ in range(3))
    for t, t_prev in [(199, 150), (10, 9), (0, -1)]:
        torch.testing.assert_close(dm.ddim_step(sched, eps, t, t_prev, x, 1.0, noise),
                                   dm.ddpm_step(sched, eps, t, t_prev, x, noise))
    a = dm.ddim_step(sched, eps, 120, 60, x, 0.0, noise)
    b = dm.ddim_step(sched, eps, 120, 60, x, 0.0, -noise)
    torch.testing.assert_close(a, b)


def test_q_sample_closed_form_matches_simulated_chain():
    sched = dm.linear_schedule(100, 1e-3, 0.05)
    n, t = 20000, 60
    gen = torch.Generator().manual_seed(0)
    x0 = torch.tensor([[1.5, -0.5]], dtype=torch.float64).expand(n, 2)
    x = x0.clone()
    for s in range(t + 1):  # steps 0..t, eq. (1)
        beta = float(sched.betas[s])
        x = math.sqrt(1 - beta) * x + math.sqrt(beta) * torch.randn(n, 2, generator=gen, dtype=torch.float64)
    closed = dm.q_sample(sched, x0, torch.full((n,), t), torch.randn(n, 2, generator=gen, dtype=torch.float64))
    ab = float(sched.alpha_bar[t])
    for sample in (x, closed):
        se_mean = math.sqrt((1 - ab) / n)  # standard error of the mean
        assert torch.all((sample.mean(0) - math.sqrt(ab) * x0[0]).abs() < 5 * se_mean)
        se_var = (1 - ab) * math.sqrt(2 / (n - 1))
        assert torch.all((sample.var(0) - (1 - ab)).abs() < 5 * se_var)


def test_posterior_mean_variance_is_the_gaussian_conditional():
    """Check eqs. (6-7) against conditioning the joint Gaussian of (x_{t-1}, x_t) given x0 directly."""
    ab_t, ab_prev = 0.3, 0.45
    a = ab_t / ab_prev
    x0, xt = torch.tensor([0.7]), torch.tensor([-0.2])
    # x_{t-1} = sqrt(ab_prev) x0 + ..., x_t = sqrt(a) x_{t-1} + sqrt(1 - a) z: cov(x_{t-1}, x_t) = sqrt(a)(1 - ab_prev)
    var_prev, var_t, cov = 1 - ab_prev, 1 - ab_t, math.sqrt(a) * (1 - ab_prev)
    mean = math.sqrt(ab_prev) * x0 + cov / var_t * (xt - math.sqrt(ab_t) * x0)
    mu, var = dm.posterior_mean_variance(x0, xt, ab_t, ab_prev)
    torch.testing.assert_close(mu, mean)
    assert math.isclose(var, var_prev - cov**2 / var_t, rel_tol=1e-12)


@pytest.mark.parametrize("n_steps", [3, 7, 30])
def test_diffusers_ddim_pairs_t_with_t_minus_T_over_n_not_the_next_visited_timestep(n_steps):
    """For n not dividing T, DDIMScheduler.step goes to t - T // n (its prev_timestep), while the course's sampler
    goes to the next visited timestep; the two differ at some steps (lesson 11, section 6)."""
    ref = ddim_scheduler()
    ref.set_timesteps(n_steps)
    sched = dm.Schedule(betas=ref.betas.double(), alpha_bar=ref.alphas_cumprod.double())
    steps = dm.sampling_timesteps(T, n_steps)
    assert ref.timesteps.tolist() == steps
    gen = torch.Generator().manual_seed(n_steps)
    x, eps = torch.randn(64, 2, generator=gen), torch.randn(64, 2, generator=gen)
    differ = 0
    for t, t_next in zip(steps, steps[1:] + [-1]):
        want = ref.step(eps, t, x, eta=0.0).prev_sample
        torch.testing.assert_close(dm.ddim_step(sched, eps, t, t - T // n_steps, x), want, rtol=1e-5, atol=1e-5)
        if t - T // n_steps != t_next:
            differ += 1
            assert not torch.allclose(dm.ddim_step(sched, eps, t, t_next, x), want, rtol=1e-5, atol=1e-5)
    assert differ > 0
