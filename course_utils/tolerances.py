"""The course's one table of tolerances, and how a tolerance grows with a reduction's length.

Used by :mod:`course_utils.checks` (every exercise check), by lessons through
``checks.assert_close`` / ``checks.tolerance_for``, and by tests. Lesson 01 derives the numbers.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["tolerance_for", "TOLERANCES", "UNIT_ROUNDOFF"]

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


# Tolerances per dtype, as (rtol, atol), with the reason. One table for the whole course.
# fp64: reductions in another order differ by a few ulps of ~1e-16 times the number of terms.
# fp32: same, with ulp ~6e-8; 1e-5 relative leaves room for sums of thousands of terms.
# tf32: what a GPU's tensor cores use for fp32 matmuls when allowed: 10 mantissa bits like fp16.
# fp16: 10 mantissa bits (ulp 2^-10 ~ 1e-3 relative); allow a couple of roundings.
# bf16: 7 mantissa bits (ulp 2^-7 ~ 8e-3 relative); allow a couple of roundings.
# fp8 e4m3 / e5m2: 3 / 2 mantissa bits, so one rounding is 6% / 12% relative.
# triton_interpreter: Triton's CPU interpreter evaluates tl.dot with NumPy in fp32, in another order than
#   torch's kernels, and programs accumulate tile by tile: fp32 rounding over a K loop, a little looser.
# Integers and booleans must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "tfloat32": (2e-3, 1e-4),
    "float16": (2e-3, 1e-4),
    "bfloat16": (1.6e-2, 1e-3),
    "float8_e4m3fn": (1.25e-1, 1e-2),
    "float8_e5m2": (2.5e-1, 1e-2),
    "triton_interpreter": (1e-4, 1e-5),
}

# Unit roundoff u = 2^-(mantissa bits + 1) of each accumulator format (lesson 01, section 12).
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53, "float32": 2.0**-24, "tfloat32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8,
}


def tolerance_for(dtype: Any, n: int | None = None, *, accumulate: Any = None) -> tuple[float, float]:
    """``(rtol, atol)`` for a NumPy or torch dtype (or a name in :data:`TOLERANCES`); exact for integers.

    ``n`` is the length of the longest reduction behind each output element (a GEMM's K, a sum over
    a sequence). Two correct programs that add ``n`` terms in different orders differ by about
    ``sqrt(n) * u`` relative (rounding errors of random sign add like a random walk; lesson 01 measures
    it), where ``u`` is the unit roundoff of the *accumulator* (``accumulate``, default: ``dtype``
    itself, but fp32 for 16-bit outputs, as every kernel in the course accumulates). The tolerance is
    the table's value or ``4 * sqrt(n) * u``, whichever is larger, so a long fp32 reduction passes on any
    CPU while a 16-bit accumulator (``u`` 2^11 times larger) still fails.
    """
    name = dtype if isinstance(dtype, str) and dtype in TOLERANCES else _dtype_name(dtype)
    rtol, atol = TOLERANCES.get(name, (0.0, 0.0))
    if n is None or n <= 1 or (rtol, atol) == (0.0, 0.0):
        return rtol, atol
    acc = name if accumulate is None else _dtype_name(accumulate)
    if accumulate is None and name in ("float16", "bfloat16", "triton_interpreter") or "float8" in acc:
        acc = "float32"
    u = UNIT_ROUNDOFF.get(acc, UNIT_ROUNDOFF["float32"])
    grown = 4.0 * math.sqrt(n) * u
    return max(rtol, grown), max(atol, grown)


def _dtype_name(dtype: Any) -> str:
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)
