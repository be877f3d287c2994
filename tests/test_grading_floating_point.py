"""Tests of course_utils.grading.floating_point: each check passes right answers (the solution's and ones
written differently), names each plausible mistake (written here independently of the module's own
Mistake variants), rejects forbidden shortcuts and lookup tables, and reports a stub as not attempted.
"""
import numpy as np
import pytest
import torch

from course_utils import floating_point as fp
from course_utils import floating_point_rounding as fpr
from course_utils.grading import floating_point as gfp
from _grading_helpers import quiet_passes, stub  # noqa: E402
from _grading_helpers import SEED, Recorder, fails, forbidden, not_attempted, passes, rejects_recorded_answers  # noqa: E402


# ---------------------------------------------------------------- right answers
def format_limits(e, m):
    bias = 2 ** (e - 1) - 1
    return (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias), 2.0 ** (1 - bias), 2.0 ** (1 - bias - m), 2.0**-m


def format_limits_by_enumeration(e, m):  # right, written differently: the largest and smallest patterns
    bias = 2 ** (e - 1) - 1
    largest = sum(2.0 ** (2**e - 2 - bias - k) for k in range(m + 1))
    return largest, 2.0 ** (1 - bias), 2.0 ** (1 - bias) / 2**m, (1 + 2.0**-m) - 1


def decode(bits, e, m, no_inf=False, *, bias_shift=0, implicit_one_always=False, sub_exp=1, ieee_e4m3=False,
           lose_zero_sign=False):
    bits = np.asarray(bits, np.int64)
    s, E, M = (bits >> (e + m)) & 1, (bits >> m) & (2**e - 1), bits & (2**m - 1)
    bias = 2 ** (e - 1) - 1 + bias_shift
    lead = np.where((E > 0) | implicit_one_always, 1.0, 0.0)
    v = (lead + M / 2.0**m) * 2.0 ** (np.where(E > 0, E, sub_exp).astype(float) - bias)
    top = E == 2**e - 1
    if no_inf and not ieee_e4m3:
        v = np.where(top & (M == 2**m - 1), np.nan, v)
    else:
        v = np.where(top, np.where(M == 0, np.inf, np.nan), v)
    if lose_zero_sign:  # multiplies by (1 - 2 s) after zeroing: -0 becomes +0
        return (1 - 2 * s) * v + 0.0
    return np.where(s == 1, -v, v)


def decode_by_copysign(bits, e, m, no_inf=False):  # right, written differently
    bits = np.asarray(bits, np.int64)
    sign = np.where((bits >> (e + m)) & 1, -1.0, 1.0)
    E, M = (bits >> m) & (2**e - 1), bits & (2**m - 1)
    bias = 2 ** (e - 1) - 1
    mag = np.where(E == 0, M * 2.0 ** (1 - bias - m), (2**m + M) * 2.0 ** (E.astype(float) - bias - m))
    special = (E == 2**e - 1) & ((M == 2**m - 1) if no_inf else True)
    mag = np.where(special, np.where((M == 0) & (not no_inf), np.inf, np.nan), mag)
    return np.copysign(mag, sign)


def round_fp32(x, e, m, *, how="even"):
    a = np.abs(x.astype(np.float64))
    bias = 2 ** (e - 1) - 1
    gap = 2.0 ** (np.maximum(np.frexp(a)[1] - 1, 1 - bias if how != "flush" else -10**4) - m).astype(float)
    q = a / gap
    low = np.floor(q)
    rest = q - low
    if how == "away":
        up = rest >= 0.5
    elif how == "truncate":
        up = np.zeros_like(rest, bool)
    else:
        up = (rest > 0.5) | ((rest == 0.5) & (low % 2 == 1))
    v = (low + up) * gap
    if how == "flush":
        v = np.where(v < 2.0 ** (1 - bias), 0.0, v)
    largest = (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)
    v = np.where(v > largest, largest if how == "saturate" else np.inf, v)
    v = np.where(np.isnan(a), np.nan, v)
    if how == "sign_lost":  # -0.0 comes out as +0.0
        return np.where(v == 0, 0.0, np.copysign(v, x.astype(np.float64)))
    return np.copysign(v, x.astype(np.float64))


