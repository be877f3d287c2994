"""Structural checks for problem sets 06 and 07: measure what a learner's function allocates.

A prompt that says "tiled, never the full score matrix", "without building the mask" or "one group of the
weight at a time" is checked, not trusted: :class:`LargestAllocation` is a ``TorchDispatchMode`` that sees
every aten op the learner's call runs, whatever Python path reached it, and records the largest tensor each
op *allocates* (views and in-place ops share storage and are not counted).

:func:`watched` wraps a learner's function so that :func:`course_utils.checks.check_function` calls it under
the watch and a violation fails with a one-line message. The watch runs where the learner's function runs:
under the course grader a learner's function is a remote proxy (``course_utils.remote``), whose call runs in
the learner's kernel; there :func:`watched` leaves the proxy alone (the forbidden-name guard still runs
there) until the grader carries an operator-level watch into the learner's kernel.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import CheckFailed

_VIEW_OR_INPLACE = ("view", "alias", "expand", "transpose", "permute", "select", "slice", "unsqueeze", "squeeze",
                    "as_strided", "detach", "t.default", "unfold", "diagonal", "split", "chunk", "unbind", "narrow")


def _is_new_storage(func, out: torch.Tensor) -> bool:
    name = str(func)
    if any(f"aten.{v}" in name for v in _VIEW_OR_INPLACE):
        return False
    schema = getattr(func, "_schema", None)
    if schema is not None and schema.is_mutable:  # in-place and out= ops write into an existing tensor
        return False
    return not out._is_view()


class LargestAllocation(TorchDispatchMode):
    """Records, per dtype kind, the largest tensor that an op allocated while the mode was active.

    ``largest(kind)`` with kind ``"float"`` (floating point), ``"bool"`` or ``"any"`` gives (numel, shape, op).
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # nothing is compiled under the watch; skipping would import torch._dynamo (seconds)
        return False

    def __init__(self):
        super().__init__()
        self.records: dict[str, tuple[int, tuple, str]] = {}
        self.ops: set[str] = set()
        self._lock = threading.Lock()

    def _note(self, kind: str, t: torch.Tensor, func) -> None:
        if t.numel() > self.records.get(kind, (0, (), ""))[0]:
            self.records[kind] = (t.numel(), tuple(t.shape), str(func))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        with self._lock:
            self.ops.add(str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and _is_new_storage(func, t):
                    self._note("any", t, func)
                    if t.is_floating_point():
                        self._note("float", t, func)
                    elif t.dtype == torch.bool:
                        self._note("bool", t, func)
        return out

    def largest(self, kind: str = "any") -> tuple[int, tuple, str]:
        return self.records.get(kind, (0, (), ""))


def watched(fn: Callable, limit: Callable[..., tuple[str, int, str] | list], name: str) -> Callable:
    """``fn`` called under :class:`LargestAllocation`; ``limit(*args)`` gives [(kind, max_numel, hint), ...].

    When an allocation of ``kind`` reaches ``max_numel`` elements the call fails with ``name: hint`` and the
    offending shape. A remote proxy (the grader's view of a learner's function) is returned unchanged.
    """
    if hasattr(fn, "__course_remote_call__"):
        return fn

    def call(*args: Any, **kwargs: Any):
        with LargestAllocation() as watch:
            result = fn(*args, **kwargs)
        if _forbidden_hit():
            return result  # a forbidden call is the better message: call_learner reports it
        for kind, max_numel, hint in limit(*args, **kwargs):
            numel, shape, op = watch.largest(kind)
            if numel >= max_numel:
                raise CheckFailed(f"{name}: {hint} (your code allocated a {kind} tensor of shape {list(shape)} "
                                  f"in {op.split('.')[1] if op.count('.') else op}).")
        return result

    call.__name__ = getattr(fn, "__name__", name)
    return call


def _forbidden_hit() -> bool:
    """Whether the forbidden-name guard around this call (``checks.call_learner``) has already seen a forbidden call."""
    import sys

    guard = getattr(sys.getprofile(), "__self__", None)
    return bool(getattr(guard, "hit", None))


def ops_called(fn: Callable, *args: Any, **kwargs: Any) -> set[str]:
    """For tests: the aten ops (overload packets, e.g. ``aten.mm``) that ``fn(*args)`` runs."""
    with LargestAllocation() as watch:
        fn(*args, **kwargs)
    return watch.ops


def peak_watched(fn: Callable, limit: Callable[..., int], name: str, hint: str) -> Callable:
    """``fn`` called under ``tracemalloc`` (which sees NumPy's buffers); its peak must stay under ``limit(*args)`` bytes.

    For NumPy answers whose prompt demands a structure ("never the full score matrix", "without building a
    mask"): the check sizes one trial so that the forbidden object alone is above the limit and the tiled
    answer far below it. A ``MemoryError`` (a mask too large to build at all) gets the same hint. A remote
    proxy is returned unchanged (see the module's docstring).
    """
    import tracemalloc

    if hasattr(fn, "__course_remote_call__"):
        return fn

    def call(*args: Any, **kwargs: Any):
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            result = fn(*args, **kwargs)
        except MemoryError:
            raise CheckFailed(f"{name}: {hint} (your code ran out of memory on {_sizes(args)}).") from None
        finally:
            peak = tracemalloc.get_traced_memory()[1] - base
            if started:
                tracemalloc.stop()
        allowed = limit(*args, **kwargs)
        if peak > allowed and not _forbidden_hit():
            raise CheckFailed(f"{name}: {hint} (on {_sizes(args)} your code held {peak / 2**20:.1f} MiB at once; "
                              f"the limit is {allowed / 2**20:.1f} MiB).")
        return result

    call.__name__ = getattr(fn, "__name__", name)
    return call


def _sizes(args) -> str:
    return "inputs (" + ", ".join(f"{tuple(a.shape)}" if hasattr(a, "shape") else repr(a) for a in args) + ")"
