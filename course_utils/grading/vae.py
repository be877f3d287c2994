"""Checks of the VAE problem set (``solutions/10_vae.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference built from :mod:`course_utils.vae` and names the likely mistake. Exercises that say "by hand"
forbid ``torch.distributions`` (``kl_divergence``, ``Normal.log_prob``...) and the course's own copy.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, call_learner, check_function, fresh_seed
from ..classroom.released import AffineDecoder
from ..errors import CheckFailed
from ..vae import LOG_2PI, bernoulli_log_prob, diag_gaussian_kl, gaussian_log_prob, reparameterize

# For the by-hand watch (passed as by_hand=ByHand.of(BY_HAND_X); "allowed_ops" only documents):
# per exercise, the elementary aten ops it needs and the
# ones that compute the whole result. torch.distributions computes these in plain aten ops, so it stays refused
# by name (``forbidden=``) as well.
_ELEMENTWISE = ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.neg", "aten.pow", "aten.exp", "aten.log",
                "aten.sum", "aten.mean", "aten.sqrt", "aten.square", "aten.unsqueeze", "aten.expand", "aten.view")
_LESSON = ("course_utils.vae",)  # lesson modules refused by hand (course_utils.vae_* too)
BY_HAND_KL_DIAG_GAUSSIANS = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": ()}
BY_HAND_KL_MONTE_CARLO = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": ()}
# F.gaussian_nll_loss is composite Python (no aten packet of its own): refused by name.
BY_HAND_GAUSSIAN_LOG_LIKELIHOOD = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE, "whole_result_ops": (),
                                   "names": ("torch.nn.functional.gaussian_nll_loss",)}
BY_HAND_BERNOULLI_LOG_LIKELIHOOD = {"modules": _LESSON,
                                    "allowed_ops": _ELEMENTWISE + ("aten.log_sigmoid_forward", "aten.softplus"),
                                    "whole_result_ops": ("aten.binary_cross_entropy_with_logits",
                                                         "aten.binary_cross_entropy")}
BY_HAND_NEGATIVE_ELBO = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE + ("aten.log_sigmoid_forward", "aten.softplus"),
                         "whole_result_ops": (),
                         "allow": ("course_utils.vae.bernoulli_log_prob",)}  # the prompt lets the learner call it
BY_HAND_IWAE_BOUND = {"modules": _LESSON, "allowed_ops": _ELEMENTWISE + ("aten.logsumexp", "aten.amax", "aten.max"),
                      "whole_result_ops": ()}

_DISTRIBUTIONS = ("torch.distributions.kl_divergence", "torch.distributions.Normal.log_prob",
                  "torch.distributions.Independent.log_prob", "torch.distributions.MultivariateNormal.log_prob")

def _t(rng: np.random.Generator, *shape, scale: float = 1.0, loc: float = 0.0) -> torch.Tensor:
    return torch.from_numpy(loc + scale * rng.standard_normal(shape))  # float64


def _gauss_inputs(rng):
    b, d = int(rng.integers(3, 7)), int(rng.integers(2, 9))
    return _t(rng, b, d), _t(rng, b, d, scale=0.7), _t(rng, b, d, scale=0.5), _t(rng, b, d, scale=0.7)


# ---------------------------------------------------------------- exercise 1
def check_kl_diag_gaussians(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: KL(q || p) for two diagonal Gaussians given means and log-variances, ``(B, k) -> (B,)``."""

    def std_ratio(mq, lq, mp, lp):
        return 0.5 * (lp - lq + (torch.exp(0.5 * lq) + (mq - mp) ** 2) / torch.exp(0.5 * lp) - 1).sum(-1)

    def logvar_as_logstd(mq, lq, mp, lp):
        return diag_gaussian_kl(mq, 2 * lq, mp, 2 * lp)

    mistakes = [
        Mistake("reversed", "you computed KL(p || q): the first argument is q, so divide by p's variance and use "
                "log(var_p / var_q).", lambda mq, lq, mp, lp: diag_gaussian_kl(mp, lp, mq, lq)),
        Mistake("no_half", "your KL is twice the right one: the bracket is multiplied by 1/2.",
                lambda *a: 2 * diag_gaussian_kl(*a)),
        Mistake("negated", "your KL is negative: it is 0.5 * (log var_p - log var_q + (var_q + dmu^2)/var_p - 1), "
                "which is never below 0; check the signs.", lambda *a: -diag_gaussian_kl(*a)),
        Mistake("mean_dims", "you averaged over the latent dimensions; a KL between product distributions is the "
                "SUM of the per-dimension KLs.", lambda *a: diag_gaussian_kl(*a) / a[0].shape[-1]),
        Mistake("per_dim", "you returned one KL per dimension, shape (B, k); sum over the last axis.",
                lambda *a: diag_gaussian_kl(*(t.unsqueeze(-1) for t in a))),
        Mistake("std", "you used standard deviations exp(logvar/2) where the formula needs variances exp(logvar).",
                std_ratio),
        Mistake("logstd", "you treated the inputs as log standard deviations; they are log-variances: "
                "var = exp(logvar), not exp(2 * logvar).", logvar_as_logstd),
        Mistake("no_minus_one", "you forgot the -1 inside the bracket (KL(q || q) must be 0).",
                lambda *a: diag_gaussian_kl(*a) + 0.5 * a[0].shape[-1]),
        Mistake("log_ratio_flipped", "the log term is log(var_p / var_q) = logvar_p - logvar_q; you flipped it.",
                lambda mq, lq, mp, lp: diag_gaussian_kl(mq, lq, mp, lp) + (lq - lp).sum(-1)),
    ]
    check_function(fn, diag_gaussian_kl, _gauss_inputs, name="kl_diag_gaussians", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_KL_DIAG_GAUSSIANS),
                   mistakes=mistakes, forbidden=(*_DISTRIBUTIONS, "course_utils.vae.diag_gaussian_kl"), quiet=quiet)


