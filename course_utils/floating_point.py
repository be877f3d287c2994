r"""Topic 01 (floating point): formats on the bit level, rounding, spacing and careful summation.

Used by:

* ``notebooks/01_floating_point.ipynb`` -- derives everything here first (decoding bit patterns,
  the format table, round-to-nearest-even, stochastic rounding, ULPs, Kahan and pairwise sums),
  then imports it from this module;
* ``solutions/01_floating_point.ipynb`` -- the ``check_*`` functions of its six exercises;
* later lessons -- :data:`FORMATS` and :func:`format_table` (02 mixed precision: which gradients
  FP16 flushes to zero; 08 training memory: bytes per format), :func:`round_to_format` and
  :func:`stochastic_round` (02), :func:`kahan_sum` / :func:`pairwise_sum` /
  :func:`sequential_sum` (05 GEMM: why the accumulator is FP32).

A format with ``e`` exponent bits and ``m`` mantissa (fraction) bits stores a sign ``s``, a biased
exponent field ``E`` and a fraction field ``M`` (lesson 01, eqs. 1-3):

.. math::

    \text{bias} = 2^{e-1} - 1, \qquad
    x = (-1)^s\, 2^{E - \text{bias}} \left(1 + M / 2^m\right) \quad (0 < E < E_\text{max}), \qquad
    x = (-1)^s\, 2^{1 - \text{bias}}\, M / 2^m \quad (E = 0,\ \text{subnormal}).

IEEE-style formats (FP64, FP32, FP16, BF16, FP8 E5M2) reserve the all-ones exponent for
infinities (``M = 0``) and NaNs. FP8 E4M3 in its "fn" flavour (``torch.float8_e4m3fn``, the OCP
FP8 format) has no infinities: the all-ones exponent holds normal numbers, and only the all-ones
pattern ``S.1111.111`` is NaN, which pushes its maximum to 448.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from .checks import CheckFailed, Mistake, call_learner, check_function

__all__ = [
    "FloatFormat",
    "FORMATS",
    "decode",
    "fields",
    "bits_of",
    "torch_bits",
    "torch_decode",
    "format_table",
    "format_table_text",
    "round_bits",
    "round_to_format",
    "torch_round",
    "stochastic_round",
    "ulp",
    "classify",
    "random_patterns",
    "rounding_test_values",
    "CLASS_NAMES",
    "sequential_sum",
    "kahan_sum",
    "pairwise_sum",
    "bit_table",
    "bit_explorer",
    "check_format_limits",
    "check_decode",
    "check_round_to_nearest_even",
    "check_overflow_underflow",
    "check_kahan_sum",
    "check_stochastic_rounding",
]


# ---------------------------------------------------------------- the formats
@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: 1 sign bit, ``exp_bits`` exponent bits, ``man_bits`` fraction bits.

    ``no_inf=True`` is the FP8 E4M3 "fn" rule: no infinities, only the all-ones pattern is NaN.
    ``torch_dtype`` / ``numpy_dtype`` name the framework types holding the same format (or None).
    """

    name: str
    exp_bits: int
    man_bits: int
    no_inf: bool = False
    torch_dtype: str | None = None
    numpy_dtype: str | None = None

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def nbytes(self) -> int:
        return self.bits // 8

    @property
    def bias(self) -> int:  # eq. 3
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def max_value(self) -> float:
        """Largest finite value: all-ones exponent minus one (IEEE) or all-ones but the NaN pattern (fn)."""
        e_all = 2**self.exp_bits - 1
        if self.no_inf:  # exponent field e_all, fraction all ones minus one
            return math.ldexp(2 - 2.0 ** (1 - self.man_bits), e_all - self.bias)
        return math.ldexp(2 - 2.0**-self.man_bits, e_all - 1 - self.bias)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, 1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, 1 - self.bias - self.man_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1 and the next larger value, ``2**-man_bits``."""
        return 2.0**-self.man_bits

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits carried by the ``man_bits + 1``-bit significand."""
        return (self.man_bits + 1) * math.log10(2)

    @property
    def torch(self):
        return getattr(torch, self.torch_dtype) if self.torch_dtype else None

    @property
    def uint(self):
        """The unsigned NumPy integer type as wide as the format (for bit views)."""
        return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits]


