"""Grade a learner's notebook per exercise: ``python -m course_utils grade PATH``.

Used by ``make grade NB=...``, by ``grade-class`` (:mod:`course_utils.gradebook`), by the test suite
(solutions grade full marks, untouched exercises grade zero, attacks score zero) and by instructors
who do not run nbgrader.

**The learner's kernel is sandboxed** (:mod:`course_utils.classroom.sandbox`, bubblewrap): it sees its own
notebook and a copy of the course without ``solutions/`` and without the grading references, no other
submission, no network, and nothing it writes outlives it. Without bubblewrap, grading refuses unless
``sandbox=False`` (``--no-sandbox``) is given.

**The verdict is taken where the learner's code cannot reach.** The learner's notebook runs in a
fresh Jupyter kernel, in its own folder, with a time limit per cell; the file itself is never written.
Its graded cells are *not* run there. For each graded cell of the course's pristine copy of the
problem set (``solutions/NAME.ipynb``, matched by nbgrader ``grade_id``), the grading process itself
runs that cell, hidden tests included, in a namespace made from the pristine notebook's opening cells
(its imports and ``setup()``), with every name the learner defined replaced by a
:class:`~course_utils.remote.RemoteObject`: calling it runs the learner's function in the kernel on
inputs sent from here, and only data comes back. References, comparisons and named mistakes run
here. So replacing a check cell by ``pass``, patching ``course_utils``, ``numpy.allclose``,
``builtins`` or IPython's traceback display in the notebook changes nothing: the first is reported
as *tampered*, the rest never reach this process.

=============== ===========================================================================
passed          the pristine check ran without an error: full points
not attempted   it raised ``NotAttempted`` or ``NotImplementedError`` (the untouched stub)
failed          it raised ``CheckFailed`` or another ``AssertionError``; the hint is its message
tampered        the submission's copy of the graded cell was changed or deleted: zero points
timed out       a cell of the exercise, or the learner's code called by the check, ran past the limit
error           anything else (a crash in the learner's code, a dead kernel, a missing name)
=============== ===========================================================================

Exit codes of the command: 0 full marks, 1 graded but not full marks, 2 bad input (missing file,
not a notebook, nothing to grade, no pristine copy), 3 the notebook could not be executed (no kernel).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from ..paths import ROOT
from .assignments import exercise_name, is_graded, nbgrader_meta
from .notebooks import GradingInputError, error_of, number, one_line, read_notebook
from .pristine import KernelSession, preamble_namespace, run_check, tampered

__all__ = ["GradingInputError", "KernelStartError", "SandboxUnavailableError", "DEFAULT_CELL_TIMEOUT", "cell_name", "ExerciseResult", "GradeReport", "NOT_ATTEMPTED_ERRORS", "FAILED_ERRORS", "EXIT_FULL", "EXIT_PARTIAL", "EXIT_BAD_INPUT", "EXIT_NO_KERNEL", "read_notebook", "find_pristine", "grade_notebook", "write_json"]

EXIT_FULL, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_NO_KERNEL = 0, 1, 2, 3
NOT_ATTEMPTED_ERRORS = {"NotAttempted", "NotImplementedError"}
FAILED_ERRORS = {"CheckFailed", "AssertionError", "ForbiddenCall"}


class KernelStartError(RuntimeError):
    """No kernel could be started to execute the notebook."""


class SandboxUnavailableError(KernelStartError):
    """Grading with isolation was asked for (the default) and no bubblewrap sandbox can be made here."""


DEFAULT_CELL_TIMEOUT = 60  # seconds per cell, for ``grade`` and ``grade-class`` alike


@dataclass
class ExerciseResult:
    name: str
    grade_id: str
    points: float
    max_points: float
    status: str
    hint: str = ""


@dataclass
class GradeReport:
    notebook: str
    cell_timeout: float
    exercises: list[ExerciseResult] = field(default_factory=list)
    seconds: float = 0.0
    cell_errors: list[dict] = field(default_factory=list)  # every error output: cell index, ename, evalue
    # the submission as it ran: the learner's cells with their fresh outputs (graded cells run here, not there);
    # not part of the report's JSON. The course's tests compare it with a solution's committed outputs, as nbval would.
    executed: Any = field(default=None, repr=False, compare=False)

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_total(self) -> float:
        return sum(e.max_points for e in self.exercises)

    @property
    def full_marks(self) -> bool:
        return all(e.status == "passed" for e in self.exercises)

    def to_dict(self) -> dict:
        return {
            "notebook": self.notebook,
            "cell_timeout": self.cell_timeout,
            "seconds": round(self.seconds, 1),
            "total": self.total,
            "max_total": self.max_total,
            "exercises": [asdict(e) for e in self.exercises],
            "cell_errors": self.cell_errors,
        }

    def table(self) -> str:
        rows = [(e.name, f"{number(e.points)}/{number(e.max_points)}", e.status, e.hint) for e in self.exercises]
        width = max([len("exercise")] + [len(r[0]) for r in rows]) + 2
        lines = [f"Grading {self.notebook} (cell time limit {number(self.cell_timeout)} s)"]
        lines.append(f"{'exercise':<{width}}{'points':<9}{'status':<15}hint")
        for name, pts, status, hint in rows:
            short = hint if len(hint) <= 110 else hint[:107] + "..."
            lines.append(f"{name:<{width}}{pts:<9}{status:<15}{short}")
        lines.append(f"{'total':<{width}}{number(self.total)}/{number(self.max_total)}")
        return "\n".join(lines)


def find_pristine(path: Path, nb) -> Path:
    """The course's solution notebook for a submission: same file name in ``solutions/``, else the one
    whose graded ``grade_id``s the submission shares."""
    candidate = ROOT / "solutions" / Path(path).name
    if candidate.exists():
        return candidate
    ids = {nbgrader_meta(c).get("grade_id") for c in nb.cells if is_graded(c)}
    best, overlap = None, 0
    for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
        theirs = {nbgrader_meta(c).get("grade_id") for c in nbformat.read(solution, as_version=4).cells if is_graded(c)}
        if len(ids & theirs) > overlap:
            best, overlap = solution, len(ids & theirs)
    if best is None:
        raise GradingInputError(f"{path}: no problem set in solutions/ has its graded cells; pass pristine=PATH (--pristine).")
    return best


def cell_name(cell) -> str:
    """A cell as a learner finds it in Jupyter: by its first line (Jupyter shows no cell indexes)."""
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    first = first if len(first) <= 50 else first[:47] + "..."
    return f'the cell that starts "{first}"' if first else "an empty cell"


def _cells_status(cells, timed_out: set[int], dead_at: int | None, graded_index: int, cell_timeout: float, nb=None):
    """A learner cell of the exercise that timed out or killed the kernel decides the status."""
    for index, cell in cells:
        if index in timed_out:
            return "timed out", f"{cell_name(cell)} ran longer than {number(cell_timeout)} s and was interrupted; look for an endless loop."
    if dead_at is not None and dead_at <= graded_index:
        where = cell_name(nb.cells[dead_at]) if nb is not None else "a cell"
        return "error", (f"the kernel died or stopped answering while running {where} (a crash, running out of memory, "
                         "or a loop that ignores interrupts).")
    return None


def _earlier_error(cells) -> tuple[str, str] | None:
    for _index, cell in cells:
        error = error_of(cell)
        if error is not None:
            ename, evalue = error
            if ename in NOT_ATTEMPTED_ERRORS:
                return "not attempted", one_line(evalue) or "not attempted yet."
            return "error", one_line(f"{cell_name(cell)} raised {ename}: {evalue}")
    return None


@dataclass
class _Submission:
    """A learner's notebook lined up against the pristine problem set it answers."""

    nb: Any                                   # the learner's notebook, outputs cleared
    reference: Any                            # the pristine solution notebook
    graded: list                              # its graded code cells, in order
    graded_ids: set[str]
    submitted: dict[str, tuple[int, Any]]     # grade_id -> (index, cell) of the learner's copy of each

    def is_graded(self, cell) -> bool:
        return nbgrader_meta(cell).get("grade_id") in self.graded_ids

    def span(self, grade_id: str, cursor: int) -> tuple[int, int]:
        """Where the learner's cells of an exercise stop (its graded cell), and where the next exercise's start.

        A deleted graded cell: the learner's cells up to the next graded cell that is still there."""
        if grade_id in self.submitted:
            stop = self.submitted[grade_id][0]
            return stop, stop + 1
        later = sorted(i for i, _cell in self.submitted.values() if i >= cursor)
        stop = later[0] if later else len(self.nb.cells)
        return stop, stop


