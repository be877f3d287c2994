"""nbgrader compatibility: a solutions notebook works unchanged in an nbgrader course.

generate_assignment must accept it, autograde must give the solution full points and the
generated release zero.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_utils.paths import ROOT
from _notebook_helpers import toy_problem_set

pytestmark = pytest.mark.slow
nbgrader_api = pytest.importorskip("nbgrader.api")

REPO_SOLUTION = ROOT / "solutions" / "01_floating_point.ipynb"  # the quickest real set to execute (4 s; 00 takes 6.5)


def nbgrader_cli(course, *args):
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}", "--log-level=ERROR"],
        cwd=course, capture_output=True, text=True, timeout=900,
        # nbgrader runs the `alembic` command of its environment by name: put that environment first on PATH.
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert result.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result


@pytest.fixture(scope="module")
def autograded(tmp_path_factory):
    """One nbgrader course whose assignment holds the toy problem set and the course's set 01, released,
    submitted by a learner who solved both and one who handed the release back untouched, and autograded:
    {notebook: ({student: score}, max score)}. One course instead of one per notebook: each nbgrader command
    is a process that takes seconds to start."""
    tmp_path = tmp_path_factory.mktemp("nbgrader")
    toy = tmp_path / "toy.ipynb"
    nbformat.write(toy_problem_set(), toy)
    course = tmp_path / "course"
    (course / "source" / "ps").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'loops-to-kernels'\n")
    solutions = [toy] + ([REPO_SOLUTION] if REPO_SOLUTION.exists() else [])
    for path in solutions:
        shutil.copy(path, course / "source" / "ps" / path.name)
    (tmp_path / "students.csv").write_text("id\nsolver\nuntouched\n")
    nbgrader_cli(course, "db", "student", "import", str(tmp_path / "students.csv"))
    nbgrader_cli(course, "generate_assignment", "ps", "--force")
    for path in solutions:
        release = course / "release" / "ps" / path.name
        assert "BEGIN SOLUTION" not in release.read_text()
        for student, source in (("solver", path), ("untouched", release)):
            target = course / "submitted" / student / "ps"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / path.name)
    nbgrader_cli(course, "autograde", "ps", "--force", "--ExecutePreprocessor.timeout=300")
    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        out = {}
        for path in solutions:
            books = {s: gb.find_submission_notebook(path.stem, "ps", s) for s in ("solver", "untouched")}
            out[path.name] = ({s: b.score for s, b in books.items()}, books["solver"].max_score)
        return out


def test_toy_problem_set_round_trips_through_nbgrader(autograded):
    scores, max_score = autograded["toy.ipynb"]
    assert max_score == 5
    assert scores == {"solver": 5, "untouched": 0}


@pytest.mark.skipif(not REPO_SOLUTION.exists(), reason="solutions/01_floating_point.ipynb not written yet")
def test_course_solution_round_trips_through_nbgrader(autograded):
    scores, max_score = autograded[REPO_SOLUTION.name]
    assert max_score > 0
    assert scores == {"solver": max_score, "untouched": 0}
