"""Forbidden shortcuts: notice when a learner's code calls the function an exercise asks them to write.

Used by :func:`course_utils.classroom.checking.call_learner` (``forbidden=...``) in the learner's own kernel, and by
:mod:`course_utils.remote`, which runs the same guard around a learner's call when the grader asks.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any, Iterable

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

from ..errors import ForbiddenCall

__all__ = ["ForbiddenCall", "forbidden_message"]


def _resolve(dotted: str) -> Any:
    """Import ``a.b.c.d`` as far as it is a module, then follow attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"cannot resolve forbidden name {dotted!r}")


class _ForbiddenGuard:
    """Notices calls of forbidden functions while the learner's code runs.

    Two detectors, because the shortcuts come in two kinds: torch's functions (``F.conv2d``,
    ``torch.matmul``, ``Tensor.__matmul__``, ``F.interpolate``) are seen by a ``TorchFunctionMode``,
    which catches them under any alias; plain Python and C functions (the course's own reference,
    ``np.matmul``) by a profile hook that compares code objects and function identity. The first
    forbidden call is remembered and reported after the learner's function returns.
    """

    def __init__(self, names: Iterable[str]):
        self.names = list(names)
        self.hit: str | None = None
        self._torch_funcs: dict[int, str] = {}
        self._codes: dict[Any, str] = {}
        self._cfuncs: dict[int, str] = {}
        for dotted in self.names:
            obj = _resolve(dotted)
            self._torch_funcs[id(obj)] = dotted
            plain = inspect.unwrap(obj) if callable(obj) else obj  # decorated functions share their wrapper's code
            code = (getattr(plain, "__code__", None) or getattr(getattr(plain, "__func__", None), "__code__", None)
                    or getattr(getattr(plain, "_implementation", None), "__code__", None))  # NumPy's dispatched functions
            if code is not None:  # torch's own Python functions too: some (torch.nn.grad.*) skip the function mode
                self._codes[code] = dotted
            else:
                self._cfuncs[id(obj)] = dotted
        self._mode = None
        self._previous_profile = None

    def _profile(self, frame, event, arg):
        if self.hit is None:
            if event == "call":
                self.hit = self._codes.get(frame.f_code)
            elif event == "c_call":
                self.hit = self._cfuncs.get(id(arg))

    def __enter__(self):
        if torch is not None and self._torch_funcs:
            from torch.overrides import TorchFunctionMode

            guard = self

            class _Mode(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    if guard.hit is None:
                        guard.hit = guard._torch_funcs.get(id(func)) or guard._torch_funcs.get(id(getattr(func, "__func__", None)))
                    return func(*args, **(kwargs or {}))

            self._mode = _Mode()
            self._mode.__enter__()
        if self._codes or self._cfuncs:
            self._previous_profile = sys.getprofile()
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        if self._codes or self._cfuncs:
            sys.setprofile(self._previous_profile)
        if self._mode is not None:
            try:
                self._mode.__exit__(*exc)
            except Exception:  # the learner's code popped the mode itself
                self.hit = self.hit or "torch's function-mode stack (your code changed it)"
        return False


def forbidden_message(name: str, hit: str) -> str:
    return (f"{name}: your code calls {hit}, which this exercise asks you to replace by hand; "
            f"write the computation yourself.")
