"""Grading for topic 01 (floating point): the checks, named mistakes and references of ``solutions/01_floating_point.ipynb``.

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``; a failure names
the seed that reproduces it), compares bit-exactly where the answer is exact, and names the likely
mistake. Reference answers are private. Exercises 7 and 8 live in :mod:`course_utils.grading.floating_point_fp8`
(re-exported here).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, call_learner, check_function
from ..errors import CheckFailed
from ..floating_point import FORMATS, FloatFormat, decode, fields, random_patterns, torch_decode
from ..floating_point_rounding import _F32_MAX, classify, round_to_format, rounding_test_values, torch_round
from ..floating_point_summation import kahan_sum, sequential_sum
from ._float_values import _classify_variant, _in_turn, _rounded_variant, _wrap_learner, _wrap_values
from .floating_point_fp8 import check_fp8_quantize, check_ulp_distance  # exercises 7 and 8

__all__ = [
    "check_format_limits",
    "check_decode",
    "check_round_to_nearest_even",
    "check_overflow_underflow",
    "check_kahan_sum",
    "check_stochastic_rounding",
    "check_ulp_distance",
    "check_fp8_quantize",
]


# ---------------------------------------------------------------- exercise checks
def _reference_limits(exp_bits: int, man_bits: int):
    f = FloatFormat("x", exp_bits, man_bits)
    return f.max_value, f.smallest_normal, f.smallest_subnormal, f.eps


def _reference_limits_torch(exp_bits: int, man_bits: int):
    """torch.finfo's numbers (and torch's reading of the pattern 0...01) where torch has the format."""
    for fmt in FORMATS.values():
        if (fmt.exp_bits, fmt.man_bits, fmt.no_inf) == (exp_bits, man_bits, False):
            fi = torch.finfo(fmt.torch)
            tiniest = float(torch_decode(np.array([1]), fmt)[0])
            return float(fi.max), float(fi.smallest_normal), tiniest, float(fi.eps)
    return _reference_limits(exp_bits, man_bits)


# the course's reference (torch.finfo and np.finfo are classes, which the guard cannot see; the random widths
# defeat them anyway)
# Naming a course_utils.floating_point function refuses the whole lesson module (and floating_point_*): the
# FloatFormat class's properties (max_value, eps, ...) included.
FORMAT_LIMITS_FORBIDDEN = ("course_utils.grading.floating_point._reference_limits",
                           "course_utils.grading.floating_point._reference_limits_torch",
                           "course_utils.floating_point.FloatFormat")


def check_format_limits(fn: Callable, *, trials: int = 5, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: ``(exp_bits, man_bits) -> (max, smallest_normal, smallest_subnormal, eps)`` of an IEEE-style format."""
    # FP16, BF16, FP8 E5M2 first (compared with torch.finfo); then a format no table lists, so that a lookup
    # table of known formats fails; then random widths, FP32/FP64 among them.
    known = {(5, 10), (8, 7), (5, 2), (4, 3), (8, 23), (11, 52)}

    def unusual(rng):
        while True:
            e, m = int(rng.integers(2, 11)), int(rng.integers(1, 21))
            if (e, m) not in known:
                return e, m

    pick = _in_turn([(5, 10), (8, 7), (5, 2), None],
                    lambda rng: [(8, 23), (11, 52)][int(rng.integers(2))] if rng.random() < 0.3 else unusual(rng))

    def make_inputs(rng):
        shape = pick(rng)
        return unusual(rng) if shape is None else shape

    def with_bias(exp_bits, man_bits, bias):
        top = 2**exp_bits - 2
        return (math.ldexp(2 - 2.0**-man_bits, top - bias), math.ldexp(1.0, 1 - bias),
                math.ldexp(1.0, 1 - bias - man_bits), 2.0**-man_bits)

    r = _reference_limits
    check_function(
        fn, _reference_limits_torch, make_inputs, name="format_limits", trials=trials, seed=seed, rtol=1e-12, atol=0.0,
        forbidden=FORMAT_LIMITS_FORBIDDEN,
        mistakes=[
            Mistake("bias_off_by_one", "your numbers are off by a factor of two: the bias is 2**(exp_bits-1) - 1, "
                    "not 2**(exp_bits-1).", lambda e, m: with_bias(e, m, 2 ** (e - 1))),
            Mistake("max_uses_inf_exponent", "your max uses the all-ones exponent, which IEEE reserves for inf/NaN: "
                    "the largest finite exponent field is 2**exp_bits - 2.",
                    lambda e, m: (2 * r(e, m)[0],) + r(e, m)[1:]),
            Mistake("max_without_fraction", "your max is a power of two: the largest value also has every fraction "
                    "bit set, (2 - 2**-man_bits) * 2**(E - bias).",
                    lambda e, m: (math.ldexp(1.0, 2**e - 2 - (2 ** (e - 1) - 1)),) + r(e, m)[1:]),
            Mistake("no_subnormals", "your smallest subnormal equals the smallest normal: subnormals (exponent field 0) "
                    "go down to 2**(1 - bias - man_bits).", lambda e, m: r(e, m)[:2] + (r(e, m)[1],) + r(e, m)[3:]),
            Mistake("subnormal_exponent", "your smallest subnormal is half too small: subnormals use exponent "
                    "1 - bias (like the smallest normals), not 0 - bias.",
                    lambda e, m: r(e, m)[:2] + (r(e, m)[2] / 2,) + r(e, m)[3:]),
            Mistake("unit_roundoff", "your eps is half the gap above 1 (that is the unit roundoff u): machine epsilon "
                    "is the gap itself, 2**-man_bits.", lambda e, m: r(e, m)[:3] + (r(e, m)[3] / 2,)),
        ], quiet=quiet,
    )


