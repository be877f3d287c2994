"""Every lesson and problem set follows the anatomy; solutions grade full; exercises grade zero.

nbval itself (outputs reproduce) runs on notebooks/ through pytest's `--nbval` (see pyproject.toml). A solution is
executed once, by its full-marks grading, whose fresh outputs are then compared with the committed ones as nbval
would compare them (`nbval_differences`); `pytest --nbval solutions/NN_slug.ipynb` still works by hand.
These tests check what nbval cannot.
"""
from __future__ import annotations

import re

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils import topics
from _notebook_helpers import nbval_differences
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
def test_solutions_grade_full_marks_and_reproduce_their_outputs(path):
    report = grade_notebook(path, cell_timeout=300)
    assert len(report.exercises) >= 5, f"{path.name}: a problem set has at least five graded exercises"
    not_passed = [(e.name, e.status, e.hint) for e in report.exercises if e.status != "passed"]
    assert not not_passed and report.total == report.max_total > 0
    committed = nbformat.read(path, as_version=4)
    # not compared: graded cells (the grader runs them in its own process) and the cells that call course_utils.grading
    # themselves (00's demonstration of a check failing, 09's gloo run), which in the sandbox reach stand-ins; what
    # those two print is tested in tests/test_grading_foundations*.py and test_grading_parallelism.py
    skipped = {i for i, c in enumerate(committed.cells)
               if c.get("metadata", {}).get("nbgrader", {}).get("grade") or re.search(r"\bgrading\.", c.source)}
    problems = nbval_differences(report.executed, committed, skip_cells=skipped)
    assert not problems, f"{path.name}: outputs differ from the committed ones (as nbval compares them):\n" + "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_untouched_exercises_raise_only_not_attempted_and_grade_zero(path):
    report = grade_notebook(path, cell_timeout=300)
    crashes = [e for e in report.cell_errors if e["ename"] not in NOT_ATTEMPTED_ERRORS]
    assert not crashes, f"{path.name}: an untouched exercise must raise only 'not attempted' errors, got {crashes[:3]}"
    assert report.total == 0 and all(e.status == "not attempted" for e in report.exercises)


def test_nbval_differences_compares_as_nbval_does():
    """The comparison that replaces nbval's second run of each solution: it must see what nbval sees and no more."""
    def nb(*cells):
        book = nbformat.v4.new_notebook()
        for source, outputs, tags in cells:
            cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags} if tags else {})
            cell.outputs, cell.execution_count = [nbformat.from_dict(o) for o in outputs], 1
            book.cells.append(cell)
        return book

    def out(text, name="stdout"):
        return {"output_type": "stream", "name": name, "text": text}

    committed = nb(("print(1)", [out("1\n")], None), ("f", [{"output_type": "execute_result", "execution_count": 2,
                   "metadata": {}, "data": {"text/plain": "<function f at 0x7f00deadbeef>", "image/png": "AAA"}}], None),
                   ("t", [out("took 3 s\n")], ["nbval-ignore-output"]), ("print(2)", [out("a"), out("b\n")], None))
    same = nb(("print(1)", [out("1\n")], None), ("f", [{"output_type": "execute_result", "execution_count": 9,
              "metadata": {}, "data": {"text/plain": "<function f at 0x7f11cafef00d>", "image/png": "BBB"}}], None),
              ("t", [out("took 5 s\n")], None), ("print(2)", [out("ab\n")], None))
    assert nbval_differences(same, committed) == []  # addresses sanitized, images not compared, streams coalesced
    wrong = nbformat.from_dict(same)
    wrong.cells[0].outputs = [nbformat.from_dict(out("2\n"))]
    wrong.cells[3].outputs.append(nbformat.from_dict({"output_type": "error", "ename": "ValueError", "evalue": "x", "traceback": []}))
    problems = nbval_differences(wrong, committed)
    assert [p.split(":")[0] for p in problems] == ["Cell 0 (stdout) differs", "Cell 3 raised ValueError",
                                                   "Cell 3 (ename) differs"]
    assert nbval_differences(wrong, committed, skip_cells={0, 3}) == []
    warned = nbformat.from_dict(same)
    warned.cells[0].outputs.append(nbformat.from_dict(out("UserWarning: x\n", "stderr")))
    assert nbval_differences(warned, committed) and "stderr" in nbval_differences(warned, committed)[0]