FORMATS: dict[str, FloatFormat] = {
    "fp64": FloatFormat("fp64", 11, 52, torch_dtype="float64", numpy_dtype="float64"),
    "fp32": FloatFormat("fp32", 8, 23, torch_dtype="float32", numpy_dtype="float32"),
    "fp16": FloatFormat("fp16", 5, 10, torch_dtype="float16", numpy_dtype="float16"),
    "bf16": FloatFormat("bf16", 8, 7, torch_dtype="bfloat16"),
    "fp8_e4m3": FloatFormat("fp8_e4m3", 4, 3, no_inf=True, torch_dtype="float8_e4m3fn"),
    "fp8_e5m2": FloatFormat("fp8_e5m2", 5, 2, torch_dtype="float8_e5m2"),
}


def _fmt(fmt: FloatFormat | str) -> FloatFormat:
    return FORMATS[fmt] if isinstance(fmt, str) else fmt


def _as_format(fmt_or_exp: Any, man_bits: int | None = None, no_inf: bool = False) -> FloatFormat:
    if man_bits is None:
        return _fmt(fmt_or_exp)
    return FloatFormat(f"e{fmt_or_exp}m{man_bits}", int(fmt_or_exp), int(man_bits), no_inf=no_inf)


# ---------------------------------------------------------------- bits <-> values
def fields(bits: Any, exp_bits: int, man_bits: int):
    """Split integer bit patterns into (sign, biased exponent, fraction) int64 arrays."""
    total = 1 + exp_bits + man_bits
    b = np.asarray(bits).astype(np.uint64) & np.uint64((1 << total) - 1)  # two's complement views wrap here
    sign = (b >> np.uint64(total - 1)).astype(np.int64)
    exponent = ((b >> np.uint64(man_bits)) & np.uint64((1 << exp_bits) - 1)).astype(np.int64)
    fraction = b & np.uint64((1 << man_bits) - 1)
    return sign, exponent, fraction


def decode(bits: Any, exp_bits: int, man_bits: int, *, no_inf: bool = False) -> np.ndarray:
    """Values (float64) of integer bit patterns of a format with ``exp_bits``/``man_bits`` (eqs. 1-3).

    Exact for every format up to FP64: the significand has at most 53 bits and ``np.ldexp``
    scales by a power of two without rounding. ``no_inf`` selects the E4M3FN rule.
    """
    sign, exponent, fraction = fields(bits, exp_bits, man_bits)
    bias = 2 ** (exp_bits - 1) - 1
    e_all = 2**exp_bits - 1
    significand = fraction.astype(np.float64) + np.where(exponent > 0, 2.0**man_bits, 0.0)  # M + 2^m (normal)
    scaled = exponent if no_inf else np.where(exponent == e_all, 1, exponent)  # inf/NaN: overwritten below
    scale = (np.maximum(scaled, 1) - bias - man_bits).astype(np.int32)  # subnormals use exponent 1 - bias
    value = np.ldexp(significand, scale)
    frac_all = np.uint64((1 << man_bits) - 1)
    if no_inf:
        value = np.where((exponent == e_all) & (fraction == frac_all), np.nan, value)
    else:
        value = np.where(exponent == e_all, np.where(fraction == 0, np.inf, np.nan), value)
    return np.where(sign == 1, -value, value)


def bits_of(values: Any, fmt: FloatFormat | str) -> np.ndarray:
    """Integer bit patterns (int64) of ``values`` stored in ``fmt`` (through torch, which holds every format)."""
    fmt = _fmt(fmt)
    t = torch.as_tensor(np.asarray(values, dtype=np.float64)).to(fmt.torch)
    return torch_bits(t, fmt)


def torch_bits(t: torch.Tensor, fmt: FloatFormat | str) -> np.ndarray:
    """Bit patterns (non-negative int64) of a tensor of ``fmt``'s dtype, from an integer view."""
    fmt = _fmt(fmt)
    int_dtype = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[fmt.bits]
    raw = t.contiguous().view(int_dtype).numpy().astype(np.int64)
    if fmt.bits < 64:
        raw = raw & ((1 << fmt.bits) - 1)
    return raw


