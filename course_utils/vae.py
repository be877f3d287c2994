r"""Topic 10 (VAE): digits data, ELBO terms, the Gaussian VAE and its training loop.

Used by:

* ``notebooks/10_vae.ipynb`` -- derives the KL between diagonal Gaussians (lesson 10, eq. 6) and the
  Gaussian log-likelihood (eq. 7) on the ladder, asserts its by-hand rungs equal
  :func:`diag_gaussian_kl` and :func:`gaussian_log_prob`, then imports :func:`load_digits_01`,
  :class:`VAEConfig`, :class:`GaussianVAE` and :func:`train_vae` from here;
* ``solutions/10_vae.ipynb`` -- :func:`load_digits_01` and :func:`bernoulli_log_prob` (its checks live
  in :mod:`course_utils.grading.vae`);
* later generative lessons (11, 12) -- :func:`load_digits_01` (digits scaled to [0, 1]) and
  :func:`diag_gaussian_kl` can be imported from here instead of being written again.

Notation (lesson 10): data :math:`x \in [0,1]^{64}`, latent :math:`z \in \mathbb{R}^k`, prior
:math:`p(z) = \mathcal N(0, I)`, encoder :math:`q_\phi(z|x) = \mathcal N(\mu, \operatorname{diag} e^{\ell})`
with :math:`\ell` the log-variance, decoder :math:`p_\theta(x|z) = \mathcal N(m_\theta(z), \sigma^2 I)`.

.. math::

    \mathrm{ELBO}(x) = \mathbb E_{q}[\log p_\theta(x|z)] - \mathrm{KL}(q_\phi(z|x)\,\|\,p(z))
    \le \log p_\theta(x)

    \mathrm{KL}(\mathcal N(\mu_q, \sigma_q^2) \| \mathcal N(\mu_p, \sigma_p^2)) = \tfrac12 \sum_j
    \Big[\log\tfrac{\sigma_{p,j}^2}{\sigma_{q,j}^2} + \tfrac{\sigma_{q,j}^2 + (\mu_{q,j}-\mu_{p,j})^2}{\sigma_{p,j}^2} - 1\Big]
"""
from __future__ import annotations

import math
import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .bench import single_thread
from .progress import progress

__all__ = [
    "LOG_2PI",
    "Digits",
    "load_digits_01",
    "diag_gaussian_kl",
    "gaussian_log_prob",
    "bernoulli_log_prob",
    "reparameterize",
    "evaluate_neg_elbo",
    "VAEConfig",
    "GaussianVAE",
    "TrainingHistory",
    "train_vae",
]

LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------- data
@dataclass(frozen=True)
class Digits:
    """scikit-learn's 8x8 digits as float tensors in [0, 1], flattened to 64 pixels, split in two."""

    x_train: torch.Tensor  # (N_train, 64)
    y_train: torch.Tensor  # (N_train,) int64 labels 0..9
    x_test: torch.Tensor  # (N_test, 64)
    y_test: torch.Tensor  # (N_test,)