def _line_up(path: Path, pristine: Path | str | None) -> _Submission:
    """Step 1: read the submission and its pristine problem set; clear the submission's stale outputs."""
    nb = read_notebook(path)
    pristine_path = Path(pristine) if pristine is not None else find_pristine(path, nb)
    reference = read_notebook(pristine_path)
    graded = [c for c in reference.cells if c.cell_type == "code" and is_graded(c)]
    if not graded:
        raise GradingInputError(f"{pristine_path}: no graded cells (nbgrader metadata grade: true); is this a problem set?")
    graded_ids = {nbgrader_meta(c)["grade_id"] for c in graded}
    submitted = {nbgrader_meta(c).get("grade_id"): (i, c) for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade_id") in graded_ids}
    for cell in nb.cells:  # grade what the learner's code does now, not stale outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return _Submission(nb, reference, graded, graded_ids, submitted)


def _client(nb, path: Path, cell_timeout: float, startup_timeout: float, kernel_name: str):
    """Step 2: the notebook client that runs the learner's cells in a fresh kernel, interrupting endless cells."""
    from nbclient import NotebookClient

    return NotebookClient(
        nb,
        timeout=cell_timeout,
        startup_timeout=startup_timeout,
        kernel_name=kernel_name,
        allow_errors=True,
        interrupt_on_timeout=True,
        shutdown_kernel="immediate",  # nothing the learner's kernel does after the last cell counts: kill it, do not wait
        error_on_timeout={"ename": "CellTimeout", "evalue": f"cell ran past {cell_timeout} s", "traceback": []},
        resources={"metadata": {"path": str(path.resolve().parent)}},
    )


class _Execution:
    """Step 3: the learner's cells running in the kernel; remembers which timed out and where the kernel died."""

    def __init__(self, client, session: KernelSession, cell_timeout: float):
        self.client, self.session, self.cell_timeout = client, session, cell_timeout
        self.timed_out: set[int] = set()
        self.dead_at: int | None = None

    def run_learner_cells(self, sub: _Submission, start: int, stop: int) -> list[tuple[int, Any]]:
        """Run the learner's code cells in ``[start, stop)`` (graded cells excepted) until the kernel dies."""
        from nbclient.exceptions import DeadKernelError

        cells = []
        for index in range(start, stop):
            cell = sub.nb.cells[index]
            if cell.cell_type != "code" or sub.is_graded(cell) or self.dead_at is not None:
                continue
            tick = time.monotonic()
            try:
                self.client.execute_cell(cell, index)
            except DeadKernelError:
                self.dead_at, self.session.dead = index, True
            if time.monotonic() - tick >= self.cell_timeout:
                self.timed_out.add(index)
                if not self.session.resync():
                    self.dead_at, self.session.dead = index, True
            cells.append((index, cell))
        return cells


def _verdict(check, sub: _Submission, cells, run: _Execution, stop: int, preamble: dict) -> tuple[str, str]:
    """Step 4: one exercise's status and hint: tampered, timed out or dead, else what the pristine check says."""
    grade_id = nbgrader_meta(check)["grade_id"]
    problem = tampered(check, sub.submitted.get(grade_id, (None, None))[1])
    if problem:
        return "tampered", problem
    status_hint = _cells_status(cells, run.timed_out, run.dead_at, stop, run.cell_timeout, sub.nb)
    if status_hint is not None and status_hint[0] == "timed out" and not run.session.dead:
        # what ran before the hang (a correct function, then an endless loop) is still graded
        checked = run_check(check.source, preamble, run.session)
        if checked[0] == "passed":
            return "passed", f"passed with what ran before the interruption; {status_hint[1]}"
    if status_hint is not None:
        return status_hint
    status_hint = run_check(check.source, preamble, run.session)
    if status_hint[0] == "error":  # a check that cannot run: the learner's own cell that failed says more
        return _earlier_error(cells) or status_hint
    return status_hint


def _record(report: GradeReport, check, status: str, hint: str, stop: int) -> None:
    """Step 5: the exercise's line of the report, and its entry among the report's errors when it did not pass."""
    meta = nbgrader_meta(check)
    max_points = float(meta.get("points", 0))
    report.exercises.append(ExerciseResult(
        name=exercise_name(meta["grade_id"]), grade_id=meta["grade_id"], points=max_points if status == "passed" else 0.0,
        max_points=max_points, status=status, hint=hint))
    if status != "passed":
        ename = {"not attempted": "NotAttempted", "failed": "CheckFailed", "tampered": "Tampered",
                 "timed out": "Timeout"}.get(status, "Error")
        report.cell_errors.append({"cell": stop, "ename": ename, "evalue": hint[:300], "check": meta["grade_id"]})


def grade_notebook(path: Path | str, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT, kernel_name: str = "python3",
                   startup_timeout: float = 60, pristine: Path | str | None = None, sandbox: bool | None = None,
                   course: Path | str | None = None, limits=None, progress=None) -> GradeReport:
    """Execute a copy of the notebook at ``path`` and grade each exercise against the pristine checks.

    ``sandbox=True`` (the default, unless the environment sets ``L2K_NO_SANDBOX=1``) runs the learner's kernel
    in a bubblewrap sandbox (see :mod:`course_utils.classroom.sandbox`) and raises
    :class:`SandboxUnavailableError` where none can be made; ``course`` is a prepared
    :func:`~course_utils.classroom.sandbox.course_copy` to reuse. ``progress(result)`` is called after each exercise.

    Per exercise: run the learner's cells that precede its graded cell, then judge it (:func:`_verdict`) with the
    pristine check running here against the learner's kernel. Cells after the last exercise still run, so that
    their errors are reported too.
    """
    from jupyter_client.kernelspec import NoSuchKernel

    from . import sandbox as box

    if sandbox is None:
        sandbox = box.sandbox_wanted()
    path = Path(path)
    sub = _line_up(path, pristine)
    client = _client(sub.nb, path, cell_timeout, startup_timeout, kernel_name)
    report = GradeReport(notebook=str(path), cell_timeout=cell_timeout)
    started = time.monotonic()
    if sandbox and box.sandbox_problem():
        raise SandboxUnavailableError(box.sandbox_problem())
    workdir = Path(tempfile.mkdtemp(prefix="l2k-grade-"))
    own_course = None
    if sandbox:
        if course is None:
            course = own_course = box.course_copy(workdir.with_name(workdir.name + "-course"))
        code_cells = sum(c.cell_type == "code" for c in sub.nb.cells)
        limits = limits or box.Limits(cpu_seconds=int(cell_timeout * (code_cells + len(sub.graded)) + 300))
        client.km = box.SandboxedKernelManager(course=Path(course), notebook=path.resolve(), shared=workdir, limits=limits,
                                               kernel_name=kernel_name)
    preamble = preamble_namespace(sub.reference)
    run: _Execution | None = None
    try:
        with client.setup_kernel(stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL):  # kernel log lines are noise
            run = _Execution(client, KernelSession(client, cell_timeout, workdir, sandboxed=sandbox), cell_timeout)
            run.session.warm_up(max(startup_timeout, cell_timeout))  # the grader's own imports do not count against a cell
            cursor = 0
            for check in sub.graded:
                stop, next_cursor = sub.span(nbgrader_meta(check)["grade_id"], cursor)
                cells = run.run_learner_cells(sub, cursor, stop)
                cursor = next_cursor
                _record(report, check, *_verdict(check, sub, cells, run, stop, preamble), stop)
                if progress is not None:
                    progress(report.exercises[-1])
            run.run_learner_cells(sub, cursor, len(sub.nb.cells))  # what follows the last exercise still runs
    except NoSuchKernel:
        raise KernelStartError(f"no Jupyter kernel named {kernel_name!r}; install ipykernel in this environment.") from None
    except RuntimeError as exc:
        if (run is None or run.dead_at is None) and "kernel" in str(exc).lower():
            raise KernelStartError(f"the kernel could not start: {one_line(str(exc))[:200]}") from None
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if own_course is not None:
            shutil.rmtree(own_course, ignore_errors=True)
    report.seconds = time.monotonic() - started
    report.executed = sub.nb
    for index, cell in enumerate(sub.nb.cells):
        error = error_of(cell) if cell.cell_type == "code" else None
        if error is not None:
            report.cell_errors.append({"cell": index, "ename": error[0], "evalue": one_line(error[1])[:300]})
    return report


def write_json(report: GradeReport, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
