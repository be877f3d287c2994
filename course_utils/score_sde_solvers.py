r"""Topic 12: the VP and VE SDEs, the reverse-time SDE, the probability-flow ODE and their samplers.

Used by ``notebooks/12_score_sde.ipynb`` (section 4 writes each step by hand, then asserts it equals the
copy here and compares it with diffusers' ``ScoreSdeVpScheduler`` and ``ScoreSdeVeScheduler`` step by
step). Equation numbers refer to that lesson. Time runs forward from the data at ``u = 0`` to noise at
``u = 1``; samplers integrate backwards.

VP SDE (eq. 7): :math:`dx = -\tfrac12\beta(u)\,x\,du + \sqrt{\beta(u)}\,dw`, :math:`\beta(u) = \beta_{min} + u(\beta_{max}-\beta_{min})`.
With :math:`\beta_{min} = 0.1`, :math:`\beta_{max} = 20` it is the limit of lesson 11's linear schedule
(:math:`\beta_t = \beta(u)/T`, T = 1000). Reverse SDE (eq. 9):
:math:`dx = [f - g^2 s]\,du + g\,d\bar w`; probability-flow ODE (eq. 10): :math:`dx/du = f - \tfrac12 g^2 s`.
The exact log-likelihood along that ODE (section 7, eq. 17): :func:`pf_ode_log_likelihood`.
"""
from __future__ import annotations

import math

import torch

__all__ = [
    "vp_beta",
    "vp_marginal",
    "score_from_eps",
    "vp_network_score",
    "reverse_sde_euler_maruyama",
    "probability_flow_velocity",
    "sample_vp",
    "ve_discrete_sigmas",
    "ve_reverse_step",
    "snr_langevin_corrector",
    "sample_ve_pc",
    "divergence_exact",
    "pf_ode_log_likelihood",
    "ddpm_elbo_per_dim",
]

BETA_MIN, BETA_MAX = 0.1, 20.0  # lesson 11's linear schedule (1e-4 .. 0.02) times T = 1000


def vp_beta(u, beta_min: float = BETA_MIN, beta_max: float = BETA_MAX):
    r""":math:`\beta(u) = \beta_{min} + u(\beta_{max} - \beta_{min})`."""
    return beta_min + u * (beta_max - beta_min)


def vp_marginal(u, beta_min: float = BETA_MIN, beta_max: float = BETA_MAX):
    r"""Eq. (8): :math:`x_u = m(u)\,x_0 + \sigma(u)\,z` with :math:`m = e^{-\frac12\int_0^u\beta}`, :math:`\sigma^2 = 1 - m^2`.
    Returns ``(m, sigma)`` (floats for a float ``u``, tensors for a tensor)."""
    log_m = -0.25 * u**2 * (beta_max - beta_min) - 0.5 * u * beta_min
    if isinstance(u, torch.Tensor):
        return log_m.exp(), (1.0 - (2.0 * log_m).exp()).sqrt()
    return math.exp(log_m), math.sqrt(1.0 - math.exp(2.0 * log_m))


def score_from_eps(eps, std):
    r"""Tweedie (eq. 6b): a noise prediction is a scaled score, :math:`s = -\epsilon/\sqrt{1-\bar\alpha}`."""
    return -eps / std


def vp_network_score(model, T: int = 1000, beta_min: float = BETA_MIN, beta_max: float = BETA_MAX):
    r"""Turn lesson 11's noise predictor ``model(x, t)`` (integer t in 0..T-1) into ``score(x, u)`` for u in (0, 1].

    Continuous time ``u`` is the discrete step ``t = u T - 1`` (the network's sinusoidal embedding accepts a
    fractional t), and the score is :func:`score_from_eps` with the VP SDE's :math:`\sigma(u)`.
    """

    @torch.no_grad()
    def score(x, u: float):
        t = torch.full((x.shape[0],), u * T - 1.0)
        return score_from_eps(model(x, t), vp_marginal(u, beta_min, beta_max)[1])

    return score


def reverse_sde_euler_maruyama(x, score, u: float, h: float, noise, beta_min: float = BETA_MIN,
                               beta_max: float = BETA_MAX):
    r"""Eq. (9) by Euler-Maruyama, one step from u to u - h:
    :math:`x + h\,[\tfrac12\beta x + \beta s] + \sqrt{\beta h}\,z` (:math:`f = -\tfrac12\beta x`, :math:`g^2 = \beta`)."""
    beta = vp_beta(u, beta_min, beta_max)
    return x + h * (0.5 * beta * x + beta * score) + math.sqrt(beta * h) * noise


def probability_flow_velocity(x, score, u: float, beta_min: float = BETA_MIN, beta_max: float = BETA_MAX):
    r"""Eq. (10): :math:`dx/du = f - \tfrac12 g^2 s = -\tfrac12\beta(u)\,(x + s)`."""
    return -0.5 * vp_beta(u, beta_min, beta_max) * (x + score)