def torch_decode(bits: Any, fmt: FloatFormat | str) -> np.ndarray:
    """The framework's reading of bit patterns: an integer tensor viewed as ``fmt``'s dtype, as float64."""
    fmt = _fmt(fmt)
    b = np.asarray(bits, dtype=np.int64)
    if fmt.bits == 8:
        ints = torch.from_numpy(b.astype(np.uint8))
    elif fmt.bits == 64:
        ints = torch.from_numpy(b.astype(np.uint64).view(np.int64))
    else:
        ints = torch.from_numpy(b.astype(fmt.uint).view({16: np.int16, 32: np.int32}[fmt.bits]))
    return ints.view(fmt.torch).to(torch.float64).numpy()


# ---------------------------------------------------------------- the format table
def format_table(names: tuple[str, ...] | None = None) -> list[dict]:
    """One row per format: bits, bytes, max, smallest normal, smallest subnormal, eps, decimal digits."""
    rows = []
    for name in names or tuple(FORMATS):
        f = FORMATS[name]
        rows.append(dict(format=name, exp_bits=f.exp_bits, man_bits=f.man_bits, bias=f.bias, bytes=f.nbytes,
                         max=f.max_value, smallest_normal=f.smallest_normal,
                         smallest_subnormal=f.smallest_subnormal, eps=f.eps, digits=f.decimal_digits))
    return rows


def format_table_text(names: tuple[str, ...] | None = None) -> str:
    """:func:`format_table` as aligned text (3 significant digits)."""
    head = f"{'format':<10}{'e':>3}{'m':>4}{'bias':>6}{'bytes':>6}{'max':>11}{'min normal':>12}{'min subnorm':>13}{'eps':>10}{'digits':>8}"
    lines = [head, "-" * len(head)]
    for r in format_table(names):
        lines.append(f"{r['format']:<10}{r['exp_bits']:>3}{r['man_bits']:>4}{r['bias']:>6}{r['bytes']:>6}"
                     f"{r['max']:>11.3g}{r['smallest_normal']:>12.3g}{r['smallest_subnormal']:>13.3g}"
                     f"{r['eps']:>10.3g}{r['digits']:>8.3g}")
    return "\n".join(lines)


# ---------------------------------------------------------------- rounding FP32 -> narrower formats
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


# ---------------------------------------------------------------- summation
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


# ---------------------------------------------------------------- the bit explorer
def bit_table(values: Any, fmt: FloatFormat | str) -> str:
    """A text table: each value's pattern in ``fmt`` as sign | exponent | fraction, and what it decodes to."""
    fmt = _fmt(fmt)
    vals = np.atleast_1d(np.asarray(values, dtype=np.float64))
    bits = bits_of(vals, fmt)
    sign, exponent, fraction = fields(bits, fmt.exp_bits, fmt.man_bits)
    decoded = decode(bits, fmt.exp_bits, fmt.man_bits, no_inf=fmt.no_inf)
    width = fmt.bits // 4
    head = f"{fmt.name} (1 sign, {fmt.exp_bits} exponent, {fmt.man_bits} fraction bits, bias {fmt.bias})"
    lines = [head, f"{'input':>12}  {'hex':>{max(width, 3) + 2}}  {'s':>1} {'exponent':>{max(fmt.exp_bits, 8)}} "
                   f"{'fraction':<{max(fmt.man_bits, 8)}}  {'kind':<9} {'stored value':>14}"]
    for v, b, s, e, f, d in zip(vals, bits, sign, exponent, fraction, decoded):
        kind = _kind_of(int(e), int(f), fmt)
        lines.append(f"{v:>12.5g}  {'0x' + format(int(b), f'0{width}x'):>{max(width, 3) + 2}}  {int(s):>1} "
                     f"{format(int(e), f'0{fmt.exp_bits}b'):>{max(fmt.exp_bits, 8)}} "
                     f"{format(int(f), f'0{fmt.man_bits}b'):<{max(fmt.man_bits, 8)}}  {kind:<9} {d:>14.6g}")
    return "\n".join(lines)


