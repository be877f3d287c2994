"""Tests of course_utils.diffusion: schedules, forward process, DDPM/DDIM steps (against diffusers'
DDPMScheduler and DDIMScheduler, step by step), the metrics, training, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import diffusion as dm
from course_utils.checks import NotAttempted
from conftest import stub, fails_with  # noqa: E402

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
    """Check eqs. (7-8) against conditioning the joint Gaussian of (x_{t-1}, x_t) given x0 directly."""
    ab_t, ab_prev = 0.3, 0.45
    a = ab_t / ab_prev
    x0, xt = torch.tensor([0.7]), torch.tensor([-0.2])
    # x_{t-1} = sqrt(ab_prev) x0 + ..., x_t = sqrt(a) x_{t-1} + sqrt(1 - a) z: cov(x_{t-1}, x_t) = sqrt(a)(1 - ab_prev)
    var_prev, var_t, cov = 1 - ab_prev, 1 - ab_t, math.sqrt(a) * (1 - ab_prev)
    mean = math.sqrt(ab_prev) * x0 + cov / var_t * (xt - math.sqrt(ab_t) * x0)
    mu, var = dm.posterior_mean_variance(x0, xt, ab_t, ab_prev)
    torch.testing.assert_close(mu, mean)
    assert math.isclose(var, var_prev - cov**2 / var_t, rel_tol=1e-12)


def test_metrics_separate_same_from_different():
    a, b = dm.make_data(500, seed=1), dm.make_data(500, seed=2)
    shifted = b + torch.tensor([0.5, 0.0])
    assert abs(dm.mmd_rbf(a, b)) < 0.02 < dm.mmd_rbf(a, shifted)
    assert dm.sliced_wasserstein(a, b) < 0.1 < dm.sliced_wasserstein(a, shifted)
    assert dm.sliced_wasserstein(a, a) == 0.0
    with pytest.raises(ValueError):
        dm.sliced_wasserstein(a, b[:10])


def test_swiss_roll_data_and_unknown_kind():
    x = dm.make_data(300, kind="swiss_roll")
    assert x.shape == (300, 2) and x.dtype == torch.float32 and 0.3 < float(x.std()) < 2
    with pytest.raises(ValueError):
        dm.make_data(10, kind="circles")


def test_short_training_lowers_the_loss_and_sampler_runs():
    data = dm.make_data(2000)
    config = dm.TrainConfig(T=100, hidden=32, depth=2, steps=300, batch_size=128, lr=3e-3)
    threads = torch.get_num_threads()
    model, sched, losses = dm.train_denoiser(data, config, show_progress=False)
    assert torch.get_num_threads() == threads  # single_thread() restores the setting
    assert losses[-50:].mean() < 0.8 * losses[:50].mean()
    x, kept = dm.sample(model, sched, 200, 10, method="ddim", keep=(0, 5, 10))
    assert x.shape == (200, 2) and sorted(kept) == [0, 5, 10]
    torch.testing.assert_close(kept[10], x)
    again = dm.sample(model, sched, 200, 10, method="ddim")
    torch.testing.assert_close(again, x)  # seeded: the same samples
    with pytest.raises(ValueError):
        dm.sample(model, sched, 10, 5, method="euler")


# ---------------------------------------------------------------- exercise checks
def cosine_ok(T, s):
    t = np.arange(T)
    f = lambda u: np.cos((u + s) / (1 + s) * np.pi / 2) ** 2  # noqa: E731
    return np.cumprod(1 - np.minimum(1 - f((t + 1) / T) / f(t / T), 0.999))


def test_check_cosine_alpha_bar():
    dm.check_cosine_alpha_bar(cosine_ok)
    with pytest.raises(NotAttempted):
        dm.check_cosine_alpha_bar(stub)
    f = lambda u, s: np.cos((u + s) / (1 + s) * np.pi / 2) ** 2  # noqa: E731
    fails_with(dm.check_cosine_alpha_bar, lambda T, s: f(np.arange(T) / T, s) / f(0.0, s), "one step late")
    betas = lambda T, s: np.minimum(1 - f((np.arange(T) + 1) / T, s) / f(np.arange(T) / T, s), 0.999)  # noqa: E731
    fails_with(dm.check_cosine_alpha_bar, betas, "returned the betas")
    fails_with(dm.check_cosine_alpha_bar, lambda T, s: f((np.arange(T) + 1) / T, s) / f(0.0, s), "cap them")


def posterior_ok(x0, x_t, alpha_bar, t):
    ab_t, ab_prev = alpha_bar[t], alpha_bar[t - 1] if t > 0 else 1.0
    beta = 1 - ab_t / ab_prev
    mean = (np.sqrt(ab_prev) * beta * x0 + np.sqrt(1 - beta) * (1 - ab_prev) * x_t) / (1 - ab_t)
    return mean, (1 - ab_prev) / (1 - ab_t) * beta


def test_check_posterior():
    dm.check_posterior(posterior_ok)
    with pytest.raises(NotAttempted):
        dm.check_posterior(stub)
    fails_with(dm.check_posterior, lambda *a: (posterior_ok(*a)[0], np.sqrt(posterior_ok(*a)[1])), "standard deviation")
    fails_with(dm.check_posterior, lambda x0, xt, ab, t: posterior_ok(x0, xt, ab, t + 1), "off by one")

    def alpha_bar_coef(x0, x_t, ab, t):
        mean, var = posterior_ok(x0, x_t, ab, t)
        beta = 1 - ab[t] / ab[t - 1]
        return mean + (np.sqrt(ab[t]) - np.sqrt(1 - beta)) * (1 - ab[t - 1]) / (1 - ab[t]) * x_t, var

    fails_with(dm.check_posterior, alpha_bar_coef, "sqrt(alpha_t)")
    fails_with(dm.check_posterior, lambda x0, xt, ab, t: (posterior_ok(x0, xt, ab, t)[0], 1 - ab[t] / ab[t - 1]), "beta_t")


def ddim_ok(x_t, eps, ab_t, ab_prev, eta, noise):
    sigma = eta * np.sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev))
    x0 = (x_t - np.sqrt(1 - ab_t) * eps) / np.sqrt(ab_t)
    return np.sqrt(ab_prev) * x0 + np.sqrt(1 - ab_prev - sigma**2) * eps + sigma * noise


def test_check_ddim_update():
    dm.check_ddim_update(ddim_ok)
    with pytest.raises(NotAttempted):
        dm.check_ddim_update(stub)
    fails_with(dm.check_ddim_update, lambda x, e, a, p, eta, z: ddim_ok(x, e, a, p, eta, -z), "wrong sign")
    fails_with(dm.check_ddim_update, lambda x, e, a, p, eta, z: ddim_ok(x, e, a, p, 1.0, z), "eta")

    def variance_for_std(x, e, a, p, eta, z):
        sigma = eta * np.sqrt((1 - p) / (1 - a) * (1 - a / p))
        return ddim_ok(x, e, a, p, eta, z) + (sigma**2 - sigma) * z

    fails_with(dm.check_ddim_update, variance_for_std, "sigma^2")

    def no_sigma_direction(x, e, a, p, eta, z):
        sigma = eta * np.sqrt((1 - p) / (1 - a) * (1 - a / p))
        return ddim_ok(x, e, a, p, eta, z) + (np.sqrt(1 - p) - np.sqrt(1 - p - sigma**2)) * e

    fails_with(dm.check_ddim_update, no_sigma_direction, "direction term")


def from_v_ok(x_t, v, ab):
    return np.sqrt(ab) * x_t - np.sqrt(1 - ab) * v, np.sqrt(1 - ab) * x_t + np.sqrt(ab) * v


def test_check_from_v_prediction():
    dm.check_from_v_prediction(from_v_ok)
    with pytest.raises(NotAttempted):
        dm.check_from_v_prediction(stub)
    fails_with(dm.check_from_v_prediction, lambda x, v, ab: from_v_ok(x, v, ab)[::-1], "(x0, eps)")
    fails_with(dm.check_from_v_prediction, lambda x, v, ab: from_v_ok(x, -v, ab), "signs")
    fails_with(dm.check_from_v_prediction, lambda x, v, ab: (ab * x - (1 - ab) * v, (1 - ab) * x + ab * v), "square")


def ddpm_loss_ok(model, x0, t, noise, betas):
    ab = torch.cumprod(1 - betas, 0)[t][:, None]  # (B, 1)
    return torch.mean((model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t) - noise) ** 2)


def test_check_ddpm_loss():
    dm.check_ddpm_loss(ddpm_loss_ok)
    with pytest.raises(NotAttempted):
        dm.check_ddpm_loss(stub)

    def alpha_not_bar(model, x0, t, noise, betas):
        a = (1 - betas)[t][:, None]
        return torch.mean((model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t) - noise) ** 2)

    fails_with(dm.check_ddpm_loss, alpha_not_bar, "alpha_bar_t = cumprod")

    def shifted(model, x0, t, noise, betas):
        ab = torch.cumprod(1 - betas, 0)
        ab = torch.cat([ab.new_ones(1), ab])[t][:, None]
        return torch.mean((model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t) - noise) ** 2)

    fails_with(dm.check_ddpm_loss, shifted, "off by one")
    fails_with(dm.check_ddpm_loss, lambda *a: ddpm_loss_ok(*a) * a[1].numel(), ".mean()")


def mmd_ok(a, b, sigma):
    k = lambda x, y: torch.exp(-torch.cdist(x, y) ** 2 / (2 * sigma**2))  # noqa: E731
    n, m = len(a), len(b)
    return ((k(a, a).sum() - n) / (n * (n - 1)) + (k(b, b).sum() - m) / (m * (m - 1)) - 2 * k(a, b).mean())


def test_check_mmd():
    dm.check_mmd(mmd_ok)
    with pytest.raises(NotAttempted):
        dm.check_mmd(stub)

    def biased(a, b, sigma):
        k = lambda x, y: torch.exp(-torch.cdist(x, y) ** 2 / (2 * sigma**2))  # noqa: E731
        return k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean()

    fails_with(dm.check_mmd, biased, "biased estimator")
    fails_with(dm.check_mmd, lambda a, b, s: mmd_ok(a, b, s / math.sqrt(2)), "2 sigma^2")


CHECKS = [dm.check_cosine_alpha_bar, dm.check_posterior, dm.check_ddim_update, dm.check_from_v_prediction,
          dm.check_ddpm_loss, dm.check_mmd]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_listed_mistake_is_reported_with_its_own_hint(check, monkeypatch):
    """Submitting each named wrong variant as the answer must raise that variant's hint (none is shadowed)."""
    recorded = []
    original = dm.check_function

    def recording(*args, **kwargs):
        recorded.extend(kwargs["mistakes"])
        return original(*args, **kwargs)

    monkeypatch.setattr(dm, "check_function", recording)
    with pytest.raises(NotAttempted):
        check(stub)
    monkeypatch.setattr(dm, "check_function", original)
    assert len(recorded) >= 4
    for mistake in recorded:
        fails_with(check, mistake.fn, mistake.hint)
