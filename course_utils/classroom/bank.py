"""Replay a recorded bank: the self-checks of a learners' release (see :mod:`course_utils.classroom.release`).

The bank of one check holds fixed inputs, the reference's outputs on them and the outputs of the named
mistakes, all recorded from the course's references when the release was made. :func:`replay` calls the
learner's function on those inputs with the same comparison, by-hand watch (``by_hand=``, its size limits
evaluated on each fixed input) and messages as :func:`~course_utils.classroom.checking.check_function`,
without any reference code. A bank recorded with a driver (:mod:`course_utils.classroom.released`) calls the
learner's function through it, as the grader's check does.
"""
from __future__ import annotations

import functools
import pickle
from pathlib import Path

from ..checks import _close, _flatten, _is_array, _validate
from ..errors import CheckFailed
from ..tolerances import TOLERANCES, tolerance_for
from .checking import (_copy_inputs, _describe_inputs, _difference_message, _is_dtype_problem, _precision_hint,
                       _same_input, call_learner)
from .forbidden import ByHand

__all__ = ["replay", "unavailable"]

_BANKS: dict[str, dict] = {}


def _bank(module: str) -> dict:
    if module not in _BANKS:
        path = Path(__file__).resolve().parent.parent / "grading" / "_bank" / f"{module}.pkl"
        with open(path, "rb") as f:
            _BANKS[module] = {k: pickle.loads(v) for k, v in pickle.load(f).items()}
    return _BANKS[module]


def unavailable(module: str, check: str) -> None:
    print(f"ℹ️ {check}: this exercise is checked by your instructor's grader only (its check cannot run without the "
          f"course's references); test your function on small inputs yourself.")


def replay(module: str, check: str, learner_fn) -> None:
    """The released ``check``: the learner's function against the recorded answers and mistakes."""
    entry = _bank(module)[check]
    name = entry["name"]
    if not callable(learner_fn):
        raise CheckFailed(f"{name}: expected a function, got {type(learner_fn).__name__}; pass the function itself.")
    trials = entry["trials"]
    driver = entry.get("driver")  # the check drives the learner's function (course_utils.classroom.released)
    call = learner_fn if driver is None else functools.partial(driver["func"], learner_fn, *driver["args"], **driver["kwargs"])
    for index, trial in enumerate(trials):
        args, kwargs, want = _copy_inputs(trial["args"]), dict(trial["kwargs"]), trial["want"]
        where = f" (fixed input {index + 1} of {len(trials)}, {_describe_inputs(args, kwargs)})"
        originals = _copy_inputs(args)
        # the check's by-hand watch, its size limits as recorded for this input (banks without one: none)
        fields = entry.get("by_hand")
        by_hand = ByHand(**fields, **trial.get("limits", {})) if fields is not None else None
        got = call_learner(name, call, args, kwargs, forbidden=entry["forbidden"], by_hand=by_hand, where=where)
        if entry["check_inputs_unchanged"] and not all(_same_input(a, b) for a, b in zip(args, originals)):
            raise CheckFailed(f"{name}: your function modified its input in place; work on a copy (or a new array) instead.")
        first = _flatten(want)[0]
        default_rtol, default_atol = tolerance_for(first.dtype, entry["n"]) if _is_array(first) else TOLERANCES["float64"]
        r = default_rtol if entry["rtol"] is None else entry["rtol"]
        a = default_atol if entry["atol"] is None else entry["atol"]
        try:
            _validate(name, got, want, where)
            problem = None
        except CheckFailed as exc:
            problem = exc
        if problem is None and _close(got, want, r, a):
            continue
        if problem is not None and _is_dtype_problem(problem):
            raise problem
        for hint, wrong in trial["mistakes"]:
            try:
                if _close(got, wrong, r, a, equal_nan=True):
                    raise CheckFailed(f"{name}: {hint}")
            except CheckFailed:
                raise
            except Exception:  # a recorded mistake of another shape never matches
                continue
        if problem is not None:
            raise problem
        raise CheckFailed(_difference_message(name, got, want, r, a, where) + _precision_hint(got, want, r, a))
    print(f"✅ {name}: matches the recorded answers on {len(trials)} fixed inputs (your instructor's grader uses fresh ones).")
