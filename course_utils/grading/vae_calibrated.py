"""Exercise 7 of the VAE problem set (``solutions/10_vae.ipynb``): the negative ELBO with a *calibrated* Gaussian
decoder, whose shared variance is set to its maximum-likelihood value for the batch (Rybkin, Daniilidis and Levine,
2021, "Simple and Effective VAE Training with Calibrated Decoders"). The learner derives the optimal
:math:`\\sigma^2` and what the Gaussian log-likelihood becomes there; lesson 10 fixed :math:`\\sigma` by hand.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function

LOG_2PI = math.log(2 * math.pi)
_LESSON = ("course_utils.vae",)  # lesson modules refused by hand (course_utils.vae_* too)
BY_HAND_CALIBRATED_NEGATIVE_ELBO = {"modules": _LESSON,
    "allowed_ops": ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.pow", "aten.exp", "aten.log", "aten.sum",
                    "aten.mean", "aten.square"),
    "whole_result_ops": ("aten.mse_loss",),  # F.gaussian_nll_loss is composite Python: refused by name below
}


def _calibrated(x, mean, mu, logvar, *, sigma2="shared", constant=True, kl=True, batch="mean", log_of="var"):
    sq = (x - mean) ** 2                                                # (B, D)
    if sigma2 == "shared":
        s2 = sq.mean().expand_as(sq)
    elif sigma2 == "pixel":
        s2 = sq.mean(0, keepdim=True).expand_as(sq)
    else:                                                               # one sigma per data point
        s2 = sq.mean(1, keepdim=True).expand_as(sq)
    log_s2 = torch.log(s2) if log_of == "var" else 2 * torch.log(s2)    # 'std': the variance used as sigma
    nll = (0.5 * sq / s2 * (1.0 if constant else 0.0) + 0.5 * log_s2 + 0.5 * LOG_2PI).sum(-1)        # (B,)
    kl_term = 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(-1) if kl else 0.0
    per_point = kl_term + nll
    return per_point.mean() if batch == "mean" else per_point.sum()


def _reference_calibrated_negative_elbo(x, mean, mu, logvar):
    return _calibrated(x, mean, mu, logvar)


def _inputs(rng):
    b, d, k = int(rng.integers(4, 60)), int(rng.integers(6, 80)), int(rng.integers(2, 7))
    x = torch.from_numpy(rng.uniform(0, 1, (b, d)))
    noise = rng.uniform(0.02, 0.3) * rng.uniform(0.2, 3.0, (1, d)) * rng.uniform(0.3, 2.0, (b, 1))
    mean = x + torch.from_numpy(noise * rng.standard_normal((b, d)))   # errors vary by pixel and by point
    mu = torch.from_numpy(rng.standard_normal((b, k)))
    logvar = torch.from_numpy(rng.uniform(-3.0, 0.5, (b, k)))
    return x, mean, mu, logvar


def check_calibrated_negative_elbo(fn: Callable, *, trials: int = 5, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``fn(x, mean, mu, logvar) -> 0-d tensor``, -ELBO with sigma^2 at its batch optimum."""

    def variant(**kw):
        return lambda *args: _calibrated(*args, **kw)

    check_function(
        fn, _reference_calibrated_negative_elbo, _inputs, name="calibrated_negative_elbo", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_CALIBRATED_NEGATIVE_ELBO),
        n=4800,
        mistakes=[
            Mistake("per_pixel", "one sigma is shared by every pixel and data point: sigma^2 = the mean of (x - mean)^2 "
                    "over the whole batch and all pixels, not one per pixel.", variant(sigma2="pixel")),
            Mistake("per_point", "one sigma is shared by the whole batch: average (x - mean)^2 over the data points "
                    "too, not per data point.", variant(sigma2="point")),
            Mistake("var_as_std", "the optimum is a variance, sigma^2 = mean squared error; log sigma = 1/2 log(MSE), "
                    "not log(MSE).", variant(log_of="std")),
            Mistake("no_quadratic", "at the optimum the quadratic term is not zero: sum_i (x_i - m_i)^2 / (2 sigma^2) "
                    "averages to D/2 per data point.", variant(constant=False)),
            Mistake("no_kl", "the loss is -ELBO: add KL(q(z|x) || N(0, I)) (closed form) to the reconstruction term.",
                    variant(kl=False)),
            Mistake("sum_batch", "average over the batch (the loss is per data point), do not sum.", variant(batch="sum")),
        ],
        forbidden=("torch.distributions.kl.kl_divergence", "torch.distributions.Normal.log_prob",
                   "torch.nn.functional.gaussian_nll_loss", "course_utils.vae.gaussian_log_prob",
                   "course_utils.vae.diag_gaussian_kl",
                   "course_utils.grading.vae_calibrated._reference_calibrated_negative_elbo",
                   "course_utils.grading.vae_calibrated._calibrated"), quiet=quiet,
    )


__all__ = ["check_calibrated_negative_elbo"]