def load_digits_01(test_fraction: float = 0.2, seed: int = 0, dtype: torch.dtype = torch.float32) -> Digits:
    """The 1797 bundled digits (no download), pixels divided by 16 so they lie in [0, 1].

    The split is a seeded random permutation: the same ``seed`` always gives the same split.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = data.data / 16.0  # the raw pixels are integers 0..16
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test, train = order[:n_test], order[n_test:]
    as_x = lambda idx: torch.as_tensor(x[idx], dtype=dtype)  # noqa: E731
    as_y = lambda idx: torch.as_tensor(y[idx])  # noqa: E731
    return Digits(as_x(train), as_y(train), as_x(test), as_y(test))


# ---------------------------------------------------------------- ELBO terms
def _lib(x: Any):
    return torch if isinstance(x, torch.Tensor) else np


def diag_gaussian_kl(mu_q, logvar_q, mu_p=None, logvar_p=None):
    r"""KL(N(mu_q, diag e^logvar_q) || N(mu_p, diag e^logvar_p)), summed over the last axis (lesson 10, eq. 6).

    ``mu_p``/``logvar_p`` default to the standard normal prior. Works on NumPy arrays and torch
    tensors; ``(..., k) -> (...)``.
    """
    lib = _lib(mu_q)
    if mu_p is None:
        mu_p = lib.zeros_like(mu_q)
    if logvar_p is None:
        logvar_p = lib.zeros_like(logvar_q)
    ratio = (lib.exp(logvar_q) + (mu_q - mu_p) ** 2) / lib.exp(logvar_p)
    return 0.5 * (logvar_p - logvar_q + ratio - 1.0).sum(-1)


def gaussian_log_prob(x, mean, log_sigma):
    r"""log N(x; mean, diag sigma^2), summed over the last axis (lesson 10, eq. 7); ``log_sigma`` broadcasts.

    Per dimension: :math:`-\tfrac12 ((x-m)/\sigma)^2 - \log\sigma - \tfrac12\log 2\pi`.
    """
    lib = _lib(x)
    z = (x - mean) / lib.exp(log_sigma)
    return (-0.5 * z**2 - log_sigma - 0.5 * LOG_2PI).sum(-1)


def bernoulli_log_prob(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    r"""log Bernoulli(x; sigmoid(logits)) summed over the last axis, stable for any logits.

    :math:`x\log s + (1-x)\log(1-s) = x\,l - \operatorname{softplus}(l)` with :math:`s = \sigma(l)`;
    ``x`` may be any value in [0, 1] (the "continuous Bernoulli" without its normalizer); ``x`` and
    ``logits`` broadcast, e.g. ``(B, D)`` with ``(S, B, D) -> (S, B)``.
    """
    return (x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)).sum(-1)


def reparameterize(mu, logvar, eps):
    """z = mu + sigma * eps with sigma = exp(logvar / 2) (lesson 10, eq. 9); eps ~ N(0, I) broadcasts."""
    return mu + _lib(mu).exp(0.5 * logvar) * eps


# ---------------------------------------------------------------- the model
@dataclass(frozen=True)
class VAEConfig:
    """Everything that defines one training run, with the reason for each value."""

    latent_dim: int = 2  # 2 so the latent space *is* the map we plot; more dims reconstruct better
    hidden: int = 256  # two hidden layers of this width each side: enough for 64-pixel digits
    epochs: int = 100  # the test -ELBO stops improving around here; later epochs only overfit (lesson 10, sec. 5)
    batch_size: int = 128  # ~12 steps per epoch on 1438 training digits: cheap, still noisy enough
    lr: float = 2e-3  # Adam; larger makes the KL term oscillate early in training
    init_log_sigma: float = math.log(0.3)  # decoder noise std at the start: about the pixels' spread
    learn_sigma: bool = True  # learn one shared decoder std (its optimum is the RMS reconstruction error)
    seed: int = 0  # model initialization, shuffling and the noise eps all come from this seed
    threads: int | None = 1  # torch threads during training only (restored after); None keeps the current count.
    # The layers are too small to gain from threads, and on a busy 2-core machine 2 threads ran 10x slower
    # than 1 (they spin-wait for each other). The count in effect outside train_vae is never changed.

    @classmethod
    def cpu(cls) -> "VAEConfig":
        """The CPU preset: 6-7 s of training on a lightly loaded 2-core machine, up to ~25 s under load."""
        return cls()

    def with_(self, **changes) -> "VAEConfig":
        return replace(self, **changes)


class GaussianVAE(nn.Module):
    """MLP encoder x -> (mu, logvar), MLP decoder z -> mean in (0, 1), one learned decoder std."""

    def __init__(self, data_dim: int = 64, latent_dim: int = 2, hidden: int = 256,
                 init_log_sigma: float = math.log(0.3), learn_sigma: bool = True):
        super().__init__()
        self.latent_dim = latent_dim
        self.encoder = nn.Sequential(
            nn.Linear(data_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2 * latent_dim)
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, data_dim)
        )
        self.log_sigma = nn.Parameter(torch.tensor(float(init_log_sigma)), requires_grad=learn_sigma)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = self.encoder(x).chunk(2, dim=-1)  # (B, 2k) -> 2 x (B, k)
        return mu, logvar

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The decoder mean m(z), squashed into (0, 1) like the pixels: ``(..., k) -> (..., 64)``."""
        return torch.sigmoid(self.decoder(z))

    def elbo_terms(self, x: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One-sample estimate of E_q[log p(x|z)] and the exact KL(q || p(z)), each ``(B,)``."""
        mu, logvar = self.encode(x)  # (B, k) each
        z = reparameterize(mu, logvar, eps)  # (B, k)
        recon = gaussian_log_prob(x, self.decode(z), self.log_sigma)  # (B,)
        return recon, diag_gaussian_kl(mu, logvar)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, *, noise: bool = True) -> torch.Tensor:
        """``n`` draws from p(x) = E_z p(x|z): the decoder mean, plus sigma * N(0, I) when ``noise``."""
        z = torch.randn(n, self.latent_dim, generator=generator)
        mean = self.decode(z)
        if not noise:
            return mean
        return mean + self.log_sigma.exp() * torch.randn(mean.shape, generator=generator)


@dataclass
class TrainingHistory:
    """Per-epoch averages over the training digits (nats per digit) and the test negative ELBO."""

    recon: list[float] = field(default_factory=list)  # E_q log p(x|z), one sample, train
    kl: list[float] = field(default_factory=list)  # KL(q(z|x) || p(z)), train
    test_neg_elbo: list[float] = field(default_factory=list)  # -ELBO on the test digits
    sigma: list[float] = field(default_factory=list)  # decoder std after each epoch


@torch.no_grad()
def evaluate_neg_elbo(model: GaussianVAE, x: torch.Tensor, seed: int = 1) -> float:
    """Average -ELBO (nats per digit) over ``x`` with fixed noise, so epochs are comparable."""
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(x.shape[0], model.latent_dim, generator=gen)
    recon, kl = model.elbo_terms(x, eps)
    return float((kl - recon).mean())


def train_vae(config: VAEConfig, x_train: torch.Tensor, x_test: torch.Tensor | None = None, *,
              show_progress: bool = True) -> tuple[GaussianVAE, TrainingHistory]:
    """Train a :class:`GaussianVAE` with Adam on -ELBO (lesson 10, eq. 10); deterministic for a seed.

    The global torch RNG is left untouched: initialization runs under ``fork_rng`` and the
    shuffling and noise come from a private generator. ``config.threads`` applies inside this call only.
    """
    with single_thread(config.threads) if config.threads else contextlib.nullcontext():
        return _train(config, x_train, x_test, show_progress)


def _train(config, x_train, x_test, show_progress):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GaussianVAE(x_train.shape[1], config.latent_dim, config.hidden, config.init_log_sigma, config.learn_sigma)
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    history = TrainingHistory()
    n = x_train.shape[0]
    epochs = range(config.epochs)
    for _ in (progress(epochs, desc="train VAE") if show_progress else epochs):
        order = torch.randperm(n, generator=gen)
        sums = torch.zeros(2, dtype=torch.float64)
        for start in range(0, n, config.batch_size):
            x = x_train[order[start:start + config.batch_size]]  # (B, 64)
            eps = torch.randn(x.shape[0], config.latent_dim, generator=gen)  # (B, k)
            recon, kl = model.elbo_terms(x, eps)
            loss = (kl - recon).mean()  # -ELBO per digit
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums += torch.stack([recon.detach().sum(), kl.detach().sum()]).double()
        history.recon.append(float(sums[0]) / n)
        history.kl.append(float(sums[1]) / n)
        history.sigma.append(float(model.log_sigma.detach().exp()))
        if x_test is not None:
            history.test_neg_elbo.append(evaluate_neg_elbo(model, x_test, seed=config.seed + 1))
    model.eval()
    return model, history
