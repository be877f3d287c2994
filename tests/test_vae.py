"""Tests of course_utils.vae: the helpers lesson 10 imports, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.distributions import Normal, kl_divergence

from course_utils import vae


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


def test_diag_gaussian_kl_matches_torch_distributions_and_numpy():
    g = torch.Generator().manual_seed(0)
    mq, lq, mp, lp = (torch.randn(5, 3, generator=g, dtype=torch.float64) for _ in range(4))
    want = kl_divergence(Normal(mq, (0.5 * lq).exp()), Normal(mp, (0.5 * lp).exp())).sum(-1)
    torch.testing.assert_close(vae.diag_gaussian_kl(mq, lq, mp, lp), want)
    prior = kl_divergence(Normal(mq, (0.5 * lq).exp()), Normal(0.0, 1.0)).sum(-1)
    torch.testing.assert_close(vae.diag_gaussian_kl(mq, lq), prior)
    np.testing.assert_allclose(vae.diag_gaussian_kl(mq.numpy(), lq.numpy(), mp.numpy(), lp.numpy()), want.numpy())
    assert float(vae.diag_gaussian_kl(mq, lq, mq, lq).abs().max()) < 1e-12


def test_likelihoods_match_torch_distributions():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 6, generator=g, dtype=torch.float64)
    mean = torch.rand(4, 6, generator=g, dtype=torch.float64)
    log_sigma = torch.randn(6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(vae.gaussian_log_prob(x, mean, log_sigma), Normal(mean, log_sigma.exp()).log_prob(x).sum(-1))
    binary = (x > 0.5).double()
    logits = 3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    want = torch.distributions.Bernoulli(logits=logits).log_prob(binary).sum(-1)
    torch.testing.assert_close(vae.bernoulli_log_prob(binary, logits), want)
    big = torch.tensor([[60.0, -60.0]])  # stable where sigmoid saturates
    assert torch.isfinite(vae.bernoulli_log_prob(torch.tensor([[0.0, 1.0]]), big)).all()


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
