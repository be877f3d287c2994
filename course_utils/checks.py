"""``assert_close`` for lessons, and the comparison it shares with the exercise checks.

A lesson asserts a claim with one call, ``checks.assert_close(got, want)``, at the tolerance
:mod:`course_utils.tolerances` gives the dtype (grown with a reduction's length ``n``), instead of literal
``rtol``/``atol`` numbers. A wrong value raises :class:`~course_utils.errors.CheckFailed` with one line
naming the largest difference and where it is.

The exercise checks (``check_function``, ``check_value``, ``Mistake``, ``call_learner``) live in
:mod:`course_utils.classroom.checking`, which builds on the comparison helpers here. Their old address
(``course_utils.checks.check_function`` ...) still resolves, lazily, for notebooks written before the move.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

try:  # torch is a hard dependency of the course, but keep the checks importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None

from .errors import CheckFailed, ForbiddenCall, NotAttempted
from .tolerances import TOLERANCES, UNIT_ROUNDOFF, _dtype_name, tolerance_for

__all__ = ["assert_close", "tolerance_for", "TOLERANCES", "UNIT_ROUNDOFF", "CheckFailed", "NotAttempted", "ForbiddenCall"]


def assert_close(got: Any, want: Any, *, dtype: Any = None, n: int | None = None, name: str = "result") -> None:
    """Assert that ``got`` equals ``want`` within :func:`tolerance_for` (``dtype`` defaults to ``want``'s).

    For lessons: one call instead of literal ``rtol``/``atol`` numbers. Raises :class:`CheckFailed`
    with one line naming the largest difference and where it is.
    """
    first = _flatten(want)[0]
    rtol, atol = tolerance_for(dtype if dtype is not None else (first.dtype if _is_array(first) else "float64"), n)
    _validate(name, got, want, "")
    if not _close(got, want, rtol, atol):
        pairs = [(g, w) for g, w in zip(_flatten(got), _flatten(want)) if not _close(g, w, rtol, atol)]
        if _is_array(pairs[0][1]):
            err, idx = _max_error(*pairs[0])
            raise CheckFailed(f"{name}: differs by up to {err:.3g} at index {idx} (rtol={rtol:.3g}, atol={atol:.3g}).")
        raise CheckFailed(f"{name}: got {_describe_value(pairs[0][0])}, expected {_describe_value(pairs[0][1])}.")


def _is_tensor(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or _is_tensor(x)


def _to_numpy(x: Any) -> np.ndarray:
    if _is_tensor(x):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16) or "float8" in str(x.dtype):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _kind(x: Any) -> str:
    if _is_tensor(x):
        return "torch.Tensor"
    if isinstance(x, np.ndarray):
        return "numpy.ndarray"
    return type(x).__name__


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        out: list[Any] = []
        for item in x:
            out.extend(_flatten(item))
        return out
    return [x]


def _close(got: Any, want: Any, rtol: float, atol: float, *, equal_nan: bool = False) -> bool:
    """True when ``got`` has ``want``'s structure and shape and agrees within the tolerance.

    ``equal_nan`` (used when matching named mistakes) lets NaN and inf in the same places agree, so
    a mistake that overflows (a softmax without its max subtraction) can still be recognised."""
    got_items, want_items = _flatten(got), _flatten(want)
    if len(got_items) != len(want_items):
        return False
    for g, w in zip(got_items, want_items):
        if _is_array(w) and _kind(g) != _kind(w):
            return False
        try:
            g_np, w_np = _to_numpy(g), _to_numpy(w)
        except (TypeError, ValueError, RuntimeError):
            return False
        if g_np.shape != w_np.shape:
            return False
        try:
            if not np.allclose(g_np.astype(np.float64), w_np.astype(np.float64), rtol=rtol, atol=atol, equal_nan=equal_nan):
                return False
        except (TypeError, ValueError):
            if not np.array_equal(g_np, w_np):
                return False
    return True


def _max_error(got: Any, want: Any) -> tuple[float, tuple]:
    g, w = _to_numpy(got).astype(np.float64), _to_numpy(want).astype(np.float64)
    diff = np.abs(g - w)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    return (float(diff.max()) if diff.size else 0.0), tuple(int(i) for i in idx)


def _describe_value(x: Any) -> str:
    if _is_array(x) and len(tuple(x.shape)) == 0:  # a 0-d result: its value is what the learner needs to see
        return f"{_kind(x)} of shape () and dtype {_dtype_name(x.dtype)} holding {float(_to_numpy(x)):.10g}"
    if _is_array(x):
        return f"{_kind(x)} of shape {tuple(x.shape)} and dtype {_dtype_name(x.dtype)}"
    if isinstance(x, (float, np.floating)):
        return f"{type(x).__name__} {float(x):.10g}"
    text = repr(x)
    if len(text) > 80:  # never cut a number in half: say what it is instead
        size = f" of {len(x)}" if hasattr(x, "__len__") else ""
        return f"a {type(x).__name__}{size}"
    return f"{type(x).__name__} {text}"


def _validate(name: str, got: Any, want: Any, where: str) -> None:
    """Raise CheckFailed with a one-line message when ``got`` cannot be compared with ``want``."""
    if want is None:
        return
    if isinstance(want, (tuple, list)) and not _is_array(want):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            raise CheckFailed(
                f"{name}: expected a {type(want).__name__} of {len(want)} results, got {_describe_value(got)}; "
                f"return all {len(want)} values{where}."
            )
        for i, (g, w) in enumerate(zip(got, want)):
            _validate(f"{name}[{i}]", g, w, where)
        return
    if got is None:
        raise CheckFailed(f"{name}: the function returned None; add a `return` statement{where}.")
    if _is_array(want):
        if _kind(got) != _kind(want):
            raise CheckFailed(
                f"{name}: expected a {_kind(want)}, got {_describe_value(got)}; "
                f"return a {_kind(want)}{' (torch.from_numpy / .numpy() convert)' if _is_array(got) else ''}{where}."
            )
        if tuple(got.shape) != tuple(want.shape):
            raise CheckFailed(
                f"{name}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}; "
                f"check which axes you reduce, stack or transpose{where}."
            )
        if _dtype_name(got.dtype) != _dtype_name(want.dtype):
            raise CheckFailed(
                f"{name}: expected dtype {_dtype_name(want.dtype)}, got {_dtype_name(got.dtype)}; "
                f"keep the input's dtype (avoid a stray .astype/.to or a float64 constant array){where}."
            )
        if _is_tensor(want) and got.device != want.device:
            raise CheckFailed(
                f"{name}: expected a tensor on {want.device}, got one on {got.device}; "
                f"create new tensors with device=x.device{where}."
            )
        arr = _to_numpy(got)
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            bad = "NaN" if np.isnan(arr).any() else "Inf"
            raise CheckFailed(
                f"{name}: the output contains {bad}; look for a division by zero, an overflowing exp, "
                f"or an uninitialized np.empty/torch.empty buffer{where}."
            )
    elif isinstance(want, (bool, np.bool_)):
        if not isinstance(got, (bool, np.bool_)):
            raise CheckFailed(f"{name}: expected True or False, got {_describe_value(got)}{where}.")
    elif isinstance(want, (int, float, np.number)):
        if not isinstance(got, (int, float, np.number)) or isinstance(got, (bool, np.bool_)):
            if _is_array(got) and got.ndim == 0:
                return
            raise CheckFailed(f"{name}: expected a number, got {_describe_value(got)}{where}.")
        if isinstance(got, (float, np.floating)) and not math.isfinite(float(got)):
            raise CheckFailed(f"{name}: the result is {got}; look for a division by zero or an overflow{where}.")


# Old addresses of the exercise-check machinery (now course_utils.classroom.checking and .forbidden), for
# notebooks and scripts written before the move. Resolved on first use, so importing this module never
# imports the classroom package.
_MOVED = {"Mistake", "check_function", "check_value", "call_learner", "fresh_seed", "_ForbiddenGuard", "forbidden_message"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from .classroom import checking

        return getattr(checking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
