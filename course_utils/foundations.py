r"""Topic 00 (foundations): the NumPy/PyTorch memory model, and the helpers later lessons reuse.

Used by:

* ``notebooks/00_foundations.ipynb`` -- derives :func:`sliding_windows` (strides and
  ``as_strided``) and :func:`numerical_gradient` (central differences) by hand, then asserts that
  its versions equal these;
* later lessons -- :func:`sliding_windows` for convolution as a windowed dot product (03) and
  :func:`numerical_gradient` to check the backward passes later lessons write by hand.

The checks of ``solutions/00_foundations.ipynb`` live in :mod:`course_utils.grading.foundations`.

Central difference (lesson 00, eq. 5), with error :math:`O(\epsilon^2)` against the forward
difference's :math:`O(\epsilon)`:

.. math:: \frac{\partial f}{\partial x_i} \approx \frac{f(x + \epsilon e_i) - f(x - \epsilon e_i)}{2\epsilon}
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

__all__ = ["sliding_windows", "numerical_gradient"]


def sliding_windows(x: Any, width: int):
    """All length-``width`` windows along the last axis, as a view: ``(..., L) -> (..., L - width + 1, width)``.

    ``out[..., i, k] == x[..., i + k]``. No bytes are copied: the window axis and the position
    axis both step by the last axis's stride (lesson 00, eq. 2). Works on NumPy arrays (the view is
    read-only, because writing through overlapping windows changes several windows at once) and on
    torch tensors (``Tensor.as_strided``; do not write into the result).
    """
    length = x.shape[-1]
    if not 1 <= width <= length:
        raise ValueError(f"window width must be between 1 and the last axis length {length}, got {width}")
    count = length - width + 1
    shape = tuple(x.shape[:-1]) + (count, width)
    if isinstance(x, torch.Tensor):
        strides = tuple(x.stride()[:-1]) + (x.stride(-1), x.stride(-1))  # in elements
        return x.as_strided(shape, strides, x.storage_offset())
    x = np.asarray(x)
    strides = x.strides[:-1] + (x.strides[-1], x.strides[-1])  # in bytes
    return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)


def numerical_gradient(f: Callable[[Any], Any], x: Any, eps: float = 1e-6):
    """Central-difference gradient of the scalar ``f(x)`` with respect to the array ``x`` (lesson 00, eq. 5).

    ``x`` (a NumPy array or a torch tensor, ideally float64) is perturbed *in place* one entry at
    a time and every entry is restored afterwards, so ``f`` may read ``x`` through a closure (for
    example a model parameter). Returns an array/tensor shaped like ``x``. Cost: ``2 * x.size``
    evaluations of ``f``, so use it on small problems only.
    """
    is_tensor = isinstance(x, torch.Tensor)
    grad = torch.zeros_like(x) if is_tensor else np.zeros_like(x, dtype=np.float64)
    with torch.no_grad():
        for idx in np.ndindex(*tuple(x.shape)):
            original = x[idx].item() if is_tensor else x[idx]
            x[idx] = original + eps
            f_plus = float(f(x))
            x[idx] = original - eps
            f_minus = float(f(x))
            x[idx] = original  # restore, or every later entry is evaluated at the wrong point
            grad[idx] = (f_plus - f_minus) / (2 * eps)
    return grad