def will_it_fit(x, e, m, *, how="right"):
    a = np.abs(x.astype(np.float64))
    bias = 2 ** (e - 1) - 1
    tiny, normal, top = 2.0 ** (1 - bias - m), 2.0 ** (1 - bias), 2.0 ** (2**e - 2 - bias)
    largest = (2 - 2.0**-m) * top
    if how == "naive":  # compare the unrounded value with the limits
        return np.select([a > largest, a >= normal, a >= tiny], [3, 2, 1], 0).astype(np.int64)
    classes = np.select([a >= largest + top * 2.0**-m / 2, a >= normal - tiny / 2, a > tiny / 2], [3, 2, 1], 0)
    if how == "flush":
        classes = np.where(classes == 1, 0, classes)
    return classes.astype(np.int64)


def kahan(x, *, variant="right"):
    s = c = np.float16(0)
    for xi in x:
        if variant == "naive":
            s = np.float16(s + xi)
            continue
        y = np.float16(xi + c) if variant == "sign" else np.float16(xi - c)
        t = np.float16(s + y)
        c = np.float16(np.float16(t - s) - y)
        s = t
    return np.float32(s) if variant == "float32" else s


def kahan_while(x):  # right, written differently: an index loop with float16 arrays of one element
    s, c, i = np.zeros(1, np.float16), np.zeros(1, np.float16), 0
    while i < len(x):
        y = x[i:i + 1] - c
        t = s + y
        c = (t - s) - y
        s, i = t, i + 1
    return s[0]


