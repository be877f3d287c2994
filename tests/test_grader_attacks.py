"""The grader against a learner who tries to game it: every attack scores zero for the attacked exercise.

Attacks on the toy problem set of _notebook_helpers.py (two exercises, double and triple) and on every real
problem set. Each attack pairs a *wrong* answer with a trick that would make an in-kernel check pass it.
"""
from __future__ import annotations

import nbformat
import pytest

from course_utils.paths import ROOT
from _notebook_helpers import cut_after, toy_problem_set
from course_utils.classroom.assignments import make_exercise
from course_utils.classroom.grader import grade_notebook

pytestmark = pytest.mark.slow
WRONG_DOUBLE = "return x * x"


def grade(write_notebook, nb, **kwargs):
    pristine = write_notebook(toy_problem_set(), "pristine.ipynb")
    return grade_notebook(write_notebook(nb, "submission.ipynb"), pristine=pristine, cell_timeout=30, **kwargs)


def status(report, name):
    return next((e.status, e.points, e.hint) for e in report.exercises if e.name == name)


def with_prelude(prelude: str, double_body: str = WRONG_DOUBLE):
    """A submission whose first answer cell runs ``prelude`` before a wrong ``double``."""
    nb = toy_problem_set(double_body=double_body)
    nb.cells[3].source = prelude + "\n" + nb.cells[3].source
    return nb


def test_graded_cells_replaced_by_pass_are_tampered(write_notebook):
    nb = make_exercise(toy_problem_set())
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass"
    report = grade(write_notebook, nb)
    assert [(e.status, e.points) for e in report.exercises] == [("tampered", 0.0), ("tampered", 0.0)]
    assert "changed" in report.exercises[0].hint


def test_a_deleted_graded_cell_is_tampered_and_the_next_exercise_still_grades(write_notebook):
    nb = toy_problem_set()
    del nb.cells[4]
    report = grade(write_notebook, nb)
    assert status(report, "ex1_double")[:2] == ("tampered", 0.0) and "deleted" in status(report, "ex1_double")[2]
    assert status(report, "ex2_triple")[:2] == ("passed", 3.0)


def test_a_graded_cell_moved_to_another_grade_id_is_tampered(write_notebook):
    nb = toy_problem_set(double_body=WRONG_DOUBLE)
    nb.cells[4].metadata["nbgrader"]["grade_id"] = "something_else"
    assert status(grade(write_notebook, nb), "ex1_double")[:2] == ("tampered", 0.0)


@pytest.mark.parametrize("prelude", [
    # the course's check functions made into no-ops
    "import course_utils, course_utils.checks as c\nc.check_function = lambda *a, **k: None\ncourse_utils.check_function = c.check_function",
    # the comparison functions made to agree with anything
    "import numpy as np, torch\nnp.allclose = lambda *a, **k: True\nnp.array_equal = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True",
    # the exceptions: every failure becomes an exception nobody reports
    "import builtins, course_utils.checks as c\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\nc.CheckFailed = KeyboardInterrupt",
    # IPython's traceback display and custom exception handler (a known notebook-grader exploit)
    "ip = get_ipython()\nip.showtraceback = lambda *a, **k: None\nip.set_custom_exc((BaseException,), lambda *a, **k: None)",
    # sys.excepthook and the display hook
    "import sys\nsys.excepthook = lambda *a: None\nsys.displayhook = lambda *a: None",
])
def test_patching_the_learners_kernel_cannot_pass_a_wrong_answer(write_notebook, prelude):
    report = grade(write_notebook, with_prelude(prelude))
    assert status(report, "ex1_double")[:2] == ("failed", 0.0), status(report, "ex1_double")
    assert status(report, "ex2_triple")[:2] == ("passed", 3.0)


def test_an_object_that_equals_everything_does_not_pass(write_notebook):
    body = ("class Anything:\n    def __eq__(self, other): return True\n    def __array__(self, *a, **k): return 2 * x\n"
            "return Anything()")
    report = grade(write_notebook, toy_problem_set(double_body=body))
    assert status(report, "ex1_double")[:2] == ("failed", 0.0)


def test_an_ndarray_subclass_that_lies_travels_as_plain_data(write_notebook):
    body = ("import numpy as np\nclass Liar(np.ndarray):\n    def __eq__(self, other): return np.ones(np.shape(other), bool)\n"
            "return (x * x).view(Liar)")
    assert status(grade(write_notebook, toy_problem_set(double_body=body)), "ex1_double")[:2] == ("failed", 0.0)


def test_a_hard_coded_answer_fails_on_fresh_inputs(write_notebook):
    import numpy as np
    table = {tuple(np.round(x, 12)): tuple(2 * x) for x in [np.random.default_rng([0, t]).standard_normal(4) for t in range(3)]}
    body = f"import numpy as np\nreturn np.array({table!r}[tuple(np.round(x, 12))])"
    got = status(grade(write_notebook, toy_problem_set(double_body=body)), "ex1_double")
    assert got[:2] == ("failed", 0.0) and "KeyError" in got[2]          # the inputs of seed 0 never come back


def test_redefining_the_check_name_in_the_kernel_changes_nothing(write_notebook):
    nb = with_prelude("def check_function(*a, **k):\n    return None\nMistake = None")
    assert status(grade(write_notebook, nb), "ex1_double")[:2] == ("failed", 0.0)


