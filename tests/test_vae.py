"""Tests of course_utils.vae: the helpers lesson 10 imports, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

from course_utils import vae
from course_utils.checks import NotAttempted
from conftest import stub, fails_with  # noqa: E402


# ---------------------------------------------------------------- helpers
def test_load_digits_01_range_split_and_determinism():
    d = vae.load_digits_01()
    assert d.x_train.shape == (1438, 64) and d.x_test.shape == (359, 64)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert float(d.x_train.min()) == 0.0 and float(d.x_train.max()) == 1.0
    assert set(d.y_test.tolist()) == set(range(10))
    again = vae.load_digits_01()
    assert torch.equal(d.x_test, again.x_test)
    assert not torch.equal(d.x_test, vae.load_digits_01(seed=1).x_test)


def test_kl_diag_gaussians_matches_torch_distributions_and_numpy():
    g = torch.Generator().manual_seed(0)
    mq, lq, mp, lp = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4))
    want = kl_divergence(Normal(mq, (0.5 * lq).exp()), Normal(mp, (0.5 * lp).exp())).sum(-1)
    torch.testing.assert_close(vae.kl_diag_gaussians(mq, lq, mp, lp), want)
    prior = kl_divergence(Normal(mq, (0.5 * lq).exp()), Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(vae.kl_diag_gaussians(mq, lq), prior)
    np.testing.assert_allclose(vae.kl_diag_gaussians(mq.numpy(), lq.numpy(), mp.numpy(), lp.numpy()), want.numpy())
    assert float(vae.kl_diag_gaussians(mq, lq, mq, lq).abs().max()) < 1e-12


def test_likelihoods_match_torch_distributions():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 6, generator=g, dtype=torch.float64)
    mean = torch.rand(4, 6, generator=g, dtype=torch.float64)
    log_sigma = torch.randn(6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(vae.gaussian_log_likelihood(x, mean, log_sigma), Normal(mean, log_sigma.exp()).log_prob(x).sum(-1))
    binary = (x > 0.5).double()
    logits = 3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    want = torch.distributions.Bernoulli(logits=logits).log_prob(binary).sum(-1)
    torch.testing.assert_close(vae.bernoulli_log_likelihood(binary, logits), want)
    big = torch.tensor([[60.0, -60.0]])  # stable where sigmoid saturates
    assert torch.isfinite(vae.bernoulli_log_likelihood(torch.tensor([[0.0, 1.0]]), big)).all()


def test_reparameterize_has_the_right_moments_and_gradients():
    mu = torch.tensor([1.0, -2.0], requires_grad=True)
    logvar = torch.tensor([0.0, math.log(4.0)], requires_grad=True)
    eps = torch.randn(200_000, 2, generator=torch.Generator().manual_seed(2))
    z = vae.reparameterize(mu, logvar, eps)  # (N, 2)
    torch.testing.assert_close(z.mean(0), mu.detach(), atol=0.02, rtol=0)
    torch.testing.assert_close(z.std(0), torch.tensor([1.0, 2.0]), atol=0.02, rtol=0)
    z.sum().backward()
    torch.testing.assert_close(mu.grad, torch.full((2,), 200_000.0))


def test_vae_shapes_and_sampling():
    model = vae.GaussianVAE(64, 3, 32)
    x = torch.rand(5, 64)
    recon, kl = model.elbo_terms(x, torch.zeros(5, 3))
    assert recon.shape == kl.shape == (5,) and bool((kl >= 0).all())
    g = torch.Generator().manual_seed(0)
    means = model.sample(4, g, noise=False)
    assert means.shape == (4, 64) and float(means.min()) > 0 and float(means.max()) < 1


def test_train_vae_is_deterministic_learns_and_keeps_global_rng():
    d = vae.load_digits_01()
    cfg = vae.VAEConfig.cpu().with_(epochs=3, hidden=32)
    state = torch.random.get_rng_state()
    m1, h1 = vae.train_vae(cfg, d.x_train[:256], d.x_test[:64], show_progress=False)
    assert torch.equal(state, torch.random.get_rng_state())
    m2, h2 = vae.train_vae(cfg, d.x_train[:256], d.x_test[:64], show_progress=False)
    assert h1.test_neg_elbo == h2.test_neg_elbo and h1.kl == h2.kl
    assert len(h1.recon) == 3 and h1.test_neg_elbo[-1] < h1.test_neg_elbo[0]
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


# ---------------------------------------------------------------- exercise 1
def kl_ok(mu_q, logvar_q, mu_p, logvar_p):
    return 0.5 * (logvar_p - logvar_q + (logvar_q.exp() + (mu_q - mu_p) ** 2) / logvar_p.exp() - 1).sum(-1)


def test_check_kl_diag_gaussians():
    vae.check_kl_diag_gaussians(kl_ok)
    vae.check_kl_diag_gaussians(lambda mq, lq, mp, lp: kl_divergence(Normal(mq, (lq / 2).exp()), Normal(mp, (lp / 2).exp())).sum(-1))
    with pytest.raises(NotAttempted):
        vae.check_kl_diag_gaussians(stub)
    check = vae.check_kl_diag_gaussians
    fails_with(check, lambda mq, lq, mp, lp: kl_ok(mp, lp, mq, lq), "KL(p || q)")
    fails_with(check, lambda *a: 2 * kl_ok(*a), "1/2")
    fails_with(check, lambda *a: kl_ok(*a).neg(), "never below 0")
    fails_with(check, lambda *a: kl_ok(*a) / a[0].shape[-1], "SUM of the per-dimension")
    fails_with(check, lambda mq, lq, mp, lp: 0.5 * (lp - lq + ((lq / 2).exp() + (mq - mp) ** 2) / (lp / 2).exp() - 1).sum(-1),
               "standard deviations")
    fails_with(check, lambda mq, lq, mp, lp: kl_ok(mq, 2 * lq, mp, 2 * lp), "log-variances")
    fails_with(check, lambda mq, lq, mp, lp: 0.5 * (lp - lq + (lq.exp() + (mq - mp) ** 2) / lp.exp() - 1), "one KL per dimension")
    fails_with(check, lambda mq, lq, mp, lp: 0.5 * (lp - lq + (lq.exp() + (mq - mp) ** 2) / lp.exp()).sum(-1), "-1 inside")


# ---------------------------------------------------------------- exercise 2
def log_normal(z, mu, logvar):
    return (-0.5 * (z - mu) ** 2 / logvar.exp() - 0.5 * logvar - 0.5 * math.log(2 * math.pi)).sum(-1)


def kl_mc_ok(mu_q, logvar_q, mu_p, logvar_p, eps):
    z = mu_q + (0.5 * logvar_q).exp() * eps  # (S, B, k)
    return (log_normal(z, mu_q, logvar_q) - log_normal(z, mu_p, logvar_p)).mean(0)


def test_check_kl_monte_carlo(capsys):
    vae.check_kl_monte_carlo(kl_mc_ok)
    assert "5 standard errors" in capsys.readouterr().out
    with pytest.raises(NotAttempted):
        vae.check_kl_monte_carlo(stub)
    check = vae.check_kl_monte_carlo

    def with_z(make_z):
        return lambda mq, lq, mp, lp, eps: (log_normal(make_z(mq, lq, eps), mq, lq) - log_normal(make_z(mq, lq, eps), mp, lp)).mean(0)

    fails_with(check, with_z(lambda m, l, e: m + l.exp() * e), "exp(logvar) * eps")
    fails_with(check, with_z(lambda m, l, e: m + l * e), "logvar * eps")
    fails_with(check, lambda *a: -kl_mc_ok(*a), "log p(z) - log q(z)")
    fails_with(check, lambda *a: kl_mc_ok(*a) * a[-1].shape[0], "AVERAGES")
    fails_with(check, lambda mq, lq, mp, lp, eps: vae.kl_diag_gaussians(mq, lq, mp, lp), "closed form")


# ---------------------------------------------------------------- exercise 3
def gauss_ok(x, mean, log_sigma):
    return (-0.5 * ((x - mean) / log_sigma.exp()) ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)).sum(-1)


def test_check_gaussian_log_likelihood():
    vae.check_gaussian_log_likelihood(gauss_ok)
    vae.check_gaussian_log_likelihood(lambda x, m, ls: Normal(m, ls.exp()).log_prob(x).sum(-1))
    with pytest.raises(NotAttempted):
        vae.check_gaussian_log_likelihood(stub)
    check = vae.check_gaussian_log_likelihood
    fails_with(check, lambda x, m, ls: (-0.5 * ((x - m) / ls.exp()) ** 2 - ls).sum(-1), "log(2 pi)")
    fails_with(check, lambda x, m, ls: (-((x - m) / ls.exp()) ** 2 - ls - 0.5 * math.log(2 * math.pi)).sum(-1), "dropped the 1/2")
    fails_with(check, lambda x, m, ls: (-0.5 * (x - m) ** 2 / ls.exp() - ls - 0.5 * math.log(2 * math.pi)).sum(-1), "instead of sigma^2")
    fails_with(check, lambda x, m, ls: Normal(m, (0.5 * ls).exp()).log_prob(x).sum(-1), "log-variance")
    fails_with(check, lambda x, m, ls: gauss_ok(x, m, ls).neg(), "negative log-likelihood")
    fails_with(check, lambda x, m, ls: gauss_ok(x, m, ls) / x.shape[-1], "SUM")
    fails_with(check, lambda x, m, ls: -F.mse_loss(m, x, reduction="none").sum(-1) / 2, "squared error only")


# ---------------------------------------------------------------- exercise 4
def bern_ok(x, logits):
    return (x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)).sum(-1)


def test_check_bernoulli_log_likelihood(capsys):
    vae.check_bernoulli_log_likelihood(bern_ok)
    assert "size 40" in capsys.readouterr().out
    with pytest.raises(NotAttempted):
        vae.check_bernoulli_log_likelihood(stub)
    check = vae.check_bernoulli_log_likelihood

    def naive(x, logits):
        p = torch.sigmoid(logits)
        return (x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum(-1)

    def clamped(x, logits):
        p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7)
        return (x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum(-1)

    fails_with(check, naive, "logsigmoid(-l)")
    fails_with(check, clamped, "logsigmoid(-l)")
    fails_with(check, lambda x, l: F.binary_cross_entropy_with_logits(l, x, reduction="none").sum(-1), "cross-entropy")
    fails_with(check, lambda x, l: bern_ok(x, l) / x.shape[-1], "averaged over the pixels")
    fails_with(check, lambda x, l: (x * F.logsigmoid(l)).sum(-1), "(1 - x) * log(1 - p)")
    fails_with(check, lambda x, l: bern_ok(x, torch.sigmoid(l)), "probabilities where logits")


# ---------------------------------------------------------------- exercise 5
def neg_elbo_ok(x, mu, logvar, decode, eps):
    z = mu + (0.5 * logvar).exp() * eps  # (S, B, k)
    recon = bern_ok(x, decode(z)).mean(0)  # (B,)
    kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(-1)
    return (kl - recon).mean()


def test_check_negative_elbo():
    vae.check_negative_elbo(neg_elbo_ok)
    with pytest.raises(NotAttempted):
        vae.check_negative_elbo(stub)
    check = vae.check_negative_elbo

    def parts(x, mu, logvar, decode, eps, scale=lambda lv: (0.5 * lv).exp()):
        z = mu + scale(logvar) * eps
        return bern_ok(x, decode(z)).mean(0), 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(-1)

    fails_with(check, lambda *a: -neg_elbo_ok(*a), "returned the ELBO")
    fails_with(check, lambda *a: (lambda r, k: (-r - k).mean())(*parts(*a)), "plus sign")
    fails_with(check, lambda *a: (lambda r, k: (-r).mean())(*parts(*a)), "KL(q(z|x) || p(z)) term is missing")
    fails_with(check, lambda *a: (lambda r, k: (k - r).sum())(*parts(*a)), "summed over the batch")
    fails_with(check, lambda *a: (lambda r, k: (k - r / a[0].shape[-1]).mean())(*parts(*a)), "averaged the reconstruction")
    fails_with(check, lambda *a: (lambda r, k: (k - r).mean())(*parts(*a, scale=torch.exp)), "exp(logvar) * eps")
    fails_with(check, lambda *a: (lambda r, k: (k - r).mean())(*parts(*a, scale=lambda lv: 0 * lv)), "decoded mu")


# ---------------------------------------------------------------- exercise 6
def iwae_ok(log_px_given_z, log_pz, log_qz):
    return torch.logsumexp(log_px_given_z + log_pz - log_qz, dim=0) - math.log(log_pz.shape[0])


def test_check_iwae_bound(capsys):
    vae.check_iwae_bound(iwae_ok)
    out = capsys.readouterr().out
    assert "K=1000" in out and "known log p(x)" in out
    with pytest.raises(NotAttempted):
        vae.check_iwae_bound(stub)
    check = vae.check_iwae_bound
    fails_with(check, lambda a, b, c: torch.log(torch.exp(a + b - c).mean(0)), "exp() underflows")
    fails_with(check, lambda a, b, c: torch.logsumexp(a + b - c, dim=0), "subtract log K")
    fails_with(check, lambda a, b, c: (a + b - c).mean(0), "that is the ELBO")
    fails_with(check, lambda a, b, c: iwae_ok(a, b, -c), "subtract log q")
    fails_with(check, lambda a, b, c: (a + b - c).max(0).values - math.log(a.shape[0]), "largest log-weight")
    fails_with(check, lambda a, b, c: torch.logsumexp(a + b - c, dim=1) - math.log(a.shape[1]), "batch axis")
