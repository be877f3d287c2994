"""The course's exceptions, at the bottom of the package: every other module may import this one.

* :class:`CheckFailed` -- a learner's answer is wrong (an ``AssertionError``, so nbgrader, the grader and
  pytest all see a failure); :class:`NotAttempted` -- the exercise still holds its stub;
  :class:`ForbiddenCall` -- the learner's code called the function the exercise asks them to write.
* :class:`TritonUnavailable` -- a kernel was launched or compiled on a machine without Triton.
"""
from __future__ import annotations

__all__ = ["CheckFailed", "NotAttempted", "ForbiddenCall", "TritonUnavailable"]


class CheckFailed(AssertionError):
    """A learner's answer is wrong. The message is one line and names the likely fix."""


class NotAttempted(CheckFailed):
    """The exercise still holds its stub (it raised ``NotImplementedError``)."""


class ForbiddenCall(CheckFailed):
    """The learner's code called a function the exercise asks them to replace by hand."""


class TritonUnavailable(RuntimeError):
    """Triton is not installed here; raised when a stand-in kernel is launched or compiled."""