def _kind_of(exponent: int, fraction: int, fmt: FloatFormat) -> str:
    e_all = (1 << fmt.exp_bits) - 1
    if fmt.no_inf and exponent == e_all and fraction == (1 << fmt.man_bits) - 1:
        return "NaN"
    if not fmt.no_inf and exponent == e_all:
        return "inf" if fraction == 0 else "NaN"
    if exponent == 0:
        return "zero" if fraction == 0 else "subnormal"
    return "normal"


def bit_explorer(value: float = 0.1, fmt: str = "fp16"):
    """An ipywidgets explorer (format dropdown, value box, sign/exponent/fraction readout).

    Returns the widget, or ``None`` when ipywidgets is not installed; callers print
    :func:`bit_table` as well, so a static copy exists wherever widgets do not render.
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return None
    choose = widgets.Dropdown(options=list(FORMATS), value=fmt, description="format")
    number = widgets.FloatText(value=value, description="value")
    readout = widgets.HTML()

    def refresh(_change=None):
        readout.value = "<pre>" + bit_table([number.value], choose.value) + "</pre>"

    choose.observe(refresh, names="value")
    number.observe(refresh, names="value")
    refresh()
    return widgets.VBox([widgets.HBox([choose, number]), readout])


# ---------------------------------------------------------------- exercise checks
def _special_codes(values: Any):
    """(finite values with specials set to 0, codes: 0 finite, 1 +inf, 2 -inf, 3 NaN) for exact comparison."""
    v = np.asarray(values, dtype=np.float64)
    codes = np.where(np.isnan(v), 3, np.where(v == np.inf, 1, np.where(v == -np.inf, 2, 0)))
    return np.where(codes == 0, v, 0.0), codes.astype(np.int64)


def _wrap_values(fn: Callable, name: str) -> Callable:
    def wrapped(*args):
        out = fn(*args)
        if out is None:
            raise CheckFailed(f"{name}: the function returned None; add a `return` statement.")
        if isinstance(out, torch.Tensor):
            out = out.detach().to(torch.float64).numpy()
        try:
            return _special_codes(out)
        except (TypeError, ValueError):
            raise CheckFailed(f"{name}: expected a NumPy array of numbers, got {type(out).__name__}.") from None
    return wrapped


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


def check_format_limits(format_limits: Callable, *, trials: int = 5, seed: int = 0) -> None:
    """Exercise 1: ``(exp_bits, man_bits) -> (max, smallest_normal, smallest_subnormal, eps)`` of an IEEE-style format."""
    # FP16, BF16, FP8 E5M2 first (compared with torch.finfo), then random widths, FP32/FP64 among them
    make_inputs = _in_turn([(5, 10), (8, 7), (5, 2)], lambda rng: [(8, 23), (11, 52)][int(rng.integers(2))]
                           if rng.random() < 0.3 else (int(rng.integers(3, 10)), int(rng.integers(1, 20))))

    def with_bias(exp_bits, man_bits, bias):
        top = 2**exp_bits - 2
        return (math.ldexp(2 - 2.0**-man_bits, top - bias), math.ldexp(1.0, 1 - bias),
                math.ldexp(1.0, 1 - bias - man_bits), 2.0**-man_bits)

    r = _reference_limits
    check_function(
        format_limits, _reference_limits_torch, make_inputs, name="format_limits", trials=trials, seed=seed, rtol=1e-12, atol=0.0,
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
        ],
    )


def random_patterns(rng: np.random.Generator, exp_bits: int, man_bits: int, n: int) -> np.ndarray:
    """Random bit patterns with every kind represented: zeros, subnormals, normals, inf, NaN, both signs."""
    total = 1 + exp_bits + man_bits
    e_all = (1 << exp_bits) - 1
    sign = rng.integers(0, 2, n)
    exponent = rng.integers(0, e_all + 1, n)
    exponent[: n // 4] = 0  # a quarter subnormal or zero
    exponent[n // 4: n // 4 + 4] = e_all  # a few inf/NaN
    fraction = rng.integers(0, 1 << man_bits, n)
    fraction[n // 4: n // 4 + 2] = 0  # inf
    fraction[:2] = 0  # zeros
    b = (sign.astype(np.int64) << (total - 1)) | (exponent.astype(np.int64) << man_bits) | fraction
    return rng.permutation(b).astype(np.int64)


def _in_turn(shapes: list, random_shape: Callable) -> Callable:
    """A shape picker: trial k uses ``shapes[k]`` (so every listed format is tested), then random ones."""
    calls = [0]

    def pick(rng):
        k = calls[0]
        calls[0] += 1
        return shapes[k] if k < len(shapes) else random_shape(rng)
    return pick


def _reference_decode(bits, exp_bits, man_bits, no_inf=False):
    for fmt in FORMATS.values():  # compare with the framework itself where it has the format
        if (fmt.exp_bits, fmt.man_bits, fmt.no_inf) == (exp_bits, man_bits, no_inf) and fmt.bits <= 16:
            return torch_decode(bits, fmt)
    return decode(bits, exp_bits, man_bits, no_inf=no_inf)


def check_decode(decode_fn: Callable, *, trials: int = 6, seed: int = 0) -> None:
    """Exercise 2: ``decode(bits, exp_bits, man_bits, no_inf=False)`` for any IEEE-like format, FP8 included."""
    def random_shape(rng):
        e = int(rng.integers(3, 9))
        return e, int(rng.integers(1, 16 - e)), False  # at most 16 bits in all

    pick = _in_turn([(4, 3, True), (5, 2, False), (5, 10, False), (8, 7, False), (3, 4, False), (6, 9, False)],
                    random_shape)

    def make_inputs(rng):
        e, m, no_inf = pick(rng)
        n = 256 if e + m <= 7 else 400
        bits = np.arange(256, dtype=np.int64) if e + m == 7 else random_patterns(rng, e, m, n)
        return bits, e, m, no_inf

    def ref(bits, e, m, no_inf):
        return _reference_decode(bits, e, m, no_inf)

    def variant(bias_shift=0, subnormal_hidden=False, sub_exp0=False, ignore_specials=False, ignore_sign=False,
                specials_ieee=False):
        def fn(bits, e, m, no_inf):
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
            return v if ignore_sign else np.where(s == 1, -v, v)
        return fn

    name = "decode"
    check_function(
        _wrap_values(decode_fn, name), _wrap_values(ref, name), make_inputs, name=name, trials=trials, seed=seed,
        rtol=0.0, atol=0.0,
        mistakes=[
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
        ],
    )


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


def _ref_rne(x, exp_bits, man_bits):
    for fmt in FORMATS.values():
        if (fmt.exp_bits, fmt.man_bits, fmt.no_inf) == (exp_bits, man_bits, False) and fmt.bits <= 16:
            return torch_round(x, fmt)
    return round_to_format(x, FloatFormat("x", exp_bits, man_bits))


def _rounded_variant(x, exp_bits, man_bits, how):
    """Plausible wrong roundings, computed exactly on the float64 grid of the target format."""
    f = FloatFormat("x", exp_bits, man_bits)
    a = np.abs(x.astype(np.float64))
    if how in ("flush", "ftz"):  # a grid without subnormals
        gap = ulp(np.maximum(a, f.smallest_normal), f) if how == "flush" else np.ldexp(1.0, np.frexp(a)[1] - 1 - man_bits)
    else:
        gap = ulp(a, f)
    gap = np.where(gap > 0, gap, 1.0)
    q = a / gap
    if how == "truncate":
        r = np.floor(q)
    elif how == "half_away":
        r = np.floor(q + 0.5)
    else:  # nearest-even on a grid without subnormals ("flush") or the right grid
        r = np.round(q)
    v = r * gap
    if how == "flush":  # nothing between 0 and the smallest normal: round to the nearer of the two
        v = np.where(a < f.smallest_normal / 2, 0.0, np.maximum(v, f.smallest_normal))
    if how == "ftz":  # round as if the exponent were unbounded, then flush results below the smallest normal
        v = np.where(v < f.smallest_normal, 0.0, v)
    if how == "saturate":
        v = np.minimum(v, f.max_value)
    else:
        v = np.where(v > f.max_value, np.inf, v)
    v = np.where(np.isnan(a), np.nan, v)
    return np.copysign(v, x.astype(np.float64))


def check_round_to_nearest_even(round_fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 3: ``round_fp32(x, exp_bits, man_bits)``: FP32 array -> values rounded to nearest-even, IEEE overflow."""
    pick = _in_turn([(5, 10), (8, 7), (5, 2), (4, 3)], lambda rng: (int(rng.integers(3, 9)), int(rng.integers(1, 12))))

    def make_inputs(rng):
        e, m = pick(rng)
        return rounding_test_values(rng, FloatFormat("x", e, m), 600), e, m

    name = "round_fp32"
    check_function(
        _wrap_values(round_fn, name), _wrap_values(_ref_rne, name), make_inputs, name=name, trials=trials, seed=seed,
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
        ],
    )


