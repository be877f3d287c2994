"""Where things are in a checkout of the course: the one place that knows the repository's layout.

Every module that reads or writes a file of the checkout (solutions, exercises, recorded benchmark
results, the test helpers) takes its folder from here instead of computing it from ``__file__``.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "PACKAGE", "NOTEBOOKS", "SOLUTIONS", "EXERCISES", "BENCHMARKS", "BENCHMARK_RESULTS", "TESTS"]

PACKAGE = Path(__file__).resolve().parent        # course_utils/
ROOT = PACKAGE.parent                            # the checkout (or site-packages, for an installed wheel)
NOTEBOOKS = ROOT / "notebooks"                   # the lessons
SOLUTIONS = ROOT / "solutions"                   # the solved problem sets (the source of exercises/)
EXERCISES = ROOT / "exercises"                   # generated from solutions/ by `python -m course_utils exercises`
BENCHMARKS = ROOT / "benchmarks"                 # the benchmark scripts
BENCHMARK_RESULTS = BENCHMARKS / "results"       # recorded results, each naming its machine
TESTS = ROOT / "tests"
