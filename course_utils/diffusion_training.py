r"""The noise-prediction network of lesson 11, its training loop, the 2-D training data and its exact density.

Used by ``notebooks/11_ddpm_ddim.ipynb`` (section 3, which writes the loss, eq. 5, first) and by later
lessons that need a trained denoiser. The schedules and :func:`~course_utils.diffusion.q_sample` are in
:mod:`course_utils.diffusion`. :func:`moons_mixture` writes the moons data as a Gaussian mixture
(:class:`DiagMixture`) with an exact density and score: lesson 11 measures the true NLL with it, lesson 12
(:mod:`course_utils.score_sde`, which re-exports both) its exact scores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .bench import single_thread
from .diffusion import Schedule, cosine_schedule, linear_schedule, q_sample

__all__ = ["timestep_embedding", "TimeMLP", "DenoiserConfig", "CPU_PRESET", "train_denoiser", "make_data", "DiagMixture",
           "moons_mixture"]


def timestep_embedding(t: torch.Tensor, dim: int, T: int) -> torch.Tensor:
    """Sinusoidal features of the timestep: (B,) ints -> (B, dim), frequencies from 1 to ~T/2π."""
    half = dim // 2
    freqs = torch.exp(-math.log(T) * torch.arange(half, dtype=torch.float32) / half)  # (half,)
    angles = t.float().unsqueeze(-1) * freqs  # (B, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (B, dim)


class TimeMLP(nn.Module):
    """Noise predictor for low-dimensional data: MLP on [x, embedding(t)] with SiLU activations."""

    def __init__(self, dim: int = 2, hidden: int = 128, depth: int = 3, emb_dim: int = 32, T: int = 1000):
        super().__init__()
        self.emb_dim, self.T = emb_dim, T
        layers, width = [], dim + emb_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x, timestep_embedding(t, self.emb_dim, self.T)], dim=-1)  # (B, dim + emb_dim)
        return self.net(h)  # (B, dim)


@dataclass(frozen=True)
class DenoiserConfig:
    """Everything that decides a training run, with the reason for each default."""

    T: int = 1000  # diffusion steps; 1000 as in DDPM, so the linear schedule ends near pure noise
    schedule: str = "linear"  # "linear" or "cosine"
    hidden: int = 128  # MLP width: enough for a 2-D density with thin features (moons)
    depth: int = 3  # hidden layers
    emb_dim: int = 32  # sinusoidal timestep features
    batch_size: int = 512  # averages the very noisy per-sample loss (256 gave visibly worse samples)
    steps: int = 4000  # optimizer steps; the CPU preset trains in ~12 s on one core
    lr: float = 3e-3  # Adam; decayed to 0 with a cosine so the final model is not jittery
    seed: int = 0  # seeds the initialization, the batches, the timesteps and the noise

    def make_schedule(self) -> Schedule:
        if self.schedule == "linear":  # betas scaled by 1000/T, so any T ends near pure noise like T=1000
            return linear_schedule(self.T, 1e-4 * 1000 / self.T, 0.02 * 1000 / self.T)
        if self.schedule == "cosine":
            return cosine_schedule(self.T)
        raise ValueError(f"schedule must be 'linear' or 'cosine', not {self.schedule!r}")


CPU_PRESET = DenoiserConfig()


def train_denoiser(data: torch.Tensor, config: DenoiserConfig = CPU_PRESET, *, show_progress: bool = True):
    r"""Train a :class:`TimeMLP` with the DDPM loss (eq. 5) :math:`\|\epsilon - \epsilon_\theta(x_t, t)\|^2`.

    ``data`` is (N, D) float32. Returns ``(model, schedule, losses)`` with ``losses`` the per-step
    batch losses (a NumPy array). Deterministic for a given ``config.seed`` on a given machine.
    """
    from .progress import progress

    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)  # the initialization
    schedule = config.make_schedule()
    model = TimeMLP(data.shape[1], config.hidden, config.depth, config.emb_dim, config.T)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.steps)
    losses = np.empty(config.steps)
    steps = range(config.steps)
    with single_thread():
        _train_loop(model, opt, sched, schedule, data, config, gen, losses,
                    progress(steps, desc="training") if show_progress else steps)
    model.eval()
    return model, schedule, losses


def _train_loop(model, opt, sched, schedule, data, config, gen, losses, steps):
    for step in steps:
        idx = torch.randint(0, data.shape[0], (config.batch_size,), generator=gen)
        t = torch.randint(0, config.T, (config.batch_size,), generator=gen)
        noise = torch.randn(config.batch_size, data.shape[1], generator=gen)
        x_t = q_sample(schedule, data[idx], t, noise)  # eq. (4)
        loss = ((model(x_t, t) - noise) ** 2).mean()  # eq. (5)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses[step] = loss.item()


def make_data(n: int, *, kind: str = "moons", seed: int = 0) -> torch.Tensor:
    """2-D toy data, independent draws, standardized with fixed constants: (n, 2) float32.

    ``kind="moons"`` is the distribution of scikit-learn's ``make_moons(noise=0.05)`` (two half circles,
    Gaussian noise), but drawn i.i.d.: ``make_moons`` itself places its points at *evenly spaced* angles,
    so two of its samples share one skeleton and two-sample metrics between them come out biased
    (the unbiased MMD is then clearly negative). ``kind="swiss_roll"`` uses ``make_swiss_roll``, whose
    draws are already independent. The scaling constants are fixed, not estimated from the sample, so
    a training set and a held-out set are transformed identically.
    """
    rng = np.random.default_rng(seed)
    if kind == "moons":
        angle = rng.uniform(0.0, math.pi, n)
        upper = rng.random(n) < 0.5
        x = np.where(upper[:, None], np.stack([np.cos(angle), np.sin(angle)], 1),
                     np.stack([1 - np.cos(angle), 0.5 - np.sin(angle)], 1))  # (n, 2), make_moons' two arcs
        x = x + 0.05 * rng.standard_normal((n, 2))
        x = (x - np.array([0.5, 0.25])) / np.array([0.87, 0.5])
    elif kind == "swiss_roll":
        from sklearn.datasets import make_swiss_roll

        x, _ = make_swiss_roll(n, noise=0.3, random_state=seed)
        x = x[:, [0, 2]] / 7.5
    else:
        raise ValueError(f"kind must be 'moons' or 'swiss_roll', not {kind!r}")
    return torch.tensor(x, dtype=torch.float32)


# ---------------------------------------------------------------- the moons' exact density (lesson 12, eqs. 1-2)
@dataclass(frozen=True)
class DiagMixture:
    r"""``weights`` (K,), ``means`` (K, D), ``variances`` (K, D): :math:`p(x)=\sum_k w_k\,\mathcal N(x;\mu_k,\mathrm{diag}(v_k))`."""

    weights: torch.Tensor
    means: torch.Tensor
    variances: torch.Tensor

    @classmethod
    def of(cls, weights, means, variances) -> "DiagMixture":
        w = torch.as_tensor(weights, dtype=torch.float64)
        m = torch.as_tensor(means, dtype=torch.float64)
        v = torch.as_tensor(variances, dtype=torch.float64).expand_as(m).clone()
        return cls(w / w.sum(), m, v)

    def _log_joint(self, x: torch.Tensor) -> torch.Tensor:
        """log w_k + log N(x; mu_k, v_k): (n, D) -> (n, K), one coordinate at a time (no (n, K, D) temporary)."""
        out = (self.weights.log() - 0.5 * (2 * math.pi * self.variances).log().sum(-1)).expand(x.shape[0], -1).clone()
        for d in range(x.shape[1]):
            out -= 0.5 * (x[:, d, None] - self.means[None, :, d]) ** 2 / self.variances[None, :, d]  # (n, K)
        return out

    def log_prob(self, x) -> torch.Tensor:
        """log p(x), (n, D) -> (n,), float64."""
        return torch.logsumexp(self._log_joint(torch.as_tensor(x, dtype=torch.float64)), dim=-1)

    def score(self, x) -> torch.Tensor:
        r"""Eq. (2): :math:`\nabla\log p = \sum_k r_k(x)\,(\mu_k - x)/v_k`, responsibilities :math:`r_k`; (n, D), float64."""
        x = torch.as_tensor(x, dtype=torch.float64)
        r = torch.softmax(self._log_joint(x), dim=-1)  # (n, K)
        return r @ (self.means / self.variances) - x * (r @ (1.0 / self.variances))  # (n, D)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` independent draws, (n, D) float64."""
        k = torch.multinomial(self.weights, n, replacement=True, generator=generator)  # (n,)
        z = torch.randn(n, self.means.shape[1], generator=generator, dtype=torch.float64)
        return self.means[k] + self.variances[k].sqrt() * z

    def ve_noised(self, sigma: float) -> "DiagMixture":
        r"""The law of :math:`x + \sigma z`: every variance grows by :math:`\sigma^2`."""
        return DiagMixture(self.weights, self.means, self.variances + sigma**2)

    def vp_noised(self, alpha_bar: float) -> "DiagMixture":
        r"""The law of :math:`\sqrt{\bar\alpha}x + \sqrt{1-\bar\alpha}z` (lesson 11, eq. 4)."""
        return DiagMixture(self.weights, math.sqrt(alpha_bar) * self.means, alpha_bar * self.variances + 1.0 - alpha_bar)


def moons_mixture(n_angles: int = 200) -> DiagMixture:
    r"""The standardized two-moons law of :func:`make_data` as a mixture: its exact density and score (lessons 11, 12).

    Each arc point at angle :math:`\theta \sim U(0, \pi)` carries Gaussian noise of std 0.05 before the fixed
    standardization; the midpoint rule over ``n_angles`` angles per arc turns the integral over
    :math:`\theta` into ``2 * n_angles`` equally weighted diagonal Gaussians. With 200 angles the spacing
    along an arc (0.016) is a third of the noise std, where the midpoint rule of a Gaussian is exact to
    many digits.
    """
    theta = (torch.arange(n_angles, dtype=torch.float64) + 0.5) * math.pi / n_angles
    upper = torch.stack([theta.cos(), theta.sin()], 1)  # (n_angles, 2)
    lower = torch.stack([1 - theta.cos(), 0.5 - theta.sin()], 1)
    shift, scale = torch.tensor([0.5, 0.25], dtype=torch.float64), torch.tensor([0.87, 0.5], dtype=torch.float64)
    means = (torch.cat([upper, lower]) - shift) / scale  # (2 n_angles, 2)
    return DiagMixture.of(torch.ones(2 * n_angles), means, (0.05 / scale) ** 2)
