"""The test session: the checkout on sys.path, setup()'s explicit calls, and the write_notebook fixture.

Shared helpers live in modules of their own: _notebook_helpers (toy problem sets), _grading_helpers (testing checks).
"""
from __future__ import annotations

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


@pytest.fixture
def write_notebook(tmp_path):
    def _write(nb, name: str = "toy.ipynb") -> Path:
        path = tmp_path / name
        nbformat.write(nb, path)
        return path

    return _write