def sr_bf16(x, rng, *, variant="right"):
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if variant == "nearest":  # round to nearest even on the bits
        return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)
    if variant == "truncate":
        noise = np.zeros(bits.shape, np.uint32)
    elif variant == "coin":
        noise = rng.integers(0, 2, bits.shape, dtype=np.uint32) * np.uint32(0xFFFF)
        noise = np.where((bits & 0xFFFF) == 0, 0, noise).astype(np.uint32)
    else:
        noise = rng.integers(0, 1 << 16, bits.shape, dtype=np.uint32)
    out = ((bits + noise) & np.uint32(0xFFFF0000)).view(np.float32)
    if variant == "inverted":  # goes up with probability (hi - |x|) / (hi - lo)
        low = (bits & np.uint32(0xFFFF0000)).view(np.float32)
        up = (low != x) & (rng.random(bits.shape) < 1 - (bits & 0xFFFF) / 65536)
        out = np.where(up, ((bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32), low)
    return out


def sr_by_values(x, rng):  # right, written differently: on values, with a uniform float
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    lo = (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    hi = ((bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    p = (np.abs(x.astype(np.float64)) - np.abs(lo)) / (np.abs(hi) - np.abs(lo))
    return np.where(rng.random(x.shape) < p, hi, lo).astype(np.float32)


CHECKS = [
    (gfp.check_format_limits, format_limits, format_limits_by_enumeration),
    (gfp.check_decode, decode, decode_by_copysign),
    (gfp.check_round_to_nearest_even, round_fp32, lambda x, e, m: round_fp32(x.copy(), e, m)),
    (gfp.check_overflow_underflow, will_it_fit, lambda x, e, m: will_it_fit(x, e, m).astype(np.int64)),
    (gfp.check_kahan_sum, kahan, kahan_while),
    (gfp.check_stochastic_rounding, sr_bf16, sr_by_values),
]


@pytest.mark.parametrize("check, solution, other", CHECKS, ids=[c.__name__ for c, _, _ in CHECKS])
def test_check_passes_right_answers(check, solution, other, capsys):
    passes(check, solution)
    passes(check, other)
    assert capsys.readouterr().out.count("✅") == 4


@pytest.mark.parametrize("check, solution", [c[:2] for c in CHECKS], ids=[c.__name__ for c, _, _ in CHECKS])
def test_quiet_prints_nothing_on_a_right_answer(check, solution):
    quiet_passes(check, solution, seed=SEED)


@pytest.mark.parametrize("check", [c for c, _, _ in CHECKS], ids=[c.__name__ for c, _, _ in CHECKS])
def test_check_reports_a_stub_as_not_attempted(check):
    not_attempted(check, stub)


WRONG = [
    (gfp.check_format_limits, lambda e, m: format_limits(e + 0, m)[:3] + (2.0 ** -(m + 1),), "unit roundoff"),
    (gfp.check_format_limits, lambda e, m: tuple(v / 2 if i < 3 else v for i, v in enumerate(format_limits(e, m))),
     "2**(exp_bits-1) - 1"),
    (gfp.check_format_limits, lambda e, m: format_limits(e, m)[:2] + (format_limits(e, m)[1], format_limits(e, m)[3]),
     "subnormals"),
    (gfp.check_format_limits, lambda e, m: (2 * format_limits(e, m)[0],) + format_limits(e, m)[1:], "all-ones exponent"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, bias_shift=1), "bias is 2**(exp_bits-1) - 1"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, implicit_one_always=True),
     "no implicit leading 1"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, sub_exp=0), "not 0 - bias"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, ieee_e4m3=True), "E4M3FN"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, lose_zero_sign=True), "-0.0"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: np.abs(decode(b, e, m, no_inf)), "top bit is the sign"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="away"), "ties"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="truncate"), "truncate"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="flush"), "subnormals"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="saturate"), "inf"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="sign_lost"), "round_fp32: values differ"),
    (gfp.check_overflow_underflow, lambda x, e, m: will_it_fit(x, e, m, how="naive"), "decide after rounding"),
    (gfp.check_overflow_underflow, lambda x, e, m: will_it_fit(x, e, m, how="flush"), "subnormals"),
    (gfp.check_kahan_sum, lambda x: kahan(x, variant="naive"), "plain running sum"),
    (gfp.check_kahan_sum, lambda x: kahan(x, variant="sign"), "y = x_i - c"),  # may look like the naive sum: both hints say it
    (gfp.check_kahan_sum, lambda x: kahan(x, variant="float32"), "float16"),
    (gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="nearest"), "deterministic"),
    (gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="truncate"), "never round up"),
    (gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="inverted"), "probability of rounding down"),
    (gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="coin"), "fair coin"),
    (gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng) * 1.001, "not one of the two bf16 neighbours"),
]


@pytest.mark.parametrize("check, wrong, hint", WRONG, ids=[f"{c.__name__}-{h[:20]}" for c, _, h in WRONG])
def test_check_names_the_mistake(check, wrong, hint):
    fails(check, wrong, hint)


SHORTCUTS = [
    (gfp.check_format_limits, lambda e, m: gfp._reference_limits(e, m), "_reference_limits"),
    (gfp.check_decode, lambda b, e, m, no_inf=False: fp.decode(b, e, m, no_inf=no_inf), "course_utils.floating_point.decode"),
    # the FloatFormat built for the argument is refused first: the message names the lesson module
    (gfp.check_round_to_nearest_even, lambda x, e, m: fpr.round_to_format(x, fp.FloatFormat("x", e, m)),
     "course_utils.floating_point"),
    (gfp.check_round_to_nearest_even, lambda x, e, m: torch.from_numpy(x).half().double().numpy(), "torch.Tensor.half"),
    (gfp.check_overflow_underflow, lambda x, e, m: fpr.classify(x, fp.FloatFormat("x", e, m)),
     "course_utils.floating_point"),
    (gfp.check_kahan_sum, lambda x: np.float16(__import__("math").fsum(x.astype(float))), "math.fsum"),
    (gfp.check_stochastic_rounding, lambda x, rng: fpr.stochastic_round(x, "bf16", rng).astype(np.float32),
     "course_utils.floating_point_rounding.stochastic_round"),
    (gfp.check_stochastic_rounding, lambda x, rng: torch.from_numpy(x).bfloat16().float().numpy(), "torch.Tensor.bfloat16"),
]


