r"""Topic 12, section 8: EDM's preconditioning, training loss and Heun sampler (Karras et al., 2022).

Used by ``notebooks/12_score_sde.ipynb`` (section 8 writes the preconditioning and the Heun sampler by hand,
then asserts they equal this copy). Equation numbers refer to that lesson. EDM works in the VE
parametrization :math:`x_\sigma = x_0 + \sigma z` with a denoiser :math:`D(x;\sigma) \approx \mathbb E[x_0 \mid x_\sigma]`:

* :func:`edm_preconditioning` (eq. 18) and :class:`EDMDenoiser`, around lesson 11's ``TimeMLP``;
* :func:`train_edm_denoiser` (eq. 19);
* :func:`edm_sigmas` and :func:`edm_heun_sampler` (eq. 20), and :func:`vp_network_denoiser`, which turns
  lesson 11's noise predictor into such a denoiser so the sampler can be compared on the same network.
"""
from __future__ import annotations

import math

import torch

from .score_sde_solvers import vp_marginal

__all__ = ["edm_preconditioning", "EDMDenoiser",
           "train_edm_denoiser", "edm_sigmas", "edm_heun_sampler", "vp_network_denoiser", "SIGMA_DATA"]

SIGMA_DATA = 0.5  # EDM's sigma_data; lesson 11's standardized moons have per-coordinate std 0.5 to 1


# ---------------------------------------------------------------- EDM (Karras et al., 2022)
def edm_preconditioning(sigma, sigma_data: float = SIGMA_DATA):
    r"""Eq. (18): ``(c_skip, c_out, c_in, c_noise)`` with :math:`c_{skip} = \sigma_d^2/(\sigma^2+\sigma_d^2)`,
    :math:`c_{out} = \sigma\sigma_d/\sqrt{\sigma^2+\sigma_d^2}`, :math:`c_{in} = 1/\sqrt{\sigma^2+\sigma_d^2}`,
    :math:`c_{noise} = \tfrac14\ln\sigma`."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    total = sigma**2 + sigma_data**2
    return sigma_data**2 / total, sigma * sigma_data / total.sqrt(), 1 / total.sqrt(), 0.25 * sigma.log()


class EDMDenoiser(torch.nn.Module):
    r""":math:`D(x;\sigma) = c_{skip}x + c_{out}F(c_{in}x;\,c_{noise})` (eq. 18) around lesson 11's ``TimeMLP`` F, whose
    timestep input receives :math:`1000\,(c_{noise} + 1)/2`, which maps :math:`\sigma \in [e^{-4}, e^{4}]` onto [0, 1000]."""

    def __init__(self, dim: int = 2, hidden: int = 128, sigma_data: float = SIGMA_DATA):
        super().__init__()
        from .diffusion_training import TimeMLP

        self.sigma_data = sigma_data
        self.net = TimeMLP(dim, hidden, 3, 32, 1000)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        c_skip, c_out, c_in, c_noise = (c.reshape(-1, 1) for c in edm_preconditioning(sigma, self.sigma_data))
        return c_skip * x + c_out * self.net(c_in * x, 500.0 * (c_noise.reshape(-1) + 1.0))


def train_edm_denoiser(data: torch.Tensor, *, steps: int = 2000, batch_size: int = 512, lr: float = 3e-3,
                       p_mean: float = -1.2, p_std: float = 1.2, seed: int = 0):
    r"""Eq. (19): :math:`\mathbb E\,\lambda(\sigma)\|D(x+\sigma z;\sigma) - x\|^2` with :math:`\ln\sigma \sim
    \mathcal N(P_{mean}, P_{std}^2)` and :math:`\lambda = 1/c_{out}^2`. Returns ``(model, losses)``."""
    from .bench import single_thread

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = EDMDenoiser(data.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses = torch.empty(steps)
    with single_thread():
        for step in range(steps):
            x = data[torch.randint(0, data.shape[0], (batch_size,), generator=gen)]  # (B, D)
            sigma = (p_mean + p_std * torch.randn(batch_size, generator=gen)).exp()  # (B,)
            noisy = x + sigma[:, None] * torch.randn(x.shape, generator=gen)
            weight = 1 / edm_preconditioning(sigma, model.sigma_data)[1] ** 2  # lambda = 1 / c_out^2
            loss = (weight[:, None] * (model(noisy, sigma) - x) ** 2).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses[step] = loss.detach()
    model.eval()
    return model, losses.numpy()


def edm_sigmas(n_steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> torch.Tensor:
    r"""EDM's time steps: :math:`\sigma_i = (\sigma_{max}^{1/\rho} + \tfrac{i}{N-1}(\sigma_{min}^{1/\rho} -
    \sigma_{max}^{1/\rho}))^\rho`, ``i < N``, then 0 appended: (N + 1,), float64, decreasing."""
    i = torch.arange(n_steps, dtype=torch.float64)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return torch.cat([(hi + i / (n_steps - 1) * (lo - hi)) ** rho, torch.zeros(1, dtype=torch.float64)])


@torch.no_grad()
def edm_heun_sampler(denoiser, n_points: int, n_steps: int, *, sigma_min: float = 0.002, sigma_max: float = 80.0,
                     rho: float = 7.0, seed: int = 0, dim: int = 2):
    r"""Eq. (20), EDM's deterministic sampler: :math:`dx/d\sigma = (x - D(x;\sigma))/\sigma` from
    :math:`x \sim \mathcal N(0, \sigma_{max}^2 I)` over :func:`edm_sigmas`, Heun steps except the last (Euler
    to :math:`\sigma = 0`). ``denoiser(x, sigma)`` takes (n, D) float32 and a float. Returns ``(x, NFE)``: 2N - 1."""
    sig = edm_sigmas(n_steps, sigma_min, sigma_max, rho).tolist()
    x = sig[0] * torch.randn(n_points, dim, generator=torch.Generator().manual_seed(seed))
    nfe = 0
    for s, s_next in zip(sig[:-1], sig[1:]):
        d = (x - denoiser(x, s)) / s
        nfe += 1
        x_next = x + (s_next - s) * d
        if s_next > 0:
            d_next = (x_next - denoiser(x_next, s_next)) / s_next
            nfe += 1
            x_next = x + (s_next - s) * 0.5 * (d + d_next)
        x = x_next
    return x, nfe


def vp_network_denoiser(model, T: int = 1000):
    r"""Lesson 11's noise predictor as an EDM denoiser: :math:`x_{VP} = m\,x`, :math:`\sigma = \sigma_{VP}/m`, so
    :math:`D(x;\sigma) = x - \sigma\,\epsilon_\theta(m x, t)` with the VP time ``u`` whose :math:`\sigma(u)/m(u) = \sigma`
    (solved in closed form from eq. 8) and ``t = u T - 1``. Valid for :math:`\sigma` from 0.0105 (t = 0) to 152 (u = 1)."""
    from .score_sde_solvers import BETA_MAX, BETA_MIN

    @torch.no_grad()
    def denoise(x, sigma: float):
        log_m = -0.5 * math.log1p(sigma**2)  # m = 1 / sqrt(1 + sigma^2)
        a, b = 0.25 * (BETA_MAX - BETA_MIN), 0.5 * BETA_MIN  # -log m = a u^2 + b u (eq. 8)
        u = (-b + math.sqrt(b * b - 4 * a * log_m)) / (2 * a)
        m = vp_marginal(u)[0]
        eps = model((m * x).float(), torch.full((x.shape[0],), u * T - 1.0))
        return x - sigma * eps

    return denoise