# ---------------------------------------------------------------- exercise 2
def _log_normal(z, mu, logvar):
    """log N(z; mu, diag e^logvar) summed over the last axis."""
    return (-0.5 * (z - mu) ** 2 / torch.exp(logvar) - 0.5 * logvar - 0.5 * LOG_2PI).sum(-1)


def _reference_kl_monte_carlo(mu_q, logvar_q, mu_p, logvar_p, eps):
    z = reparameterize(mu_q, logvar_q, eps)  # (S, B, k)
    return (_log_normal(z, mu_q, logvar_q) - _log_normal(z, mu_p, logvar_p)).mean(0)  # (B,)


def check_kl_monte_carlo(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: Monte Carlo KL(q || p) from reparameterized samples z = mu_q + sigma_q * eps, eps ``(S, B, k)``.

    After the exact comparison it estimates one KL with many samples and checks that it agrees with
    the closed form within five standard errors.
    """

    def make_inputs(rng):
        mq, lq, mp, lp = _gauss_inputs(rng)
        return mq, lq, mp, lp, _t(rng, int(rng.integers(5, 12)), *mq.shape)

    def with_z(make_z):
        def wrong(mq, lq, mp, lp, eps):
            z = make_z(mq, lq, eps)
            return (_log_normal(z, mq, lq) - _log_normal(z, mp, lp)).mean(0)
        return wrong

    mistakes = [
        Mistake("var_scale", "your samples are mu + exp(logvar) * eps: scale eps by the standard deviation "
                "exp(logvar / 2).", with_z(lambda m, l, e: m + torch.exp(l) * e)),
        Mistake("logvar_scale", "your samples are mu + logvar * eps: scale eps by the standard deviation "
                "exp(logvar / 2).", with_z(lambda m, l, e: m + l * e)),
        Mistake("no_shift", "your samples are sigma * eps: add the mean, z = mu_q + sigma_q * eps.",
                with_z(lambda m, l, e: torch.exp(0.5 * l) * e)),
        Mistake("sign", "you averaged log p(z) - log q(z); KL(q || p) averages log q(z) - log p(z) over z ~ q.",
                lambda *a: -_reference_kl_monte_carlo(*a)),
        Mistake("sum_samples", "you summed over the S samples; a Monte Carlo estimate AVERAGES them (axis 0).",
                lambda *a: _reference_kl_monte_carlo(*a) * a[-1].shape[0]),
        Mistake("mean_dims", "you averaged the log-densities over the latent dimensions; sum them (the densities "
                "of independent coordinates multiply).", lambda *a: _reference_kl_monte_carlo(*a) / a[0].shape[-1]),
        Mistake("closed_form", "you returned the closed form; this exercise estimates the KL from the samples eps.",
                lambda mq, lq, mp, lp, eps: diag_gaussian_kl(mq, lq, mp, lp)),
        Mistake("samples_from_p", "your samples come from p; the KL(q || p) expectation is over z ~ q: "
                "z = mu_q + exp(logvar_q / 2) * eps.", lambda mq, lq, mp, lp, eps: (
                    _log_normal(reparameterize(mp, lp, eps), mq, lq) - _log_normal(reparameterize(mp, lp, eps), mp, lp)).mean(0)),
    ]
    seed = fresh_seed(seed)
    forbidden = (*_DISTRIBUTIONS, "course_utils.vae.diag_gaussian_kl", "course_utils.vae.gaussian_log_prob",
                 "course_utils.grading.vae._reference_kl_monte_carlo")
    check_function(fn, _reference_kl_monte_carlo, make_inputs, name="kl_monte_carlo", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_KL_MONTE_CARLO),
                   mistakes=mistakes, forbidden=forbidden, quiet=True)
    # Closed form vs Monte Carlo with many samples.
    rng = np.random.default_rng([seed, 77])
    mq, lq, mp, lp = (t[:2, :3] for t in _gauss_inputs(np.random.default_rng([seed, 78])))
    eps = _t(rng, 20000, *mq.shape)  # (S, B, k) with B <= 2, k <= 3
    estimate = call_learner("kl_monte_carlo", fn, (mq, lq, mp, lp, eps), forbidden=forbidden)
    z = reparameterize(mq, lq, eps)
    spread = (_log_normal(z, mq, lq) - _log_normal(z, mp, lp)).std(0) / math.sqrt(eps.shape[0])  # (B,)
    closed = diag_gaussian_kl(mq, lq, mp, lp)
    worst = float(((torch.as_tensor(estimate) - closed).abs() / spread).max())
    if not worst < 5:
        raise CheckFailed(f"kl_monte_carlo: with 20000 samples your estimate is {worst:.3g} standard errors from the "
                          "closed form; check that the samples come from q.")
    if not quiet:
        print(f"✅ kl_monte_carlo: matches the reference on {trials} random inputs, and with 20000 samples it agrees with "
              "the closed form within 5 standard errors.")


# ---------------------------------------------------------------- exercise 3
def check_gaussian_log_likelihood(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: the Gaussian decoder's log p(x|z) = log N(x; mean, diag sigma^2), ``(B, D) -> (B,)``, ``log_sigma`` ``(D,)``."""

    def make_inputs(rng):
        b, d = int(rng.integers(3, 7)), int(rng.integers(4, 17))
        x = torch.from_numpy(rng.uniform(0, 1, (b, d)))
        mean = torch.from_numpy(rng.uniform(0, 1, (b, d)))
        return x, mean, _t(rng, d, scale=0.5, loc=-1.0)

    mistakes = [
        Mistake("no_const", "you left out the constant -0.5 * log(2 pi) per dimension: it does not change the "
                "gradients, but a log-likelihood (and the ELBO) must include it.",
                lambda x, m, ls: gaussian_log_prob(x, m, ls) + 0.5 * LOG_2PI * x.shape[-1]),
        Mistake("no_half", "the squared term is -0.5 * ((x - mean) / sigma)^2; you dropped the 1/2.",
                lambda x, m, ls: gaussian_log_prob(x, m, ls) - 0.5 * (((x - m) / ls.exp()) ** 2).sum(-1)),
        Mistake("sigma_not_var", "you divided the squared error by sigma instead of sigma^2 = exp(2 * log_sigma).",
                lambda x, m, ls: (-0.5 * (x - m) ** 2 / ls.exp() - ls - 0.5 * LOG_2PI).sum(-1)),
        Mistake("as_logvar", "you treated log_sigma as a log-variance; it is the log standard deviation, so "
                "sigma^2 = exp(2 * log_sigma) and the normalizer is -log_sigma.",
                lambda x, m, ls: gaussian_log_prob(x, m, 0.5 * ls)),
        Mistake("no_log_sigma", "you left out the normalizer -log(sigma) per dimension; without it a smaller "
                "sigma could never be penalized.", lambda x, m, ls: gaussian_log_prob(x, m, ls) + ls.sum() + 0 * x.sum(-1)),
        Mistake("mean_dims", "you averaged over the pixels; the log-likelihood of independent pixels is the SUM "
                "of their log-densities.", lambda x, m, ls: gaussian_log_prob(x, m, ls) / x.shape[-1]),
        Mistake("sq_error_only", "that is -0.5 * squared error only: divide by sigma^2 and add -log(sigma) - "
                "0.5 * log(2 pi) per pixel.", lambda x, m, ls: -0.5 * ((x - m) ** 2).sum(-1)),
        Mistake("negated", "you returned the negative log-likelihood (a loss); return log p(x|z) itself.",
                lambda *a: -gaussian_log_prob(*a)),
    ]
    check_function(fn, gaussian_log_prob, make_inputs, name="gaussian_log_likelihood", trials=trials,
                   by_hand=ByHand.of(BY_HAND_GAUSSIAN_LOG_LIKELIHOOD),
                   seed=seed, mistakes=mistakes, forbidden=(*_DISTRIBUTIONS, "course_utils.vae.gaussian_log_prob"), quiet=quiet)


# ---------------------------------------------------------------- exercise 4
def check_bernoulli_log_likelihood(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: the Bernoulli decoder's log p(x|z) from logits, ``(B, D) -> (B,)``, stable for large logits."""

    def make_inputs(rng, scale=2.0, dtype=torch.float64):
        b, d = int(rng.integers(3, 7)), int(rng.integers(4, 17))
        x = torch.from_numpy(rng.uniform(0, 1, (b, d))).to(dtype)
        x[0, :2] = torch.tensor([0.0, 1.0], dtype=dtype)  # exact 0 and 1 pixels, as in the digits
        return x, _t(rng, b, d, scale=scale).to(dtype)

    mistakes = [
        Mistake("bce", "you returned the binary cross-entropy (a loss); the log-likelihood is its negative.",
                lambda x, l: -bernoulli_log_prob(x, l)),
        Mistake("mean_dims", "you averaged over the pixels; sum their log-probabilities.",
                lambda x, l: bernoulli_log_prob(x, l) / x.shape[-1]),
        Mistake("no_zero_term", "you only kept x * log(p); the pixels' (1 - x) * log(1 - p) term is missing.",
                lambda x, l: (x * F.logsigmoid(l)).sum(-1)),
        Mistake("probs", "you passed probabilities where logits belong (sigmoid applied twice?); the input is "
                "logits: log p = logsigmoid(l), log(1 - p) = logsigmoid(-l).",
                lambda x, l: bernoulli_log_prob(x, torch.sigmoid(l))),
    ]
    seed = fresh_seed(seed)
    forbidden = ("torch.distributions.Bernoulli.log_prob", "torch.distributions.ContinuousBernoulli.log_prob",
                 "course_utils.vae.bernoulli_log_prob")
    check_function(fn, bernoulli_log_prob, make_inputs, name="bernoulli_log_likelihood", trials=trials,
                   by_hand=ByHand.of(BY_HAND_BERNOULLI_LOG_LIKELIHOOD),
                   seed=seed, mistakes=mistakes, forbidden=forbidden, quiet=True)
    # Large logits in float32: sigmoid rounds to exactly 0 or 1 and log(0) appears in a naive version.
    rng = np.random.default_rng([seed, 5])
    x, logits = make_inputs(rng, scale=40.0, dtype=torch.float32)
    got = call_learner("bernoulli_log_likelihood", fn, (x.clone(), logits.clone()), forbidden=forbidden)
    want = bernoulli_log_prob(x, logits)
    finite = isinstance(got, torch.Tensor) and bool(torch.isfinite(got).all())
    if not finite or not torch.allclose(got.float(), want, rtol=1e-4, atol=1e-3):
        raise CheckFailed("bernoulli_log_likelihood: with float32 logits of size ~40 your result is "
                          f"{'not finite' if not finite else 'wrong'}: sigmoid rounds to 0 or 1, so compute "
                          "x * logsigmoid(l) + (1 - x) * logsigmoid(-l) (or -F.binary_cross_entropy_with_logits).")
    if not quiet:
        print(f"✅ bernoulli_log_likelihood: matches the reference on {trials} random inputs and stays exact for logits "
              "of size 40.")


# ---------------------------------------------------------------- exercise 5
def _reference_negative_elbo(x, mu, logvar, decode, eps):
    z = reparameterize(mu, logvar, eps)  # (S, B, k)
    recon = bernoulli_log_prob(x, decode(z)).mean(0)  # (S, B) -> (B,)
    return (diag_gaussian_kl(mu, logvar) - recon).mean()


def check_negative_elbo(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: the batch loss -ELBO with a Bernoulli decoder, S samples per digit, averaged over the batch."""

    def make_inputs(rng):
        b, k, d, s = int(rng.integers(3, 7)), int(rng.integers(2, 5)), int(rng.integers(6, 13)), int(rng.integers(3, 6))
        x = torch.from_numpy(rng.uniform(0, 1, (b, d)))
        return x, _t(rng, b, k), _t(rng, b, k, scale=0.5, loc=-0.5), AffineDecoder(rng, k, d), _t(rng, s, b, k)

    def terms(x, mu, logvar, decode, eps, z=None):
        z = reparameterize(mu, logvar, eps) if z is None else z
        return bernoulli_log_prob(x, decode(z)).mean(0), diag_gaussian_kl(mu, logvar)

    def variant(combine, z_fn=None):
        def wrong(x, mu, logvar, decode, eps):
            z = None if z_fn is None else z_fn(mu, logvar, eps)
            recon, kl = terms(x, mu, logvar, decode, eps, z)
            return combine(recon, kl, x)
        return wrong

    mistakes = [
        Mistake("elbo_not_loss", "you returned the ELBO; the loss to minimize is its negative, KL - E[log p(x|z)].",
                variant(lambda r, k, x: (r - k).mean())),
        Mistake("kl_sign", "the KL enters the loss with a plus sign: -ELBO = -E[log p(x|z)] + KL(q || p).",
                variant(lambda r, k, x: (-r - k).mean())),
        Mistake("no_kl", "the KL(q(z|x) || p(z)) term is missing; without it this is only a reconstruction loss.",
                variant(lambda r, k, x: (-r).mean())),
        Mistake("sum_batch", "you summed over the batch; average over it (the loss is per digit).",
                variant(lambda r, k, x: (k - r).sum())),
        Mistake("mean_pixels", "you averaged the reconstruction log-likelihood over the pixels; sum it, or the KL "
                "term is weighted D times too strongly.", variant(lambda r, k, x: (k - r / x.shape[-1]).mean())),
        Mistake("var_scale", "your samples are mu + exp(logvar) * eps; scale eps by the standard deviation exp(logvar / 2).",
                variant(lambda r, k, x: (k - r).mean(), lambda m, l, e: m + torch.exp(l) * e)),
        Mistake("decode_mu", "you decoded mu for every sample; decode the samples z = mu + exp(logvar / 2) * eps.",
                variant(lambda r, k, x: (k - r).mean(), lambda m, l, e: m + 0 * e)),
    ]
    check_function(fn, _reference_negative_elbo, make_inputs, name="negative_elbo", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_NEGATIVE_ELBO),
                   mistakes=mistakes, forbidden=(*_DISTRIBUTIONS, "course_utils.grading.vae._reference_negative_elbo"),
                   quiet=quiet)


# ---------------------------------------------------------------- exercise 6
def _reference_iwae_bound(log_px_given_z, log_pz, log_qz):
    log_w = log_px_given_z + log_pz - log_qz  # (K, B)
    return torch.logsumexp(log_w, dim=0) - math.log(log_w.shape[0])  # (B,)


def _linear_gaussian_bound(bound_fn, x, k, noise_std, gen):
    """The learner's bound for the model z ~ N(0,1), x|z ~ N(z, s^2) with q(z|x) = N(x/2, 1) (deliberately poor)."""
    b = x.shape[0]
    z = x / 2 + torch.randn(k, b, generator=gen, dtype=torch.float64)  # (K, B)
    log_px_given_z = -0.5 * ((x - z) / noise_std) ** 2 - math.log(noise_std) - 0.5 * LOG_2PI
    log_pz = -0.5 * z**2 - 0.5 * LOG_2PI
    log_qz = -0.5 * (z - x / 2) ** 2 - 0.5 * LOG_2PI
    return bound_fn(log_px_given_z, log_pz, log_qz)


def check_iwae_bound(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False,
                     verbose: bool = True) -> None:
    """Exercise 6: the importance-weighted bound log (1/K) sum_k p(x, z_k) / q(z_k | x), ``(K, B) x 3 -> (B,)``.

    The inputs have log-likelihoods near -1000, so exponentiating them underflows. After the exact
    comparison, the bound is applied to a model whose log p(x) is known, and must rise toward it with K.
    ``quiet=True`` prints nothing; ``verbose=False`` prints the success line without the gaps for each K.
    """

    def make_inputs(rng):
        k, b = int(rng.integers(5, 12)), int(rng.integers(2, 5))
        return _t(rng, k, b, scale=3.0, loc=-1000.0), _t(rng, k, b, scale=1.0, loc=-3.0), _t(rng, k, b, scale=1.0, loc=-2.0)

    mistakes = [
        Mistake("no_log_k", "you forgot to subtract log K: the bound averages the K weights, it does not add them.",
                lambda *a: _reference_iwae_bound(*a) + math.log(a[0].shape[0])),
        Mistake("elbo", "you averaged the log-weights: that is the ELBO (K = 1 bound, averaged); the IWAE bound is "
                "the log of the AVERAGE weight, logsumexp(log_w, dim=0) - log K.", lambda a, b_, c: (a + b_ - c).mean(0)),
        Mistake("q_sign", "the weight is p(x|z) p(z) / q(z|x): subtract log q, do not add it.",
                lambda a, b_, c: _reference_iwae_bound(a, b_, -c)),
        Mistake("wrong_axis", "you reduced over the batch axis; the K samples lie along axis 0, so reduce over dim=0.",
                lambda a, b_, c: torch.logsumexp(a + b_ - c, dim=1) - math.log(a.shape[1])),
        Mistake("underflow", "your result is -inf/NaN for log-likelihoods near -1000: exp() underflows to 0; subtract "
                "the maximum first, or use torch.logsumexp(log_w, dim=0) - log K.",
                lambda a, b_, c: torch.log(torch.exp(a + b_ - c).mean(0))),
        Mistake("max_only", "you kept only the largest log-weight (minus log K); logsumexp adds log(sum exp(w - max)) to it.",
                lambda a, b_, c: (a + b_ - c).max(0).values - math.log(a.shape[0])),
    ]

    seed = fresh_seed(seed)
    forbidden = (*_DISTRIBUTIONS, "course_utils.grading.vae._reference_iwae_bound")
    check_function(fn, _reference_iwae_bound, make_inputs, name="iwae_bound", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_IWAE_BOUND),
                   mistakes=mistakes, forbidden=forbidden, quiet=True)
    # The bound tightens toward log p(x) as K grows, on a model with a known marginal. Fixed draws (the
    # exact comparison above already used fresh ones), so that the printed gaps are the same every run.
    noise_std = 0.5
    gen = torch.Generator().manual_seed(0)

    def bound(log_px_given_z, log_pz, log_qz):
        return call_learner("iwae_bound", fn, (log_px_given_z, log_pz, log_qz), forbidden=forbidden)

    x = torch.randn(400, generator=gen, dtype=torch.float64) * math.sqrt(1 + noise_std**2)  # x ~ p(x)
    log_px_each = -0.5 * x**2 / (1 + noise_std**2) - 0.5 * math.log(1 + noise_std**2) - 0.5 * LOG_2PI  # (400,)
    log_px = float(log_px_each.mean())
    ks = (1, 10, 100, 1000)
    gaps = [log_px_each - torch.as_tensor(_linear_gaussian_bound(bound, x, k, noise_std, gen)) for k in ks]  # (400,) each
    bounds = [log_px - float(gap.mean()) for gap in gaps]
    last_se = float(gaps[-1].std()) / math.sqrt(len(x))
    rising = all(lo < hi for lo, hi in zip(bounds[:3], bounds[1:3]))
    below = float(gaps[-1].mean()) > -4 * last_se - 1e-6  # a bound, up to Monte Carlo error
    if not (rising and below and float(gaps[-1].mean()) < 0.05):
        raise CheckFailed(f"iwae_bound: on a model with known log p(x) = {log_px:.3g} your bounds for K = {ks} are "
                          f"{[round(b, 3) for b in bounds]}; they should rise toward log p(x) and stay below it.")
    if quiet:
        return
    print(f"✅ iwae_bound: matches the reference on {trials} random inputs (log-likelihoods near -1000).")
    if verbose:
        print(f"   known log p(x) = {log_px:.3g} nats; gap log p(x) - your bound: " +
              ", ".join(f"K={k}: {float(gap.mean()):.2g}" for k, gap in zip(ks, gaps)))


__all__ = ["check_kl_diag_gaussians", "check_kl_monte_carlo", "check_gaussian_log_likelihood",
           "check_bernoulli_log_likelihood", "check_negative_elbo", "check_iwae_bound"]


# ---------------------------------------------------------------- exercise 7: a calibrated Gaussian decoder
from .vae_calibrated import check_calibrated_negative_elbo  # noqa: E402,F401