@pytest.mark.parametrize("check, shortcut, name", SHORTCUTS, ids=[n for _, _, n in SHORTCUTS])
def test_check_rejects_the_shortcut(check, shortcut, name):
    forbidden(check, shortcut, name)


def test_format_limits_rejects_a_lookup_table_of_known_formats():
    table = Recorder(format_limits)
    for e, m in [(5, 10), (8, 7), (5, 2), (4, 3), (8, 23), (11, 52)]:
        table(e, m)
    table.learning = False
    for seed in range(5):  # whatever the seed, one trial is a format no table lists
        fails(gfp.check_format_limits, table, "format_limits", seed=seed)


def test_decode_draws_both_zeros_and_names_the_lost_sign():
    message = fails(gfp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, lose_zero_sign=True),
                    "keeps it too", seed=None)
    assert "decode_any" in message


def test_sr_failure_names_the_seed():
    message = fails(gfp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="truncate"), "never round up",
                    seed=SEED)
    assert f"seed={SEED}" in message


# NumPy's dispatched functions (np.round, np.sum, ...) and torch's decorated Python functions escape
# checks._ForbiddenGuard until it reads their code objects (proposed to the lead; see the branch report).
NUMPY_SHORTCUTS = [
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m) if np.round(0.5) == 0 else None, "numpy.round"),
    (gfp.check_kahan_sum, lambda x: np.float16(np.sum(x, dtype=np.float64)), "numpy.sum"),
    # the leaks of issue 23: np.rint breaks the ties for you, the .sum() method and Python's sum add in float64,
    # the lesson's FloatFormat knows every limit
    (gfp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m) if np.rint(x).size >= 0 else None,
     "numpy.rint"),
    (gfp.check_kahan_sum, lambda x: np.float16(x.astype(np.float64).sum()), "numpy.ndarray.sum"),
    (gfp.check_kahan_sum, lambda x: np.float16(sum(x.astype(np.float64).tolist())), "sum"),
    (gfp.check_format_limits, lambda e, m: (lambda f: (f.max_value, f.smallest_normal, f.smallest_subnormal, f.eps))(
        fp.FloatFormat("x", e, m)), "course_utils.floating_point"),
    (gfp.check_overflow_underflow, lambda x, e, m: will_it_fit(x, e, m) if fp.FloatFormat("x", e, m).bias else None,
     "course_utils.floating_point"),
]


@pytest.mark.parametrize("check, shortcut, name", NUMPY_SHORTCUTS, ids=[n for _, _, n in NUMPY_SHORTCUTS])
def test_check_rejects_numpy_shortcuts(check, shortcut, name):
    forbidden(check, shortcut, name)


LOOKUPS = [(gfp.check_decode, decode), (gfp.check_round_to_nearest_even, round_fp32),
           (gfp.check_overflow_underflow, will_it_fit), (gfp.check_kahan_sum, kahan)]


@pytest.mark.parametrize("check, solution", LOOKUPS, ids=[c.__name__ for c, _ in LOOKUPS])
def test_checks_reject_answers_recorded_on_other_inputs(check, solution):
    rejects_recorded_answers(check, solution)


# ---------------------------------------------------------------- exercise 7: distance in ULPs
from course_utils.grading import floating_point_fp8 as g8  # noqa: E402
from _grading_helpers import pasted  # noqa: E402


def ulp_distance_ok(a, b):
    def position(x):
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
        magnitude = bits & 0x7FFFFFFF
        return np.where(bits >> 31 == 1, -magnitude, magnitude)
    return np.abs(position(a) - position(b))


