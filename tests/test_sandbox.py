"""The grading sandbox (bubblewrap): a learner's code cannot reach the answers, other submissions or later gradings.

One submission of problem set 00 carries four attacks, one per exercise, and two right answers:

* ex1 reads the solution notebook (through ``course_utils.paths``, ``../solutions`` and the checkout's absolute
  path) and executes the solution's source;
* ex6 calls the private reference of ``course_utils.grading`` (imported, and loaded from its file);
* ex3 reads another learner's submission in the class folder, executes its answer, and overwrites it;
* ex4 plants a module with the right answer in every writable place it can think of, for a later grading.

Without the sandbox the first three attacks score full marks (checked here, so the attacks are real); inside it
every attack scores 0, the right answers still pass, the other submission is unchanged and a later submission
that imports the planted module scores 0.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils.classroom.grader import SandboxUnavailableError, grade_notebook
from course_utils.classroom.sandbox import course_copy, sandbox_problem

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}")]

SOLUTION = ROOT / "solutions" / "00_foundations.ipynb"
EXERCISE = ROOT / "exercises" / "00_foundations.ipynb"


def _solution_source(name: str) -> str:
    nb = nbformat.read(SOLUTION, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"def {name}("))


STEAL_SOLUTION = f'''
import json, pathlib
import course_utils.paths as P

def _steal(name):
    for place in (P.SOLUTIONS / "00_foundations.ipynb", pathlib.Path("../solutions/00_foundations.ipynb"),
                  pathlib.Path({str(ROOT)!r}) / "solutions" / "00_foundations.ipynb"):
        try:
            cells = json.loads(pathlib.Path(place).read_text())["cells"]
        except OSError:
            continue
        for cell in cells:
            if "".join(cell["source"]).startswith(f"def {{name}}("):
                exec("".join(cell["source"]), globals())
                return True
    return False

if not _steal("c_strides"):
    def c_strides(shape, itemsize, perm):
        return (0,) * len(shape)
'''

CALL_REFERENCE = f'''
def normalize_columns(X):
    try:  # loaded from its file: a fresh copy of the reference, which the forbidden-call watch does not know
        import importlib.util
        spec = importlib.util.spec_from_file_location("g", {str(ROOT / "course_utils" / "grading" / "foundations.py")!r})
        g = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(g)
        return g._reference_normalize_columns(X)
    except (OSError, ImportError):
        pass
    try:
        from course_utils.grading import foundations as g
        return g._reference_normalize_columns(X)
    except (ImportError, AttributeError):
        return X - X.mean(dim=0)
'''


def _other_submission_attack(victim) -> str:
    return f'''
import json, pathlib
_victim = pathlib.Path({str(victim)!r})
try:
    for cell in json.loads(_victim.read_text())["cells"]:
        if "".join(cell["source"]).startswith("def pairwise_sq_dists("):
            exec("".join(cell["source"]), globals())
    _victim.write_text("{{}}")
except OSError:
    pass
if "pairwise_sq_dists" not in globals():
    def pairwise_sq_dists(X, Y):
        return X @ Y.T
'''


def _plant_attack(places) -> str:
    answer = _solution_source("attention_scores")
    return f'''
import os, pathlib, tempfile
import course_utils.paths as P
_answer = {answer!r}
for place in [os.getcwd(), tempfile.gettempdir(), os.path.expanduser("~"), str(P.PACKAGE), *{[str(p) for p in places]!r}]:
    try:
        pathlib.Path(place, "planted_answer.py").write_text(_answer)
    except OSError:
        pass
try:
    startup = pathlib.Path(os.path.expanduser("~"), ".ipython", "profile_default", "startup")
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-planted.py").write_text(_answer)
except OSError:
    pass
def attention_scores(Q, K):
    return Q @ K.T
'''


LATER = '''
import sys
sys.path[:0] = {places!r} + ["/tmp", __import__("os").path.expanduser("~")]
try:
    from planted_answer import attention_scores
except ImportError:
    if "attention_scores" not in globals():
        def attention_scores(Q, K):
            return Q @ K.T
'''


def _submission(answers: dict[str, str]):
    nb = nbformat.read(SOLUTION, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def _status(report):
    return {e.name: (e.status, e.points) for e in report.exercises}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return course_copy(tmp_path_factory.mktemp("course"))


def test_the_course_copy_holds_no_solution_and_no_reference(course):
    assert not (course / "solutions").exists()
    text = "\n".join(p.read_text(errors="replace") for p in course.rglob("*.py"))
    assert "_reference_c_strides" not in text and "def check_c_strides" not in text
    assert (course / "course_utils" / "classroom" / "remote.py").exists()


def test_every_attack_scores_zero_in_the_sandbox_and_right_answers_pass(tmp_path, course):
    classdir = tmp_path / "class"
    classdir.mkdir()
    victim = classdir / "victim.ipynb"
    shutil.copy(SOLUTION, victim)
    before = victim.read_bytes()
    places = [str(classdir), str(ROOT), str(ROOT / "exercises")]
    attacker = classdir / "attacker.ipynb"
    nbformat.write(_submission({"ex1_c_strides": STEAL_SOLUTION, "ex6_normalize_columns": CALL_REFERENCE,
                                "ex3_pairwise_sq_dists": _other_submission_attack(victim),
                                "ex4_attention_scores": _plant_attack(places)}), attacker)

    boxed = _status(grade_notebook(attacker, pristine=SOLUTION, course=course))
    assert boxed["ex1_c_strides"] == ("failed", 0.0), boxed
    assert boxed["ex6_normalize_columns"] == ("failed", 0.0), boxed
    assert boxed["ex3_pairwise_sq_dists"] == ("failed", 0.0), boxed
    assert boxed["ex4_attention_scores"] == ("failed", 0.0), boxed
    assert boxed["ex2_strided_windows"][0] == boxed["ex5_numerical_jacobian"][0] == "passed", boxed
    assert victim.read_bytes() == before
    for place in [*places, "/tmp", str(ROOT / "course_utils")]:
        assert not (ROOT / place / "planted_answer.py").exists(), place
    assert not list(course.rglob("planted_answer.py"))

    later = classdir / "later.ipynb"
    nbformat.write(_submission({"ex4_attention_scores": LATER.format(places=places)}), later)
    assert _status(grade_notebook(later, pristine=SOLUTION, course=course))["ex4_attention_scores"] == ("failed", 0.0)


def test_without_the_sandbox_the_same_attacks_succeed(tmp_path):
    """The attacks are real: unsandboxed, reading the solution, the reference and another submission pass."""
    victim = tmp_path / "victim.ipynb"
    shutil.copy(SOLUTION, victim)
    attacker = tmp_path / "attacker.ipynb"
    nbformat.write(_submission({"ex1_c_strides": STEAL_SOLUTION, "ex6_normalize_columns": CALL_REFERENCE,
                                "ex3_pairwise_sq_dists": _other_submission_attack(victim)}), attacker)
    loose = _status(grade_notebook(attacker, pristine=SOLUTION, sandbox=False))
    assert loose["ex1_c_strides"] == loose["ex6_normalize_columns"] == loose["ex3_pairwise_sq_dists"] == ("passed", 2.0), loose
    assert victim.read_text() == "{}"  # and it could overwrite another learner's file


def test_the_sandbox_has_no_network_and_limits(tmp_path, course):
    probe = '''
import socket, resource, json
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    net = "reachable"
except OSError as exc:
    net = type(exc).__name__
print(json.dumps({"net": net, "as": resource.getrlimit(resource.RLIMIT_AS)[0],
                  "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0], "cwd": __import__("os").getcwd()}))
'''
    nb = _submission({})
    nb.cells.insert(1, nbformat.v4.new_code_cell(probe))
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    from course_utils.classroom import sandbox as box
    from nbclient import NotebookClient

    shared = tmp_path / "s"
    shared.mkdir()
    client = NotebookClient(nbformat.read(path, as_version=4), timeout=60, kernel_name="python3", allow_errors=True)
    client.km = box.SandboxedKernelManager(course=course, notebook=path, shared=shared, limits=box.Limits(memory_bytes=6 << 30))
    with client.setup_kernel(stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL):
        cell = client.nb.cells[1]
        client.execute_cell(cell, 1)
    seen = json.loads(cell.outputs[0]["text"])
    assert seen["net"] != "reachable" and seen["as"] == 6 << 30 and seen["nproc"] > 0 and seen["cwd"] == box.WORK


def test_grading_refuses_without_a_sandbox_unless_told(monkeypatch, tmp_path):
    from course_utils.classroom import sandbox as box

    monkeypatch.setattr(box, "_PROBLEM", ["bubblewrap (bwrap) is not installed, so learners' code cannot be isolated; "
                                          f"{box.NO_SANDBOX_HINT}."])
    with pytest.raises(SandboxUnavailableError, match="install bubblewrap"):
        grade_notebook(EXERCISE, pristine=SOLUTION)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no bwrap on this PATH
    done = subprocess.run([sys.executable, "-m", "course_utils", "grade", str(EXERCISE)], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    assert done.returncode == 3 and "install bubblewrap" in done.stderr and "--no-sandbox" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
