"""Grading for topic 01, exercises 7 and 8 (re-exported by :mod:`course_utils.grading.floating_point`): the distance
between two FP32 values in ULPs, read from their bit patterns, and FP8 quantization with a per-tensor scale from a
calibrated amax, saturating, compared with torch's ``float8_e4m3fn``/``float8_e5m2`` casts. Reference answers are
private.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand
from ._float_values import _in_turn

__all__ = ["check_ulp_distance", "check_fp8_quantize"]

_LESSON = ("course_utils.floating_point",)  # with floating_point_rounding and floating_point_summation


# ---------------------------------------------------------------- exercise 7: distance in ULPs
def _ordered(x):
    """FP32 values -> int64 positions on the number line of all FP32 values; +0 and -0 share position 0."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    magnitude = bits & 0x7FFFFFFF
    return np.where(bits >> 31 == 1, -magnitude, magnitude)


def _reference_ulp_distance(a, b):
    return np.abs(_ordered(a) - _ordered(b))


# the neighbour-stepping function, torch's reading of the bits and the lesson's ULP helpers
BY_HAND_ULP_DISTANCE = ByHand(names=("numpy.nextafter", "numpy.spacing", "torch.nextafter", "torch.Tensor.view"),
                              modules=_LESSON)


def _ulp_inputs(rng, k):
    """Pairs of finite FP32 values: neighbours a few ULPs apart, across binades, across zero and both zeros,
    subnormals, and far apart (distances near 2**32, beyond int32)."""
    n = 1000
    bits = rng.integers(0, 0x7F800000, size=n, dtype=np.int64)  # finite magnitudes, subnormals included
    sign = rng.integers(0, 2, size=n, dtype=np.int64) << 31
    a = (bits | sign).astype(np.uint32).view(np.float32)
    kind = rng.integers(0, 5, size=n)
    step = rng.integers(-40, 41, size=n)
    near = np.clip(bits + step, 0, 0x7F7FFFFF) | sign  # a few ULPs away, possibly into the next binade
    cross = np.clip(rng.integers(0, 200, size=n), 0, None) | (sign ^ (1 << 31))  # tiny, on the other side of zero
    far = rng.integers(0, 0x7F800000, size=n, dtype=np.int64) | (sign ^ (1 << 31))  # big, of the other sign
    same = rng.integers(0, 0x7F800000, size=n, dtype=np.int64) | sign
    b_bits = np.select([kind == 0, kind == 1, kind == 2], [near, cross, far], default=same)
    b = b_bits.astype(np.uint32).view(np.float32)
    zeros = np.float32([0.0, -0.0, 0.0, -0.0, np.float32(1.4e-45), -np.float32(1.4e-45)])
    a = np.concatenate([a, zeros[[0, 1, 1, 4, 4, 5]]])
    b = np.concatenate([b, zeros[[1, 0, 3, 5, 0, 1]]])
    order = rng.permutation(a.size)
    return a[order], b[order]