def ulp_distance_keys(a, b):  # right, written differently: the sortable-key trick, with -0 moved onto +0
    def key(x):
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
        flipped = np.where(u >> 31 == 1, 0xFFFFFFFF - u, u | 0x80000000)  # monotonic in the value; -0 is 0x7FFFFFFF
        return np.where(u == 0x80000000, 0x80000000, flipped)  # -0 and +0 share a key
    ka, kb = key(a), key(b)
    # between a negative and a positive value the two zeros are one key apart but one number
    across = (ka < 0x80000000) != (kb < 0x80000000)
    return np.abs(ka - kb) - across


def test_check_ulp_distance():
    passes(gfp.check_ulp_distance, ulp_distance_ok)
    passes(gfp.check_ulp_distance, ulp_distance_keys)
    not_attempted(gfp.check_ulp_distance, stub)

    def bits(x):
        return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)

    def position_minus_one(x):
        m = bits(x) & 0x7FFFFFFF
        return np.where(bits(x) >> 31 == 1, -m - 1, m)

    fails(gfp.check_ulp_distance, lambda a, b: ulp_distance_ok(a, b) * np.where(a < b, -1, 1), "negative")
    fails(gfp.check_ulp_distance, lambda a, b: np.abs(bits(a) - bits(b)), "across zero")
    fails(gfp.check_ulp_distance, lambda a, b: np.abs(position_minus_one(a) - position_minus_one(b)), "same number")
    def int32(a, b):
        def position(x):
            m = bits(x) & 0x7FFFFFFF
            return np.where(bits(x) >> 31 == 1, -m, m).astype(np.int32)
        return np.abs(position(a) - position(b)).astype(np.int64)  # wraps past 2**31

    fails(gfp.check_ulp_distance, int32, "int64")
    def relative(a, b):  # |a - b| in units of the gap at a, counted in float64: wrong across binades
        gap = np.ldexp(1.0, np.frexp(np.abs(a.astype(np.float64)))[1] - 24)
        d = np.abs(a.astype(np.float64) - b) / np.maximum(gap, 2.0**-149)
        return np.floor(np.minimum(d, 2.0**62) + 0.5).astype(np.int64)

    fails(gfp.check_ulp_distance, relative, "only inside one binade")


def test_check_ulp_distance_refuses_shortcuts():
    def stepping(a, b):  # nextafter, one step at a time, vectorized: refused whatever it would cost
        return (np.nextafter(a, b) != a).astype(np.int64)

    forbidden(gfp.check_ulp_distance, stepping, "numpy.nextafter")
    forbidden(gfp.check_ulp_distance, lambda a, b: (np.spacing(a) > 0).astype(np.int64), "numpy.spacing")
    forbidden(gfp.check_ulp_distance, lambda a, b: (torch.from_numpy(a).view(torch.int32).long()
                                                  - torch.from_numpy(b).view(torch.int32).long()).abs().numpy(),
              "torch.Tensor.view")
    forbidden(gfp.check_ulp_distance, lambda a, b: np.abs(a - b) / fpr.ulp(a, "fp32"), "course_utils.floating_point")
    forbidden(gfp.check_ulp_distance, g8._reference_ulp_distance, "_reference_ulp_distance")
    forbidden(gfp.check_ulp_distance, lambda a, b: g8._ordered(a) - g8._ordered(b), "_ordered")
    passes(gfp.check_ulp_distance, lambda a, b: np.abs(pasted(g8)._ordered(a) - pasted(g8)._ordered(b)))


# ---------------------------------------------------------------- exercise 8: FP8 with a per-tensor scale
FP8 = {"e4m3": (4, 3, 448.0), "e5m2": (5, 2, 57344.0)}


