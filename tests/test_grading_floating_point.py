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
