"""What checks hand the learner's function, and how they drive it: shipped in the learners' release.

A check of :mod:`course_utils.grading` whose inputs hold a callable (a fixed noise predictor, a score function, a
test function, a small module) builds it from a class of this module, so that the release can store those inputs
as data (a pickle names ``course_utils.classroom.released.<Class>`` and its arrays) and replay them without the
grading modules. A check that adapts the learner's call (copies an input and checks it comes back unchanged,
builds the learner's class and drives it through a script) passes ``functools.partial(driver, fn)`` to
``check_function``, with ``driver`` a function of this module; the release records the driver by name and the
released check calls it around the learner's function. See :mod:`course_utils.classroom.release`.

Nothing here is an answer: these are inputs and harnesses, the same for the right answer and for every mistake.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..errors import CheckFailed

__all__ = ["EpsModel", "LinearDenoiser", "SmoothMap", "AffineScore", "MixtureDenoiser", "StepNoise", "AffineDecoder",
           "Gated", "ScaledByFirst", "HalvesProduct", "HalfKept", "SimulatedPeers",
           "call_restoring", "drive_loss_scaler", "scaler_trace", "comparable_grads", "choice_total_loss"]


# ---------------------------------------------------------------- fixed functions handed to the learner's code
class EpsModel:
    """A fixed, deterministic noise predictor eps(x, t) = tanh(x @ W) * c + b * t / T (t a Python int).

    Computed in NumPy: tiny matrices, where torch's intra-op threads only add contention on a loaded machine."""

    def __init__(self, rng, T):
        self.W = rng.standard_normal((2, 2))
        self.c = float(rng.uniform(0.5, 1.5))
        self.b = rng.standard_normal(2)
        self.T = T

    def __call__(self, x, t):
        out = np.tanh(x.detach().cpu().numpy() @ self.W) * self.c + self.b * (int(t) / self.T)
        return torch.from_numpy(out).to(x.dtype)

    def __repr__(self):
        return "eps_model"


class LinearDenoiser:
    """A fixed, deterministic 'network' eps(x, t) = x @ W + b * t/T, for checking losses."""

    def __init__(self, rng, T):
        self.W = torch.tensor(rng.standard_normal((2, 2)) * 0.5)
        self.b = torch.tensor(rng.standard_normal(2))
        self.T = T

    def __call__(self, x, t):
        return x @ self.W + self.b * (t.to(x.dtype).unsqueeze(-1) / self.T)

    def __repr__(self):
        return "denoiser"


class SmoothMap:
    """f(x) = tanh(A x) + (x . x) c: an R^n -> R^m function with curvature in every direction."""

    def __init__(self, rng, n, m):
        self.A = rng.standard_normal((m, n))
        self.c = rng.standard_normal(m) * 0.5

    def __call__(self, x):
        return np.tanh(self.A @ x) + (x @ x) * self.c

    def __repr__(self):
        return f"f: R^{self.A.shape[1]} -> R^{self.A.shape[0]}"


class AffineScore:
    """A fixed 'score network' s(x, c) = x @ W + b / c (or s(x) = x @ W + b), for checking losses and steps."""

    def __init__(self, rng: np.random.Generator, dim: int, with_sigma: bool):
        self.W = torch.tensor(rng.standard_normal((dim, dim)) * 0.5)
        self.b = torch.tensor(rng.standard_normal(dim))
        self.with_sigma = with_sigma

    def __call__(self, x, sigma=None):
        out = x @ self.W
        if self.with_sigma:
            return out + self.b / sigma.unsqueeze(-1)
        return out + self.b

    def __repr__(self):
        return "score_fn"


