r"""Topic 01 (floating point): rounding FP32 to narrower formats, spacing (ULPs) and what survives a cast.

Used by ``notebooks/01_floating_point.ipynb`` (round-to-nearest-even on the bit level, eq. 4;
stochastic rounding, eq. 7; ULPs, eq. 6), which derives each function by hand and asserts its
version equals the one here; by the checks in :mod:`course_utils.grading.floating_point`
(:func:`rounding_test_values`); and by lesson 02 (what a cast to FP16/BF16 flushes or overflows).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .floating_point import FloatFormat, _fmt, decode, fields

__all__ = [
    "OVERFLOW_MODES",
    "default_overflow",
    "round_bits",
    "round_to_format",
    "torch_round",
    "stochastic_round",
    "ulp",
    "CLASS_NAMES",
    "classify",
    "rounding_test_values",
]


OVERFLOW_MODES = ("inf", "saturate", "nan")


def default_overflow(fmt: FloatFormat) -> str:
    """What PyTorch's cast does on overflow: IEEE formats go to inf; E4M3FN saturates to +-max (torch 2.13)."""
    return "saturate" if fmt.no_inf else "inf"


def round_bits(x: Any, fmt: FloatFormat | str, *, overflow: str | None = None, stochastic_u: Any = None) -> np.ndarray:
    """Bit patterns (int64) of FP32 values ``x`` rounded to ``fmt`` with integer arithmetic only.

    Round-to-nearest, ties-to-even (lesson 01, eq. 4): keep the top bits of the 24-bit FP32
    significand, look at the dropped remainder ``r`` against half a unit ``h``, round up when
    ``r > h``, or ``r == h`` and the kept part is odd. Subnormal results shift further right; a
    carry out of the fraction bumps the exponent field by itself. ``overflow`` is ``inf``,
    ``saturate`` (to +-max) or ``nan``; default: what torch does (:func:`default_overflow`).

    With ``stochastic_u`` (uniform integers in ``[0, 2**shift)`` are drawn from it if it is a
    ``np.random.Generator``), rounds up when ``r + u >= 2**shift``: stochastic rounding.
    """
    fmt = _fmt(fmt)
    overflow = overflow or default_overflow(fmt)
    if overflow not in OVERFLOW_MODES or (overflow == "inf" and fmt.no_inf):
        raise ValueError(f"overflow must be one of {OVERFLOW_MODES} (and not 'inf' for a format without infinities)")
    m, e = fmt.man_bits, fmt.exp_bits
    if not (e <= 8 and m < 23):
        raise ValueError("round_bits converts FP32 into narrower formats (exp_bits <= 8, man_bits < 23)")
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    sign, mag = u >> 31, u & 0x7FFFFFFF
    E, M = mag >> 23, mag & 0x7FFFFF
    sig = np.where(E > 0, M | (1 << 23), M)  # 24-bit significand (no hidden bit for FP32 subnormals)
    e_target = np.maximum(E, 1) - 127 + fmt.bias  # target's biased exponent if the result is normal
    e_eff = np.maximum(e_target, 1)  # subnormal results live at exponent field 1 - bias ...
    shift = np.minimum((23 - m) + (e_eff - e_target), 40)  # ... and drop that many more bits
    kept = sig >> shift
    rest = sig & ((np.int64(1) << shift) - 1)
    if stochastic_u is None:
        half = np.int64(1) << (shift - 1)
        up = (rest > half) | ((rest == half) & ((kept & 1) == 1))  # eq. 4: ties go to the even neighbour
    else:
        if isinstance(stochastic_u, np.random.Generator):
            stochastic_u = stochastic_u.integers(0, np.int64(1) << shift)
        up = rest + np.asarray(stochastic_u, dtype=np.int64) >= (np.int64(1) << shift)
    out = ((e_eff - 1) << m) + kept + up  # a carry out of the fraction bumps the exponent (eq. 5)
    e_all = (1 << e) - 1
    inf_bits = e_all << m
    nan_bits = (e_all << m) | ((1 << m) - 1)
    max_bits = nan_bits - 1 if fmt.no_inf else inf_bits - 1
    too_big = (out > max_bits) | (mag == 0x7F800000)
    out = np.where(too_big, {"inf": inf_bits, "saturate": max_bits, "nan": nan_bits}[overflow], out)
    out = np.where(mag > 0x7F800000, nan_bits, out)
    return (sign << (fmt.bits - 1)) | out


def round_to_format(x: Any, fmt: FloatFormat | str, *, overflow: str | None = None) -> np.ndarray:
    """FP32 ``x`` rounded to nearest-even in ``fmt``, returned as float64 values (see :func:`round_bits`)."""
    fmt = _fmt(fmt)
    return decode(round_bits(x, fmt, overflow=overflow), fmt.exp_bits, fmt.man_bits, no_inf=fmt.no_inf)


