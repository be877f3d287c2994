"""The machinery behind every exercise check (all problem sets in ``solutions/``).

An exercise check runs the learner's function on fresh random inputs, validates what came back
(type, shape, dtype, device, NaN/Inf), compares it with a reference at a tolerance fit for the
dtype, and, when the answer is wrong, tries a list of *named wrong variants*: functions that
compute a plausible mistake (transposed output, missing scale, wrong axis...). If the learner's
output matches one, that variant's hint becomes the message.

On success it prints one line. Otherwise it raises :class:`~course_utils.errors.CheckFailed` (an
``AssertionError`` subclass, so nbgrader, the course grader and CI all see the failure) with a one-line
message; for an exercise that still raises ``NotImplementedError`` it raises
:class:`~course_utils.errors.NotAttempted`.

The grading modules (``course_utils.grading.<topic>``) build their ``check_*`` functions from
:func:`check_function` and :func:`check_value`. The value comparison itself (:func:`_close`,
:func:`_validate`) is the one lessons use through :func:`course_utils.checks.assert_close`.
"""
from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

try:  # torch is a hard dependency of the course, but keep the checks importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None

from ..checks import _close, _describe_value, _flatten, _is_array, _is_tensor, _max_error, _to_numpy, _validate
from ..errors import CheckFailed, ForbiddenCall, NotAttempted
from ..tolerances import TOLERANCES, _dtype_name, tolerance_for
from .forbidden import ByHand, WatchHit, forbidden_message, learner_line, watch
from .remote import RemoteDriver

