r"""Two-sample distances for judging generated point clouds offline (lesson 11, section 9).

:func:`mmd_rbf` (unbiased squared maximum mean discrepancy with a sum of RBF kernels) and
:func:`sliced_wasserstein`. Used by ``notebooks/11_ddpm_ddim.ipynb`` and later generative lessons.
:func:`distances_to` gives both against one fixed reference sample for many samples (lesson 12 scores
dozens of sampler runs against the same held-out points), computing the reference's own part once.
"""
from __future__ import annotations

from typing import Any

import torch

from .bench import single_thread

__all__ = ["mmd_rbf", "sliced_wasserstein", "distances_to"]

BANDWIDTHS = (0.05, 0.1, 0.2, 0.5, 1.0)


def _sq_dists(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
              work: torch.Tensor | None = None) -> torch.Tensor:
    """Squared Euclidean distances (n, D), (m, D) -> (n, m), one column of D at a time (no (n, m, D) temporary),
    into ``out`` with ``work`` as scratch when given (both (n, m); reused buffers skip fresh pages)."""
    out = torch.zeros(a.shape[0], b.shape[0], dtype=a.dtype) if out is None else out.zero_()
    work = torch.empty_like(out) if work is None else work
    for d in range(a.shape[1]):
        out += torch.sub(a[:, d, None], b[None, :, d], out=work).square_()  # (n, m)
    return out


def _kernel_sum(x: torch.Tensor, y: torch.Tensor, bandwidths, buffers=None) -> torch.Tensor:
    r""":math:`\sum_\sigma \exp(-\|x_i-y_j\|^2 / (2\sigma^2))`, (n, m). The same operations in the same order as
    ``sum(torch.exp(d2 * (-0.5 / s**2)) for s in bandwidths)``, in place: a fresh million-entry float64 temporary per
    operation costs more (new pages) than the arithmetic. ``buffers``: three (n, m) tensors to reuse, or None."""
    d2, out, term = buffers if buffers is not None else (torch.empty(x.shape[0], y.shape[0], dtype=x.dtype) for _ in range(3))
    _sq_dists(x, y, d2, term)
    out.zero_()
    for s in bandwidths:
        torch.mul(d2, -0.5 / s**2, out=term)
        out += term.exp_()
    return out


def _within(a: torch.Tensor, bandwidths, buffers=None) -> torch.Tensor:
    """The mean of k(a_i, a_j) over i != j (the unbiased estimator's within-sample term), a 0-d float64 tensor."""
    n = a.shape[0]
    kaa = _kernel_sum(a, a, bandwidths, buffers)
    return (kaa.sum() - kaa.diagonal().sum()) / (n * (n - 1))


def mmd_rbf(a: Any, b: Any, bandwidths: tuple[float, ...] = BANDWIDTHS) -> float:
    r"""Unbiased squared maximum mean discrepancy between samples ``a`` (n, D) and ``b`` (m, D).

    Kernel: :math:`k(x, y) = \sum_\sigma \exp(-\|x-y\|^2 / (2\sigma^2))`. The unbiased estimator leaves
    the diagonal out of the within-sample means, so it is about 0 (and can be slightly negative) when
    both samples come from the same distribution.
    """
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    same = a.shape[0] == b.shape[0]  # then the three (n, n) kernel matrices share three buffers
    buffers = [torch.empty(a.shape[0], b.shape[0], dtype=torch.float64) for _ in range(3)] if same else None
    with single_thread():  # a few million exps: one thread is fast enough and immune to a loaded machine
        within_a, within_b = _within(a, bandwidths, buffers), _within(b, bandwidths, buffers)
        cross = _kernel_sum(a, b, bandwidths, buffers).mean()
    return float(within_a + within_b - 2 * cross)


def _directions(dim: int, n_projections: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    dirs = torch.randn(dim, n_projections, generator=gen, dtype=torch.float64)
    return dirs / dirs.norm(dim=0, keepdim=True)  # (D, P) unit columns


def _sorted_projections(a: torch.Tensor, dirs: torch.Tensor) -> torch.Tensor:
    """Each column of ``a @ dirs`` (n, P) sorted; sorted along contiguous rows of the transpose (faster), then laid
    out as (n, P) again so that later reductions run in the same order."""
    return torch.sort((a @ dirs).T.contiguous(), dim=1)[0].T.contiguous()


def sliced_wasserstein(a: Any, b: Any, n_projections: int = 256, seed: int = 0) -> float:
    """Sliced 1-Wasserstein distance between two samples of the same size (n, D).

    Projects both onto ``n_projections`` random unit directions (fixed by ``seed``); in 1-D the
    Wasserstein-1 distance is the mean absolute difference of the sorted samples. Averages over directions.
    """
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"sliced_wasserstein needs samples of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    dirs = _directions(a.shape[1], n_projections, seed)
    return float((_sorted_projections(a, dirs) - _sorted_projections(b, dirs)).abs().mean())


def distances_to(reference: Any, bandwidths: tuple[float, ...] = BANDWIDTHS, n_projections: int = 256, seed: int = 0):
    """A function ``x -> (mmd_rbf(x, reference), sliced_wasserstein(x, reference))``, bit for bit those two numbers,
    for scoring many samples against one fixed ``reference`` (m, D): the reference's within-sample kernel mean
    and its sorted projections are computed once, here, instead of once per call."""
    ref = torch.as_tensor(reference, dtype=torch.float64)
    dirs = _directions(ref.shape[1], n_projections, seed)
    buffers = [torch.empty(len(ref), len(ref), dtype=torch.float64) for _ in range(3)]   # reused by every call
    with single_thread():
        within_ref, ref_sorted = _within(ref, bandwidths, buffers), _sorted_projections(ref, dirs)

    def distances(x: Any) -> tuple[float, float]:
        x = torch.as_tensor(x, dtype=torch.float64)
        if x.shape != ref.shape:
            raise ValueError(f"distances_to needs samples of the reference's shape {tuple(ref.shape)}, got {tuple(x.shape)}")
        with single_thread():
            within_x = _within(x, bandwidths, buffers)
            mmd = within_x + within_ref - 2 * _kernel_sum(x, ref, bandwidths, buffers).mean()
            sw = (_sorted_projections(x, dirs) - ref_sorted).abs().mean()
        return float(mmd), float(sw)

    return distances
