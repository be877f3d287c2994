"""The learners' release (``python -m course_utils release OUT``): no solution, no reference, working self-checks.

Built for problem sets 00, 03 and 12 (grading modules foundations, convolution, score_sde). Each set's
released exercise notebook is run with the solution cells filled in from ``solutions/``: every banked check
passes the right answers; a known mistake per set is named by the released check.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils.classroom.release import build_release, find_leaks, reference_names

pytestmark = pytest.mark.slow
SETS = {"00_foundations": "foundations", "03_convolution": "convolution", "12_score_sde": "score_sde"}

RUN = r'''
import json, sys, traceback
import nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
ns = {"__name__": "__main__"}
out = []
for cell in nb.cells:
    if cell.cell_type != "code":
        continue
    meta = cell.metadata.get("nbgrader", {})
    try:
        exec(compile(cell.source, "<cell>", "exec"), ns)
        out.append([meta.get("grade_id"), "ok", ""])
    except BaseException as exc:
        out.append([meta.get("grade_id"), type(exc).__name__, str(exc)[:300]])
import course_utils
out.append(["__file__", course_utils.__file__, ""])
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "release"
    summary = build_release(out, modules=list(SETS.values()), log=lambda *a: None)
    return out, summary


def _run(release_dir, nb, tmp_path):
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    script = tmp_path / "run.py"
    script.write_text(RUN)
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=900,
                          cwd=release_dir / "exercises", env={"PYTHONPATH": str(release_dir), "PATH": "/usr/bin:/bin",
                                                               "HOME": str(tmp_path)})
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, done.stderr[-2000:]
    results = json.loads(line[len("RESULT"):])
    assert results[-1][1].startswith(str(release_dir)), results[-1]  # the release's package, not the repository's
    return {gid: (status, message) for gid, status, message in results[:-1] if gid}


def _filled(release_dir, stem, answers=None):
    """The released exercise notebook with the solution cells of solutions/ (or ``answers``) filled in."""
    nb = nbformat.read(release_dir / "exercises" / f"{stem}.ipynb", as_version=4)
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    solved.update(answers or {})
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in solved and cell.metadata["nbgrader"].get("solution"):
            cell.source = solved[gid]
    return nb


def test_the_release_holds_no_solution_and_no_reference(release):
    out, summary = release
    assert not (out / "solutions").exists() and not (out / "tests").exists()
    assert find_leaks(out) == []
    names = reference_names()
    assert "_reference_c_strides" in names and len(names) > 50
    for bank in (out / "course_utils" / "grading" / "_bank").glob("*.pkl"):
        data = bank.read_bytes()
        assert b"course_utils.grading" not in data
        assert not [n for n in names if n.encode() in data]
        assert pickle.loads(data)
    for module in SETS.values():
        text = (out / "course_utils" / "grading" / f"{module}.py").read_text()
        assert "def check_" in text and "_reference" not in text
        assert (ROOT / "course_utils" / "grading" / f"{module}.py").read_text() != text
    assert sum(sum(v.values()) for v in summary.values()) >= 10  # most checks replay a bank


@pytest.mark.parametrize("stem", list(SETS))
def test_the_released_self_checks_pass_the_right_answers(release, stem, tmp_path):
    out, summary = release
    results = _run(out, _filled(out, stem), tmp_path)
    graded = {gid: r for gid, r in results.items() if gid.endswith("_check")}
    assert graded and all(status == "ok" for status, _ in graded.values()), graded


MISTAKES = {
    "00_foundations": ("ex1_c_strides", "def c_strides(shape, itemsize, perm):\n    strides, size = [], 1\n"
                       "    for d in reversed(shape):\n        strides.insert(0, size)\n        size *= d\n"
                       "    return tuple(strides[p] for p in perm)", "in elements"),
    "03_convolution": ("ex1_output_shape", "def conv_output_shape(hw, kernel, stride, padding, dilation):\n"
                       "    return tuple((hw[a] + 2 * padding[a] - kernel[a]) // stride[a] + 1 for a in (0, 1))",
                       "forgot the dilation"),
    "12_score_sde": ("ex4_probability_flow_drift", "def probability_flow_drift(x, score, u, beta_min, beta_max):\n"
                     "    beta = beta_min + u * (beta_max - beta_min)\n    return -0.5 * beta * x + 0.5 * beta * score",
                     "sign of the score"),
}


@pytest.mark.parametrize("stem", list(SETS))
def test_the_released_self_checks_name_mistakes(release, stem, tmp_path):
    out, _ = release
    gid, source, fragment = MISTAKES[stem]
    results = _run(out, _filled(out, stem, {gid: source}), tmp_path)
    status, message = results[gid + "_check"]
    assert status == "CheckFailed" and fragment in message, (status, message)


def test_release_refuses_a_folder_inside_the_repository():
    from course_utils.classroom.release import ReleaseError

    with pytest.raises(ReleaseError, match="outside"):
        build_release(ROOT / "build_release_here")
