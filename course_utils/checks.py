"""The machinery behind every exercise check (all problem sets in ``solutions/``).

An exercise check runs the learner's function on fresh random inputs, validates what came back
(type, shape, dtype, device, NaN/Inf), compares it with a reference at a tolerance fit for the
dtype, and, when the answer is wrong, tries a list of *named wrong variants*: functions that
compute a plausible mistake (transposed output, missing scale, wrong axis...). If the learner's
output matches one, that variant's hint becomes the message.

On success it prints one line. Otherwise it raises :class:`CheckFailed` (an ``AssertionError``
subclass, so nbgrader, the course grader and CI all see the failure) with a one-line message;
for an exercise that still raises ``NotImplementedError`` it raises :class:`NotAttempted`.

The grading modules (``course_utils.grading.<topic>``) build their ``check_*`` functions from
:func:`check_function` and :func:`check_value`.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

try:  # torch is a hard dependency of the course, but keep the checks importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None

from .tolerances import TOLERANCES, UNIT_ROUNDOFF, _dtype_name, tolerance_for  # noqa: F401  (re-exported)


class CheckFailed(AssertionError):
    """A learner's answer is wrong. The message is one line and names the likely fix."""


class NotAttempted(CheckFailed):
    """The exercise still holds its stub (it raised ``NotImplementedError``)."""


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer: ``fn`` computes it from the same inputs as the reference."""

    name: str
    hint: str
    fn: Callable[..., Any]


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


def _copy_inputs(args: Sequence[Any]) -> list[Any]:
    out = []
    for a in args:
        if _is_tensor(a):
            out.append(a.detach().clone().requires_grad_(a.requires_grad))
        elif isinstance(a, np.ndarray):
            out.append(a.copy())
        else:
            out.append(a)
    return out


def _same_input(a: Any, b: Any) -> bool:
    if _is_tensor(a):
        return bool(torch.equal(a.detach(), b))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b, equal_nan=True))
    return True


def call_learner(name: str, fn: Callable, args: Sequence[Any] = (), kwargs: dict | None = None,
                 *, forbidden: Iterable[str] = ()) -> Any:
    """Call a learner's function: a stub becomes :class:`NotAttempted`, a crash a one-line :class:`CheckFailed`.

    ``forbidden`` names functions (dotted, e.g. ``"torch.nn.functional.conv2d"``) that the learner's code
    must not call; a call to one raises :class:`ForbiddenCall`. When ``fn`` is a grader's remote proxy
    (``course_utils.remote``), the guard runs in the learner's kernel, around the real call.

    For checks that cannot be written with :func:`check_function` (statistical checks, for example).
    """
    kwargs = kwargs or {}
    forbidden = tuple(forbidden)
    try:
        if hasattr(fn, "__course_remote_call__"):
            result, hit = fn.__course_remote_call__(args, kwargs, forbidden)
        elif forbidden:
            with _ForbiddenGuard(forbidden) as guard:
                result = fn(*args, **kwargs)
            hit = guard.hit
        else:
            result, hit = fn(*args, **kwargs), None
    except NotImplementedError:
        raise NotAttempted(
            f"{name}: not attempted yet; replace `raise NotImplementedError` with your code and run this cell again."
        ) from None
    except CheckFailed:
        raise
    except Exception as exc:  # the learner's code crashed: report it in one line
        if getattr(exc, "fatal", False):  # the grader's time limit or a dead kernel: not the learner's answer
            raise
        kind = getattr(exc, "type_name", type(exc).__name__)
        message = getattr(exc, "message", None) or (str(exc).splitlines()[0] if str(exc) else "")
        if kind == "TritonUnavailable":
            raise CheckFailed(f"{name}: this exercise needs Triton, which is not installed here (it installs only on Linux "
                              f"x86-64); do it in the course's container (README) or on a Linux machine.") from None
        if kind in ("NotImplementedError", "NotAttempted"):
            raise NotAttempted(
                f"{name}: not attempted yet; replace `raise NotImplementedError` with your code and run this cell again."
            ) from None
        raise CheckFailed(
            f"{name}: your function raised {kind}({message[:160]!r}) on {_describe_inputs(args, kwargs)}; "
            f"call it on such inputs yourself to see where."
        ) from None
    if hit:
        raise ForbiddenCall(forbidden_message(name, hit))
    return result


def _describe_one(a: Any) -> str:
    if _is_array(a):
        return f"{_dtype_name(a.dtype)}{list(a.shape)}"
    if isinstance(a, (list, tuple)) and len(a) > 4:
        return f"{type(a).__name__} of {len(a)}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_describe_one(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if callable(a):
        return getattr(a, "__name__", type(a).__name__)
    text = repr(a)
    return text if len(text) <= 60 else type(a).__name__


def _describe_inputs(args: Sequence[Any], kwargs: dict | None = None) -> str:
    parts = [_describe_one(a) for a in args] + [f"{k}={_describe_one(v)}" for k, v in (kwargs or {}).items()]
    return "inputs (" + ", ".join(parts) + ")" if parts else "no inputs"


def _as_args(inputs: Any) -> tuple[tuple, dict]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, tuple):
        return inputs, {}
    return (inputs,), {}


def fresh_seed(seed: int | None) -> int:
    """``seed`` itself, or a new random one when it is None (checks draw fresh inputs every run)."""
    return secrets.randbits(31) if seed is None else int(seed)


def _is_dtype_problem(exc: CheckFailed) -> bool:
    return "expected dtype" in str(exc)


def check_function(
    learner_fn: Callable[..., Any],
    reference_fn: Callable[..., Any],
    make_inputs: Callable[[np.random.Generator], Any],
    *,
    name: str,
    trials: int = 3,
    seed: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    n: int | None = None,
    mistakes: Iterable[Mistake] = (),
    check_inputs_unchanged: bool = True,
    forbidden: Iterable[str] = (),
    quiet: bool = False,
) -> None:
    """Run ``learner_fn`` and ``reference_fn`` on ``trials`` fresh random inputs and compare.

    ``make_inputs(rng)`` returns the arguments: a tuple (positional), a dict (keywords) or a
    single value. ``seed=None`` (the default) draws new inputs on every run; a failure message names
    the seed, and passing it back reproduces the failure. Tolerances default to :func:`tolerance_for`
    the reference output's dtype, grown for a reduction of length ``n`` when given. ``mistakes`` are
    tried in order when the answer is wrong; the first whose output agrees with the learner's gives the
    hint. ``forbidden`` names functions the learner must not call (see :func:`call_learner`).
    Raises :class:`NotAttempted` or :class:`CheckFailed`.
    """
    if not callable(learner_fn):
        raise CheckFailed(f"{name}: expected a function, got {_describe_value(learner_fn)}; pass the function itself, not its result.")
    mistakes = list(mistakes)
    seed = fresh_seed(seed)
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        args, kwargs = _as_args(make_inputs(rng))
        where = f" (trial {trial + 1} of {trials}, {_describe_inputs(args, kwargs)}; reproduce with seed={seed})"
        originals = _copy_inputs(args)
        got = call_learner(name, learner_fn, args, kwargs, forbidden=forbidden)
        if check_inputs_unchanged and not all(_same_input(a, b) for a, b in zip(args, originals)):
            raise CheckFailed(
                f"{name}: your function modified its input in place; work on a copy (or a new array) instead."
            )
        args = originals
        want = reference_fn(*_copy_inputs(args), **kwargs)
        first = _flatten(want)[0]
        default_rtol, default_atol = tolerance_for(first.dtype, n) if _is_array(first) else TOLERANCES["float64"]
        r = default_rtol if rtol is None else rtol
        a = default_atol if atol is None else atol
        try:
            _validate(name, got, want, where)
            problem = None
        except CheckFailed as exc:  # wrong type/shape/dtype/device/NaN; a named mistake may explain it better
            problem = exc
        if problem is None and _close(got, want, r, a):
            continue
        if problem is not None and _is_dtype_problem(problem):
            raise problem  # a dtype mistake is a dtype mistake, whatever value it happens to equal
        for mistake in mistakes:
            try:
                wrong = mistake.fn(*_copy_inputs(args), **kwargs)
            except Exception:  # a variant that cannot run on these inputs simply does not match
                continue
            if _close(got, wrong, r, a, equal_nan=True):
                raise CheckFailed(f"{name}: {mistake.hint}")
        if problem is not None:
            raise problem
        raise CheckFailed(_difference_message(name, got, want, r, a, where))
    if not quiet:
        print(f"✅ {name}: matches the reference on {trials} random input{'s' if trials != 1 else ''}.")


def _difference_message(name: str, got: Any, want: Any, r: float, a: float, where: str) -> str:
    """One line saying where ``got`` and ``want`` differ: which element of a tuple, which index of an array."""
    if isinstance(want, (tuple, list)) and not _is_array(want) and len(want) > 1:
        for i, (g, w) in enumerate(zip(got, want)):
            if not _close(g, w, r, a):
                return _difference_message(f"{name}[{i}] (element {i + 1} of the {len(want)} you return)", g, w, r, a, where)
    if _is_array(want) and (_to_numpy(want).ndim > 0):
        err, idx = _max_error(got, want)
        g_at, w_at = _to_numpy(got)[idx], _to_numpy(want)[idx]
        return (f"{name}: values differ from the reference by up to {err:.3g} at index {idx} "
                f"(got {float(g_at):.6g}, expected {float(w_at):.6g}; tolerance rtol={r:.3g}, atol={a:.3g}){where}.")
    return f"{name}: got {_describe_value(got)}, expected {_describe_value(want)}{where}."


def check_value(
    got: Any,
    expected: Any,
    *,
    name: str,
    rtol: float = 1e-6,
    atol: float = 0.0,
    mistakes: dict[Any, str] | None = None,
    quiet: bool = False,
) -> None:
    """Check a single answer (a number, a bool, a shape tuple...) against ``expected``.

    ``mistakes`` maps plausible wrong answers to their hints. A value of ``...`` (Ellipsis) or
    ``NotImplemented`` counts as not attempted, so stubs can write ``answer = ...``.
    """
    if got is Ellipsis or got is NotImplemented:
        raise NotAttempted(f"{name}: not attempted yet; replace the `...` with your answer and run this cell again.")
    for wrong, hint in (mistakes or {}).items():
        if _close(got, wrong, rtol, atol) and not _close(got, expected, rtol, atol):
            raise CheckFailed(f"{name}: {hint}")
    if not _close(got, expected, rtol, atol):
        _validate(name, got, expected, "")
        raise CheckFailed(f"{name}: {_describe_value(got)} is not right yet; re-derive it step by step.")
    if not quiet:
        print(f"✅ {name}: correct.")


# Imported last: forbidden.py subclasses CheckFailed, defined above.
from .forbidden import ForbiddenCall, _ForbiddenGuard, forbidden_message  # noqa: E402,F401  (re-exported)
