"""Shared helpers of the Loops to Kernels course, one module per concern.

* :mod:`course_utils.env`         -- ``setup()``: seeds, device tier, Triton mode (every notebook)
* :mod:`course_utils.checks`      -- exercise checks and the course's exceptions (every problem set)
* :mod:`course_utils.bench`       -- timing, FLOP/byte counters, ceilings, ladder and roofline plots
* :mod:`course_utils.progress`    -- nbval-stable progress bars
* :mod:`course_utils.plotting`    -- the course's figure style
* :mod:`course_utils.assignments` -- ``solutions/`` -> ``exercises/`` generation and drift check
* :mod:`course_utils.grader`      -- grading a learner's notebook per exercise
* :mod:`course_utils.doctor`      -- environment report
* :mod:`course_utils.foundations` -- topic 00's helpers and exercise checks

Command line: ``python -m course_utils {exercises,grade,doctor,times}``.
"""
from .checks import CheckFailed, Mistake, NotAttempted, check_function, check_value
from .env import Env, setup

__all__ = [
    "CheckFailed",
    "Env",
    "Mistake",
    "NotAttempted",
    "check_function",
    "check_value",
    "setup",
]
__version__ = "0.1.0"
