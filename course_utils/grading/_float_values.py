"""Helpers of the topic-01 checks (:mod:`course_utils.grading.floating_point`): exact comparison of float values
(NaN, infinities and the sign of zero included), the format picker, and plausible wrong roundings."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..classroom.checking import call_learner
from ..errors import CheckFailed
from ..floating_point import FloatFormat
from ..floating_point_rounding import classify, ulp


_NAN = 7.7e307  # stands for NaN (any sign) in compared values: no format here reaches it
_NEG_ZERO = -1e-300  # stands for -0.0, so that a lost sign of zero is a difference: no format here reaches it
_INF = 8.8e307  # stands for inf (-_INF for -inf), so that values compare exactly as finite numbers


def _comparable(values: Any) -> np.ndarray:
    """float64 values with NaN, +-inf and -0.0 replaced by sentinels, so that an exact comparison sees both."""
    v = np.array(values, dtype=np.float64)
    v[np.isnan(v)] = _NAN
    v[np.isinf(v)] = np.copysign(_INF, v[np.isinf(v)])
    v[(v == 0) & np.signbit(v)] = _NEG_ZERO
    return v


def _as_values(out: Any, name: str) -> np.ndarray:
    if out is None:
        raise CheckFailed(f"{name}: the function returned None; add a `return` statement.")
    if isinstance(out, torch.Tensor):
        out = out.detach().to(torch.float64).numpy()
    try:
        return _comparable(out)
    except (TypeError, ValueError):
        raise CheckFailed(f"{name}: expected a NumPy array of numbers, got {type(out).__name__}.") from None


def _wrap_values(fn: Callable, name: str) -> Callable:
    """A reference or a named mistake, its output made comparable."""
    return lambda *args: _as_values(fn(*args), name)


def _wrap_learner(fn: Callable, name: str, forbidden: tuple[str, ...]) -> Callable:
    """The learner's function, called through ``call_learner`` (stubs, crashes, forbidden calls), output made comparable."""
    return lambda *args: _as_values(call_learner(name, fn, args, forbidden=forbidden), name)


def _in_turn(shapes: list, random_shape: Callable) -> Callable:
    """A shape picker: trial k uses ``shapes[k]`` (so every listed format is tested), then random ones."""
    calls = [0]

    def pick(rng):
        k = calls[0]
        calls[0] += 1
        return shapes[k] if k < len(shapes) else random_shape(rng)
    return pick


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
