r"""Topic 12 (score matching, Langevin, SDEs): densities with exact scores, Langevin samplers, score matching.

Used by ``notebooks/12_score_sde.ipynb`` (sections 1-3 write every function here by hand first, then
assert it equals this copy) and by ``solutions/12_score_sde.ipynb`` (checks in
:mod:`course_utils.grading.score_sde`). The SDE samplers are in :mod:`course_utils.score_sde_solvers`,
the Fokker-Planck material in :mod:`course_utils.score_sde_fokker_planck`; the noise-prediction network
and the 2-D data come from lesson 11 (:mod:`course_utils.diffusion_training`).

The central object is a Gaussian mixture with diagonal covariances, :class:`DiagMixture`. Its score is
exact, and it stays a mixture under both forward processes (VE: add :math:`\sigma^2` to every variance;
VP: scale the means by :math:`\sqrt{\bar\alpha}` and the variances to :math:`\bar\alpha v + 1 - \bar\alpha`),
so every noised marginal has an exact score too (both live in :mod:`course_utils.diffusion_training`, next to
lesson 11's data, and are re-exported here). :func:`moons_mixture` writes lesson 11's two-moons
distribution as such a mixture (a quadrature over the arcs' angle), which gives the exact score of the
data the lesson-11 network was trained on.

=====================  =======================  ==========================================
symbol                 variable                  meaning
=====================  =======================  ==========================================
:math:`s(x)`           ``score``                 :math:`\nabla_x \log p(x)`
:math:`\tau`           ``tau``                   Langevin step size (eq. 3 of lesson 12)
:math:`\sigma`         ``sigma``                 noise level of a VE perturbation
=====================  =======================  ==========================================
"""
from __future__ import annotations

import math

import torch

from .diffusion_training import DiagMixture, moons_mixture

__all__ = [
    "DiagMixture",
    "two_mode_mixture",
    "moons_mixture",
    "ula_step",
    "langevin_chain",
    "annealed_langevin",
    "dsm_objective",
    "sliced_score_objective",
    "train_noise_conditional_score",
]


# ---------------------------------------------------------------- Gaussian mixtures with exact scores (eqs. 1-2)
# DiagMixture and moons_mixture live with lesson 11's data (course_utils.diffusion_training), which lesson 11 also uses.
def two_mode_mixture(separation: float = 8.0, std: float = 0.5, weight_left: float = 0.8, dim: int = 2) -> DiagMixture:
    """Two isotropic modes on the first axis at -separation/2 and +separation/2, weights ``weight_left`` and the rest."""
    means = torch.zeros(2, dim, dtype=torch.float64)
    means[:, 0] = torch.tensor([-separation / 2, separation / 2])
    return DiagMixture.of([weight_left, 1 - weight_left], means, torch.full((2, dim), std**2))


# ---------------------------------------------------------------- Langevin dynamics (eqs. 3-4)
def ula_step(x, score, tau: float, noise):
    r"""Eq. (3), one unadjusted Langevin step: :math:`x + \tau\,s(x) + \sqrt{2\tau}\,z`. ``score`` is s(x), an array."""
    return x + tau * score + math.sqrt(2.0 * tau) * noise


def langevin_chain(score_fn, x, tau: float, n_steps: int, generator: torch.Generator):
    """``n_steps`` of :func:`ula_step` from ``x`` (n, D) with ``score_fn(x) -> (n, D)``; noise from ``generator``."""
    for _ in range(n_steps):
        x = ula_step(x, score_fn(x), tau, torch.randn(x.shape, generator=generator, dtype=x.dtype))
    return x


