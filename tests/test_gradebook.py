"""grade-class: a folder of generated submissions of the toy problem set, every kind of submission -> the right gradebook."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from _notebook_helpers import toy_problem_set
from course_utils.classroom.assignments import make_exercise

pytestmark = pytest.mark.slow


def tampered():
    nb = make_exercise(toy_problem_set())
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass"
    return nb


def hung(double_body="return 2 * x"):
    """A submission that never finishes. It sleeps rather than spins: three of them spinning for a 15 s limit
    took 45 s of CPU from the rest of the suite; interrupting a busy loop is tested in test_grader.py."""
    nb = toy_problem_set(double_body=double_body)
    nb.cells[3].source += "\nimport time\nwhile True:\n    time.sleep(0.1)"
    return nb


def crashed():
    nb = toy_problem_set()
    nb.cells[6].source += "\nimport os\nos._exit(1)"
    return nb


# kind -> (how many, notebook maker or raw bytes, expected {exercise: (status, points)})
KINDS = {
    "solved": (2, toy_problem_set, {"ex1_double": ("passed", 2), "ex2_triple": ("passed", 3)}),
    "untouched": (2, lambda: make_exercise(toy_problem_set()), {"ex1_double": ("not attempted", 0), "ex2_triple": ("not attempted", 0)}),
    "mixed_wrong": (1, lambda: toy_problem_set(double_body="return x * x"), {"ex1_double": ("failed", 0), "ex2_triple": ("passed", 3)}),
    "mixed_half": (1, lambda: toy_problem_set(triple_body='raise NotImplementedError("stub")'),
                   {"ex1_double": ("passed", 2), "ex2_triple": ("not attempted", 0)}),
    "tampered": (1, tampered, {"ex1_double": ("tampered", 0), "ex2_triple": ("tampered", 0)}),
    "hung": (1, hung, {"ex1_double": ("passed", 2), "ex2_triple": ("passed", 3)}),  # the function was right before the loop
    "hung_wrong": (1, lambda: hung("return x * x"), {"ex1_double": ("timed out", 0), "ex2_triple": ("passed", 3)}),
    "crashed": (1, crashed, {"ex1_double": ("passed", 2), "ex2_triple": ("error", 0)}),
    "garbage": (1, b"this is not a notebook", {"ex1_double": ("invalid", 0), "ex2_triple": ("invalid", 0)}),
    "empty": (1, b"", {"ex1_double": ("invalid", 0), "ex2_triple": ("invalid", 0)}),
}


def test_grade_class_on_every_kind_of_submission(tmp_path):
    folder, out = tmp_path / "submissions", tmp_path / "book"
    folder.mkdir()
    pristine = tmp_path / "pristine.ipynb"
    nbformat.write(toy_problem_set(), pristine)
    expected = {}
    for kind, (count, make, want) in KINDS.items():
        for i in range(count):
            path = folder / f"{kind}_{i}.ipynb"
            if isinstance(make, bytes):
                path.write_bytes(make)
            else:
                nbformat.write(make(), path)
            expected[path.stem] = want
    n = len(expected)
    assert n == 12
    done = subprocess.run([sys.executable, "-m", "course_utils", "grade-class", str(folder), "--pristine", str(pristine),
                           "--out", str(out), "--cell-timeout", "5"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    book = json.loads((out / "gradebook.json").read_text())
    got = {r["learner"]: {n: (e["status"], e["points"]) for n, e in r["exercises"].items()} for r in book["learners"]}
    assert got == expected
    with open(out / "gradebook.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == n and {r["learner"]: float(r["total"]) for r in rows}["solved_0"] == 5.0
    stats = {s["exercise"]: s for s in book["statistics"]}
    assert stats["ex1_double"]["share_passed"] == round((2 + 1 + 1 + 1) / n, 3)
    assert stats["ex1_double"]["shares"]["not attempted"] == round(2 / n, 3)
    assert stats["ex1_double"]["shares"]["timed out"] == round(1 / n, 3)
    assert "invalid" in stats["ex1_double"]["shares"]
    assert "multiply it by 2" in stats["ex1_double"]["most_common_mistake"]["hint"]
    assert "ex1_double" in done.stdout and "most common mistake" in done.stdout
    assert f"{n - 2} submissions graded" not in done.stdout and "2 of them broken" in done.stdout
    assert "BROKEN: invalid" in next(line for line in done.stdout.splitlines() if line.startswith("garbage_0"))
    assert f"graded {n}/{n}" in done.stderr


def _nbgrader_class(root, pristine_nb):
    """nbgrader's layout: submitted/LEARNER/ps1/NAME.ipynb with timestamp.txt; one wrong set, one late."""
    def put(learner, nb, stamp):
        folder = root / "submitted" / learner / "ps1"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "toy.ipynb")
        (folder / "timestamp.txt").write_text(stamp)

    put("ada", pristine_nb, "2026-12-01 10:00:00.000000 UTC")
    put("bob", toy_problem_set(double_body="return x * x"), "2026-12-02 09:00:00.000000 UTC")  # late
    other = toy_problem_set()
    for cell in other.cells:
        meta = cell.metadata.get("nbgrader")
        if meta:
            meta["grade_id"] = "other_" + meta["grade_id"]
    put("cy", other, "2026-12-01 11:00:00.000000 UTC")
    (root / "roster.csv").write_text("id,name,email\nada,Ada L,ada@example.org\nbob,Bob B,bob@example.org\n"
                                     "cy,Cy C,cy@example.org\ndee,Dee D,dee@example.org\n")


def test_nbgrader_layout_roster_deadline_and_feedback(tmp_path):
    pristine = tmp_path / "toy.ipynb"
    nbformat.write(toy_problem_set(), pristine)
    _nbgrader_class(tmp_path / "course", toy_problem_set())
    out = tmp_path / "book"
    # paths relative to the instructor's folder, as typed at a prompt (each submission grades in a folder of its own)
    done = subprocess.run([sys.executable, "-m", "course_utils", "grade-class", "course", "--pristine", "toy.ipynb",
                           "--out", "book", "--roster", "course/roster.csv",
                           "--deadline", "2026-12-01T23:59:00+00:00", "--cell-timeout", "30"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
    assert done.returncode == 0, done.stderr[-2000:]
    book = {r["learner"]: r for r in json.loads((out / "gradebook.json").read_text())["learners"]}
    assert {k: (r["submission"], r["total"], r["late"]) for k, r in book.items()} == {
        "ada": ("graded", 5.0, False), "bob": ("graded", 3.0, True), "cy": ("wrong assignment", 0.0, False),
        "dee": ("not submitted", 0.0, False)}
    assert "not toy" in book["cy"]["message"] and "tampered" not in json.dumps(book["cy"])
    assert book["ada"]["name"] == "Ada L"
    with open(out / "gradebook.csv", newline="") as f:
        rows = {r["learner"]: r for r in csv.DictReader(f)}
    assert "multiply it by 2" in rows["bob"]["ex1_double message"] and rows["bob"]["late"] == "late"
    feedback = (out / "feedback" / "bob.md").read_text()
    assert "| ex1_double | 0/2 | failed |" in feedback and "multiply it by 2" in feedback and "after the deadline" in feedback
    assert sorted(p.name for p in (out / "feedback").iterdir()) == ["ada.md", "bob.md", "cy.md", "dee.md"]
    assert "wrong assignment" in done.stdout and "no submission" in done.stdout