class MixtureDenoiser:
    """The exact denoiser D(x; sigma) = E[x0 | x0 + sigma z = x] of a random isotropic Gaussian mixture.

    Written in NumPy (tiny matrices: torch's intra-op threads only add contention on a loaded machine)."""

    def __init__(self, rng: np.random.Generator, dim: int):
        k = int(rng.integers(2, 6))
        self.log_w = np.log(rng.dirichlet(np.ones(k)))                   # (K,)
        self.means = rng.standard_normal((k, dim)) * 2.0                 # (K, D)
        self.var = rng.uniform(0.05, 0.6, k)                             # (K,) isotropic component variances

    def __call__(self, x, sigma):
        sigma = float(sigma)
        xn = x.detach().cpu().numpy()                                    # (B, D)
        v = self.var + sigma**2                                          # variances of the noised components
        sq = ((xn[:, None, :] - self.means[None]) ** 2).sum(-1)          # (B, K)
        logits = self.log_w - 0.5 * xn.shape[1] * np.log(v) - 0.5 * sq / v
        r = np.exp(logits - logits.max(-1, keepdims=True))
        r /= r.sum(-1, keepdims=True)                                    # responsibilities
        post = (self.var[None, :, None] * xn[:, None, :] + sigma**2 * self.means[None]) / v[None, :, None]
        return torch.from_numpy((r[:, :, None] * post).sum(1)).to(x.dtype)   # sum_k r_k E[x0 | x, k]

    def __repr__(self):
        return "denoiser"


class StepNoise:
    """``noise(i)``: the fixed standard normal draw of step i, shape (B, D), the same on every call."""

    def __init__(self, z: torch.Tensor):
        self.z = z                                                       # (N, B, D)

    def __call__(self, i):
        if not 0 <= int(i) < self.z.shape[0]:
            raise IndexError(f"noise({i}): steps are numbered 0 to {self.z.shape[0] - 1}, one draw per step")
        return self.z[int(i)].clone()

    def __repr__(self):
        return "noise"


class AffineDecoder:
    """A fixed random affine decoder z -> logits, ``(..., k) -> (..., D)``, for the ELBO exercise (float64)."""

    def __init__(self, rng: np.random.Generator, k: int, d: int):
        self.weight = torch.from_numpy(1.5 * rng.standard_normal((k, d)))
        self.bias = torch.from_numpy(0.5 * rng.standard_normal((d,)))

    def __call__(self, z):
        return z @ self.weight + self.bias  # (..., k) @ (k, D) -> (..., D)

    def __repr__(self) -> str:
        return "decode"


# ---------------------------------------------------------------- small modules whose saved tensors are tricky
class Gated(nn.Module):
    """tanh(fc(x)) * x: its input is saved by fc and by the product, one tensor saved twice."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):  # (B, w) -> (B, w)
        return torch.tanh(self.fc(x)) * x


class ScaledByFirst(nn.Module):
    """y * y[:, :1] with y = fc(x): y and a view of it that starts at the same address are both saved."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):  # (B, w) -> (B, w)
        y = self.fc(x)
        return y * y[:, :1]  # (B, w) * (B, 1)


class HalvesProduct(nn.Module):
    """a * b with a, b = fc(x).chunk(2): two views (two tensor objects, two data pointers) of one storage."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)

    def forward(self, x):  # (B, w) -> (B, w)
        a, b = self.fc(x).chunk(2, dim=-1)  # two (B, w) views of one (B, 2w) storage
        return a * b


class HalfKept(nn.Module):
    """tanh(a) * b with a, b = fc(x).chunk(2): only the view b is saved, and it keeps all of fc(x) alive."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)

    def forward(self, x):  # (B, w) -> (B, w)
        a, b = self.fc(x).chunk(2, dim=-1)
        return torch.tanh(a) * b


