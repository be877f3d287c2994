"""Every lesson and problem set follows the anatomy; solutions grade full; exercises grade zero.

nbval itself (outputs reproduce) runs on notebooks/ and solutions/ through pytest's `--nbval`
(see pyproject.toml); these tests check what nbval cannot.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils import topics
from course_utils.grader import NOT_ATTEMPTED_ERRORS, grade_notebook

SLUGS = topics.slugs()  # course_utils/topics.py
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
EXECUTED = LESSONS + SOLUTIONS


def ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_is_at_least_one_lesson_and_problem_set():
    assert LESSONS and SOLUTIONS


@pytest.mark.parametrize("path", EXECUTED + EXERCISES, ids=ids(EXECUTED + EXERCISES))
def test_file_name_uses_a_fixed_topic_slug(path):
    stem = re.sub(r"^(\d\d)[a-z]_", r"\1_", path.stem)
    assert stem in SLUGS or any(stem.startswith(s) for s in SLUGS), f"{path.name}: use one of {SLUGS} (optionally NNa_/NNb_)"


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_setup_cell_comes_first_and_is_ignored_by_nbval(path):
    nb = nbformat.read(path, as_version=4)
    first = code_cells(nb)[0]
    assert "setup(" in first.source, f"{path.name}: the first code cell must call course_utils.setup()"
    assert "nbval-ignore-output" in first.metadata.get("tags", []), f"{path.name}: tag the setup cell nbval-ignore-output"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


@pytest.mark.parametrize("path", EXECUTED, ids=ids(EXECUTED))
def test_committed_executed_in_order_without_unexpected_errors(path):
    nb = nbformat.read(path, as_version=4)
    counts = [c.execution_count for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: re-run it top to bottom in a fresh kernel before committing"
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                assert "raises-exception" in cell.metadata.get("tags", []), f"{path.name}: cell {index} has an error output"


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_exercises_carry_no_solutions_or_outputs(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert all(not c.outputs and c.execution_count is None for c in code_cells(nb))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_solutions_grade_full_marks(path):
    report = grade_notebook(path, cell_timeout=300)
    assert len(report.exercises) >= 5, f"{path.name}: a problem set has at least five graded exercises"
    not_passed = [(e.name, e.status, e.hint) for e in report.exercises if e.status != "passed"]
    assert not not_passed and report.total == report.max_total > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_untouched_exercises_raise_only_not_attempted_and_grade_zero(path):
    report = grade_notebook(path, cell_timeout=300)
    crashes = [e for e in report.cell_errors if e["ename"] not in NOT_ATTEMPTED_ERRORS]
    assert not crashes, f"{path.name}: an untouched exercise must raise only 'not attempted' errors, got {crashes[:3]}"
    assert report.total == 0 and all(e.status == "not attempted" for e in report.exercises)