def fp8_ok(x, amax, fmt):
    exp_bits, man_bits, fmax = FP8[fmt]
    bias = 2 ** (exp_bits - 1) - 1
    scale = np.float32(fmax / amax)
    y = (x * scale).astype(np.float64)
    a = np.abs(y)
    gap = 2.0 ** (np.maximum(np.frexp(a)[1] - 1, 1 - bias) - man_bits).astype(np.float64)
    q = a / gap
    low = np.floor(q)
    rest = q - low
    up = (rest > 0.5) | ((rest == 0.5) & (low % 2 == 1))
    return np.copysign(np.minimum((low + up) * gap, fmax), y).astype(np.float32), scale


def fp8_bits(x, amax, fmt):  # right, written differently: integer rounding on the FP32 bit pattern
    exp_bits, man_bits, fmax = FP8[fmt]
    bias = 2 ** (exp_bits - 1) - 1
    scale = np.float32(fmax / amax)
    y = np.clip(x * scale, -fmax, fmax).astype(np.float32)
    u = y.view(np.uint32).astype(np.int64)
    sign, mag = u >> 31, u & 0x7FFFFFFF
    e32 = mag >> 23
    # bits dropped: 23 - man_bits for normals, more below the smallest normal exponent (1 - bias)
    shift = 23 - man_bits + np.maximum(0, (1 - bias + 127) - np.maximum(e32, 1))
    shift = np.minimum(shift, 40)
    significand = np.where(e32 > 0, (mag & 0x7FFFFF) | 0x800000, mag & 0x7FFFFF)
    kept, dropped = significand >> shift, significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    kept = kept + ((dropped > half) | ((dropped == half) & (kept & 1 == 1)))
    value = np.ldexp(kept.astype(np.float64), (np.maximum(e32, 1) - 127 - 23 + shift).astype(np.int64))
    value = np.minimum(value, fmax)
    return np.where(sign == 1, -value, value).astype(np.float32), float(scale)


def grid(y, e, m, fmax, how="even", subnormals=True, saturate=True):
    """A wrong (or right) FP8 rounding as a learner would write it: floor and compare, no np.round."""
    bias = 2 ** (e - 1) - 1
    a = np.abs(y.astype(np.float64))
    exponent = np.frexp(a)[1] - 1
    gap = 2.0 ** ((np.maximum(exponent, 1 - bias) if subnormals else exponent) - m).astype(np.float64)
    q = a / gap
    low = np.floor(q)
    rest = q - low
    up = {"even": (rest > 0.5) | ((rest == 0.5) & (low % 2 == 1)), "half_away": rest >= 0.5, "truncate": rest < 0}[how]
    v = (low + up) * gap
    if not subnormals:
        v = np.where(v < 2.0 ** (1 - bias), 0.0, v)
    v = np.minimum(v, fmax) if saturate else np.where(v > fmax, np.inf, v)
    return np.copysign(v, y.astype(np.float64)).astype(np.float32)


def test_the_fp8_reference_is_torchs_cast_and_has_ties():
    rng = np.random.default_rng(SEED)
    for fmt in ("e4m3", "e5m2"):
        for _ in range(4):
            x, amax, f = g8._fp8_inputs(rng, fmt)
            want, scale = g8._reference_fp8_quantize(x, amax, f)
            np.testing.assert_array_equal(fp8_ok(x, amax, f)[0], want)
            np.testing.assert_array_equal(fp8_bits(x, amax, f)[0], want)
    rng = np.random.default_rng(SEED)
    ties = 0
    for _ in range(10):  # the power-of-two trials hold exact ties: half-away rounding differs there
        x, amax, f = g8._fp8_inputs(rng, "e5m2")
        e, m, fmax = FP8[f]
        ties += int((g8._grid_round(x * np.float32(fmax / amax), e, m, fmax, how="half_away") != fp8_ok(x, amax, f)[0]).sum())
    assert ties > 50