def test_right_answers_written_differently_pass(write_notebook):
    nb = toy_problem_set(double_body="y = x + 0\ny = y + x\nreturn y", triple_body="return x + x + x")
    report = grade(write_notebook, nb)
    assert [e.status for e in report.exercises] == ["passed", "passed"]


def test_a_function_that_never_returns_times_out_and_the_next_exercise_still_grades(write_notebook):
    nb = toy_problem_set(double_body="while True:\n    pass")
    report = grade_notebook(
        write_notebook(nb, "loop.ipynb"), pristine=write_notebook(toy_problem_set(), "pristine.ipynb"), cell_timeout=5)  # see test_grader.py's loop
    assert status(report, "ex1_double")[:2] == ("timed out", 0.0)
    assert status(report, "ex2_triple")[:2] == ("passed", 3.0)


SOLUTION_FILES = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("solution", SOLUTION_FILES, ids=[p.stem for p in SOLUTION_FILES])
def test_every_problem_set_gives_zero_to_wrong_answers_behind_every_trick(tmp_path, solution):
    """Each problem set, its answers left wrong (`return None`), with every trick at once: the first graded cell
    emptied, the checks, the comparisons and IPython's traceback display patched in the learner's kernel; graded up
    to its third exercise."""
    nb = make_exercise(nbformat.read(solution, as_version=4))
    solutions = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"]
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    solutions[0].source = (
        "import builtins as _b, numpy as _np, torch as _t, course_utils.checks as _c\n"
        "_c.check_function = _c.check_value = _c.call_learner = lambda *a, **k: None\n"
        "_np.allclose = _np.array_equal = _t.allclose = _t.equal = lambda *a, **k: True\n"
        "get_ipython().showtraceback = lambda *a, **k: None\n"
        "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n" + solutions[0].source)
    for cell in solutions:
        cell.source = cell.source.replace(
            'raise NotImplementedError("Exercise not attempted yet: replace this line with your code.")', "return None")
    graded[0].source = "pass"
    # up to the third graded cell: the tricks act from the first answer cell on, and every check runs in the grader
    # whatever the kernel patched, so a tampered exercise and two wrong answers behind the tricks show it; grading
    # the whole set doubled the test's time (the later exercises' wrong answers fail the same way in test_grading_*)
    cut_after(nb, graded[min(2, len(graded) - 1)].metadata["nbgrader"]["grade_id"])
    path = tmp_path / solution.name
    nbformat.write(nb, path)
    report = grade_notebook(path, cell_timeout=120)
    assert report.total == 0, [(e.name, e.status, e.hint) for e in report.exercises if e.points]
    assert report.exercises[0].status == "tampered"
    assert not any(e.status == "passed" for e in report.exercises)
    if solution.stem == "00_foundations":  # (once its own test, which graded problem set 00 a second time)
        assert {e.status for e in report.exercises[1:3]} == {"failed"}, [(e.name, e.status) for e in report.exercises]


def _set_02_up_to_exercise_1(tmp_path, ex1_source):
    """Problem set 02 cut after exercise 1's graded cell (a driver of course_utils.classroom.released runs the
    learner's loss scaler in their kernel, in one request), with exercise 1's answer cell replaced."""
    nb = cut_after(nbformat.read(ROOT / "solutions" / "02_mixed_precision.ipynb", as_version=4), "ex1_dynamic_scaler_check")
    ex1 = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ex1_dynamic_scaler")
    ex1.source = ex1_source(ex1.source)
    path = tmp_path / "submission.ipynb"
    nbformat.write(nb, path)
    report = grade_notebook(path, pristine=ROOT / "solutions" / "02_mixed_precision.ipynb", cell_timeout=120)
    return status(report, "ex1_dynamic_scaler")


WRONG_TRACE_DRIVER = """
import course_utils.classroom.released as _r, torch as _t
_r.drive_loss_scaler = lambda make, hyper, script: _r.scaler_trace(
    [1.0] * len(script), [False] * len(script), [_t.zeros(17)] * len(script))
"""
TORCH_SCALER_DRIVER = """
import course_utils.classroom.released as _r, torch as _t
_drive = _r.drive_loss_scaler


class _TorchScaler:
    def __init__(self, **hyper):
        self.inner = _t.amp.GradScaler("cpu", **hyper)
        self.scale = hyper["init_scale"]

    def unscale_(self, grads):
        return False

    def update(self, found_inf):
        self.inner.update()
        self.scale = float(self.inner.get_scale())


_r.drive_loss_scaler = lambda make, hyper, script: _drive(_TorchScaler, hyper, script)
"""


@pytest.mark.parametrize("attack", ["named mistake", "driver replaced by a wrong trace", "driver replaced by GradScaler"])
def test_a_driver_that_runs_in_the_learners_kernel_cannot_be_turned_into_a_pass(tmp_path, attack):
    if attack == "named mistake":  # the driver in the kernel still lets the grader name the mistake
        def source(s):
            return s.replace("found_inf = found_inf or not bool(torch.isfinite(g).all())", "pass")
        want = "was not reported"
    elif attack == "driver replaced by a wrong trace":  # the verdict is the grader's comparison, not the driver's
        def source(s):
            return WRONG_TRACE_DRIVER + s
        want = "ListLossScaler"
    else:  # torch's own scaler reached from a replaced driver: the by-hand watch runs around the whole driver
        def source(s):
            return TORCH_SCALER_DRIVER + s
        want = "torch.amp"
    got = _set_02_up_to_exercise_1(tmp_path, source)
    assert got[:2] == ("failed", 0.0) and want in got[2], got
