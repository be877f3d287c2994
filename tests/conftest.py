"""Shared fixtures: small synthetic problem sets for testing the pipeline and the grader."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_utils.env import configure_numba, configure_triton  # noqa: E402

# What setup() does first in every notebook, done once for the test session (importing a course module changes
# nothing): Triton's interpreter on a CPU, before any kernel module imports Triton; Numba's two options.
configure_triton()
configure_numba()


def _sandbox_or_explicit_opt_out() -> None:
    """Grading refuses to run unsandboxed unless told; without bubblewrap the suite says so and opts out explicitly
    (the sandbox's own tests, tests/test_sandbox.py, are then skipped with the reason)."""
    from course_utils.classroom.sandbox import sandbox_problem

    problem = sandbox_problem()
    if problem is not None and os.environ.get("L2K_NO_SANDBOX") != "1":
        print(f"\nconftest: {problem} The grader tests run with L2K_NO_SANDBOX=1.", file=sys.stderr)
        os.environ["L2K_NO_SANDBOX"] = "1"


_sandbox_or_explicit_opt_out()


def nbgrader(grade_id: str, *, solution: bool = False, grade: bool = False, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


CHECK_DOUBLE = (
    "from course_utils import check_function, Mistake\n"
    "check_function(double, lambda x: 2 * x, lambda rng: rng.standard_normal(4), name='double',\n"
    "               mistakes=[Mistake('square', 'you squared x; multiply it by 2 instead.', lambda x: x * x)])"
)
CHECK_TRIPLE = (
    "from course_utils import check_function\n"
    "check_function(triple, lambda x: 3 * x, lambda rng: rng.standard_normal(4), name='triple')"
)


def toy_problem_set(double_body: str = "return 2 * x", triple_body: str = "return 3 * x", *, hidden: bool = True):
    """A two-exercise solution notebook; the bodies replace the solution regions' contents."""
    def solution_cell(name: str, body: str, grade_id: str):
        src = f"def {name}(x):\n    ### BEGIN SOLUTION\n" + "\n".join("    " + line for line in body.split("\n")) + "\n    ### END SOLUTION\n"
        return nbformat.v4.new_code_cell(src, metadata=nbgrader(grade_id, solution=True))

    check_double = CHECK_DOUBLE
    if hidden:
        check_double += "\n### BEGIN HIDDEN TESTS\nassert double(1.5) == 3.0\n### END HIDDEN TESTS"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Toy problem set", metadata=nbgrader("intro")),
        nbformat.v4.new_code_cell("import numpy as np"),
        nbformat.v4.new_markdown_cell("Exercise 1: double x."),
        solution_cell("double", double_body, "ex1_double"),
        nbformat.v4.new_code_cell(check_double, metadata=nbgrader("ex1_double_check", grade=True, points=2)),
        nbformat.v4.new_markdown_cell("Exercise 2: triple x."),
        solution_cell("triple", triple_body, "ex2_triple"),
        nbformat.v4.new_code_cell(CHECK_TRIPLE, metadata=nbgrader("ex2_triple_check", grade=True, points=3)),
    ]
    return nb


@pytest.fixture
def write_notebook(tmp_path):
    def _write(nb, name: str = "toy.ipynb") -> Path:
        path = tmp_path / name
        nbformat.write(nb, path)
        return path

    return _write


# ---------------------------------------------------------------- helpers for testing exercise checks
def stub(*args, **kwargs):
    """What an untouched exercise function does."""
    raise NotImplementedError("Exercise not attempted yet")


def fails_with(check, fn, fragment):
    """``check(fn)`` must fail as a wrong answer (not 'not attempted') with a one-line message holding ``fragment``."""
    from course_utils.checks import CheckFailed, NotAttempted

    with pytest.raises(CheckFailed) as info:
        check(fn)
    assert not isinstance(info.value, NotAttempted)
    assert fragment in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- the parallel run (`make test`: pytest-xdist)
# `--dist loadfile` keeps each file on one worker: a notebook's cells share one kernel, and a module's fixtures
# (the compile matrix, the torchrun cluster) are built once. The worker that draws the longest file last decides
# the run's length, so the files that take longest go first; the many short files and notebooks fill in behind.
LONGEST_FIRST = [
    "tests/test_gradebook.py",          # grade-class: 30 submissions, one grader process and kernel each
    "tests/test_notebooks.py",          # every solution graded, every exercise graded
    "tests/test_grader_attacks.py",     # every problem set graded behind every trick
    "tests/test_grader.py",
    "tests/test_compile_kernels.py",    # about 40 compiles for sm_80/sm_90
    "tests/test_gpu_compile.py",
    "tests/test_portable.py",           # the Triton lessons without Triton
    "tests/test_parallelism.py",        # a four-process torchrun cluster
    "tests/test_nbgrader.py",
    "notebooks/12_score_sde.ipynb",
    "notebooks/11_ddpm_ddim.ipynb",
    "notebooks/07b_small_language_models.ipynb",
    "notebooks/07c_small_language_models.ipynb",
]


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, move the longest files to the front (stable: everything else keeps its order).

    Every worker collects and sorts alike, so the collections stay identical; `make test` passes
    `--no-loadscope-reorder` so that xdist keeps this order instead of sorting files by test count."""
    if not hasattr(config, "workerinput"):  # only xdist's workers collect the tests they run
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
