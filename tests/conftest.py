"""The test session: the checkout on sys.path, setup()'s explicit calls, and the write_notebook fixture.

Shared helpers live in modules of their own: _notebook_helpers (toy problem sets), _grading_helpers (testing checks).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent  # before course_utils is importable: it may not be installed
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


@pytest.fixture
def write_notebook(tmp_path):
    def _write(nb, name: str = "toy.ipynb") -> Path:
        path = tmp_path / name
        nbformat.write(nb, path)
        return path

    return _write


# ---------------------------------------------------------------- the parallel run (`make test`: pytest-xdist)
# `--dist loadfile` keeps each file on one worker: a notebook's cells share one kernel, and a module's fixtures
# (the compile matrix, the torchrun cluster) are built once. The worker that draws the longest file last decides
# the run's length, so the files that take longest go first; the many short files and notebooks fill in behind.
LONGEST_FIRST = [  # by the seconds each file took in an idle `make test` (3 workers, 2 cores), longest first
    "tests/test_gpu_dry_run.py",        # (make test-tiers) the GPU tiers' cells of 8 lessons under simulated tiers
    "tests/test_portable.py",           # (make test-tiers) the Triton lessons without Triton
    "tests/test_notebooks.py",          # every solution graded (and its outputs compared), every exercise graded
    "tests/test_grader_attacks.py",     # every problem set graded behind every trick
    "notebooks/12_score_sde.ipynb",
    "notebooks/11_ddpm_ddim.ipynb",
    "tests/test_gradebook.py",          # grade-class: every kind of submission, one grader process and kernel each
    "tests/test_nbgrader.py",
    "tests/test_release.py",            # a full release, recorded from every check, and three notebooks run on it
    "tests/test_grading_gemm.py",       # Triton kernels of set 05 under the interpreter, every named mistake
    "notebooks/09_parallelism.ipynb",
    "notebooks/07c_small_language_models.ipynb",
    "notebooks/03_convolution.ipynb",
    "notebooks/06_flash_attention.ipynb",
    "notebooks/07a_small_language_models.ipynb",
    "tests/test_grading_attention.py",  # the same for set 06
    "tests/test_grader.py",
    "tests/test_attention_triton.py",
    "notebooks/10_vae.ipynb",
    "notebooks/07b_small_language_models.ipynb",
    "notebooks/08_training_memory.ipynb",
    "tests/test_sandbox.py",
    "tests/test_gpu_compile.py",
    "tests/test_parallelism.py",        # a four-process torchrun cluster
]


def pytest_configure(config):
    """One BLAS/OpenMP thread per xdist worker (set before the workers start, so that their NumPy and torch, and
    every kernel, grader and torchrun process they start, inherit it). Two workers with two OpenMP threads each
    oversubscribe a 2-core machine, and the idle threads spin: on test_score_sde, test_vae, test_diffusion and
    test_slm, 47 s of CPU and 44 s of wall time with two threads per worker, 27 s and 19 s with one. Outputs that
    nbval compares do not depend on the thread count (make test-portable runs them with 1 and 2 threads)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, move the longest files to the front (stable: everything else keeps its order).

    Every worker collects and sorts alike, so the collections stay identical; `make test` passes
    `--no-loadscope-reorder` so that xdist keeps this order instead of sorting files by test count."""
    if not hasattr(config, "workerinput"):  # only xdist's workers collect the tests they run
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