def _classify_variant(x, exp_bits, man_bits, how):
    f = FloatFormat("x", exp_bits, man_bits)
    a = np.abs(x.astype(np.float64))
    if how == "before_rounding":  # thresholds on the unrounded value
        return np.where(a > f.max_value, 3, np.where(a >= f.smallest_normal, 2,
                        np.where(a >= f.smallest_subnormal, 1, 0))).astype(np.int64)
    if how == "no_subnormals":
        c = classify(x, f)
        return np.where(c == 1, 0, c)
    if how == "bias":
        g = FloatFormat("x", exp_bits, man_bits)
        c = classify(np.asarray(x, np.float64) / 2, g)
        return c
    raise ValueError(how)


def check_overflow_underflow(classify_fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
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
        classify_fn, ref, make_inputs, name=name, trials=trials, seed=seed,
        mistakes=[
            Mistake("before_rounding", "decide after rounding: values a little above max that round down to max "
                    "still fit, and values within half a step below the smallest normal/subnormal round up to it.",
                    lambda x, e, m: _classify_variant(x, e, m, "before_rounding")),
            Mistake("no_subnormals", "values between the smallest subnormal and the smallest normal do not flush "
                    "to zero: they become subnormals (class 1).",
                    lambda x, e, m: _classify_variant(x, e, m, "no_subnormals")),
            Mistake("bias", "your thresholds are off by a factor of two: the bias is 2**(exp_bits-1) - 1.",
                    lambda x, e, m: _classify_variant(x, e, m, "bias")),
        ],
    )