def check_ulp_distance(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``(a, b)`` float32 arrays -> int64 number of FP32 steps between them (+0 and -0 are 0 apart)."""
    counter = iter(range(1 << 30))

    def make_inputs(rng):
        return _ulp_inputs(rng, next(counter))

    def raw_bits(a, b):
        u = lambda x: np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)  # noqa: E731
        return np.abs(u(a) - u(b))

    def zeros_apart(a, b):  # negatives placed one below: -0 sits at -1, one step from +0
        o = lambda x: np.where(np.signbit(x), _ordered(x) - 1, _ordered(x))  # noqa: E731
        return np.abs(o(a) - o(b))

    def in_int32(a, b):
        return (_ordered(a).astype(np.int32) - _ordered(b).astype(np.int32)).__abs__().astype(np.int64)

    def by_spacing(a, b):  # |a - b| over the gap at a: right only inside one binade
        with np.errstate(all="ignore"):
            d = np.abs(a.astype(np.float64) - b.astype(np.float64)) / np.spacing(np.abs(a))
            d = np.where(np.isfinite(d), np.floor(np.minimum(d, 2.0**62) + 0.5), -1.0)
        return d.astype(np.int64)

    check_function(
        fn, _reference_ulp_distance, make_inputs, name="ulp_distance", trials=trials, seed=seed, rtol=0, atol=0,
        by_hand=BY_HAND_ULP_DISTANCE, quiet=quiet,
        mistakes=[
            Mistake("signed", "some distances are negative: return |position(a) - position(b)|.",
                    lambda a, b: _ordered(a) - _ordered(b)),
            Mistake("raw_bits", "right for pairs of the same sign, wrong across zero: the bit pattern is sign and "
                    "magnitude, so map a negative value to minus its magnitude bits before subtracting.", raw_bits),
            Mistake("zeros_apart", "+0.0 and -0.0 are the same number: give them the same position (-magnitude for "
                    "negatives, not -magnitude - 1 or the bit-flip trick without a correction).", zeros_apart),
            Mistake("int32", "distances across zero overflow int32 (they reach about 2**32): compute the positions in "
                    "int64.", in_int32),
            Mistake("spacing", "|a - b| / spacing is the distance only inside one binade: count positions on the bit "
                    "patterns instead.", by_spacing),
        ],
    )


# ---------------------------------------------------------------- exercise 8: FP8 with a per-tensor scale
_FP8 = {"e4m3": (4, 3, 448.0, torch.float8_e4m3fn), "e5m2": (5, 2, 57344.0, torch.float8_e5m2)}


def _reference_fp8_quantize(x, amax, fmt):
    _, _, fmax, dtype = _FP8[fmt]
    scale = np.float32(fmax / amax)
    y = np.clip(x * scale, -fmax, fmax)  # float32; saturate: nothing beyond the largest finite FP8 value
    return torch.from_numpy(y).to(dtype).to(torch.float32).numpy(), scale


def _grid_round(y, exp_bits, man_bits, fmax, how="even", subnormals=True, saturate=True):
    """FP32 ``y`` rounded onto the grid of a 1/exp_bits/man_bits format whose largest value is ``fmax`` (for the
    named mistakes; exact in float64: the gap is a power of two)."""
    bias = 2 ** (exp_bits - 1) - 1
    a = np.abs(y.astype(np.float64))
    exponent = np.frexp(a)[1] - 1
    exponent = np.maximum(exponent, 1 - bias) if subnormals else exponent
    gap = np.ldexp(1.0, exponent - man_bits)
    q = a / gap
    r = {"truncate": np.floor, "half_away": lambda t: np.floor(t + 0.5)}.get(how, np.round)(q)  # np.round: ties to even
    v = r * gap
    if not subnormals:
        v = np.where(v < 2.0 ** (1 - bias), 0.0, v)
    v = np.minimum(v, fmax) if saturate else np.where(v > fmax, np.inf, v)
    return np.copysign(v, y.astype(np.float64)).astype(np.float32)


def _fp8_inputs(rng, fmt):
    """float32 x, a calibrated amax (a Python float, FP32-exact) and the format. Half the trials have a power-of-two
    scale, so x holds exact FP8 ties after scaling; a few values exceed amax (saturation), many are tiny (subnormals
    and underflow)."""
    e, m, fmax, _ = _FP8[fmt]
    n = 1500
    k = int(rng.integers(-6, 7))
    power_of_two = rng.random() < 0.5
    amax = float(np.float32(fmax * 2.0**-k if power_of_two else rng.uniform(0.2, 50.0)))
    scale = np.float32(fmax / amax)
    # log-uniform magnitudes from well below the smallest FP8 subnormal up to 1.3 amax
    bias = 2 ** (e - 1) - 1
    lo = np.log2(2.0 ** (1 - bias - m) / 4 / scale)
    mags = 2.0 ** rng.uniform(lo, np.log2(1.3 * amax), size=n)
    x = (mags * rng.choice([-1.0, 1.0], size=n)).astype(np.float32)
    if power_of_two:  # midpoints between FP8 neighbours, scaled back: exact ties after x * scale
        grid = _grid_round(rng.uniform(-fmax, fmax, size=200).astype(np.float32), e, m, fmax, how="truncate")
        gap = np.ldexp(1.0, np.maximum(np.frexp(np.abs(grid.astype(np.float64)))[1] - 1, 1 - bias) - m)
        ties = (grid + np.sign(grid) * gap / 2) / scale
        x[:200] = np.clip(ties, -1.3 * amax, 1.3 * amax).astype(np.float32)
    x[-4:] = np.float32([0.0, -0.0, 3.0 * amax, -3.0 * amax])  # signed zeros and clear outliers
    return rng.permutation(x), amax, fmt


# torch's casts (float8 included) at the operator level, NumPy's rounding functions, the lesson's rounding
BY_HAND_FP8 = ByHand(
    names=("numpy.round", "numpy.around", "numpy.rint", "numpy.ndarray.round", "torch.round",
           "torch.Tensor.to", "torch.Tensor.type", "torch.Tensor.half", "torch.Tensor.bfloat16"),
    ops=("_to_copy", "_convert_element_type", "round", "_scaled_mm"), modules=_LESSON)


def check_fp8_quantize(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 8: ``(x, amax, fmt) -> (q, scale)``: scale = fmax / amax in FP32, q = x * scale rounded to FP8
    (nearest-even, subnormals, saturating at +-fmax), as float32."""
    pick = _in_turn(["e4m3", "e5m2"], lambda rng: ("e4m3", "e5m2")[int(rng.integers(2))])

    def make_inputs(rng):
        return _fp8_inputs(rng, pick(rng))

    def variant(x, amax, fmt, *, fmax=None, exp_bits=None, **how):
        e, m, fm, _ = _FP8[fmt]
        fmax = fm if fmax is None else fmax
        scale = np.float32(fmax / amax)
        return _grid_round(x * scale, e if exp_bits is None else exp_bits, m, fmax, **how), scale

    def dequantized(x, amax, fmt):
        q, scale = _reference_fp8_quantize(x, amax, fmt)
        return q / scale, scale

    def inverse(x, amax, fmt):
        e, m, fmax, _ = _FP8[fmt]
        scale = np.float32(amax / fmax)
        return _grid_round(x * scale, e, m, fmax), scale

    def ieee_e4m3(x, amax, fmt):  # E4M3 read as an IEEE format: the top exponent reserved, largest value 240
        return variant(x, amax, fmt, fmax=240.0) if fmt == "e4m3" else None

    check_function(
        fn, _reference_fp8_quantize, make_inputs, name="fp8_quantize", trials=trials, seed=seed,
        rtol=0, atol=0, by_hand=BY_HAND_FP8, quiet=quiet,
        mistakes=[
            Mistake("overflow_inf", "values beyond amax became inf: saturate, clip x * scale to [-fmax, fmax] (an inf "
                    "or NaN in an FP8 tensor poisons every matmul it enters).",
                    lambda x, a, f: variant(x, a, f, saturate=False)),
            Mistake("ieee_e4m3", "your E4M3 stops at 240: E4M3FN has no infinities, so its top exponent holds normal "
                    "numbers up to 448 (only S.1111.111 is NaN).", ieee_e4m3),
            Mistake("truncate", "you round toward zero: round to the nearest FP8 value, ties to the even neighbour.",
                    lambda x, a, f: variant(x, a, f, how="truncate")),
            Mistake("half_away", "exact ties are rounded away from zero: on a tie pick the neighbour whose last "
                    "fraction bit is 0 (ties to even).", lambda x, a, f: variant(x, a, f, how="half_away")),
            Mistake("ftz", "small values were flushed to zero: FP8 has subnormals, spaced 2**(1 - bias - man_bits) "
                    "apart down to zero.", lambda x, a, f: variant(x, a, f, subnormals=False)),
            Mistake("dequantized", "you returned q / scale (the dequantized values); return the FP8 values q = "
                    "round(x * scale) themselves, and the scale next to them.", dequantized),
            Mistake("scale_float64", "your q is right but your scale is the float64 quotient: return the scale you "
                    "multiplied by, np.float32(fmax / amax) (it is stored in FP32 next to the FP8 tensor).",
                    lambda x, a, f: (_reference_fp8_quantize(x, a, f)[0], _FP8[f][2] / a)),
            Mistake("inverse_scale", "your scale is amax / fmax, its inverse: scale = fmax / amax maps amax onto the "
                    "largest FP8 value.", inverse),
        ],
    )
