"""solutions/ -> exercises/: stubs, hidden tests, validation, and the drift check."""
from __future__ import annotations

import shutil
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from _notebook_helpers import nbgrader, toy_problem_set
from course_utils.classroom import assignments
from course_utils.classroom.assignments import AssignmentError, STUB_CODE, generate_exercises, make_exercise


def test_solution_regions_become_stubs_at_their_indentation():
    exercise = make_exercise(toy_problem_set())
    src = exercise.cells[3].source
    assert "BEGIN SOLUTION" not in src and "2 * x" not in src
    assert src == "def double(x):\n    " + STUB_CODE


def test_hidden_tests_are_removed_and_visible_checks_kept():
    exercise = make_exercise(toy_problem_set())
    check = exercise.cells[4].source
    assert "HIDDEN" not in check and "double(1.5)" not in check
    assert "check_function(double" in check


def test_outputs_cleared_and_metadata_kept():
    nb = toy_problem_set()
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi\n")]
    nb.cells[1].execution_count = 7
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z"}
    nb.metadata["widgets"] = {"state": {}}
    exercise = make_exercise(nb)
    assert exercise.cells[1].outputs == [] and exercise.cells[1].execution_count is None
    assert "execution" not in exercise.cells[1].metadata and "widgets" not in exercise.metadata
    assert exercise.cells[4].metadata["nbgrader"]["points"] == 2


def test_markdown_answers_are_blanked():
    nb = toy_problem_set()
    nb.cells.append(nbformat.v4.new_markdown_cell("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", metadata=nbgrader("why", solution=True)))
    assert make_exercise(nb).cells[-1].source == "Why?\n\nYOUR ANSWER HERE"


@pytest.mark.parametrize(
    "source, meta, message",
    [
        ("def f():\n    ### BEGIN SOLUTION\n    return 1\n", nbgrader("a", solution=True), "never closed"),
        ("def f():\n    return 1\n    ### END SOLUTION\n", nbgrader("a", solution=True), "without a matching"),
        ("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n", {}, "not marked as a solution cell"),
        ("check()\n### BEGIN HIDDEN TESTS\ncheck()\n### END HIDDEN TESTS", nbgrader("a", solution=True), "not a graded cell"),
        ("check()", {"nbgrader": {"grade": True, "grade_id": "c", "solution": False, "locked": True, "schema_version": 3}}, "no points"),
    ],
)
def test_malformed_solutions_are_rejected_with_a_reason(source, meta, message):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source, metadata=meta)]
    with pytest.raises(AssignmentError, match=message):
        make_exercise(nb)


def test_duplicate_grade_ids_are_rejected():
    nb = toy_problem_set()
    nb.cells[6].metadata["nbgrader"]["grade_id"] = "ex1_double"
    with pytest.raises(AssignmentError, match="used twice"):
        make_exercise(nb)


def test_generation_is_deterministic_and_check_detects_hand_edits(tmp_path):
    solutions, out = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    nbformat.write(toy_problem_set(), solutions / "99_toy.ipynb")
    sources = sorted(solutions.glob("*.ipynb"))
    first = generate_exercises(sources, out)
    assert [p.name for p in first.written] == ["99_toy.ipynb"]
    assert generate_exercises(sources, out, check=True).clean
    assert generate_exercises(sources, out).written == []  # idempotent

    target = out / "99_toy.ipynb"
    target.write_text(target.read_text().replace("def double(x):", "def double(x):  # edited"))
    report = generate_exercises(sources, out, check=True)
    assert report.differing == [target] and not report.clean
    assert "edited" in assignments.diff_summary(target, sources[0])


def test_repository_exercises_are_up_to_date():
    report = generate_exercises(check=True)
    assert report.clean, (
        f"exercises/ differs from solutions/ (differing {report.differing}, missing {report.missing}, "
        f"orphaned {report.orphaned}); run `make exercises` and commit."
    )


def test_cli_check_fails_on_a_hand_edited_exercise(tmp_path):
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    if not solutions:
        pytest.skip("no solution notebooks yet")
    out = tmp_path / "exercises"
    shutil.copytree(ROOT / "exercises", out)
    args = [sys.executable, "-m", "course_utils", "exercises", "--check", "--out", str(out), "--solutions", *map(str, solutions)]
    assert subprocess.run(args, capture_output=True, text=True).returncode == 0
    edited = out / solutions[0].name
    nb = nbformat.read(edited, as_version=4)
    nb.cells[0].source += "\nhand edit"
    nbformat.write(nb, edited)
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 1
    assert "differs from" in result.stdout and "make exercises" in result.stdout
