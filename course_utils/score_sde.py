r"""Topic 12 (score matching, Langevin, SDEs): densities with exact scores, Langevin samplers, score matching.

Used by ``notebooks/12_score_sde.ipynb`` (sections 1-3 write every function here by hand first, then
assert it equals this copy) and by ``solutions/12_score_sde.ipynb`` (checks in
:mod:`course_utils.grading.score_sde`). The SDE samplers are in :mod:`course_utils.score_sde_solvers`,
the Fokker-Planck material in :mod:`course_utils.score_sde_fokker_planck`; the noise-prediction network
and the 2-D data come from lesson 11 (:mod:`course_utils.diffusion_training`).

The central object is a Gaussian mixture with diagonal covariances, :class:`DiagMixture`. Its score is
exact, and it stays a mixture under both forward processes (VE: add :math:`\sigma^2` to every variance;
VP: scale the means by :math:`\sqrt{\bar\alpha}` and the variances to :math:`\bar\alpha v + 1 - \bar\alpha`),
so every noised marginal has an exact score too. :func:`moons_mixture` writes lesson 11's two-moons
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
from dataclasses import dataclass

import torch

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


def two_mode_mixture(separation: float = 8.0, std: float = 0.5, weight_left: float = 0.8, dim: int = 2) -> DiagMixture:
    """Two isotropic modes on the first axis at -separation/2 and +separation/2, weights ``weight_left`` and the rest."""
    means = torch.zeros(2, dim, dtype=torch.float64)
    means[:, 0] = torch.tensor([-separation / 2, separation / 2])
    return DiagMixture.of([weight_left, 1 - weight_left], means, torch.full((2, dim), std**2))


def moons_mixture(n_angles: int = 200) -> DiagMixture:
    r"""Lesson 11's standardized two-moons law (:func:`course_utils.diffusion_training.make_data`) as a mixture.

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