def annealed_langevin(score_fn, x, sigmas, eps: float, steps_per_level: int, generator: torch.Generator):
    r"""Song and Ermon's annealed Langevin (eq. 4): for each :math:`\sigma_i` (largest first) run
    ``steps_per_level`` steps with :math:`\tau_i = \epsilon\,\sigma_i^2/\sigma_L^2` and ``score_fn(x, i)``."""
    last = float(sigmas[-1])
    for i, sigma in enumerate(sigmas):
        tau = eps * float(sigma) ** 2 / last**2
        x = langevin_chain(lambda y, i=i: score_fn(y, i), x, tau, steps_per_level, generator)
    return x


# ---------------------------------------------------------------- score matching (eqs. 5-6)
def dsm_objective(score_fn, x, sigma, noise):
    r"""Eq. (5), denoising score matching weighted by :math:`\lambda(\sigma)=\sigma^2`:
    :math:`\mathrm{mean}_i\,\sigma_i^2\,\|s(\tilde x_i,\sigma_i) + (\tilde x_i - x_i)/\sigma_i^2\|^2`, with
    :math:`\tilde x = x + \sigma z`. ``sigma`` is (B,), ``x`` and ``noise`` (B, D); ``score_fn(x_tilde, sigma)``."""
    sig = sigma.unsqueeze(-1)  # (B, 1)
    x_tilde = x + sig * noise
    target = -(x_tilde - x) / sig**2  # the score of N(x, sigma^2 I) at x_tilde
    return (sig**2 * (score_fn(x_tilde, sigma) - target) ** 2).sum(-1).mean()


def sliced_score_objective(score_fn, x, v):
    r"""Eq. (6), sliced score matching: :math:`\mathrm{mean}_i\,[v_i^\top \nabla_x s(x_i)\, v_i + \tfrac12 (v_i^\top s(x_i))^2]`,
    one random direction ``v`` (B, D) per point; the Jacobian-vector product by autograd (differentiable)."""
    x = x.detach().requires_grad_(True)
    s = score_fn(x)  # (B, D)
    sv = (s * v).sum()  # sum_i v_i . s(x_i)
    (grad,) = torch.autograd.grad(sv, x, create_graph=True)  # (B, D): row i is v_i^T ds/dx at x_i
    return ((grad * v).sum(-1) + 0.5 * ((s * v).sum(-1)) ** 2).mean()


def train_noise_conditional_score(data: torch.Tensor, sigmas, *, steps: int = 1500, batch_size: int = 256,
                                  hidden: int = 64, lr: float = 3e-3, seed: int = 0):
    r"""A noise-conditional score network trained with :func:`dsm_objective` (eq. 5), NCSN-style.

    Reuses lesson 11's :class:`~course_utils.diffusion_training.TimeMLP` with the noise-level *index* as its
    "timestep" (``T = len(sigmas)``); the network's raw output :math:`o` is read as :math:`-\sigma\,s`
    (a noise estimate, so its scale does not depend on :math:`\sigma`): ``score(x, i) = -net(x, i) / sigmas[i]``.
    Returns ``(score_fn, losses)``; ``score_fn(x, i)`` takes an int level and returns float32 (n, D).
    """
    from .bench import single_thread
    from .diffusion_training import TimeMLP

    sig = torch.as_tensor(sigmas, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = TimeMLP(data.shape[1], hidden, 3, 32, len(sig))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses = torch.empty(steps)

    def net_score(x, s, idx):
        return -net(x, idx) / s.unsqueeze(-1)

    with single_thread():
        for step in range(steps):
            idx = torch.randint(0, len(sig), (batch_size,), generator=gen)
            x = data[torch.randint(0, data.shape[0], (batch_size,), generator=gen)]
            noise = torch.randn(x.shape, generator=gen)
            loss = dsm_objective(lambda xt, s: net_score(xt, s, idx), x, sig[idx], noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses[step] = loss.detach()
    net.eval()

    @torch.no_grad()
    def score_fn(x, i: int):
        x = torch.as_tensor(x, dtype=torch.float32)
        return -net(x, torch.full((x.shape[0],), int(i))) / sig[int(i)]

    return score_fn, losses.numpy()
