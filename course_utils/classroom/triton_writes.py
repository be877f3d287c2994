"""Which memory a learner's Triton kernels write, and how: the by-hand watch's view of ``tl.store`` and the atomics.

Used by :mod:`course_utils.classroom.forbidden` for ``ByHand(atomic_outputs=...)``: an exercise that demands a
result be *accumulated with atomics* (problem set 06's dQ by ``tl.atomic_add``) names which of the learner's
returned tensors that is. Under Triton's CPU interpreter every store, atomic and compare-and-swap of a kernel goes
through three functions of the interpreter's C module; while the watch is on, a stand-in records the addresses each
one writes. After the call the watch asks :func:`atomic_write_problem`: a plain store (``tl.store``, ``tl.atomic_xchg``,
``tl.atomic_cas``) into the named tensor is refused, and so is a tensor that the kernels' atomic adds do not cover
element by element (an unused ``tl.atomic_add``, or a result computed outside the kernel). A comment or a dead call
changes nothing: what counts is where the kernels' writes land.

On a GPU nothing is interpreted and nothing is recorded; the check then measures nothing.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["WriteLog", "atomic_write_problem"]


class _Recording:
    """Stands in for ``triton.runtime.interpreter._interpreter`` (the C module): records, then delegates."""

    def __init__(self, inner: Any, log: "WriteLog"):
        self._inner, self._log = inner, log
        self._adds = {inner.RMW_OP.ADD, inner.RMW_OP.FADD}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def store(self, ptrs, values, mask):
        self._log.note("store", ptrs, mask)
        return self._inner.store(ptrs, values, mask)

    def atomic_rmw(self, op, ptrs, values, mask, sem):
        self._log.note("add" if op in self._adds else "store", ptrs, mask)
        return self._inner.atomic_rmw(op, ptrs, values, mask, sem)

    def atomic_cas(self, ptrs, cmp, values, sem):
        self._log.note("store", ptrs, None)
        return self._inner.atomic_cas(ptrs, cmp, values, sem)


class WriteLog:
    """Addresses written by interpreted Triton kernels while it is installed (a context manager)."""

    def __init__(self):
        self.writes: dict[str, list[np.ndarray]] = {"store": [], "add": []}
        self._module = None
        self._original = None

    def note(self, kind: str, ptrs, mask) -> None:
        ptrs = np.asarray(ptrs)
        if mask is not None:
            ptrs = ptrs[np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)]
        self.writes[kind].append(ptrs.ravel().astype(np.uint64))

    def __enter__(self):
        module = sys.modules.get("triton.runtime.interpreter")
        if module is not None and getattr(module, "_interpreter", None) is not None:
            self._module, self._original = module, module._interpreter
            module._interpreter = _Recording(self._original, self)
        return self

    def __exit__(self, *exc):
        if self._module is not None:
            self._module._interpreter = self._original
        return False

    def addresses(self, kind: str) -> np.ndarray:
        parts = self.writes[kind]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def atomic_write_problem(log: WriteLog, result: Any, index: int, what: str) -> str | None:
    """Why ``result[index]`` was not accumulated with atomic adds by the kernels, as the watch's hit ("your code
    calls ..."), or None when it was (or when no kernel was interpreted, so nothing could be seen)."""
    if not log.writes["store"] and not log.writes["add"]:
        return None  # compiled kernels (a GPU), or no kernel at all: nothing to measure
    try:
        tensor = result[index]
        start, size, count = int(tensor.data_ptr()), int(tensor.element_size()), int(tensor.numel())
    except Exception:  # not a tuple of tensors: the value comparison reports it
        return None
    end = start + size * count

    def inside(addresses):
        return addresses[(addresses >= start) & (addresses < end)]

    stored = inside(log.addresses("store"))
    if stored.size:
        element = (int(stored[0]) - start) // size
        return (f"a plain store (tl.store or an atomic exchange) into {what}, at its element {element} among others "
                f"(every program must add its share with tl.atomic_add)")
    added = np.unique(inside(log.addresses("add")))
    if added.size < count:
        return (f"tl.atomic_add on only {added.size} of the {count} elements of {what} (every program must add its "
                f"share into every row it contributes to, in a {what} that starts at zero)")
    return None