@torch.no_grad()
def sample_vp(score_fn, n_points: int, n_steps: int, *, method: str = "sde", u_end: float = 1e-3,
              seed: int = 0, dim: int = 2, snr: float = 0.1):
    r"""Integrate the VP SDE backwards from :math:`x_1 \sim \mathcal N(0, I)` over the grid
    ``linspace(1, u_end, n_steps + 1)``. ``method``: ``"sde"`` (Euler-Maruyama, eq. 9), ``"ode_euler"``,
    ``"ode_heun"`` (eq. 10; Heun's last step is plain Euler), or ``"pc"`` (an Euler-Maruyama predictor and one
    Langevin corrector step at the new time, step size from the signal-to-noise ratio ``snr``).
    ``score_fn(x, u)`` returns (n, dim). Returns ``(x, network_evaluations)``.
    """
    if method not in ("sde", "ode_euler", "ode_heun", "pc"):
        raise ValueError(f"method must be 'sde', 'ode_euler', 'ode_heun' or 'pc', not {method!r}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_points, dim, generator=gen)
    grid = torch.linspace(1.0, u_end, n_steps + 1, dtype=torch.float64).tolist()
    nfe = 0
    for i in range(n_steps):
        u, u_next = grid[i], grid[i + 1]
        h = u - u_next
        s = score_fn(x, u)
        nfe += 1
        if method in ("sde", "pc"):
            x = reverse_sde_euler_maruyama(x, s, u, h, torch.randn(x.shape, generator=gen))
            if method == "pc":
                x = snr_langevin_corrector(x, score_fn(x, u_next), snr, torch.randn(x.shape, generator=gen))
                nfe += 1
        elif method == "ode_euler" or i == n_steps - 1:
            x = x - h * probability_flow_velocity(x, s, u)
        else:  # Heun: average the velocities at both ends of the step
            v0 = probability_flow_velocity(x, s, u)
            x_pred = x - h * v0
            v1 = probability_flow_velocity(x_pred, score_fn(x_pred, u_next), u_next)
            nfe += 1
            x = x - h * 0.5 * (v0 + v1)
    return x, nfe


# ---------------------------------------------------------------- the VE SDE, as diffusers' ScoreSdeVeScheduler
def ve_discrete_sigmas(n_steps: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    r"""Eq. (11): :math:`n` noise levels spaced geometrically from :math:`\sigma_{min}` to :math:`\sigma_{max}`
    (increasing; float32 like diffusers' ``discrete_sigmas``)."""
    return torch.exp(torch.linspace(math.log(sigma_min), math.log(sigma_max), n_steps))


def ve_reverse_step(x, score, sigma: float, sigma_prev: float, noise):
    r"""Eq. (12), the VE reverse-diffusion predictor from level :math:`\sigma` down to :math:`\sigma'`:
    :math:`x + (\sigma^2 - \sigma'^2)\,s + \sqrt{\sigma^2 - \sigma'^2}\,z` (:math:`g^2\,du` is the variance added)."""
    g2 = sigma**2 - sigma_prev**2
    return x + g2 * score + g2**0.5 * noise


def snr_langevin_corrector(x, score, snr: float, noise):
    r"""Eq. (13), Song et al.'s Langevin corrector: step :math:`\tau = 2(r\,\overline{\|z\|}/\overline{\|s\|})^2`
    (norms averaged over the batch), then :math:`x + \tau s + \sqrt{2\tau}\,z`."""
    grad_norm = score.reshape(score.shape[0], -1).norm(dim=-1).mean()
    noise_norm = noise.reshape(noise.shape[0], -1).norm(dim=-1).mean()
    tau = 2.0 * (snr * noise_norm / grad_norm) ** 2
    return x + tau * score + (2.0 * tau) ** 0.5 * noise


@torch.no_grad()
def sample_ve_pc(score_fn, n_points: int, n_steps: int, *, sigma_min: float = 0.01, sigma_max: float = 5.0,
                 snr: float = 0.15, correct_steps: int = 1, seed: int = 0, dim: int = 2):
    r"""Predictor-corrector sampling of the VE SDE, in diffusers' ``ScoreSdeVePipeline`` order: at level i
    (largest first) ``correct_steps`` Langevin corrections (eq. 13), then one predictor step (eq. 12) to
    level i-1 (0 after the smallest). ``score_fn(x, sigma)`` returns (n, dim). Returns ``(x, network_evaluations)``."""
    gen = torch.Generator().manual_seed(seed)
    sig = ve_discrete_sigmas(n_steps, sigma_min, sigma_max).tolist()
    x = sigma_max * torch.randn(n_points, dim, generator=gen)
    nfe = 0
    for j in range(n_steps - 1, -1, -1):
        for _ in range(correct_steps):
            x = snr_langevin_corrector(x, score_fn(x, sig[j]), snr, torch.randn(x.shape, generator=gen))
        s = score_fn(x, sig[j])
        nfe += correct_steps + 1
        x = ve_reverse_step(x, s, sig[j], sig[j - 1] if j > 0 else 0.0, torch.randn(x.shape, generator=gen))
    return x, nfe


# ---------------------------------------------------------------- exact likelihood through the probability-flow ODE
def divergence_exact(velocity_fn, x: torch.Tensor):
    r"""``(v, div v)`` at ``x`` (n, D): :math:`\nabla\cdot v = \sum_d \partial v_d/\partial x_d`, one backward per d."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        v = velocity_fn(x)  # (n, D)
        div = torch.zeros(x.shape[0], dtype=v.dtype)
        for d in range(x.shape[1]):
            (grad,) = torch.autograd.grad(v[:, d].sum(), x, retain_graph=d < x.shape[1] - 1)
            div = div + grad[:, d]
    return v.detach(), div.detach()


def pf_ode_log_likelihood(score_fn, x0: torch.Tensor, *, n_steps: int = 64, u0: float = 1e-3):
    r"""Eq. (17): :math:`\log p_{u_0}(x_0) = \log \mathcal N(x_1; 0, I) + \int_{u_0}^1 \nabla\cdot v(x_u, u)\,du`
    along the probability-flow ODE :math:`dx/du = v = -\tfrac12\beta(u)(x + s(x, u))` (eq. 10), Heun's method on
    the grid :math:`u_i = u_0 + (1 - u_0)(i/N)^2` (dense near the data, where the score changes fastest).
    ``score_fn(x, u)`` must be differentiable in ``x``. Returns ``(log_p, x_1)``, (n,) and (n, D), float64."""
    x = x0.detach().double()
    grid = (u0 + (1.0 - u0) * torch.linspace(0.0, 1.0, n_steps + 1, dtype=torch.float64) ** 2).tolist()
    integral = torch.zeros(x.shape[0], dtype=torch.float64)

    def field(y, u):
        return divergence_exact(lambda z: probability_flow_velocity(z, score_fn(z, u).double(), u), y)

    for u, u_next in zip(grid[:-1], grid[1:]):
        h = u_next - u
        v0, d0 = field(x, u)
        v1, d1 = field(x + h * v0, u_next)
        x, integral = x + 0.5 * h * (v0 + v1), integral + 0.5 * h * (d0 + d1)
    prior = -0.5 * (x**2).sum(-1) - 0.5 * x.shape[1] * math.log(2 * math.pi)
    return prior + integral, x


@torch.no_grad()
def ddpm_elbo_per_dim(model, schedule, x_data: torch.Tensor, *, seed: int = 9) -> dict:
    r"""Lesson 11's bound (its eq. 13) on :math:`-\log p_\theta(x_{data})`, term by term, in nats per dimension.

    The same computation as lesson 11's section 10 (one noise draw per point and timestep from
    ``Generator().manual_seed(seed)``, in blocks of 100 timesteps), so that lesson 12 compares its exact
    probability-flow likelihood (eq. 17) with that number. Returns ``{"prior", "consistency", "reconstruction",
    "bound"}``, each a float per dimension, averaged over the points."""
    from .bench import single_thread
    from .diffusion import q_sample

    n, dim = x_data.shape
    T = len(schedule.betas)
    x_data = x_data.double()
    gen = torch.Generator().manual_seed(seed)
    mse = torch.empty(T)  # E |eps - eps_theta(x_t, t)|^2, per t
    with single_thread():
        for t0 in range(0, T, 100):
            tt = torch.arange(t0, t0 + 100).repeat_interleave(n)  # (100 n,)
            noise = torch.randn(len(tt), dim, generator=gen, dtype=torch.float64)
            x_t = q_sample(schedule, x_data.repeat(100, 1), tt, noise)
            mse[t0:t0 + 100] = ((model(x_t.float(), tt).double() - noise) ** 2).sum(-1).view(100, n).mean(1)
    betas, ab = schedule.betas, schedule.alpha_bar
    ab_prev = torch.cat([torch.ones(1, dtype=torch.float64), ab[:-1]])
    beta_tilde = (1 - ab_prev) / (1 - ab) * betas
    lam = betas[1:] ** 2 / (2 * beta_tilde[1:] * (1 - betas[1:]) * (1 - ab[1:]))  # lesson 11, eq. (14)
    ab_last = ab[-1].item()
    prior = 0.5 * (ab_last * (x_data**2).sum(-1) + dim * (1 - ab_last) - dim - dim * math.log(1 - ab_last)).mean().item()
    consistency = (lam * mse[1:].double()).sum().item()
    reconstruction = 0.5 * dim * math.log(2 * math.pi * betas[0].item()) + mse[0].item() / (2 * (1 - betas[0].item()))
    terms = {"prior": prior, "consistency": consistency, "reconstruction": reconstruction}
    terms["bound"] = sum(terms.values())
    return {k: v / dim for k, v in terms.items()}