# ---------------------------------------------------------------- one rank's peers, simulated in one process
class SimulatedPeers:
    """Rank ``rank`` of ``world``: the other ranks' padded gradients and their updated shards are held here
    (and the optimizer states of all ranks, ``_m_all``/``_v_all``, set by the check that draws them)."""

    def __init__(self, rank, world, padded_grads, new_shards):
        self.rank, self.world = rank, world
        self._grads, self._shards = padded_grads, new_shards   # (world, world*S), (world, S)

    def reduce_scatter(self, output, input):
        size = self._shards.shape[1]
        if tuple(input.shape) != (self.world * size,) or tuple(output.shape) != (size,):
            raise ValueError(f"reduce_scatter takes output of shape ({size},) and input of shape ({self.world * size},) "
                             f"(the gradient zero-padded to a multiple of world), got {tuple(output.shape)} and "
                             f"{tuple(input.shape)}")
        others = [self._grads[r] for r in range(self.world) if r != self.rank]
        total = input.detach().clone()
        for g in others:
            total = total + g.to(input.dtype)
        output.copy_(total[self.rank * size:(self.rank + 1) * size])

    def all_gather(self, output, input):
        size = self._shards.shape[1]
        if tuple(input.shape) != (size,) or tuple(output.shape) != (self.world * size,):
            raise ValueError(f"all_gather takes output of shape ({self.world * size},) and input of shape ({size},) "
                             f"(this rank's updated shard), got {tuple(output.shape)} and {tuple(input.shape)}")
        pieces = [input.detach() if r == self.rank else self._shards[r].to(input.dtype) for r in range(self.world)]
        output.copy_(torch.cat(pieces))

    def __repr__(self):
        return f"comm(rank={self.rank}, world={self.world})"


# ---------------------------------------------------------------- drivers: check_function(partial(driver, fn), ...)
def call_restoring(fn, f, x, eps):
    """``fn(f, x, eps)`` on a copy of ``x`` that must come back unchanged (each perturbed entry put back)."""
    x_seen = x.copy()
    got = fn(f, x_seen, eps)
    if not np.array_equal(x_seen, x):
        raise CheckFailed("numerical_jacobian: x is not the same after your function: put each perturbed "
                          "entry back (x[i] = original) before moving to the next one.")
    return got


def scaler_trace(scales, skipped, unscaled):
    """A loss scaler's run as tensors: scales (T,) float64, skipped (T,) bool, unscaled gradients (T, 17)."""
    return torch.tensor(scales, dtype=torch.float64), torch.tensor(skipped), torch.stack(unscaled)


def drive_loss_scaler(make_scaler, hyper, script):
    """Build ``make_scaler(**hyper)`` (a class with ``.scale``, ``unscale_(grads) -> found_inf``, ``update(found_inf)``)
    and feed it ``script``, a list of true gradients per step; return :func:`scaler_trace` of the run."""
    scales, skipped, unscaled = [], [], []
    scaler = make_scaler(**hyper)
    for grads in script:
        current = float(scaler.scale)
        got = [g * current for g in grads]  # what backward of S * L produces
        skip = bool(scaler.unscale_(got))
        scaler.update(skip)
        scales.append(float(scaler.scale))
        skipped.append(skip)
        unscaled.append(comparable_grads(got, skip))
    return scaler_trace(scales, skipped, unscaled)


# The grader runs this driver in the learner's kernel, in one request (classroom.remote.RemoteDriver): the check
# compares its whole result (every scale, skip and unscaled gradient) with torch's GradScaler on fresh inputs.
drive_loss_scaler.runs_in_kernel = True


def comparable_grads(grads, skip):
    """One step's unscaled gradients flattened to (17,), zeros for a skipped step, inf/NaN made comparable."""
    flat = torch.zeros(17) if skip else torch.cat([g.reshape(-1) for g in grads])  # (17,)
    return torch.nan_to_num(flat, nan=-7.0, posinf=7e30, neginf=-7e30)  # comparable even when wrong


def choice_total_loss(fn, costs, losses, budget):
    """The total loss of ``fn(costs, losses, budget)``'s choice (one variant index per layer), after checking that it
    is a valid choice within the budget: a check compares it with the optimum (a choice itself is not unique)."""
    got = fn(costs, losses, budget)
    try:
        got = [int(j) for j in got]
    except Exception:
        raise CheckFailed(f"choose_variants: return a list of integers (one variant index per layer), got "
                          f"{type(got).__name__}.") from None
    if len(got) != len(costs) or any(not 0 <= j < len(c) for j, c in zip(got, costs)):
        raise CheckFailed(f"choose_variants: return one valid variant index per layer ({len(costs)} of them).")
    cost = sum(c[j] for c, j in zip(costs, got))
    if cost > budget:
        raise CheckFailed(f"choose_variants: your choice costs {cost}, over the budget {budget}; "
                          f"a layer's cost counts once, for the variant you pick.")
    return float(sum(l_[j] for l_, j in zip(losses, got)))