def _kahan_reference(x):
    return kahan_sum(np.asarray(x, dtype=np.float16))[()]


def check_kahan_sum(kahan_fn: Callable, *, trials: int = 3, seed: int = 0) -> None:
    """Exercise 5: Kahan summation of a float16 vector with every operation in float16."""

    def make_inputs(rng):
        n = int(rng.integers(2500, 4000))
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
        got = kahan_fn(x)
        if isinstance(got, (np.ndarray, np.generic)) and got.dtype != np.float16:
            raise CheckFailed(f"kahan_sum: your result has dtype {got.dtype}; do every operation in float16 "
                              "(np.float16 scalars) and return a float16.")
        return got

    check_function(
        guard, _kahan_reference, make_inputs, name="kahan_sum", trials=trials, seed=seed, rtol=2.0**-10, atol=0.0,
        mistakes=[
            Mistake("naive", "your result is the plain running sum's: small terms vanish once the sum is large. Keep "
                    "the compensation c = (t - s) - y and subtract it from the next term (y = x_i - c, not + c).", naive),
            Mistake("sign", "the compensation has the wrong sign: c = (t - s) - y is minus the part that was lost, "
                    "so subtract it from the next term: y = x_i - c.", wrong_sign),
        ],
    )


def _sr_probability(sr_fn: Callable, x: np.ndarray, repeats: int, seed: int, name: str) -> np.ndarray:
    """Fraction of draws rounded away from zero, per value; also checks every draw is a bf16 neighbour."""
    rng = np.random.default_rng(seed)
    tiled = np.tile(x, repeats)  # (repeats * n,)
    out = call_learner(name, sr_fn, (tiled, rng))
    if out is None:
        raise CheckFailed(f"{name}: the function returned None; add a `return` statement.")
    out = np.asarray(out.detach().float().numpy() if isinstance(out, torch.Tensor) else out)
    if out.shape != tiled.shape:
        raise CheckFailed(f"{name}: expected shape {tiled.shape}, got {out.shape}; return one rounded value per input.")
    out = out.astype(np.float64).reshape(repeats, -1)  # (repeats, n)
    bf16 = FORMATS["bf16"]
    toward = round_bits(x, bf16, stochastic_u=np.zeros(x.shape, np.int64))  # truncation: the neighbour toward zero
    lo = decode(toward, 8, 7)
    hi = decode(toward + 1, 8, 7)
    ok = (out == lo) | (out == hi)
    if not ok.all():
        raise CheckFailed(f"{name}: some outputs are not one of the two bf16 neighbours of the input; round the "
                          "magnitude down or up to a bf16 value (keep the top 16 bits of the float32 pattern).")
    return (out == hi).mean(axis=0)