__all__ = ["ByHand", "Mistake", "check_function", "check_value", "call_learner", "fresh_seed", "tolerance_for",
           "TOLERANCES", "CheckFailed", "NotAttempted", "ForbiddenCall"]


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer: ``fn`` computes it from the same inputs as the reference."""

    name: str
    hint: str
    fn: Callable[..., Any]


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


def _watch_spec(forbidden: Iterable[str] | ByHand | None, by_hand: ByHand | None) -> ByHand | None:
    """One :class:`ByHand` from the older ``forbidden=`` names and the newer ``by_hand=``; None when nothing is refused."""
    spec = ByHand.of(forbidden)
    if spec is None:
        return by_hand
    return spec.merged(by_hand)


def call_learner(name: str, fn: Callable, args: Sequence[Any] = (), kwargs: dict | None = None,
                 *, forbidden: Iterable[str] | ByHand = (), by_hand: ByHand | None = None, where: str = "") -> Any:
    """Call a learner's function: a stub becomes :class:`NotAttempted`, a crash a one-line :class:`CheckFailed`.

    ``forbidden`` names functions (dotted, e.g. ``"torch.nn.functional.conv2d"``) that the learner's code
    must not call; ``by_hand`` (a :class:`~course_utils.classroom.forbidden.ByHand`) adds what a by-hand exercise
    refuses at the operator and module level and the structure it demands. Either makes the call a by-hand
    call, watched by :func:`~course_utils.classroom.forbidden.watch`; a refused call raises :class:`ForbiddenCall`.
    When ``fn`` is a grader's remote proxy (``course_utils.classroom.remote``), the watch runs in the learner's
    kernel, around the real call. ``where`` (the trial, the inputs, the seed) is added to a crash's message.

    For checks that cannot be written with :func:`check_function` (statistical checks, for example).
    """
    kwargs = kwargs or {}
    spec = _watch_spec(forbidden, by_hand)
    if RemoteDriver.applies(fn):  # the driver runs in the learner's kernel, watched as a whole, in one request
        fn = RemoteDriver(fn)
    elif spec is not None and isinstance(fn, functools.partial) and fn.args and hasattr(fn.args[0], "__course_remote_call__"):
        # a driver (course_utils.classroom.released) around a grader's remote proxy: the watch goes with each call
        # of the learner's function, into the learner's kernel, and the driver itself runs here unwatched
        fn, spec = functools.partial(fn.func, _watched_remote(name, fn.args[0], spec), *fn.args[1:], **fn.keywords), None
    try:
        if hasattr(fn, "__course_remote_call__"):
            result, hit = fn.__course_remote_call__(args, kwargs, spec or ())
        elif spec is not None:
            guard = watch(spec)
            result = guard.call(fn, args, kwargs)
            hit = guard.hit
        else:
            result, hit = fn(*args, **kwargs), None
    except NotImplementedError:
        raise NotAttempted(
            f"{name}: not attempted yet; replace `raise NotImplementedError` with your code and run this cell again."
        ) from None
    except WatchHit as exc:
        raise ForbiddenCall(forbidden_message(name, str(exc))) from None
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
        if kind == "WatchHit":  # in the learner's kernel, a refused call came before the crash
            raise ForbiddenCall(forbidden_message(name, message)) from None
        if kind in ("NotImplementedError", "NotAttempted"):
            raise NotAttempted(
                f"{name}: not attempted yet; replace `raise NotImplementedError` with your code and run this cell again."
            ) from None
        line = getattr(exc, "line", None) if hasattr(exc, "type_name") else learner_line(exc)
        at = f" at {line}" if line else ""
        raise CheckFailed(
            f"{name}: your function raised {kind}({message[:160]!r}){at}"
            f"{where or ' on ' + _describe_inputs(args, kwargs)}; call it on such inputs yourself to see why."
        ) from None
    if hit:
        raise ForbiddenCall(forbidden_message(name, hit))
    return result


def _watched_remote(name: str, remote: Callable, spec) -> Callable:
    def call(*args, **kwargs):
        result, hit = remote.__course_remote_call__(args, kwargs, spec)
        if hit:
            raise ForbiddenCall(forbidden_message(name, hit))
        return result
    return call


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
    by_hand: ByHand | None = None,
    quiet: bool = False,
) -> None:
    """Run ``learner_fn`` and ``reference_fn`` on ``trials`` fresh random inputs and compare.

    ``make_inputs(rng)`` returns the arguments: a tuple (positional), a dict (keywords) or a
    single value. ``seed=None`` (the default) draws new inputs on every run; a failure message names
    the seed, and passing it back reproduces the failure. Tolerances default to :func:`tolerance_for`
    the reference output's dtype, grown for a reduction of length ``n`` when given. ``mistakes`` are
    tried in order when the answer is wrong; the first whose output agrees with the learner's gives the
    hint. ``forbidden`` names functions the learner must not call and ``by_hand`` describes a by-hand exercise
    (see :func:`call_learner`).
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
        got = call_learner(name, learner_fn, args, kwargs, forbidden=forbidden, by_hand=by_hand, where=where)
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
        raise CheckFailed(_difference_message(name, got, want, r, a, where) + _precision_hint(got, want, r, a))
    if not quiet:
        print(f"✅ {name}: matches the reference on {trials} random input{'s' if trials != 1 else ''}.")


def _precision_hint(got: Any, want: Any, r: float, a: float) -> str:
    """A hint when the answer is off only at float32 rounding level where the check needs float64."""
    try:
        g, w = _to_numpy(got).astype(np.float64), _to_numpy(want).astype(np.float64)
        if g.shape != w.shape or not np.all(np.isfinite(g)) or not np.all(np.isfinite(w)):
            return ""
        if _dtype_name(_flatten(want)[0].dtype) != "float64" or r > 1e-8:
            return ""
        scale = np.maximum(np.abs(w), np.abs(w).max() * 1e-3 + 1e-300)
        worst = float(np.max(np.abs(g - w) / scale))
    except Exception:  # not numbers: no precision to talk about
        return ""
    if worst <= 3e-6:
        return (f" The difference ({worst:.1g} relative) is float32 rounding: some step computes in float32 (a "
                f"float32 array, torch's default dtype, np.float32); keep every step in float64.")
    return ""


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
