r"""Topic 11 (DDPM and DDIM): noise schedules, the forward process, a small noise-prediction network,
the DDPM and DDIM samplers, sample-quality metrics, and the problem set's checks.

Used by:

* ``notebooks/11_ddpm_ddim.ipynb`` -- derives every formula below (equation numbers refer to it),
  writes each step by hand, then imports them from here and checks them against diffusers'
  ``DDPMScheduler`` / ``DDIMScheduler``;
* ``solutions/11_ddpm_ddim.ipynb`` -- the ``check_*`` functions of its exercises;
* later lessons (12, score-based SDEs) -- the schedules, :func:`q_sample`, :class:`TimeMLP`,
  :func:`train_denoiser` and the metrics.

Conventions (the same as diffusers, so the two can be compared step by step): timesteps are
integers ``t = 0 .. T-1``; ``schedule.alpha_bar[t]`` is :math:`\bar\alpha_t = \prod_{s \le t}(1-\beta_s)`,
and the step *out of* the first index uses :math:`\bar\alpha_{-1} = 1` (clean data). Symbols:

=====================  ===========================  ======================================
symbol                 variable                      meaning
=====================  ===========================  ======================================
:math:`\beta_t`        ``schedule.betas[t]``         variance added by forward step t (eq. 1)
:math:`\alpha_t`       ``1 - betas[t]``              signal kept by forward step t
:math:`\bar\alpha_t`   ``schedule.alpha_bar[t]``     signal kept after steps 0..t (eq. 2)
SNR                    ``schedule.snr``              :math:`\bar\alpha_t / (1-\bar\alpha_t)`
:math:`\epsilon`       ``eps``                       the model's noise prediction
:math:`\eta`           ``eta``                       DDIM stochasticity: 0 deterministic, 1 DDPM
=====================  ===========================  ======================================
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .bench import single_thread
from .checks import Mistake, check_function

__all__ = [
    "Schedule",
    "linear_schedule",
    "cosine_schedule",
    "q_sample",
    "sampling_timesteps",
    "posterior_mean_variance",
    "predict_x0",
    "ddpm_step",
    "ddim_step",
    "sample",
    "single_thread",
    "TimeMLP",
    "TrainConfig",
    "CPU_PRESET",
    "train_denoiser",
    "make_data",
    "mmd_rbf",
    "sliced_wasserstein",
    "check_cosine_alpha_bar",
    "check_posterior",
    "check_ddim_update",
    "check_from_v_prediction",
    "check_ddpm_loss",
    "check_mmd",
]


# ---------------------------------------------------------------- schedules (lesson 11, eqs. 1-3)
@dataclass(frozen=True)
class Schedule:
    r"""A noise schedule: ``betas`` (T,) and ``alpha_bar`` (T,), float64 tensors."""

    betas: torch.Tensor
    alpha_bar: torch.Tensor

    @classmethod
    def from_betas(cls, betas: Any) -> "Schedule":
        betas = torch.as_tensor(betas, dtype=torch.float64)
        return cls(betas=betas, alpha_bar=torch.cumprod(1.0 - betas, dim=0))  # eq. (2)

    @property
    def T(self) -> int:
        return int(self.betas.shape[0])

    @property
    def alphas(self) -> torch.Tensor:
        return 1.0 - self.betas

    @property
    def snr(self) -> torch.Tensor:
        """Signal-to-noise ratio of x_t: alpha_bar / (1 - alpha_bar) (eq. 3)."""
        return self.alpha_bar / (1.0 - self.alpha_bar)

    def alpha_bar_at(self, t: int) -> float:
        """``alpha_bar[t]`` as a Python float, and 1.0 for ``t < 0`` (the clean end of the chain)."""
        return 1.0 if t < 0 else float(self.alpha_bar[t])


def linear_schedule(T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> Schedule:
    """Betas evenly spaced from ``beta_start`` to ``beta_end`` (Ho et al.; diffusers ``"linear"``)."""
    return Schedule.from_betas(torch.linspace(beta_start, beta_end, T, dtype=torch.float64))


def cosine_alpha_bar_fn(u: Any, s: float = 0.008):
    """The cosine schedule's continuous :math:`f(u) = \\cos^2(\\frac{u + s}{1 + s} \\frac{\\pi}{2})`, u in [0, 1]."""
    return np.cos((np.asarray(u, dtype=np.float64) + s) / (1 + s) * math.pi / 2) ** 2


