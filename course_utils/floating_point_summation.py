r"""Topic 01 (floating point): summation orders and their rounding errors.

Used by ``notebooks/01_floating_point.ipynb`` (section 12: a running FP16 sum stalls, Kahan's
compensation (eq. 10) and pairwise trees (eq. 9) do not), which writes each by hand and asserts its
version equals the one here, and by later lessons (05 GEMM: why the accumulator is FP32).
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["sequential_sum", "kahan_sum", "pairwise_sum"]


def sequential_sum(x: Any, acc_dtype: Any = None) -> np.ndarray:
    """Left-to-right sums over the last axis with every partial sum rounded to ``acc_dtype``.

    Returns all prefix sums (``np.add.accumulate`` adds strictly in order, unlike ``np.sum``,
    which sums pairwise and, for float16, in float32). ``[..., -1]`` is the total.
    """
    x = np.asarray(x)
    return np.add.accumulate(x.astype(acc_dtype or x.dtype), axis=-1)


def kahan_sum(x: Any, dtype: Any = None, *, prefixes: bool = False) -> np.ndarray:
    r"""Compensated (Kahan) summation over the last axis, every operation rounded to ``dtype``.

    Lanes over the leading axes run together (the loop is over the summed axis only). The
    compensation ``c`` holds the low-order part lost when ``y`` was added to ``s`` (lesson 01, eq. 10):
    ``y = x_i - c; t = s + y; c = (t - s) - y; s = t``. With ``prefixes=True`` returns every
    running sum, shape ``x.shape``; otherwise the totals, shape ``x.shape[:-1]``.
    """
    x = np.asarray(x)
    dtype = np.dtype(dtype or x.dtype)
    x = x.astype(dtype)
    s = np.zeros(x.shape[:-1], dtype)
    c = np.zeros(x.shape[:-1], dtype)
    out = np.empty(x.shape, dtype) if prefixes else None
    for i in range(x.shape[-1]):
        y = (x[..., i] - c).astype(dtype, copy=False)  # (lanes,), rounded to dtype after every operation
        t = (s + y).astype(dtype, copy=False)
        c = ((t - s).astype(dtype, copy=False) - y).astype(dtype, copy=False)
        s = t
        if prefixes:
            out[..., i] = s
    return out if prefixes else s


def pairwise_sum(x: Any, dtype: Any = None) -> np.ndarray:
    """Tree summation over the last axis in ``dtype``: add neighbours in pairs, log2(n) levels (lesson 01, eq. 9)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype or x.dtype)
    x = x.astype(dtype)
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    pad = np.zeros(x.shape[:-1] + (width - n,), dtype)
    x = np.concatenate([x, pad], axis=-1)  # (..., width), zeros add exactly
    while x.shape[-1] > 1:
        x = (x[..., 0::2] + x[..., 1::2]).astype(dtype)  # (..., width / 2)
    return x[..., 0]
