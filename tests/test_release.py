"""The learners' release (``python -m course_utils release OUT``): no solution, no reference, working self-checks.

Built for problem sets 00, 03 and 12 (grading modules foundations, convolution, score_sde). Each set's
released exercise notebook is run with the solution cells filled in from ``solutions/``: every banked check
passes the right answers; a known mistake per set is named by the released check. Exercise and check cell ids
are read from the current solution notebooks, found by the function each exercise asks for.
"""
from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils.classroom.release import build_release, find_leaks, pickled_strings, reference_names

pytestmark = pytest.mark.slow
SETS = {"00_foundations": "foundations", "03_convolution": "convolution", "12_score_sde": "score_sde"}

RUN = r'''
import json, sys, traceback
import nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
ns = {"__name__": "__main__"}
out = []
import contextlib, io
for cell in nb.cells:
    if cell.cell_type != "code":
        continue
    meta = cell.metadata.get("nbgrader", {})
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(cell.source, "<cell>", "exec"), ns)
        out.append([meta.get("grade_id"), "ok", "", printed.getvalue()[-2000:]])
    except BaseException as exc:
        out.append([meta.get("grade_id"), type(exc).__name__, str(exc)[:300], printed.getvalue()[-2000:]])
import course_utils
out.append(["__file__", course_utils.__file__, "", ""])
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
    return {gid: (status, message, printed) for gid, status, message, printed in results[:-1] if gid}


def _cells(stem):
    """{grade_id: source} of the solution notebook's answer cells and of its graded check cells."""
    cells = [c for c in nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("grade_id")]
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if c.metadata["nbgrader"].get("solution")}
    graded = {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if c.metadata["nbgrader"].get("grade")}
    return solved, graded


def _exercise(stem, function):
    """(answer cell id, check cell id, check name) of the exercise of ``stem`` that asks for ``function``."""
    solved, graded = _cells(stem)
    answer = [gid for gid, src in solved.items() if re.search(rf"^def {function}\(", src, flags=re.M)]
    assert len(answer) == 1, f"{stem}: no single answer cell defines {function}() any more; update MISTAKES"
    check = [(gid, m.group(1)) for gid, src in graded.items()
             if (m := re.search(rf"grading\.(check_\w+)\({function}\b", src))]
    assert len(check) == 1, f"{stem}: no single graded cell checks {function}(); update MISTAKES"
    return answer[0], check[0][0], check[0][1]


def _filled(release_dir, stem, answers=None):
    """The released exercise notebook with the solution cells of solutions/ (or ``answers``) filled in."""
    nb = nbformat.read(release_dir / "exercises" / f"{stem}.ipynb", as_version=4)
    solved = dict(_cells(stem)[0])
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
    assert "_inputs" in names  # an input maker of the grading modules: a leak as a name, not inside another word
    for bank in (out / "course_utils" / "grading" / "_bank").glob("*.pkl"):
        data = bank.read_bytes()
        assert b"course_utils.grading" not in data
        strings = pickled_strings(data)
        assert "check_inputs_unchanged" in strings  # the scan reads the nested banks' strings
        words = {w for s in strings for w in re.findall(r"\w+", s)}
        assert not words & names, words & names  # no reference's or helper's name, as a whole identifier
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
    _, graded = _cells(stem)
    assert graded and set(graded) <= set(results), sorted(set(graded) - set(results))
    assert all(results[gid][0] == "ok" for gid in graded), {gid: results[gid][:2] for gid in graded}
    module = SETS[stem]
    replayed = 0
    for gid, source in graded.items():
        check = re.search(r"grading\.(check_\w+)\(", source).group(1)
        if summary[module][check]:  # a banked check said so; the others say that only the grader checks them
            assert "matches the recorded answers" in results[gid][2], (gid, results[gid][2])
            replayed += 1
    assert replayed >= len(graded) // 2, replayed


def test_a_planted_reference_is_found(tmp_path):
    from course_utils.grading import foundations

    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_utils" / "bank.pkl").write_bytes(pickle.dumps({"k": pickle.dumps(foundations._reference_c_strides)}))
    (tmp_path / "course_utils" / "helper.py").write_text("from x import _inputs\n")
    (tmp_path / "course_utils" / "fine.py").write_text("check_inputs_unchanged = True\n")
    leaks = find_leaks(tmp_path)
    assert leaks == ["course_utils/bank.pkl (_reference_c_strides)", "course_utils/helper.py (_inputs)"], leaks


MISTAKES = {  # per set: the function asked for, a wrong answer, words of the hint the released check must give
    "00_foundations": ("c_strides", "def c_strides(shape, itemsize, perm):\n    strides, size = [], 1\n"
                       "    for d in reversed(shape):\n        strides.insert(0, size)\n        size *= d\n"
                       "    return tuple(strides[p] for p in perm)", "in elements"),
    "03_convolution": ("conv_output_shape", "def conv_output_shape(hw, kernel, stride, padding, dilation):\n"
                       "    return tuple((hw[a] + 2 * padding[a] - kernel[a]) // stride[a] + 1 for a in (0, 1))",
                       "forgot the dilation"),
    "12_score_sde": ("ve_probability_flow_drift", "def ve_probability_flow_drift(x, score, u, sigma_min, sigma_max):\n"
                     "    sigma = sigma_min * (sigma_max / sigma_min) ** u\n"
                     "    return math.log(sigma_max / sigma_min) * sigma**2 * score", "sign of the score"),
}


@pytest.mark.parametrize("stem", list(SETS))
def test_the_released_self_checks_name_mistakes(release, stem, tmp_path):
    out, summary = release
    function, source, fragment = MISTAKES[stem]
    answer, check_cell, check = _exercise(stem, function)
    assert summary[SETS[stem]][check], f"{check} has no bank: pick an exercise whose check replays one"
    results = _run(out, _filled(out, stem, {answer: source}), tmp_path)
    status, message, _ = results[check_cell]
    assert status == "CheckFailed" and fragment in message, (status, message)


def test_the_released_self_checks_keep_the_by_hand_watch(release, tmp_path):
    """The check's ``by_hand=`` travels with its bank. Its ``allow`` lets conv2d_grouped's answer call the course's
    im2col (the right-answers test above); its operator families refuse a micro-kernel whose GEMM is torch.inner,
    which no name in the check's ``forbidden=`` list covers (it reaches aten's mm)."""
    out, summary = release
    answer, check_cell, check = _exercise("03_convolution", "micro_kernel_update")
    assert summary["convolution"][check]
    source = ("def micro_kernel_update(c, a_panel, b_panel, i0, j0):\n"
              "    mr, nr = a_panel.shape[1], b_panel.shape[1]\n"
              "    rows, cols = min(mr, c.shape[0] - i0), min(nr, c.shape[1] - j0)\n"
              "    out = c.clone()\n"
              "    out[i0:i0 + rows, j0:j0 + cols] += torch.inner(a_panel.T, b_panel.T)[:rows, :cols]\n"
              "    return out")
    results = _run(out, _filled(out, "03_convolution", {answer: source}), tmp_path)
    status, message, _ = results[check_cell]
    assert status == "ForbiddenCall" and "mm" in message, (status, message)


def test_release_refuses_a_folder_inside_the_repository():
    from course_utils.classroom.release import ReleaseError

    with pytest.raises(ReleaseError, match="outside"):
        build_release(ROOT / "build_release_here")


def test_a_size_limit_given_as_a_function_is_stored_per_fixed_input():
    import numpy as np

    from course_utils.classroom.forbidden import ByHand
    from course_utils.classroom.release import _by_hand_fields, _by_hand_limits

    spec = ByHand(names=("torch.mm", "course_utils.grading.foundations._reference_c_strides"),
                  max_numel=lambda args, kwargs: 2 * args[0].size)
    fields = _by_hand_fields(spec)
    assert "max_numel" not in fields and fields["names"] == ("torch.mm",)
    limits = _by_hand_limits(spec, (np.zeros((3, 4)),), {})
    assert limits == {"max_numel": 24}
    assert ByHand(**fields, **limits).max_numel == 24 and pickle.dumps(fields)
