"""Tests of course_utils.floating_point: the helpers lessons import, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and names the mistake
for plausible wrong answers (written here independently of the module's own Mistake variants).
"""
import numpy as np
import pytest
import torch

from course_utils import CheckFailed, NotAttempted
from course_utils import floating_point as fp

LOW = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def same_values(a, b):
    """Bitwise-equal float64 arrays, any NaN equal to any NaN (so -0.0 != 0.0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return bool(np.all((a.view(np.int64) == b.view(np.int64)) | (np.isnan(a) & np.isnan(b))))


# ---------------------------------------------------------------- decoding
@pytest.mark.parametrize("name", LOW)
def test_decode_exhaustive_against_torch(name):
    f = fp.FORMATS[name]
    bits = np.arange(1 << f.bits)
    assert same_values(fp.decode(bits, f.exp_bits, f.man_bits, no_inf=f.no_inf), fp.torch_decode(bits, f))


@pytest.mark.parametrize("name", ["fp32", "fp64"])
def test_decode_wide_formats_onrandom_patterns(name):
    f = fp.FORMATS[name]
    rng = np.random.default_rng(1)
    bits = fp.random_patterns(rng, f.exp_bits, f.man_bits, 20000)
    assert same_values(fp.decode(bits, f.exp_bits, f.man_bits), fp.torch_decode(bits, f))


def test_e4m3_has_no_infinity_and_two_nans():
    values = fp.decode(np.arange(256), 4, 3, no_inf=True)
    assert not np.isinf(values).any()
    assert np.flatnonzero(np.isnan(values)).tolist() == [0x7F, 0xFF]
    assert np.nanmax(values) == 448.0


def test_fields_and_bits_of():
    s, e, m = fp.fields(fp.bits_of([-2.0], "fp16"), 5, 10)
    assert (int(s[0]), int(e[0]), int(m[0])) == (1, 16, 0)
    assert fp.bits_of([1.0], "bf16").tolist() == [0x3F80]


# ---------------------------------------------------------------- the table
@pytest.mark.parametrize("name", list(fp.FORMATS))
def test_format_table_matches_finfo(name):
    f = fp.FORMATS[name]
    row = next(r for r in fp.format_table() if r["format"] == name)
    fi = torch.finfo(f.torch)
    assert (row["max"], row["smallest_normal"], row["eps"]) == (fi.max, fi.smallest_normal, fi.eps)
    assert row["smallest_subnormal"] == fp.torch_decode(np.array([1]), f)[0]
    assert row["bytes"] == torch.empty(0, dtype=f.torch).element_size()
    assert int(np.floor(f.man_bits * np.log10(2))) == round(-np.log10(fi.resolution))
    if f.numpy_dtype:
        assert row["smallest_subnormal"] == np.finfo(f.numpy_dtype).smallest_subnormal


# ---------------------------------------------------------------- rounding
@pytest.mark.parametrize("name", LOW)
def test_round_bits_matches_torch_casts(name):
    f = fp.FORMATS[name]
    rng = np.random.default_rng(2)
    x = np.concatenate([
        fp.rounding_test_values(rng, f, 40000),
        rng.integers(0, 2**32, 40000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32),
    ])
    mine = fp.round_bits(x, f)
    ref = fp.torch_bits(torch.from_numpy(x).to(f.torch), f)
    nan = np.isnan(fp.decode(mine, f.exp_bits, f.man_bits, no_inf=f.no_inf))
    assert np.array_equal(nan, np.isnan(x))
    assert np.array_equal(mine[~nan], ref[~nan])


def test_ties_go_to_even_and_e4m3_saturates():
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10 in FP16: the even neighbour is 1
    assert fp.round_to_format(np.float32([1 + 2.0**-11, 1 + 3 * 2.0**-11]), "fp16").tolist() == [1.0, 1 + 2.0**-9]
    # torch's FP32 -> E4M3FN cast saturates (finite overflow and inf); NaN stays NaN
    x = np.float32([500.0, 1e9, np.inf, -np.inf])
    assert fp.torch_round(x, "fp8_e4m3").tolist() == [448.0, 448.0, 448.0, -448.0]
    assert fp.round_to_format(x, "fp8_e4m3").tolist() == [448.0, 448.0, 448.0, -448.0]
    assert np.isnan(fp.round_to_format(x, "fp8_e4m3", overflow="nan")).all()
    with pytest.raises(ValueError):
        fp.round_bits(x, "fp8_e4m3", overflow="inf")


def test_stochastic_round_is_unbiased_and_uses_neighbours():
    rng = np.random.default_rng(3)
    x = np.full(20000, 1 + 2.0**-10, np.float32)  # a quarter of the way from 1 to the next bf16
    r = fp.stochastic_round(x, "bf16", rng)
    assert set(np.unique(r).tolist()) == {1.0, 1 + 2.0**-7}
    assert abs(r.mean() - float(x[0])) < 5 * 2.0**-7 * np.sqrt(0.25 / x.size)
    assert fp.round_to_format(x[:1], "bf16")[0] == 1.0  # nearest rounding loses it every time


def test_ulp_matches_spacing_and_enumeration():
    rng = np.random.default_rng(4)
    for name in ["fp16", "fp32", "fp64"]:
        f = fp.FORMATS[name]
        x = np.exp2(rng.uniform(np.log2(f.smallest_subnormal), np.log2(f.max_value) - 1, 5000)).astype(f.numpy_dtype)
        assert np.array_equal(fp.ulp(x, f), np.spacing(x).astype(np.float64))
    for name in ["fp8_e4m3", "fp8_e5m2", "bf16"]:
        f = fp.FORMATS[name]
        v = fp.decode(np.arange(1, (1 << (f.bits - 1)) - 1), f.exp_bits, f.man_bits, no_inf=f.no_inf)
        v = v[np.isfinite(v)]  # positive finite values, increasing
        assert np.array_equal(fp.ulp(v[:-1], f), np.diff(v))


def test_classify_boundaries():
    f = fp.FORMATS["fp16"]
    x = np.float32([0.0, 2.0**-25, 2.0**-25 * 1.01, 65504, 65519.99, 65520, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-24])
    assert fp.classify(x, f).tolist() == [0, 0, 1, 2, 2, 3, 2, 1]
    assert fp.classify(np.float32([1e6, np.inf]), "fp8_e4m3").tolist() == [3, 3]


# ---------------------------------------------------------------- summation
def test_sequential_sum_is_left_to_right():
    x = np.random.default_rng(5).uniform(0, 1, 300).astype(np.float16)
    s = np.float16(0)
    for xi in x:
        s = np.float16(s + xi)
    assert fp.sequential_sum(x)[-1] == s
    assert fp.sequential_sum(x, np.float32).dtype == np.float32


def test_kahan_and_pairwise_beat_naive_in_fp16():
    x = np.random.default_rng(6).uniform(0, 1, (3, 5000)).astype(np.float16)  # (lanes, n)
    exact = x.astype(np.float64).sum(-1)
    err = {name: np.abs(s.astype(np.float64) - exact) / exact for name, s in [
        ("naive", fp.sequential_sum(x)[..., -1]), ("kahan", fp.kahan_sum(x)), ("pairwise", fp.pairwise_sum(x))]}
    assert (err["naive"] > 0.1).all()  # stalls near 2048, where the FP16 spacing reaches 2
    assert (err["kahan"] <= 2.0**-11).all()
    assert (err["pairwise"] < 2.0**-8).all()
    prefixes = fp.kahan_sum(x, prefixes=True)  # (lanes, n)
    assert prefixes.shape == x.shape and np.array_equal(prefixes[..., -1], fp.kahan_sum(x))


def test_bit_table_and_explorer():
    text = fp.bit_table([1.0, -2.0, 1e-7, 7e4], "fp16")
    assert "0x3c00" in text and "subnormal" in text and "inf" in text
    assert "01111 0000000000" in text
    widget = fp.bit_explorer(0.5, "bf16")
    assert widget is not None and "0x3f00" in widget.children[1].value


# ---------------------------------------------------------------- exercise checks: correct answers
def format_limits(e, m):
    bias = 2 ** (e - 1) - 1
    return (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias), 2.0 ** (1 - bias), 2.0 ** (1 - bias - m), 2.0**-m


def decode(bits, e, m, no_inf=False, *, bias_shift=0, implicit_one_always=False, sub_exp=1, ieee_e4m3=False):
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
    return np.where(s == 1, -v, v)


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
    return np.copysign(np.where(np.isnan(a), np.nan, v), x.astype(np.float64))


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


def sr_bf16(x, rng, *, variant="right"):
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if variant == "nearest":
        return torch.from_numpy(x).bfloat16().float().numpy()
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


def stub(*args, **kwargs):
    raise NotImplementedError


CHECKS = [
    (fp.check_format_limits, format_limits),
    (fp.check_decode, decode),
    (fp.check_round_to_nearest_even, round_fp32),
    (fp.check_overflow_underflow, will_it_fit),
    (fp.check_kahan_sum, kahan),
    (fp.check_stochastic_rounding, sr_bf16),
]


@pytest.mark.parametrize("check, solution", CHECKS, ids=[c.__name__ for c, _ in CHECKS])
def test_check_passes_a_correct_answer(check, solution, capsys):
    check(solution)
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("check", [c for c, _ in CHECKS], ids=[c.__name__ for c, _ in CHECKS])
def test_check_reports_a_stub_as_not_attempted(check):
    with pytest.raises(NotAttempted):
        check(stub)


WRONG = [
    (fp.check_format_limits, lambda e, m: format_limits(e + 0, m)[:3] + (2.0 ** -(m + 1),), "unit roundoff"),
    (fp.check_format_limits, lambda e, m: tuple(v / 2 if i < 3 else v for i, v in enumerate(format_limits(e, m))),
     "2**(exp_bits-1) - 1"),
    (fp.check_format_limits, lambda e, m: format_limits(e, m)[:2] + (format_limits(e, m)[1], format_limits(e, m)[3]),
     "subnormals"),
    (fp.check_format_limits, lambda e, m: (2 * format_limits(e, m)[0],) + format_limits(e, m)[1:], "all-ones exponent"),
    (fp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, bias_shift=1), "bias is 2**(exp_bits-1) - 1"),
    (fp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, implicit_one_always=True),
     "no implicit leading 1"),
    (fp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, sub_exp=0), "not 0 - bias"),
    (fp.check_decode, lambda b, e, m, no_inf=False: decode(b, e, m, no_inf, ieee_e4m3=True), "E4M3FN"),
    (fp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="away"), "ties"),
    (fp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="truncate"), "truncate"),
    (fp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="flush"), "subnormals"),
    (fp.check_round_to_nearest_even, lambda x, e, m: round_fp32(x, e, m, how="saturate"), "inf"),
    (fp.check_overflow_underflow, lambda x, e, m: will_it_fit(x, e, m, how="naive"), "decide after rounding"),
    (fp.check_overflow_underflow, lambda x, e, m: will_it_fit(x, e, m, how="flush"), "subnormals"),
    (fp.check_kahan_sum, lambda x: kahan(x, variant="naive"), "plain running sum"),
    (fp.check_kahan_sum, lambda x: kahan(x, variant="sign"), "wrong sign"),
    (fp.check_kahan_sum, lambda x: kahan(x, variant="float32"), "float16"),
    (fp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="nearest"), "deterministic"),
    (fp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="truncate"), "never round up"),
    (fp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="inverted"), "probability of rounding down"),
    (fp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng, variant="coin"), "fair coin"),
    (fp.check_stochastic_rounding, lambda x, rng: sr_bf16(x, rng) * 1.001, "not one of the two bf16 neighbours"),
]


@pytest.mark.parametrize("check, wrong, hint", WRONG, ids=[f"{c.__name__}-{h[:20]}" for c, _, h in WRONG])
def test_check_names_the_mistake(check, wrong, hint):
    with pytest.raises(CheckFailed) as info:
        check(wrong)
    assert not isinstance(info.value, NotAttempted)
    assert hint in str(info.value), str(info.value)