def test_check_fp8_quantize():
    passes(gfp.check_fp8_quantize, fp8_ok)
    passes(gfp.check_fp8_quantize, fp8_bits)
    not_attempted(gfp.check_fp8_quantize, stub)
    with_ = lambda **how: lambda x, a, f: (grid(x * np.float32(FP8[f][2] / a), FP8[f][0], FP8[f][1],  # noqa: E731
                                                          FP8[f][2], **how), np.float32(FP8[f][2] / a))
    fails(gfp.check_fp8_quantize, with_(saturate=False), "saturate")
    fails(gfp.check_fp8_quantize, with_(how="truncate"), "toward zero")
    fails(gfp.check_fp8_quantize, with_(how="half_away"), "ties to even")
    fails(gfp.check_fp8_quantize, with_(subnormals=False), "subnormals")

    def dequantized(x, a, f):
        q, s = fp8_ok(x, a, f)
        return q / s, s

    fails(gfp.check_fp8_quantize, dequantized, "dequantized")

    def ieee(x, a, f):
        if f == "e4m3":
            s = np.float32(240.0 / a)
            return grid(x * s, 4, 3, 240.0), s
        return fp8_ok(x, a, f)

    fails(gfp.check_fp8_quantize, ieee, "448")

    def inverse(x, a, f):
        e, m, fmax = FP8[f]
        s = np.float32(a / fmax)
        return grid(x * s, e, m, fmax), s

    fails(gfp.check_fp8_quantize, inverse, "inverse")
    fails(gfp.check_fp8_quantize, lambda x, a, f: (fp8_ok(x, a, f)[0], 1.0), "fp8_quantize")  # a wrong scale
    fails(gfp.check_fp8_quantize, lambda x, a, f: (fp8_ok(x, a, f)[0], FP8[f][2] / a), "float64 quotient")


def test_check_fp8_quantize_refuses_casts_and_the_lesson():
    def cast(dtype_of):
        def fn(x, a, f):
            fmax = FP8[f][2]
            y = torch.from_numpy(np.clip(x * np.float32(fmax / a), -fmax, fmax))
            return dtype_of(y, f).numpy(), np.float32(fmax / a)
        return fn

    f8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    forbidden(gfp.check_fp8_quantize, cast(lambda y, f: y.to(f8[f]).float()), "torch.Tensor.to")
    forbidden(gfp.check_fp8_quantize, cast(lambda y, f: y.type(f8[f]).float()), "torch.Tensor.type")
    forbidden(gfp.check_fp8_quantize, cast(lambda y, f: torch.empty_like(y, dtype=f8[f]).copy_(y).float()), "_to_copy")
    forbidden(gfp.check_fp8_quantize, lambda x, a, f: (np.round(x * np.float32(FP8[f][2] / a)), np.float32(FP8[f][2] / a)),
              "numpy.round")
    forbidden(gfp.check_fp8_quantize, lambda x, a, f: (fpr.round_to_format(x * np.float32(FP8[f][2] / a), "fp8_" + f
              if f == "e5m2" else "fp8_e4m3", overflow="saturate"), np.float32(FP8[f][2] / a)), "course_utils.floating_point")
    forbidden(gfp.check_fp8_quantize, g8._reference_fp8_quantize, "_reference_fp8_quantize")
    forbidden(gfp.check_fp8_quantize, lambda x, a, f: (g8._grid_round(x * np.float32(FP8[f][2] / a), FP8[f][0], FP8[f][1],
                                                                   FP8[f][2]), np.float32(FP8[f][2] / a)), "_grid_round")


NEW_LOOKUPS = [(gfp.check_ulp_distance, ulp_distance_ok), (gfp.check_fp8_quantize, fp8_ok)]


@pytest.mark.parametrize("check, solution", NEW_LOOKUPS, ids=[c.__name__ for c, _ in NEW_LOOKUPS])
def test_new_checks_reject_answers_recorded_on_other_inputs(check, solution):
    rejects_recorded_answers(check, solution)
