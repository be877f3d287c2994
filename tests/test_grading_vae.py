"""Tests of course_utils.grading.vae: each check of the lesson-10 problem set passes the solution and a
right answer written differently, raises NotAttempted on a stub, names the plausible mistakes (every
listed Mistake with its own hint), rejects the shortcuts (torch.distributions, the course's copies)
as forbidden, and rejects a hard-coded answer on fresh inputs."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

from course_utils import vae
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.grading import vae as gv
from _grading_helpers import SEED, quiet_passes, stub, fails_with  # noqa: E402
from _grading_helpers import each_mistake_is_named  # noqa: E402


# ---------------------------------------------------------------- exercise 1
def kl_ok(mu_q, logvar_q, mu_p, logvar_p):
    return 0.5 * (logvar_p - logvar_q + (logvar_q.exp() + (mu_q - mu_p) ** 2) / logvar_p.exp() - 1).sum(-1)


def test_check_kl_diag_gaussians():
    gv.check_kl_diag_gaussians(kl_ok)
    with pytest.raises(NotAttempted):
        gv.check_kl_diag_gaussians(stub)
    check = gv.check_kl_diag_gaussians
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
    gv.check_kl_monte_carlo(kl_mc_ok)
    assert "5 standard errors" in capsys.readouterr().out
    with pytest.raises(NotAttempted):
        gv.check_kl_monte_carlo(stub)
    check = gv.check_kl_monte_carlo

    def with_z(make_z):
        return lambda mq, lq, mp, lp, eps: (log_normal(make_z(mq, lq, eps), mq, lq) - log_normal(make_z(mq, lq, eps), mp, lp)).mean(0)

    fails_with(check, with_z(lambda m, l, e: m + l.exp() * e), "exp(logvar) * eps")
    fails_with(check, with_z(lambda m, l, e: m + l * e), "logvar * eps")
    fails_with(check, lambda *a: -kl_mc_ok(*a), "log p(z) - log q(z)")
    fails_with(check, lambda *a: kl_mc_ok(*a) * a[-1].shape[0], "AVERAGES")
    fails_with(check, lambda mq, lq, mp, lp, eps: kl_ok(mq, lq, mp, lp), "closed form")


# ---------------------------------------------------------------- exercise 3
def gauss_ok(x, mean, log_sigma):
    return (-0.5 * ((x - mean) / log_sigma.exp()) ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)).sum(-1)


def test_check_gaussian_log_likelihood():
    gv.check_gaussian_log_likelihood(gauss_ok)
    with pytest.raises(NotAttempted):
        gv.check_gaussian_log_likelihood(stub)
    check = gv.check_gaussian_log_likelihood
    fails_with(check, lambda x, m, ls: (-0.5 * ((x - m) / ls.exp()) ** 2 - ls).sum(-1), "log(2 pi)")
    fails_with(check, lambda x, m, ls: (-((x - m) / ls.exp()) ** 2 - ls - 0.5 * math.log(2 * math.pi)).sum(-1), "dropped the 1/2")
    fails_with(check, lambda x, m, ls: (-0.5 * (x - m) ** 2 / ls.exp() - ls - 0.5 * math.log(2 * math.pi)).sum(-1), "instead of sigma^2")
    fails_with(check, lambda x, m, ls: gauss_ok(x, m, 0.5 * ls), "log-variance")
    fails_with(check, lambda x, m, ls: gauss_ok(x, m, ls).neg(), "negative log-likelihood")
    fails_with(check, lambda x, m, ls: gauss_ok(x, m, ls) / x.shape[-1], "SUM")
    fails_with(check, lambda x, m, ls: -F.mse_loss(m, x, reduction="none").sum(-1) / 2, "squared error only")


# ---------------------------------------------------------------- exercise 4
def bern_ok(x, logits):
    return (x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)).sum(-1)


def test_check_bernoulli_log_likelihood(capsys):
    gv.check_bernoulli_log_likelihood(bern_ok)
    assert "size 40" in capsys.readouterr().out
    with pytest.raises(NotAttempted):
        gv.check_bernoulli_log_likelihood(stub)
    check = gv.check_bernoulli_log_likelihood

    def naive(x, logits):
        p = torch.sigmoid(logits)
        return (x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum(-1)

    def clamped(x, logits):
        p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7)
        return (x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum(-1)

    fails_with(check, naive, "logsigmoid(-l)")
    fails_with(check, clamped, "logsigmoid(-l)")
    fails_with(check, lambda x, l: -(x * F.logsigmoid(l) + (1 - x) * F.logsigmoid(-l)).sum(-1), "cross-entropy")
    # torch's own cross-entropy computes the whole result: refused at the operator, whatever the sign
    fails_with(check, lambda x, l: -F.binary_cross_entropy_with_logits(l, x, reduction="none").sum(-1),
               "binary_cross_entropy_with_logits")
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
    gv.check_negative_elbo(neg_elbo_ok)
    with pytest.raises(NotAttempted):
        gv.check_negative_elbo(stub)
    check = gv.check_negative_elbo

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
    gv.check_iwae_bound(iwae_ok)
    out = capsys.readouterr().out
    assert "K=1000" in out and "known log p(x)" in out
    with pytest.raises(NotAttempted):
        gv.check_iwae_bound(stub)
    check = gv.check_iwae_bound
    fails_with(check, lambda a, b, c: torch.log(torch.exp(a + b - c).mean(0)), "exp() underflows")
    fails_with(check, lambda a, b, c: torch.logsumexp(a + b - c, dim=0), "subtract log K")
    fails_with(check, lambda a, b, c: (a + b - c).mean(0), "that is the ELBO")
    fails_with(check, lambda a, b, c: iwae_ok(a, b, -c), "subtract log q")
    fails_with(check, lambda a, b, c: (a + b - c).max(0).values - math.log(a.shape[0]), "largest log-weight")
    fails_with(check, lambda a, b, c: torch.logsumexp(a + b - c, dim=1) - math.log(a.shape[1]), "batch axis")


# ---------------------------------------------------------------- every check, the same way
def kl_other(mu_q, logvar_q, mu_p, logvar_p):
    var_ratio = torch.exp(logvar_q - logvar_p)
    return ((var_ratio - 1 - (logvar_q - logvar_p) + (mu_q - mu_p) ** 2 * torch.exp(-logvar_p)) / 2).sum(dim=-1)


def kl_mc_other(mu_q, logvar_q, mu_p, logvar_p, eps):
    std_q, std_p = torch.exp(logvar_q / 2), torch.exp(logvar_p / 2)
    z = eps * std_q + mu_q
    log_ratio = (torch.log(std_p / std_q) - ((z - mu_q) / std_q) ** 2 / 2 + ((z - mu_p) / std_p) ** 2 / 2).sum(-1)
    return log_ratio.mean(dim=0)


def gauss_other(x, mean, log_sigma):
    d = x.shape[-1]
    return -0.5 * (((x - mean) * torch.exp(-log_sigma)) ** 2).sum(-1) - log_sigma.sum() - d * math.log(2 * math.pi) / 2


def bern_other(x, logits):
    return (x * logits - F.softplus(logits)).sum(-1)


def neg_elbo_other(x, mu, logvar, decode, eps):
    z = torch.exp(logvar / 2) * eps + mu
    recon = -F.binary_cross_entropy_with_logits(decode(z), x.expand(eps.shape[0], *x.shape), reduction="none").sum(-1)
    kl = 0.5 * (torch.exp(logvar) + mu * mu - 1 - logvar).sum(-1)
    return kl.mean() - recon.mean()


def iwae_other(log_px_given_z, log_pz, log_qz):
    log_w = log_px_given_z + log_pz - log_qz
    top = log_w.max(dim=0).values
    return top + torch.log(torch.exp(log_w - top).mean(dim=0))


CASES = {
    "kl": (gv.check_kl_diag_gaussians, kl_ok, kl_other),
    "kl_mc": (gv.check_kl_monte_carlo, kl_mc_ok, kl_mc_other),
    "gauss": (gv.check_gaussian_log_likelihood, gauss_ok, gauss_other),
    "bern": (gv.check_bernoulli_log_likelihood, bern_ok, bern_other),
    "neg_elbo": (gv.check_negative_elbo, neg_elbo_ok, neg_elbo_other),
    "iwae": (gv.check_iwae_bound, iwae_ok, iwae_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_a_right_answer_written_differently_passes(key, capsys):
    check, _, other = CASES[key]
    check(other)
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("key", list(CASES))
def test_quiet_prints_nothing_on_a_right_answer(key):
    check, ok, _ = CASES[key]
    quiet_passes(check, ok, seed=SEED)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(gv, CASES[key][0], CASES[key][1], monkeypatch, trials=6)


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


COURSE_SHORTCUTS = {
    "kl": (lambda mq, lq, mp, lp: vae.diag_gaussian_kl(mq, lq, mp, lp), "diag_gaussian_kl"),
    "kl_mc": (lambda mq, lq, mp, lp, eps: (vae.gaussian_log_prob(vae.reparameterize(mq, lq, eps), mq, lq / 2)
                                           - vae.gaussian_log_prob(vae.reparameterize(mq, lq, eps), mp, lp / 2)).mean(0),
              "vae.reparameterize"),
    "gauss": (lambda x, m, ls: vae.gaussian_log_prob(x, m, ls), "gaussian_log_prob"),
    "bern": (lambda x, l: vae.bernoulli_log_prob(x, l), "bernoulli_log_prob"),
    "neg_elbo": (gv._reference_negative_elbo, "_reference_negative_elbo"),
    "iwae": (gv._reference_iwae_bound, "_reference_iwae_bound"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_the_course_copy_is_forbidden(key):
    fn, fragment = COURSE_SHORTCUTS[key]
    fails_with(CASES[key][0], fn, fragment)


DISTRIBUTION_SHORTCUTS = {
    "kl": lambda mq, lq, mp, lp: kl_divergence(Normal(mq, (lq / 2).exp()), Normal(mp, (lp / 2).exp())).sum(-1),
    "kl_mc": lambda mq, lq, mp, lp, eps: (Normal(mq, (lq / 2).exp()).log_prob(mq + (lq / 2).exp() * eps)
                                          - Normal(mp, (lp / 2).exp()).log_prob(mq + (lq / 2).exp() * eps)).sum(-1).mean(0),
    "gauss": lambda x, m, ls: Normal(m, ls.exp()).log_prob(x).sum(-1),
}


@pytest.mark.parametrize("key", list(DISTRIBUTION_SHORTCUTS))
def test_torch_distributions_is_forbidden_where_the_exercise_says_by_hand(key):
    fails_with(CASES[key][0], DISTRIBUTION_SHORTCUTS[key], "torch.distributions")


# ---------------------------------------------------------------- exercise 7: the calibrated Gaussian decoder
from course_utils.checks import ForbiddenCall  # noqa: E402
from course_utils.grading import vae_calibrated as gvc  # noqa: E402
from _grading_helpers import fails, right_answers_pass  # noqa: E402


def calibrated_ok(x, mean, mu, logvar):
    D = x.shape[-1]
    sigma2 = ((x - mean) ** 2).mean()
    kl = 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(-1)
    return kl.mean() + 0.5 * D * (1.0 + math.log(2 * math.pi) + torch.log(sigma2))


def calibrated_other(x, mean, mu, logvar):
    """Plug sigma* into the full Gaussian log-likelihood, term by term, without simplifying."""
    log_sigma = 0.5 * torch.log(torch.square(mean - x).mean())  # F.mse_loss is refused (aten::mse_loss)
    nll = (0.5 * ((x - mean) / log_sigma.exp()) ** 2 + log_sigma + 0.5 * math.log(2 * math.pi)).sum(-1)
    kl = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(-1)
    return (kl + nll).sum() / x.shape[0]


def test_calibrated_right_answers_pass_and_the_stub_is_not_attempted(capsys):
    right_answers_pass(gv.check_calibrated_negative_elbo, calibrated_ok, calibrated_other, capsys, trials=8)


def test_calibrated_every_listed_mistake_is_named(monkeypatch):
    each_mistake_is_named(gvc, gv.check_calibrated_negative_elbo, calibrated_ok, monkeypatch, trials=5)


def test_calibrated_a_fixed_sigma_or_a_hard_coded_answer_fails():
    def fixed_sigma(x, mean, mu, logvar):  # sigma = 0.1 by hand, as in the lesson
        kl = 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(-1)
        nll = (0.5 * ((x - mean) / 0.1) ** 2 + math.log(0.1) + 0.5 * math.log(2 * math.pi)).sum(-1)
        return (kl + nll).mean()

    fails(gv.check_calibrated_negative_elbo, fixed_sigma, "calibrated_negative_elbo")
    table = {}

    def hard_coded(*args):
        table.setdefault("out", calibrated_ok(*args))
        return table["out"]

    fails(gv.check_calibrated_negative_elbo, hard_coded, "calibrated_negative_elbo")


def test_calibrated_shortcuts_are_forbidden():
    def with_course(x, mean, mu, logvar):
        log_sigma = 0.5 * torch.log(((x - mean) ** 2).mean())
        return (vae.diag_gaussian_kl(mu, logvar) - vae.gaussian_log_prob(x, mean, log_sigma)).mean()

    def with_nll_loss(x, mean, mu, logvar):
        var = ((x - mean) ** 2).mean().expand_as(x)
        nll = F.gaussian_nll_loss(mean, x, var, full=True, reduction="sum") / x.shape[0]
        return 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(-1).mean() + nll

    for fn in (with_course, with_nll_loss, lambda *a: gvc._reference_calibrated_negative_elbo(*a)):
        with pytest.raises(ForbiddenCall):
            gv.check_calibrated_negative_elbo(fn, seed=SEED, trials=2)


# ---------------------------------------------------------------- BY_HAND_* wired: the operator-level watch
def test_gaussian_nll_loss_under_an_alias_is_refused_and_the_right_answer_passes():
    nll = F.gaussian_nll_loss  # held under another name: refused by identity, whatever the name

    def via_library(x, mean, log_sigma):
        var = (2 * log_sigma).exp().expand_as(x)
        return -nll(mean, x, var, full=True, reduction="none").sum(-1)

    fails(gv.check_gaussian_log_likelihood, via_library, "gaussian_nll_loss")
    gv.check_gaussian_log_likelihood(gauss_ok, seed=SEED, trials=2)


def test_negative_elbo_allows_the_named_lesson_helper_and_refuses_the_others():
    def with_lesson_kl(x, mu, logvar, decode, eps):  # vae.diag_gaussian_kl is not among the prompt's allowed helpers
        z = mu + (0.5 * logvar).exp() * eps
        return (vae.diag_gaussian_kl(mu, logvar) - vae.bernoulli_log_prob(x, decode(z)).mean(0)).mean()

    with pytest.raises(ForbiddenCall) as info:
        gv.check_negative_elbo(with_lesson_kl, seed=SEED, trials=2)
    assert "course_utils.vae.diag_gaussian_kl" in str(info.value) and "\n" not in str(info.value)

    def with_allowed_bernoulli(x, mu, logvar, decode, eps):  # the prompt lets the learner call vae.bernoulli_log_prob
        z = mu + (0.5 * logvar).exp() * eps
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(-1)
        return (kl - vae.bernoulli_log_prob(x, decode(z)).mean(0)).mean()

    gv.check_negative_elbo(with_allowed_bernoulli, seed=SEED, trials=2)


def test_calibrated_elbo_mse_loss_is_refused():
    def via_mse(x, mean, mu, logvar):
        kl = 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(-1)
        return kl.mean() + 0.5 * x.shape[-1] * (1.0 + math.log(2 * math.pi) + torch.log(F.mse_loss(mean, x)))

    fails(gvc.check_calibrated_negative_elbo, via_mse, "aten::mse_loss")