def torch_round(x: Any, fmt: FloatFormat | str) -> np.ndarray:
    """The framework's cast of FP32 values to ``fmt``, returned as float64 values."""
    fmt = _fmt(fmt)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(fmt.torch)
    return t.to(torch.float64).numpy()


def stochastic_round(x: Any, fmt: FloatFormat | str, rng: np.random.Generator, *, overflow: str | None = None) -> np.ndarray:
    r"""FP32 ``x`` rounded to one of its two neighbours in ``fmt`` at random, unbiased (lesson 01, eq. 7).

    The magnitude rounds up with probability ``(|x| - lo) / (hi - lo)``, so ``E[round(x)] = x``:
    a tiny update that nearest rounding would always lose survives on average.
    """
    fmt = _fmt(fmt)
    b = round_bits(x, fmt, overflow=overflow, stochastic_u=rng)
    return decode(b, fmt.exp_bits, fmt.man_bits, no_inf=fmt.no_inf)


# ---------------------------------------------------------------- spacing and ranges
def ulp(x: Any, fmt: FloatFormat | str) -> np.ndarray:
    """Gap between ``|x|`` and the next larger value of ``fmt`` (lesson 01, eq. 6): ``2**(max(floor(log2|x|), 1-bias) - m)``."""
    fmt = _fmt(fmt)
    a = np.abs(np.asarray(x, dtype=np.float64))
    _, exp2 = np.frexp(a)  # a = f * 2**exp2 with f in [0.5, 1): floor(log2 a) = exp2 - 1
    exponent = np.where(a > 0, exp2 - 1, 1 - fmt.bias)
    return np.ldexp(1.0, (np.maximum(exponent, 1 - fmt.bias) - fmt.man_bits).astype(np.int32))


CLASS_NAMES = ("zero", "subnormal", "normal", "overflow")


def classify(x: Any, fmt: FloatFormat | str) -> np.ndarray:
    """What FP32 ``x`` becomes after round-to-nearest-even into ``fmt``: 0 zero, 1 subnormal, 2 normal, 3 overflow.

    ``x == 0`` counts as zero; "overflow" means the result is inf (or, for E4M3FN, that it had to
    saturate or become NaN). Decided from the *rounded* result, so values a hair below the smallest
    normal that round up to it count as normal.
    """
    fmt = _fmt(fmt)
    b = round_bits(x, fmt, overflow="nan" if fmt.no_inf else "inf")
    _, exponent, fraction = fields(b, fmt.exp_bits, fmt.man_bits)
    e_all = (1 << fmt.exp_bits) - 1
    overflowed = (exponent == e_all) & ((fraction == (1 << fmt.man_bits) - 1) if fmt.no_inf else True)
    return np.where(overflowed, 3, np.where(exponent > 0, 2, np.where(fraction > 0, 1, 0))).astype(np.int64)


_F32_MAX = float(np.finfo(np.float32).max)


def rounding_test_values(rng: np.random.Generator, fmt: FloatFormat, n: int) -> np.ndarray:
    """``n`` FP32 inputs for rounding checks: random values across the range, exact ties, and the edges."""
    m = fmt.man_bits
    lo, hi = math.log2(fmt.smallest_subnormal) - 2, math.log2(fmt.max_value) + 1
    n_spread = n - n // 4 - n // 8 - 7  # the rest of the n values
    spread = np.exp2(rng.uniform(lo, hi, n_spread)) * rng.choice([-1.0, 1.0], n_spread)
    e = rng.uniform(math.log2(fmt.smallest_normal), math.log2(fmt.max_value), n // 4)
    grid = np.ldexp(np.floor(np.ldexp(np.exp2(e), -(np.floor(e).astype(int) - m))), np.floor(e).astype(int) - m)
    ties = grid + ulp(grid, fmt) / 2  # exactly halfway between two neighbours
    k = rng.integers(0, 1 << m, n // 8)
    sub_ties = (k + 0.5) * fmt.smallest_subnormal  # halfway between subnormals (k = 0: halfway to zero)
    edges = np.array([0.0, fmt.max_value, fmt.max_value + ulp(fmt.max_value, fmt) / 2,
                      fmt.max_value * 1.5, fmt.smallest_subnormal / 2, fmt.smallest_subnormal * 0.51,
                      fmt.smallest_normal * (1 - 2.0**-(m + 2))])
    x = np.concatenate([spread, ties, -sub_ties, edges])
    x = np.clip(x, -_F32_MAX, _F32_MAX).astype(np.float32)  # BF16's range reaches FP32's end
    return rng.permutation(x)
