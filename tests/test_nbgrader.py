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

REPO_SOLUTION = ROOT / "solutions" / "00_foundations.ipynb"


def nbgrader_cli(course, *args):
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}", "--log-level=ERROR"],
        cwd=course, capture_output=True, text=True, timeout=900,
        # nbgrader runs the `alembic` command of its environment by name: put that environment first on PATH.
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert result.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result


def scores_after_autograde(tmp_path, solution_path):
    course, name = tmp_path / "course", solution_path.name
    (course / "source" / "ps").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'loops-to-kernels'\n")
    shutil.copy(solution_path, course / "source" / "ps" / name)
    nbgrader_cli(course, "db", "student", "add", "solver")
    nbgrader_cli(course, "db", "student", "add", "untouched")
    nbgrader_cli(course, "generate_assignment", "ps", "--force")
    release = course / "release" / "ps" / name
    assert "BEGIN SOLUTION" not in release.read_text()
    for student, source in (("solver", solution_path), ("untouched", release)):
        target = course / "submitted" / student / "ps"
        target.mkdir(parents=True)
        shutil.copy(source, target / name)
    nbgrader_cli(course, "autograde", "ps", "--force", "--ExecutePreprocessor.timeout=300")
    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment("ps")
        return {s: gb.find_submission("ps", s).score for s in ("solver", "untouched")}, assignment.max_score


def test_toy_problem_set_round_trips_through_nbgrader(tmp_path):
    path = tmp_path / "toy.ipynb"
    nbformat.write(toy_problem_set(), path)
    scores, max_score = scores_after_autograde(tmp_path, path)
    assert max_score == 5
    assert scores == {"solver": 5, "untouched": 0}


@pytest.mark.skipif(not REPO_SOLUTION.exists(), reason="solutions/00_foundations.ipynb not written yet")
def test_course_solution_round_trips_through_nbgrader(tmp_path):
    scores, max_score = scores_after_autograde(tmp_path, REPO_SOLUTION)
    assert max_score > 0
    assert scores == {"solver": max_score, "untouched": 0}
