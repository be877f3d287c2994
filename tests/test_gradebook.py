"""grade-class: a folder of 30 generated submissions of the toy problem set -> the right gradebook."""
from __future__ import annotations

import csv
import json
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


def hung():
    nb = toy_problem_set()
    nb.cells[3].source += "\nwhile True:\n    pass"
    return nb


def crashed():
    nb = toy_problem_set()
    nb.cells[6].source += "\nimport os\nos._exit(1)"
    return nb


# kind -> (how many, notebook maker or raw bytes, expected {exercise: (status, points)})
KINDS = {
    "solved": (6, toy_problem_set, {"ex1_double": ("passed", 2), "ex2_triple": ("passed", 3)}),
    "untouched": (6, lambda: make_exercise(toy_problem_set()), {"ex1_double": ("not attempted", 0), "ex2_triple": ("not attempted", 0)}),
    "mixed_wrong": (3, lambda: toy_problem_set(double_body="return x * x"), {"ex1_double": ("failed", 0), "ex2_triple": ("passed", 3)}),
    "mixed_half": (3, lambda: toy_problem_set(triple_body='raise NotImplementedError("stub")'),
                   {"ex1_double": ("passed", 2), "ex2_triple": ("not attempted", 0)}),
    "tampered": (4, tampered, {"ex1_double": ("tampered", 0), "ex2_triple": ("tampered", 0)}),
    "hung": (3, hung, {"ex1_double": ("timed out", 0), "ex2_triple": ("passed", 3)}),
    "crashed": (3, crashed, {"ex1_double": ("passed", 2), "ex2_triple": ("error", 0)}),
    "garbage": (1, b"this is not a notebook", {"ex1_double": ("invalid", 0), "ex2_triple": ("invalid", 0)}),
    "empty": (1, b"", {"ex1_double": ("invalid", 0), "ex2_triple": ("invalid", 0)}),
}


def test_grade_class_on_thirty_generated_submissions(tmp_path):
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
    assert len(expected) == 30
    done = subprocess.run([sys.executable, "-m", "course_utils", "grade-class", str(folder), "--pristine", str(pristine),
                           "--out", str(out), "--cell-timeout", "15"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    book = json.loads((out / "gradebook.json").read_text())
    got = {r["learner"]: {n: (e["status"], e["points"]) for n, e in r["exercises"].items()} for r in book["learners"]}
    assert got == expected
    with open(out / "gradebook.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30 and {r["learner"]: float(r["total"]) for r in rows}["solved_0"] == 5.0
    stats = {s["exercise"]: s for s in book["statistics"]}
    assert stats["ex1_double"]["share_passed"] == round((6 + 3 + 3) / 30, 3)
    assert "multiply it by 2" in stats["ex1_double"]["most_common_mistake"]["hint"]
    assert "ex1_double" in done.stdout and "most common mistake" in done.stdout