def cosine_schedule(T: int = 1000, s: float = 0.008, max_beta: float = 0.999) -> Schedule:
    r"""Nichol and Dhariwal's cosine schedule (diffusers ``"squaredcos_cap_v2"``).

    :math:`\beta_t = \min(1 - f(\frac{t+1}{T}) / f(\frac{t}{T}), \beta_{max})`, so that without the cap
    :math:`\bar\alpha_t = f(\frac{t+1}{T}) / f(0)`. The cap keeps the last step from destroying
    everything at once (:math:`f(1) = 0`).
    """
    t = np.arange(T, dtype=np.float64)
    betas = np.minimum(1.0 - cosine_alpha_bar_fn((t + 1) / T, s) / cosine_alpha_bar_fn(t / T, s), max_beta)
    return Schedule.from_betas(betas)


def q_sample(schedule: Schedule, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    r"""Closed-form forward process (eq. 4): :math:`x_t = \sqrt{\bar\alpha_t}\,x_0 + \sqrt{1-\bar\alpha_t}\,\epsilon`.

    ``x0`` and ``noise`` are (B, D); ``t`` is (B,) integer timesteps.
    """
    ab = schedule.alpha_bar.to(x0.dtype)[t].unsqueeze(-1)  # (B, 1)
    return ab.sqrt() * x0 + (1.0 - ab).sqrt() * noise


def sampling_timesteps(T: int, n_steps: int) -> list[int]:
    """The ``n_steps`` timesteps a sampler visits, largest first ("trailing" spacing).

    ``round(arange(T, 0, -T/n)) - 1``: always starts at ``T-1`` (pure noise) and, for ``n_steps == T``,
    visits every step. The step after the last one goes to ``t = -1`` (clean data).
    Identical to diffusers' ``timestep_spacing="trailing"``.
    """
    if not 1 <= n_steps <= T:
        raise ValueError(f"n_steps must be between 1 and T={T}, got {n_steps}")
    return [int(t) for t in np.round(np.arange(T, 0, -T / n_steps)).astype(np.int64) - 1]


# ---------------------------------------------------------------- the reverse steps (eqs. 5-9)
def predict_x0(x_t, eps, alpha_bar_t: float):
    r"""Eq. (6): :math:`\hat x_0 = (x_t - \sqrt{1-\bar\alpha_t}\,\epsilon) / \sqrt{\bar\alpha_t}`."""
    return (x_t - math.sqrt(1.0 - alpha_bar_t) * eps) / math.sqrt(alpha_bar_t)


def posterior_mean_variance(x0, x_t, alpha_bar_t: float, alpha_bar_prev: float):
    r"""Mean and variance of :math:`q(x_{t'} \mid x_t, x_0)` for the jump from t to t' < t (eqs. 7-8).

    With :math:`\alpha = \bar\alpha_t / \bar\alpha_{t'}` and :math:`\beta = 1 - \alpha` (one DDPM step
    when t' = t-1), the mean is
    :math:`\frac{\sqrt{\bar\alpha_{t'}}\beta}{1-\bar\alpha_t} x_0 + \frac{\sqrt{\alpha}(1-\bar\alpha_{t'})}{1-\bar\alpha_t} x_t`
    and the variance :math:`\tilde\beta = \frac{1-\bar\alpha_{t'}}{1-\bar\alpha_t}\beta`.
    """
    alpha = alpha_bar_t / alpha_bar_prev
    beta = 1.0 - alpha
    coef_x0 = math.sqrt(alpha_bar_prev) * beta / (1.0 - alpha_bar_t)
    coef_xt = math.sqrt(alpha) * (1.0 - alpha_bar_prev) / (1.0 - alpha_bar_t)
    variance = (1.0 - alpha_bar_prev) / (1.0 - alpha_bar_t) * beta
    return coef_x0 * x0 + coef_xt * x_t, variance


def ddpm_step(schedule: Schedule, eps, t: int, t_prev: int, x_t, noise):
    r"""One DDPM ancestral step from t to t_prev (eq. 9): posterior mean at :math:`\hat x_0`, plus
    :math:`\sqrt{\tilde\beta}` times ``noise``. ``t_prev = -1`` means "to clean data" (variance 0)."""
    ab_t, ab_prev = schedule.alpha_bar_at(t), schedule.alpha_bar_at(t_prev)
    mean, variance = posterior_mean_variance(predict_x0(x_t, eps, ab_t), x_t, ab_t, ab_prev)
    return mean + math.sqrt(variance) * noise


def ddim_sigma(alpha_bar_t: float, alpha_bar_prev: float, eta: float) -> float:
    r"""Eq. (11): :math:`\sigma = \eta\sqrt{\frac{1-\bar\alpha_{t'}}{1-\bar\alpha_t}(1-\frac{\bar\alpha_t}{\bar\alpha_{t'}})}`."""
    return eta * math.sqrt((1.0 - alpha_bar_prev) / (1.0 - alpha_bar_t) * (1.0 - alpha_bar_t / alpha_bar_prev))


def ddim_step(schedule: Schedule, eps, t: int, t_prev: int, x_t, eta: float = 0.0, noise=None):
    r"""One DDIM step from t to t_prev (eq. 10):
    :math:`x_{t'} = \sqrt{\bar\alpha_{t'}}\hat x_0 + \sqrt{1-\bar\alpha_{t'}-\sigma^2}\,\epsilon + \sigma z`.
    ``eta = 0`` is deterministic (``noise`` unused); ``eta = 1`` is the DDPM step."""
    ab_t, ab_prev = schedule.alpha_bar_at(t), schedule.alpha_bar_at(t_prev)
    sigma = ddim_sigma(ab_t, ab_prev, eta)
    x_prev = math.sqrt(ab_prev) * predict_x0(x_t, eps, ab_t) + math.sqrt(max(1.0 - ab_prev - sigma**2, 0.0)) * eps
    if sigma > 0:
        x_prev = x_prev + sigma * noise
    return x_prev


@torch.no_grad()
def sample(model: Callable, schedule: Schedule, n_points: int, n_steps: int, *, method: str = "ddpm",
           eta: float = 0.0, seed: int = 0, dim: int = 2, keep: tuple[int, ...] = ()):
    """Generate ``n_points`` samples with ``n_steps`` model calls; ``method`` is ``"ddpm"`` or ``"ddim"``.

    ``model(x, t)`` maps (B, dim) float32 and (B,) int64 to the predicted noise (B, dim). The start
    noise and every step's noise come from one ``torch.Generator`` seeded with ``seed``.
    Returns the final (n_points, dim) tensor, or ``(final, {step_index: x})`` when ``keep`` names
    step indices (0 = the starting noise, i = after i steps) whose intermediate clouds to return.
    """
    if method not in ("ddpm", "ddim"):
        raise ValueError(f"method must be 'ddpm' or 'ddim', not {method!r}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_points, dim, generator=gen)
    steps = sampling_timesteps(schedule.T, n_steps)
    kept = {0: x.clone()} if 0 in keep else {}
    with single_thread():
        x = _sample_loop(model, schedule, x, steps, method, eta, gen, keep, kept)
    return (x, kept) if keep else x


def _sample_loop(model, schedule, x, steps, method, eta, gen, keep, kept):
    n_points = x.shape[0]
    for i, t in enumerate(steps):
        t_prev = steps[i + 1] if i + 1 < len(steps) else -1
        eps = model(x, torch.full((n_points,), t, dtype=torch.long))
        noise = torch.randn(x.shape, generator=gen)
        if method == "ddpm":
            x = ddpm_step(schedule, eps, t, t_prev, x, noise)
        else:
            x = ddim_step(schedule, eps, t, t_prev, x, eta, noise)
        if i + 1 in keep:
            kept[i + 1] = x.clone()
    return x


# ---------------------------------------------------------------- the network and its training
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
class TrainConfig:
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


CPU_PRESET = TrainConfig()


def train_denoiser(data: torch.Tensor, config: TrainConfig = CPU_PRESET, *, show_progress: bool = True):
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


# ---------------------------------------------------------------- sample-quality metrics
def _sq_dists(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances (n, D), (m, D) -> (n, m), one column of D at a time (no (n, m, D) temporary)."""
    out = torch.zeros(a.shape[0], b.shape[0], dtype=a.dtype)
    for d in range(a.shape[1]):
        out += (a[:, d, None] - b[None, :, d]) ** 2  # (n, m)
    return out


def mmd_rbf(a: Any, b: Any, bandwidths: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0)) -> float:
    r"""Unbiased squared maximum mean discrepancy between samples ``a`` (n, D) and ``b`` (m, D).

    Kernel: :math:`k(x, y) = \sum_\sigma \exp(-\|x-y\|^2 / (2\sigma^2))`. The unbiased estimator leaves
    the diagonal out of the within-sample means, so it is about 0 (and can be slightly negative) when
    both samples come from the same distribution.
    """
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    n, m = a.shape[0], b.shape[0]

    def k(x, y):
        d2 = _sq_dists(x, y)  # (len(x), len(y))
        return sum(torch.exp(d2 * (-0.5 / s**2)) for s in bandwidths)

    with single_thread():  # a few million exps: one thread is fast enough and immune to a loaded machine
        kaa, kbb, kab = k(a, a), k(b, b), k(a, b)
    within_a = (kaa.sum() - kaa.diagonal().sum()) / (n * (n - 1))
    within_b = (kbb.sum() - kbb.diagonal().sum()) / (m * (m - 1))
    return float(within_a + within_b - 2 * kab.mean())


def sliced_wasserstein(a: Any, b: Any, n_projections: int = 256, seed: int = 0) -> float:
    """Sliced 1-Wasserstein distance between two samples of the same size (n, D).

    Projects both onto ``n_projections`` random unit directions (fixed by ``seed``); in 1-D the
    Wasserstein-1 distance is the mean absolute difference of the sorted samples. Averages over directions.
    """
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"sliced_wasserstein needs samples of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    gen = torch.Generator().manual_seed(seed)
    dirs = torch.randn(a.shape[1], n_projections, generator=gen, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=0, keepdim=True)  # (D, P) unit columns
    pa, _ = torch.sort(a @ dirs, dim=0)  # (n, P)
    pb, _ = torch.sort(b @ dirs, dim=0)
    return float((pa - pb).abs().mean())


# ---------------------------------------------------------------- problem-set checks
def _random_alpha_bar(rng: np.random.Generator, T: int) -> np.ndarray:
    kind = rng.integers(2)
    sched = linear_schedule(T, 1e-4 * 1000 / T, 0.02 * 1000 / T) if kind == 0 else cosine_schedule(T)
    return sched.alpha_bar.numpy()


# Exercise 1: the cosine schedule's alpha_bar
def _ref_cosine_alpha_bar(T, s):
    return cosine_schedule(T, s).alpha_bar.numpy()


def check_cosine_alpha_bar(fn: Callable, *, trials: int = 3, seed: int = 0) -> None:
    """Exercise 1: ``fn(T, s) -> alpha_bar`` (T,) float64 of the capped cosine schedule."""

    def make_inputs(rng):
        return int(rng.integers(20, 400)), float(rng.choice([0.008, 0.02, 0.05]))

    def off_by_one(T, s):  # alpha_bar_t = f(t/T)/f(0): starts at exactly 1
        t = np.arange(T)
        return cosine_alpha_bar_fn(t / T, s) / cosine_alpha_bar_fn(0.0, s)

    def uncapped(T, s):
        t = np.arange(T)
        return cosine_alpha_bar_fn((t + 1) / T, s) / cosine_alpha_bar_fn(0.0, s)

    def no_square(T, s):
        t = np.arange(T, dtype=np.float64)
        f = lambda u: np.cos((u + s) / (1 + s) * math.pi / 2)  # noqa: E731
        betas = np.minimum(1 - f((t + 1) / T) / f(t / T), 0.999)
        return np.cumprod(1 - betas)

    def returns_betas(T, s):
        return cosine_schedule(T, s).betas.numpy()

    check_function(
        fn, _ref_cosine_alpha_bar, make_inputs, name="cosine_alpha_bar", trials=trials, seed=seed,
        mistakes=[
            Mistake("off_by_one", "your alpha_bar[0] is exactly 1: that is f(t/T)/f(0), one step late; timestep t "
                    "has already applied beta_0..beta_t, so use f((t+1)/T) / f(0) (through the capped betas).", off_by_one),
            Mistake("uncapped", "the last value is 0 because f(1) = 0: build betas = 1 - f((t+1)/T)/f(t/T), cap them "
                    "at max_beta=0.999, then alpha_bar = cumprod(1 - betas).", uncapped),
            Mistake("no_square", "f(u) is the cosine SQUARED: cos((u + s)/(1 + s) * pi/2) ** 2.", no_square),
            Mistake("betas", "you returned the betas; alpha_bar is the cumulative product of (1 - betas).", returns_betas),
        ],
    )


# Exercise 2: posterior mean and variance of q(x_{t-1} | x_t, x_0)
def _ref_posterior(x0, x_t, alpha_bar, t):
    ab_prev = alpha_bar[t - 1] if t > 0 else 1.0
    return posterior_mean_variance(x0, x_t, float(alpha_bar[t]), float(ab_prev))


def _posterior_inputs(rng):
    T = int(rng.integers(50, 300))
    alpha_bar = _random_alpha_bar(rng, T)
    n = int(rng.integers(3, 9))
    return (rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), alpha_bar, int(rng.integers(1, T)))


def check_posterior(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 2: ``fn(x0, x_t, alpha_bar, t) -> (mean, variance)`` of q(x_{t-1} | x_t, x_0)."""

    def std_not_var(x0, x_t, ab, t):
        mean, var = _ref_posterior(x0, x_t, ab, t)
        return mean, math.sqrt(var)

    def beta_as_variance(x0, x_t, ab, t):
        mean, _ = _ref_posterior(x0, x_t, ab, t)
        return mean, 1.0 - ab[t] / ab[t - 1]

    def alpha_bar_for_alpha(x0, x_t, ab, t):  # sqrt(alpha_bar_t) on x_t instead of sqrt(alpha_t)
        a_t, ab_t, ab_prev = ab[t] / ab[t - 1], ab[t], ab[t - 1]
        mean = (math.sqrt(ab_prev) * (1 - a_t) * x0 + math.sqrt(ab_t) * (1 - ab_prev) * x_t) / (1 - ab_t)
        return mean, (1 - ab_prev) / (1 - ab_t) * (1 - a_t)

    def off_by_one(x0, x_t, ab, t):  # uses alpha_bar[t+1], alpha_bar[t]
        return posterior_mean_variance(x0, x_t, float(ab[t + 1]), float(ab[t]))

    def swapped(x0, x_t, ab, t):
        return _ref_posterior(x_t, x0, ab, t)

    check_function(
        fn, _ref_posterior, _posterior_inputs, name="posterior", trials=trials, seed=seed,
        mistakes=[
            Mistake("std", "the second result is the standard deviation; return the variance "
                    "(1 - alpha_bar_{t-1}) / (1 - alpha_bar_t) * beta_t, not its square root.", std_not_var),
            Mistake("beta", "the variance you returned is beta_t (DDPM's upper choice); the posterior variance is "
                    "smaller: multiply by (1 - alpha_bar_{t-1}) / (1 - alpha_bar_t).", beta_as_variance),
            Mistake("alpha_bar", "the x_t coefficient uses sqrt(alpha_bar_t); it should be sqrt(alpha_t) with "
                    "alpha_t = alpha_bar_t / alpha_bar_{t-1} (one step, not the whole chain).", alpha_bar_for_alpha),
            Mistake("off_by_one", "you used alpha_bar[t+1] and alpha_bar[t]: off by one; the step from t to t-1 "
                    "uses alpha_bar[t] and alpha_bar[t-1].", off_by_one),
            Mistake("swapped", "the coefficients of x0 and x_t are swapped: x0 gets sqrt(alpha_bar_{t-1}) beta_t "
                    "/ (1 - alpha_bar_t).", swapped),
        ],
    )


# Exercise 3: the DDIM update for general eta
def _ref_ddim_update(x_t, eps, alpha_bar_t, alpha_bar_prev, eta, noise):
    sigma = ddim_sigma(alpha_bar_t, alpha_bar_prev, eta)  # eq. (11)
    x0 = predict_x0(x_t, eps, alpha_bar_t)
    return math.sqrt(alpha_bar_prev) * x0 + math.sqrt(1 - alpha_bar_prev - sigma**2) * eps + sigma * noise


def _ddim_inputs(rng):
    n = int(rng.integers(3, 9))
    ab_t = float(rng.uniform(0.05, 0.6))
    ab_prev = float(rng.uniform(ab_t + 0.1, 0.99))
    eta = float(rng.choice([0.3, 0.5, 1.0]))
    return (rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), ab_t, ab_prev, eta, rng.standard_normal((n, 2)))


def check_ddim_update(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 3: ``fn(x_t, eps, alpha_bar_t, alpha_bar_prev, eta, noise) -> x_prev``."""

    def var_as_std(x_t, eps, ab_t, ab_prev, eta, noise):
        s = ddim_sigma(ab_t, ab_prev, eta)
        x0 = predict_x0(x_t, eps, ab_t)
        return math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev - s**2) * eps + s**2 * noise

    def no_sigma_in_direction(x_t, eps, ab_t, ab_prev, eta, noise):
        s = ddim_sigma(ab_t, ab_prev, eta)
        return math.sqrt(ab_prev) * predict_x0(x_t, eps, ab_t) + math.sqrt(1 - ab_prev) * eps + s * noise

    def minus_noise(x_t, eps, ab_t, ab_prev, eta, noise):
        return _ref_ddim_update(x_t, eps, ab_t, ab_prev, eta, -noise)

    def eta_ignored(x_t, eps, ab_t, ab_prev, eta, noise):
        return _ref_ddim_update(x_t, eps, ab_t, ab_prev, 1.0, noise)

    def eta_squared_missing(x_t, eps, ab_t, ab_prev, eta, noise):  # eta applied inside the square root
        s = math.sqrt(eta * (1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev))
        x0 = predict_x0(x_t, eps, ab_t)
        return math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev - s**2) * eps + s * noise

    def alpha_bar_in_sigma(x_t, eps, ab_t, ab_prev, eta, noise):  # beta = 1 - alpha_bar_t, not 1 - alpha_t
        s = eta * math.sqrt((1 - ab_prev) / (1 - ab_t) * (1 - ab_t))
        x0 = predict_x0(x_t, eps, ab_t)
        return math.sqrt(ab_prev) * x0 + math.sqrt(max(1 - ab_prev - s**2, 0.0)) * eps + s * noise

    check_function(
        fn, _ref_ddim_update, _ddim_inputs, name="ddim_update", trials=trials, seed=seed,
        mistakes=[
            Mistake("variance", "the noise is scaled by sigma^2 (a variance); scale it by sigma, the standard deviation.", var_as_std),
            Mistake("direction", "the direction term must shrink when noise is added: use sqrt(1 - alpha_bar_prev - sigma^2) * eps.",
                    no_sigma_in_direction),
            Mistake("sign", "the noise term has the wrong sign: x_prev = ... + sigma * noise.", minus_noise),
            Mistake("eta", "your result does not depend on eta the right way: sigma = eta * sqrt(...), so eta=0 is "
                    "deterministic and eta=1 is DDPM.", eta_ignored),
            Mistake("eta_sqrt", "eta multiplies the standard deviation, outside the square root: "
                    "sigma = eta * sqrt((1-abar_prev)/(1-abar_t) * (1 - abar_t/abar_prev)).", eta_squared_missing),
            Mistake("alpha_bar", "sigma uses 1 - alpha_bar_t where it needs 1 - alpha_bar_t / alpha_bar_prev "
                    "(the beta of the jump from t to prev, not of the whole chain).", alpha_bar_in_sigma),
        ],
    )


# Exercise 4: from v-prediction to x0 and eps
def _ref_from_v(x_t, v, alpha_bar_t):
    a, s = math.sqrt(alpha_bar_t), math.sqrt(1 - alpha_bar_t)
    return a * x_t - s * v, s * x_t + a * v


def _v_inputs(rng):
    n = int(rng.integers(3, 9))
    return rng.standard_normal((n, 2)), rng.standard_normal((n, 2)), float(rng.uniform(0.05, 0.95))


def check_from_v_prediction(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 4: ``fn(x_t, v, alpha_bar_t) -> (x0, eps)`` for v = sqrt(abar) eps - sqrt(1-abar) x0."""

    def swapped_outputs(x_t, v, ab):
        x0, eps = _ref_from_v(x_t, v, ab)
        return eps, x0

    def sign(x_t, v, ab):
        a, s = math.sqrt(ab), math.sqrt(1 - ab)
        return a * x_t + s * v, s * x_t - a * v

    def no_sqrt(x_t, v, ab):
        return ab * x_t - (1 - ab) * v, (1 - ab) * x_t + ab * v

    def swapped_coefs(x_t, v, ab):
        a, s = math.sqrt(ab), math.sqrt(1 - ab)
        return s * x_t - a * v, a * x_t + s * v

    check_function(
        fn, _ref_from_v, _v_inputs, name="from_v_prediction", trials=trials, seed=seed,
        mistakes=[
            Mistake("order", "return (x0, eps) in that order.", swapped_outputs),
            Mistake("sign", "the signs are flipped: x0 = sqrt(abar) x_t - sqrt(1-abar) v and "
                    "eps = sqrt(1-abar) x_t + sqrt(abar) v.", sign),
            Mistake("variance", "you used alpha_bar and 1 - alpha_bar (variances) as coefficients; use their square "
                    "roots (standard deviations).", no_sqrt),
            Mistake("coefs", "the coefficients are swapped: x0 takes sqrt(alpha_bar) on x_t, eps takes sqrt(1 - alpha_bar).",
                    swapped_coefs),
        ],
    )


# Exercise 5: the DDPM training loss for a batch
class _LinearDenoiser:
    """A fixed, deterministic 'network' eps(x, t) = x @ W + b * t/T, for checking losses."""

    def __init__(self, rng, T):
        self.W = torch.tensor(rng.standard_normal((2, 2)) * 0.5)
        self.b = torch.tensor(rng.standard_normal(2))
        self.T = T

    def __call__(self, x, t):
        return x @ self.W + self.b * (t.to(x.dtype).unsqueeze(-1) / self.T)

    def __repr__(self):
        return "denoiser"


def _ref_ddpm_loss(model, x0, t, noise, betas):
    alpha_bar = torch.cumprod(1 - betas, dim=0)[t].unsqueeze(-1)  # (B, 1)
    x_t = alpha_bar.sqrt() * x0 + (1 - alpha_bar).sqrt() * noise
    return ((model(x_t, t) - noise) ** 2).mean()


def _loss_inputs(rng):
    T = int(rng.integers(50, 300))
    B = int(rng.integers(4, 16))
    betas = linear_schedule(T, 1e-4 * 1000 / T, 0.02 * 1000 / T).betas
    return (_LinearDenoiser(rng, T), torch.tensor(rng.standard_normal((B, 2))), torch.tensor(rng.integers(0, T, B)),
            torch.tensor(rng.standard_normal((B, 2))), betas)


def check_ddpm_loss(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 5: ``fn(model, x0, t, noise, betas) -> scalar tensor``, the DDPM simple loss."""

    def with_ab(ab_fn, target="noise", reduce="mean"):
        def wrong(model, x0, t, noise, betas):
            ab = ab_fn(betas, t).unsqueeze(-1)
            x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
            err = (model(x_t, t) - (noise if target == "noise" else x0)) ** 2
            return err.mean() if reduce == "mean" else err.sum()
        return wrong

    alpha_not_bar = with_ab(lambda b, t: (1 - b)[t])
    off_by_one = with_ab(lambda b, t: torch.cat([torch.ones(1, dtype=b.dtype), torch.cumprod(1 - b, 0)])[t])
    x0_target = with_ab(lambda b, t: torch.cumprod(1 - b, 0)[t], target="x0")
    summed = with_ab(lambda b, t: torch.cumprod(1 - b, 0)[t], reduce="sum")

    def no_sqrt(model, x0, t, noise, betas):
        ab = torch.cumprod(1 - betas, 0)[t].unsqueeze(-1)
        x_t = ab * x0 + (1 - ab) * noise
        return ((model(x_t, t) - noise) ** 2).mean()

    check_function(
        fn, _ref_ddpm_loss, _loss_inputs, name="ddpm_loss", trials=trials, seed=seed,
        mistakes=[
            Mistake("alpha", "you used alpha_t = 1 - beta_t; x_t needs alpha_bar_t = cumprod(1 - betas)[t].", alpha_not_bar),
            Mistake("off_by_one", "off by one timestep: alpha_bar_t includes beta_t itself, "
                    "so alpha_bar = torch.cumprod(1 - betas, 0)[t], with no leading 1.", off_by_one),
            Mistake("variance", "x_t = sqrt(alpha_bar) x0 + sqrt(1 - alpha_bar) noise: the coefficients are standard "
                    "deviations, so take square roots.", no_sqrt),
            Mistake("target", "the network predicts the noise, so compare its output with `noise`, not with x0.", x0_target),
            Mistake("sum", "average the squared error over the batch and the coordinates (.mean()), do not sum it.", summed),
        ],
    )


# Exercise 6: the unbiased RBF MMD^2
def _mmd_inputs(rng):
    n, m = int(rng.integers(20, 60)), int(rng.integers(20, 60))
    shift = float(rng.uniform(0, 1))
    a = torch.tensor(rng.standard_normal((n, 2)))
    b = torch.tensor(rng.standard_normal((m, 2)) + shift)
    return a, b, float(rng.choice([0.3, 0.5, 1.0]))


def _ref_mmd(a, b, sigma):
    return torch.tensor(mmd_rbf(a, b, (sigma,)), dtype=torch.float64)


def check_mmd(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 6: ``fn(a, b, sigma) -> 0-d tensor``, unbiased MMD^2 with k = exp(-|x-y|^2 / (2 sigma^2))."""

    def kernel(x, y, sigma, two=True):
        return torch.exp(-_sq_dists(x, y) / ((2 if two else 1) * sigma**2))

    def biased(a, b, sigma):
        return kernel(a, a, sigma).mean() + kernel(b, b, sigma).mean() - 2 * kernel(a, b, sigma).mean()

    def no_two(a, b, sigma):
        return torch.tensor(mmd_rbf(a, b, (sigma / math.sqrt(2),)), dtype=torch.float64)

    def sigma_not_squared(a, b, sigma):
        return torch.tensor(mmd_rbf(a, b, (math.sqrt(sigma),)), dtype=torch.float64)

    def diag_wrong_count(a, b, sigma):  # diagonal removed but still divided by n^2
        n, m = a.shape[0], b.shape[0]
        kaa, kbb = kernel(a, a, sigma), kernel(b, b, sigma)
        return ((kaa.sum() - n) / n**2 + (kbb.sum() - m) / m**2 - 2 * kernel(a, b, sigma).mean())

    check_function(
        fn, _ref_mmd, _mmd_inputs, name="mmd", trials=trials, seed=seed, rtol=1e-8, atol=1e-10,
        mistakes=[
            Mistake("biased", "this is the biased estimator: leave the diagonal k(x_i, x_i) out of the within-sample "
                    "means and divide by n(n-1).", biased),
            Mistake("count", "after removing the diagonal there are n(n-1) pairs, not n^2: divide by n(n-1).", diag_wrong_count),
            Mistake("two", "the RBF kernel divides the squared distance by 2 sigma^2, not sigma^2.", no_two),
            Mistake("sigma", "divide by sigma squared (a variance), not by sigma.", sigma_not_squared),
        ],
    )
