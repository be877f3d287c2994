"""Tests of course_utils.floating_point, floating_point_rounding and floating_point_summation: the helpers
lesson 01 (and later lessons) import. The exercise checks are tested in test_grading_floating_point.py.
"""
import numpy as np
import pytest
import torch

from course_utils import floating_point as fp
from course_utils import floating_point_rounding as fpr
from course_utils import floating_point_summation as fps

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
        fpr.rounding_test_values(rng, f, 40000),
        rng.integers(0, 2**32, 40000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32),
    ])
    mine = fpr.round_bits(x, f)
    ref = fp.torch_bits(torch.from_numpy(x).to(f.torch), f)
    nan = np.isnan(fp.decode(mine, f.exp_bits, f.man_bits, no_inf=f.no_inf))
    assert np.array_equal(nan, np.isnan(x))
    assert np.array_equal(mine[~nan], ref[~nan])


def test_ties_go_to_even_and_e4m3_saturates():
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10 in FP16: the even neighbour is 1
    assert fpr.round_to_format(np.float32([1 + 2.0**-11, 1 + 3 * 2.0**-11]), "fp16").tolist() == [1.0, 1 + 2.0**-9]
    # torch's FP32 -> E4M3FN cast saturates (finite overflow and inf); NaN stays NaN
    x = np.float32([500.0, 1e9, np.inf, -np.inf])
    assert fpr.torch_round(x, "fp8_e4m3").tolist() == [448.0, 448.0, 448.0, -448.0]
    assert fpr.round_to_format(x, "fp8_e4m3").tolist() == [448.0, 448.0, 448.0, -448.0]
    assert np.isnan(fpr.round_to_format(x, "fp8_e4m3", overflow="nan")).all()
    with pytest.raises(ValueError):
        fpr.round_bits(x, "fp8_e4m3", overflow="inf")


def test_stochastic_round_is_unbiased_and_uses_neighbours():
    rng = np.random.default_rng(3)
    x = np.full(20000, 1 + 2.0**-10, np.float32)  # a quarter of the way from 1 to the next bf16
    r = fpr.stochastic_round(x, "bf16", rng)
    assert set(np.unique(r).tolist()) == {1.0, 1 + 2.0**-7}
    assert abs(r.mean() - float(x[0])) < 5 * 2.0**-7 * np.sqrt(0.25 / x.size)
    assert fpr.round_to_format(x[:1], "bf16")[0] == 1.0  # nearest rounding loses it every time


def test_ulp_matches_spacing_and_enumeration():
    rng = np.random.default_rng(4)
    for name in ["fp16", "fp32", "fp64"]:
        f = fp.FORMATS[name]
        x = np.exp2(rng.uniform(np.log2(f.smallest_subnormal), np.log2(f.max_value) - 1, 5000)).astype(f.numpy_dtype)
        assert np.array_equal(fpr.ulp(x, f), np.spacing(x).astype(np.float64))
    for name in ["fp8_e4m3", "fp8_e5m2", "bf16"]:
        f = fp.FORMATS[name]
        v = fp.decode(np.arange(1, (1 << (f.bits - 1)) - 1), f.exp_bits, f.man_bits, no_inf=f.no_inf)
        v = v[np.isfinite(v)]  # positive finite values, increasing
        assert np.array_equal(fpr.ulp(v[:-1], f), np.diff(v))


def test_classify_boundaries():
    f = fp.FORMATS["fp16"]
    x = np.float32([0.0, 2.0**-25, 2.0**-25 * 1.01, 65504, 65519.99, 65520, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-24])
    assert fpr.classify(x, f).tolist() == [0, 0, 1, 2, 2, 3, 2, 1]
    assert fpr.classify(np.float32([1e6, np.inf]), "fp8_e4m3").tolist() == [3, 3]


# ---------------------------------------------------------------- summation
def test_sequential_sum_is_left_to_right():
    x = np.random.default_rng(5).uniform(0, 1, 300).astype(np.float16)
    s = np.float16(0)
    for xi in x:
        s = np.float16(s + xi)
    assert fps.sequential_sum(x)[-1] == s
    assert fps.sequential_sum(x, np.float32).dtype == np.float32


def test_kahan_and_pairwise_beat_naive_in_fp16():
    x = np.random.default_rng(6).uniform(0, 1, (3, 5000)).astype(np.float16)  # (lanes, n)
    exact = x.astype(np.float64).sum(-1)
    err = {name: np.abs(s.astype(np.float64) - exact) / exact for name, s in [
        ("naive", fps.sequential_sum(x)[..., -1]), ("kahan", fps.kahan_sum(x)), ("pairwise", fps.pairwise_sum(x))]}
    assert (err["naive"] > 0.1).all()  # stalls near 2048, where the FP16 spacing reaches 2
    assert (err["kahan"] <= 2.0**-11).all()
    assert (err["pairwise"] < 2.0**-8).all()
    prefixes = fps.kahan_sum(x, prefixes=True)  # (lanes, n)
    assert prefixes.shape == x.shape and np.array_equal(prefixes[..., -1], fps.kahan_sum(x))


def test_bit_table_and_explorer():
    text = fp.bit_table([1.0, -2.0, 1e-7, 7e4], "fp16")
    assert "0x3c00" in text and "subnormal" in text and "inf" in text
    assert "01111 0000000000" in text
    widget = fp.bit_explorer(0.5, "bf16")
    assert widget is not None and "0x3f00" in widget.children[1].value
