r"""Topic 01 (floating point): formats on the bit level, decoding, the format table, the bit explorer.

Used by:

* ``notebooks/01_floating_point.ipynb`` -- derives the decoder and the format table by hand, then
  asserts that its versions equal these;
* later lessons -- :data:`FORMATS` and :func:`format_table` (02 mixed precision: which gradients
  FP16 flushes to zero; 08 training memory: bytes per format).

Rounding (nearest-even, stochastic), spacing and classification live in
:mod:`course_utils.floating_point_rounding`; careful summation in
:mod:`course_utils.floating_point_summation`; the problem set's checks in
:mod:`course_utils.grading.floating_point`.

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
from typing import Any

import numpy as np
import torch

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
    "random_patterns",
    "bit_table",
    "bit_explorer",
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