def _reference_decode(bits, exp_bits, man_bits, no_inf=False):
    for fmt in FORMATS.values():  # compare with the framework itself where it has the format
        if (fmt.exp_bits, fmt.man_bits, fmt.no_inf) == (exp_bits, man_bits, no_inf) and fmt.bits <= 16:
            return torch_decode(bits, fmt)
    return decode(bits, exp_bits, man_bits, no_inf=no_inf)


# the framework's reading of the bits and the course's decoders
DECODE_FORBIDDEN = ("torch.Tensor.view", "course_utils.floating_point.decode", "course_utils.floating_point.torch_decode",
                    "course_utils.floating_point.bits_of", "course_utils.grading.floating_point._reference_decode")


def check_decode(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``decode_any(bits, exp_bits, man_bits, no_inf=False)`` for any IEEE-like format, FP8 included.

    Every trial holds both zeros (+0 and -0): a decoder that loses the sign of zero fails.
    """
    def random_shape(rng):
        e = int(rng.integers(3, 9))
        return e, int(rng.integers(1, 16 - e)), False  # at most 16 bits in all

    pick = _in_turn([(4, 3, True), (5, 2, False), (5, 10, False), (8, 7, False), (3, 4, False), (6, 9, False)],
                    random_shape)

    def make_inputs(rng):
        e, m, no_inf = pick(rng)
        n = 256 if e + m <= 7 else 400
        bits = np.arange(256, dtype=np.int64) if e + m == 7 else random_patterns(rng, e, m, n)
        zeros = np.array([0, 1 << (e + m)], dtype=np.int64)  # +0 and -0
        return rng.permutation(np.concatenate([bits, zeros])), e, m, no_inf

    def ref(bits, e, m, no_inf):
        return _reference_decode(bits, e, m, no_inf)

    def variant(bias_shift=0, subnormal_hidden=False, sub_exp0=False, ignore_specials=False, ignore_sign=False,
                specials_ieee=False, unsigned_zero=False):
        def decoded(bits, e, m, no_inf):
            s, E, M = fields(bits, e, m)
            bias = 2 ** (e - 1) - 1 + bias_shift
            hidden = np.where((E > 0) | subnormal_hidden, 2.0**m, 0.0)
            exp = np.where(E > 0, E, 0 if sub_exp0 else 1) - bias - m
            v = np.ldexp(M.astype(np.float64) + hidden, exp.astype(np.int32))
            e_all = 2**e - 1
            if not ignore_specials:
                if no_inf and not specials_ieee:
                    v = np.where((E == e_all) & (M == 2**m - 1), np.nan, v)
                else:
                    v = np.where(E == e_all, np.where(M == 0, np.inf, np.nan), v)
            if unsigned_zero:
                return np.where(v == 0, 0.0, np.where(s == 1, -v, v))
            return v if ignore_sign else np.where(s == 1, -v, v)
        return decoded

    name = "decode_any"
    check_function(
        _wrap_learner(fn, name, DECODE_FORBIDDEN), _wrap_values(ref, name), make_inputs, name=name, trials=trials,
        seed=seed, rtol=0.0, atol=0.0,
        mistakes=[
            Mistake("sign_of_zero", "the pattern with only the sign bit set is -0.0, and yours came out +0.0: apply the "
                    "sign by negating (np.where(sign == 1, -value, value)) so that zero keeps it too.",
                    _wrap_values(variant(unsigned_zero=True), name)),
            Mistake("bias", "your values are off by a factor of two: the bias is 2**(exp_bits-1) - 1 (15 for FP16), "
                    "not 2**(exp_bits-1).", _wrap_values(variant(bias_shift=1), name)),
            Mistake("bias_minus", "your values are off by a factor of two: the bias is 2**(exp_bits-1) - 1, "
                    "not 2**(exp_bits-1) - 2.", _wrap_values(variant(bias_shift=-1), name)),
            Mistake("no_subnormals", "exponent field 0 means a subnormal: no implicit leading 1 (the significand "
                    "is M / 2**m), and the exponent is 1 - bias.", _wrap_values(variant(subnormal_hidden=True), name)),
            Mistake("subnormal_exponent", "your subnormals are half their true value: they use exponent 1 - bias "
                    "(the same as the smallest normals), not 0 - bias.", _wrap_values(variant(sub_exp0=True), name)),
            Mistake("specials", "the all-ones exponent field is special: inf when the fraction is 0, NaN otherwise "
                    "(with no_inf=True only the all-ones fraction is NaN).",
                    _wrap_values(variant(ignore_specials=True), name)),
            Mistake("no_inf_rule", "with no_inf=True (E4M3FN) the all-ones exponent holds ordinary normal numbers; "
                    "only the all-ones fraction there is NaN, and there is no inf.",
                    _wrap_values(variant(specials_ieee=True), name)),
            Mistake("sign", "negative patterns come out positive: the top bit is the sign, multiply by (-1)**s.",
                    _wrap_values(variant(ignore_sign=True), name)),
        ], quiet=quiet,
    )


def _ref_rne(x, exp_bits, man_bits):
    for fmt in FORMATS.values():
        if (fmt.exp_bits, fmt.man_bits, fmt.no_inf) == (exp_bits, man_bits, False) and fmt.bits <= 16:
            return torch_round(x, fmt)
    return round_to_format(x, FloatFormat("x", exp_bits, man_bits))


ROUND_FORBIDDEN = ("numpy.round", "numpy.around", "numpy.rint", "numpy.ndarray.round", "torch.Tensor.to", "torch.Tensor.half", "torch.Tensor.bfloat16",
                   "torch.round", "course_utils.floating_point_rounding.round_bits",
                   "course_utils.floating_point_rounding.round_to_format", "course_utils.floating_point_rounding.torch_round",
                   "course_utils.grading.floating_point._ref_rne", "course_utils.floating_point.FloatFormat")


def check_round_to_nearest_even(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``round_fp32(x, exp_bits, man_bits)``: FP32 array -> values rounded to nearest-even, IEEE overflow."""
    pick = _in_turn([(5, 10), (8, 7), (5, 2), (4, 3)], lambda rng: (int(rng.integers(3, 9)), int(rng.integers(1, 12))))

    def make_inputs(rng):
        e, m = pick(rng)
        x = rounding_test_values(rng, FloatFormat("x", e, m), 600)
        return rng.permutation(np.concatenate([x, np.float32([-0.0, -1e-30])])), e, m  # zeros keep their sign

    name = "round_fp32"
    check_function(
        _wrap_learner(fn, name, ROUND_FORBIDDEN), _wrap_values(_ref_rne, name), make_inputs, name=name, trials=trials,
        seed=seed,
        rtol=0.0, atol=0.0,
        mistakes=[
            Mistake("half_away", "exact ties are rounded away from zero: on a tie, pick the neighbour whose last "
                    "kept bit is 0 (ties to even).",
                    _wrap_values(lambda x, e, m: _rounded_variant(x, e, m, "half_away"), name)),
            Mistake("truncate", "you truncate (round toward zero): add half a unit of the last kept place before "
                    "dropping bits, with ties going to even.",
                    _wrap_values(lambda x, e, m: _rounded_variant(x, e, m, "truncate"), name)),
            Mistake("flush", "values below the smallest normal are wrong: the format has subnormals with a fixed "
                    "spacing of 2**(1 - bias - man_bits) down to zero.",
                    _wrap_values(lambda x, e, m: _rounded_variant(x, e, m, "flush"), name)),
            Mistake("ftz", "values below the smallest normal are flushed to zero: the format has subnormals with a "
                    "fixed spacing of 2**(1 - bias - man_bits) down to zero.",
                    _wrap_values(lambda x, e, m: _rounded_variant(x, e, m, "ftz"), name)),
            Mistake("saturate", "values beyond the maximum should become inf (IEEE), not saturate at max; only "
                    "E4M3FN casts in torch saturate.",
                    _wrap_values(lambda x, e, m: _rounded_variant(x, e, m, "saturate"), name)),
        ], quiet=quiet,
    )


def check_overflow_underflow(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: predict per value whether rounding to a format gives 0 zero, 1 subnormal, 2 normal or 3 overflow."""
    pick = _in_turn([(5, 10), (8, 7), (5, 2), (4, 3)], lambda rng: (int(rng.integers(3, 9)), int(rng.integers(1, 12))))

    def make_inputs(rng):
        e, m = pick(rng)
        f = FloatFormat("x", e, m)
        x = rounding_test_values(rng, f, 300)
        near = np.array([f.max_value * (1 + 2.0 ** -(m + 2)), f.smallest_normal * (1 - 2.0 ** -(m + 3)),
                         f.smallest_subnormal * 0.4, f.smallest_subnormal * 0.6, f.max_value * 1.01])
        x = np.clip(np.concatenate([x, near, -near]), -_F32_MAX, _F32_MAX).astype(np.float32)
        return rng.permutation(x), e, m

    def ref(x, e, m):
        return classify(x, FloatFormat("x", e, m))

    name = "will_it_fit"
    check_function(
        fn, ref, make_inputs, name=name, trials=trials, seed=seed,
        forbidden=ROUND_FORBIDDEN + ("course_utils.floating_point_rounding.classify",),
        mistakes=[
            Mistake("before_rounding", "decide after rounding: values a little above max that round down to max "
                    "still fit, and values within half a step below the smallest normal/subnormal round up to it.",
                    lambda x, e, m: _classify_variant(x, e, m, "before_rounding")),
            Mistake("no_subnormals", "values between the smallest subnormal and the smallest normal do not flush "
                    "to zero: they become subnormals (class 1).",
                    lambda x, e, m: _classify_variant(x, e, m, "no_subnormals")),
            Mistake("bias", "your thresholds are off by a factor of two: the bias is 2**(exp_bits-1) - 1.",
                    lambda x, e, m: _classify_variant(x, e, m, "bias")),
        ], quiet=quiet,
    )


def _kahan_reference(x):
    return kahan_sum(np.asarray(x, dtype=np.float16))[()]


# sums that are not the FP16 loop: exact or wide sums and the course's summation functions
KAHAN_FORBIDDEN = ("math.fsum", "numpy.sum", "numpy.cumsum", "numpy.ndarray.sum", "numpy.ndarray.cumsum", "builtins.sum",
                   "torch.sum", "course_utils.floating_point.FloatFormat", "course_utils.floating_point_summation.kahan_sum",
                   "course_utils.floating_point_summation.pairwise_sum",
                   "course_utils.floating_point_summation.sequential_sum")


def check_kahan_sum(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: Kahan summation of a float16 vector with every operation in float16."""

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        n = int(rng.integers(2500, 4000)) if next(counter) != 1 else int(rng.integers(1, 4))  # trial 2: 1 to 3 terms
        return (rng.uniform(0.0, 1.0, n) * rng.choice([1.0, 0.01], n)).astype(np.float16)

    def naive(x):
        return sequential_sum(x)[-1]

    def wrong_sign(x):  # the compensation added instead of subtracted
        s = np.float16(0)
        c = np.float16(0)
        for xi in x:
            y = np.float16(xi + c)
            t = np.float16(s + y)
            c = np.float16(np.float16(t - s) - y)
            s = t
        return s

    def guard(x):
        got = call_learner("kahan_sum_fp16", fn, (x,), forbidden=KAHAN_FORBIDDEN)
        if isinstance(got, (np.ndarray, np.generic)) and got.dtype != np.float16:
            raise CheckFailed(f"kahan_sum_fp16: your result has dtype {got.dtype}; do every operation in float16 "
                              "(np.float16 scalars) and return a float16.")
        return got

    check_function(
        guard, _kahan_reference, make_inputs, name="kahan_sum_fp16", trials=trials, seed=seed, rtol=2.0**-10, atol=0.0,
        mistakes=[
            Mistake("naive", "your result is the plain running sum's: small terms vanish once the sum is large. Keep "
                    "the compensation c = (t - s) - y and subtract it from the next term (y = x_i - c, not + c).", naive),
            Mistake("sign", "the compensation has the wrong sign: c = (t - s) - y is minus the part that was lost, "
                    "so subtract it from the next term: y = x_i - c.", wrong_sign),
        ], quiet=quiet,
    )


# exercise 6 (stochastic rounding) is released to learners as it is: see floating_point_stochastic
from .floating_point_stochastic import SR_FORBIDDEN, check_stochastic_rounding  # noqa: E402,F401
