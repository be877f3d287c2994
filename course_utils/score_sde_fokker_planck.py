r"""Topic 12: the Ornstein-Uhlenbeck process three ways (particles, the Fokker-Planck PDE, the exact law)
and Kramers-Moyal coefficients estimated from paths.

Used by ``notebooks/12_score_sde.ipynb`` (section 5 writes the finite-difference step by hand first) and
by the problem set's checks. The OU process :math:`dX = -\theta X\,dt + \sigma\,dW` has the
Fokker-Planck equation (eq. 14)

.. math:: \partial_t p = \partial_x(\theta x\,p) + \tfrac{\sigma^2}{2}\,\partial_x^2 p,

whose solution from :math:`\mathcal N(m_0, s_0^2)` is Gaussian with mean :math:`m_0 e^{-\theta t}` and variance
:math:`s_0^2 e^{-2\theta t} + \frac{\sigma^2}{2\theta}(1 - e^{-2\theta t})` (eq. 15).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["ou_law", "ou_euler_maruyama", "gaussian_pdf", "fokker_planck_ftcs", "solve_fokker_planck",
           "kramers_moyal"]


def ou_law(t: float, m0: float, s0: float, theta: float, sigma: float) -> tuple[float, float]:
    """Eq. (15): mean and variance of X_t for X_0 ~ N(m0, s0^2)."""
    decay = math.exp(-theta * t)
    return m0 * decay, s0**2 * decay**2 + sigma**2 / (2 * theta) * (1 - decay**2)


def gaussian_pdf(x, mean: float, var: float):
    return np.exp(-0.5 * (np.asarray(x) - mean) ** 2 / var) / math.sqrt(2 * math.pi * var)


def ou_euler_maruyama(x0: np.ndarray, theta: float, sigma: float, dt: float, n_steps: int,
                      rng: np.random.Generator) -> np.ndarray:
    r"""Euler-Maruyama paths :math:`x_{k+1} = x_k - \theta x_k\,\Delta t + \sigma\sqrt{\Delta t}\,z_k`: (n_steps + 1, n)."""
    out = np.empty((n_steps + 1, x0.shape[0]))
    out[0] = x0
    for k in range(n_steps):
        out[k + 1] = out[k] - theta * out[k] * dt + sigma * math.sqrt(dt) * rng.standard_normal(x0.shape[0])
    return out


def fokker_planck_ftcs(p: np.ndarray, x: np.ndarray, dt: float, theta: float, sigma: float) -> np.ndarray:
    r"""One explicit step of eq. (14) on the uniform grid ``x`` (forward in time, centred in space), with p = 0
    outside the grid: :math:`p_i + \Delta t\,[\theta\frac{x_{i+1}p_{i+1} - x_{i-1}p_{i-1}}{2\Delta x}
    + \frac{\sigma^2}{2}\frac{p_{i+1} - 2p_i + p_{i-1}}{\Delta x^2}]`. Stable for
    :math:`\Delta t \le \Delta x^2/\sigma^2`."""
    dx = x[1] - x[0]
    flux = np.pad(theta * x * p, 1)  # (n + 2,), zero beyond both ends
    pp = np.pad(p, 1)
    drift = (flux[2:] - flux[:-2]) / (2 * dx)
    diffusion = 0.5 * sigma**2 * (pp[2:] - 2 * p + pp[:-2]) / dx**2
    return p + dt * (drift + diffusion)


def solve_fokker_planck(p0: np.ndarray, x: np.ndarray, dt: float, n_steps: int, theta: float, sigma: float,
                        every: int) -> np.ndarray:
    """:func:`fokker_planck_ftcs` ``n_steps`` times; returns the density every ``every`` steps: (n_steps // every + 1, n)."""
    out, p = [p0], p0
    for k in range(1, n_steps + 1):
        p = fokker_planck_ftcs(p, x, dt, theta, sigma)
        if k % every == 0:
            out.append(p)
    return np.stack(out)


def kramers_moyal(paths: np.ndarray, dt: float, edges: np.ndarray, orders=(1, 2, 3, 4)) -> np.ndarray:
    r"""Eq. (16): :math:`D^{(n)}(x) \approx \frac{1}{n!\,\Delta t}\,\mathbb E[(x_{k+1}-x_k)^n \mid x_k \in \text{bin}]`.

    ``paths`` (steps + 1, n) sampled every ``dt``; ``edges`` the bin edges. Returns (len(orders), bins);
    empty bins are NaN."""
    start, inc = paths[:-1].ravel(), np.diff(paths, axis=0).ravel()
    which = np.digitize(start, edges) - 1
    bins = len(edges) - 1
    out = np.full((len(orders), bins), np.nan)
    counts = np.bincount(which[(which >= 0) & (which < bins)], minlength=bins)
    ok = (which >= 0) & (which < bins)
    for r, n in enumerate(orders):
        sums = np.bincount(which[ok], weights=inc[ok] ** n, minlength=bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[r] = sums / counts / (math.factorial(n) * dt)
    return out
