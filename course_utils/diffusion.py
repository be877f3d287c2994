r"""Topic 11 (DDPM and DDIM): noise schedules, the forward process, and the DDPM and DDIM steps and samplers.

Used by:

* ``notebooks/11_ddpm_ddim.ipynb`` -- derives every formula below (equation numbers refer to it),
  writes each step by hand, then imports them from here and checks them against diffusers'
  ``DDPMScheduler`` / ``DDIMScheduler``;
* ``solutions/11_ddpm_ddim.ipynb`` -- its checks are in :mod:`course_utils.grading.diffusion`;
* later lessons (12, score-based SDEs) -- the schedules, :func:`q_sample` and the samplers. The network and
  its training loop are in :mod:`course_utils.diffusion_training`, the sample-quality metrics in
  :mod:`course_utils.diffusion_metrics`.

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

from .bench import single_thread

__all__ = [
    "Schedule",
    "linear_schedule",
    "cosine_alpha_bar_fn",
    "cosine_schedule",
    "q_sample",
    "sampling_timesteps",
    "predict_x0",
    "posterior_mean_variance",
    "ddpm_step",
    "ddim_sigma",
    "ddim_step",
    "sample",
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
    r"""Eq. (8): :math:`\hat x_0 = (x_t - \sqrt{1-\bar\alpha_t}\,\epsilon) / \sqrt{\bar\alpha_t}`."""
    return (x_t - math.sqrt(1.0 - alpha_bar_t) * eps) / math.sqrt(alpha_bar_t)


def posterior_mean_variance(x0, x_t, alpha_bar_t: float, alpha_bar_prev: float):
    r"""Mean and variance of :math:`q(x_{t'} \mid x_t, x_0)` for the jump from t to t' < t (eqs. 6-7).

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