def check_stochastic_rounding(sr_fn: Callable, *, repeats: int = 2000, seed: int = 0) -> None:
    """Exercise 6: stochastic rounding FP32 -> BF16, ``sr(x, rng)``; checks the neighbours and unbiasedness."""
    name = "stochastic_round_bf16"
    rng = np.random.default_rng([seed, 1])
    n = 48
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x[:4] = np.array([1.0 + 2.0**-9, 1.0 + 3 * 2.0**-10, -(1.0 + 2.0**-10), 3.0], dtype=np.float32)
    bf16 = FORMATS["bf16"]
    toward = round_bits(x, bf16, stochastic_u=np.zeros(x.shape, np.int64))
    lo, hi = decode(toward, 8, 7), decode(toward + 1, 8, 7)
    p_true = (np.abs(x.astype(np.float64)) - np.abs(lo)) / (np.abs(hi) - np.abs(lo))  # eq. 7
    p_got = _sr_probability(sr_fn, x, repeats, seed, name)
    tol = 5 * np.sqrt(0.25 / repeats) + 1e-9  # 5 standard deviations of a fraction of `repeats` coin flips
    bad = np.abs(p_got - p_true) > tol
    if not bad.any():
        print(f"✅ {name}: every output is a bf16 neighbour and the mean of {repeats} draws matches x "
              f"(within {tol:.2g} of a bf16 step) for all {n} values.")
        return
    p_rne = (np.abs(round_to_format(x, bf16)) == np.abs(hi)).astype(float)
    wrong = [
        (np.zeros(n), "you never round up (truncation): round the magnitude up with probability "
                      "(|x| - lo) / (hi - lo), e.g. add a uniform random 16-bit integer to the pattern before truncating."),
        (p_rne, "your rounding is deterministic (nearest): it is biased for updates smaller than half a step; "
                "round up at random with probability (|x| - lo) / (hi - lo)."),
        (1 - p_true, "you round up with the probability of rounding down: the closer x is to the upper neighbour, "
                     "the more often it must go up, p = (|x| - lo) / (hi - lo)."),
        (np.full(n, 0.5), "you pick the neighbour with a fair coin: that is biased; the probability of going up "
                          "must be (|x| - lo) / (hi - lo)."),
    ]
    inexact = p_true > 0  # values already in bf16 stay put under every variant
    for p_wrong, hint in wrong:
        if np.all(np.abs(p_got - p_wrong)[inexact] <= tol):
            raise CheckFailed(f"{name}: {hint}")
    i = int(np.argmax(np.abs(p_got - p_true)))
    raise CheckFailed(f"{name}: x={x[i]:.6g} went up in {p_got[i]:.3f} of the draws, expected {p_true[i]:.3f}: "
                      "the result is biased; E[round(x)] must equal x.")
