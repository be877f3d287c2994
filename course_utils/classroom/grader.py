"""Grade a learner's notebook per exercise: ``python -m course_utils grade PATH``.

Used by ``make grade NB=...``, by ``grade-class`` (:mod:`course_utils.gradebook`), by the test suite
(solutions grade full marks, untouched exercises grade zero, attacks score zero) and by instructors
who do not run nbgrader.

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
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from ..paths import ROOT
from .assignments import exercise_name, is_graded, nbgrader_meta
from .pristine import KernelSession, preamble_namespace, run_check, tampered

__all__ = ["GradingInputError", "KernelStartError", "SandboxUnavailableError", "DEFAULT_CELL_TIMEOUT", "ExerciseResult", "GradeReport", "NOT_ATTEMPTED_ERRORS", "FAILED_ERRORS", "EXIT_FULL", "EXIT_PARTIAL", "EXIT_BAD_INPUT", "EXIT_NO_KERNEL", "read_notebook", "find_pristine", "grade_notebook", "write_json"]

EXIT_FULL, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_NO_KERNEL = 0, 1, 2, 3
NOT_ATTEMPTED_ERRORS = {"NotAttempted", "NotImplementedError"}
FAILED_ERRORS = {"CheckFailed", "AssertionError", "ForbiddenCall"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GradingInputError(ValueError):
    """The input cannot be graded (missing, not a notebook, no graded cells)."""


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
        rows = [(e.name, f"{_num(e.points)}/{_num(e.max_points)}", e.status, e.hint) for e in self.exercises]
        width = max([len("exercise")] + [len(r[0]) for r in rows]) + 2
        lines = [f"Grading {self.notebook} (cell time limit {_num(self.cell_timeout)} s)"]
        lines.append(f"{'exercise':<{width}}{'points':<9}{'status':<15}hint")
        for name, pts, status, hint in rows:
            short = hint if len(hint) <= 110 else hint[:107] + "..."
            lines.append(f"{name:<{width}}{pts:<9}{status:<15}{short}")
        lines.append(f"{'total':<{width}}{_num(self.total)}/{_num(self.max_total)}")
        return "\n".join(lines)


def _num(x: float) -> str:
    return f"{x:g}"


def read_notebook(path: Path):
    """Read a notebook or raise :class:`GradingInputError` with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise GradingInputError(f"{path}: no such file; check the path.")
    if path.is_dir():
        raise GradingInputError(f"{path}: is a folder; pass one .ipynb file.")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # JSON errors, schema errors, binary files...
        raise GradingInputError(f"{path}: not a Jupyter notebook ({type(exc).__name__}); pass an .ipynb file.") from None
    if not isinstance(nb, dict) or "cells" not in nb:
        raise GradingInputError(f"{path}: not a Jupyter notebook (no cells); pass an .ipynb file.")
    return nb


def _error_of(cell) -> tuple[str, str] | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", ""), _ANSI.sub("", output.get("evalue", ""))
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
            return "timed out", f"{cell_name(cell)} ran longer than {_num(cell_timeout)} s and was interrupted; look for an endless loop."
    if dead_at is not None and dead_at <= graded_index:
        where = cell_name(nb.cells[dead_at]) if nb is not None else "a cell"
        return "error", (f"the kernel died or stopped answering while running {where} (a crash, running out of memory, "
                         "or a loop that ignores interrupts).")
    return None


def _earlier_error(cells) -> tuple[str, str] | None:
    for _index, cell in cells:
        error = _error_of(cell)
        if error is not None:
            ename, evalue = error
            if ename in NOT_ATTEMPTED_ERRORS:
                return "not attempted", _one_line(evalue) or "not attempted yet."
            return "error", _one_line(f"{cell_name(cell)} raised {ename}: {evalue}")
    return None


def grade_notebook(path: Path | str, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT, kernel_name: str = "python3",
                   startup_timeout: float = 60, pristine: Path | str | None = None, sandbox: bool | None = None,
                   course: Path | str | None = None, limits=None) -> GradeReport:
    """Execute a copy of the notebook at ``path`` and grade each exercise against the pristine checks.

    ``sandbox=True`` (the default, unless the environment sets ``L2K_NO_SANDBOX=1``) runs the learner's kernel
    in a bubblewrap sandbox (see :mod:`course_utils.classroom.sandbox`) and raises
    :class:`SandboxUnavailableError` where none can be made; ``course`` is a prepared
    :func:`~course_utils.classroom.sandbox.course_copy` to reuse."""
    from . import sandbox as box

    if sandbox is None:
        sandbox = box.sandbox_wanted()

    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
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

    client = NotebookClient(
        nb,
        timeout=cell_timeout,
        startup_timeout=startup_timeout,
        kernel_name=kernel_name,
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout", "evalue": f"cell ran past {cell_timeout} s", "traceback": []},
        resources={"metadata": {"path": str(path.resolve().parent)}},
    )
    report = GradeReport(notebook=str(path), cell_timeout=cell_timeout)
    timed_out: set[int] = set()
    dead_at: int | None = None
    started = time.monotonic()
    if sandbox and box.sandbox_problem():
        raise SandboxUnavailableError(box.sandbox_problem())
    workdir = Path(tempfile.mkdtemp(prefix="l2k-grade-"))
    own_course = None
    if sandbox:
        if course is None:
            course = own_course = box.course_copy(workdir.with_name(workdir.name + "-course"))
        code_cells = sum(c.cell_type == "code" for c in nb.cells)
        limits = limits or box.Limits(cpu_seconds=int(cell_timeout * (code_cells + len(graded)) + 300))
        client.km = box.SandboxedKernelManager(course=Path(course), notebook=path.resolve(), shared=workdir, limits=limits,
                                               kernel_name=kernel_name)
    preamble = preamble_namespace(reference)
    # the learner's cells of each exercise: those after the previous graded cell, in the submission's order
    positions = sorted((i, gid) for gid, (i, _c) in submitted.items())
    try:
        with client.setup_kernel(stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL):  # kernel log lines are noise
            session = KernelSession(client, cell_timeout, workdir, sandboxed=sandbox)
            session.warm_up(max(startup_timeout, cell_timeout))  # the grader's own imports do not count against a cell
            cursor = 0
            for check in graded:
                meta = nbgrader_meta(check)
                grade_id = meta["grade_id"]
                stop = submitted[grade_id][0] if grade_id in submitted else None
                if stop is None:  # a deleted graded cell: run the learner's cells up to the next graded one
                    later = [i for i, _g in positions if i >= cursor]
                    stop = later[0] if later else len(nb.cells)
                cells = []
                for index in range(cursor, stop):
                    cell = nb.cells[index]
                    if cell.cell_type != "code" or nbgrader_meta(cell).get("grade_id") in graded_ids or dead_at is not None:
                        continue
                    tick = time.monotonic()
                    try:
                        client.execute_cell(cell, index)
                    except DeadKernelError:
                        dead_at = index
                        session.dead = True
                    if time.monotonic() - tick >= cell_timeout:
                        timed_out.add(index)
                        if not session.resync():
                            dead_at, session.dead = index, True
                    cells.append((index, cell))
                cursor = stop + 1 if grade_id in submitted else stop
                max_points = float(meta.get("points", 0))
                verdict = tampered(check, submitted.get(grade_id, (None, None))[1])
                status_hint = ("tampered", verdict) if verdict else _cells_status(cells, timed_out, dead_at, stop, cell_timeout, nb)
                if status_hint is not None and status_hint[0] == "timed out" and not session.dead:
                    # what ran before the hang (a correct function, then an endless loop) is still graded
                    checked = run_check(check.source, preamble, session)
                    if checked[0] == "passed":
                        status_hint = ("passed", f"passed with what ran before the interruption; {status_hint[1]}")
                if status_hint is None:
                    status_hint = run_check(check.source, preamble, session)
                    if status_hint[0] == "error" and _earlier_error(cells):
                        status_hint = _earlier_error(cells)
                status, hint = status_hint
                report.exercises.append(ExerciseResult(
                    name=exercise_name(grade_id), grade_id=grade_id, points=max_points if status == "passed" else 0.0,
                    max_points=max_points, status=status, hint=hint))
                if status != "passed":
                    ename = {"not attempted": "NotAttempted", "failed": "CheckFailed", "tampered": "Tampered",
                             "timed out": "Timeout"}.get(status, "Error")
                    report.cell_errors.append({"cell": stop, "ename": ename, "evalue": hint[:300], "check": grade_id})
            for index in range(cursor, len(nb.cells)):  # what follows the last exercise still runs
                cell = nb.cells[index]
                if cell.cell_type == "code" and dead_at is None and nbgrader_meta(cell).get("grade_id") not in graded_ids:
                    try:
                        client.execute_cell(cell, index)
                    except DeadKernelError:
                        dead_at = index
    except NoSuchKernel:
        raise KernelStartError(f"no Jupyter kernel named {kernel_name!r}; install ipykernel in this environment.") from None
    except RuntimeError as exc:
        if dead_at is None and "kernel" in str(exc).lower():
            raise KernelStartError(f"the kernel could not start: {_one_line(str(exc))[:200]}") from None
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if own_course is not None:
            shutil.rmtree(own_course, ignore_errors=True)
    report.seconds = time.monotonic() - started
    for index, cell in enumerate(nb.cells):
        error = _error_of(cell) if cell.cell_type == "code" else None
        if error is not None:
            report.cell_errors.append({"cell": index, "ename": error[0], "evalue": _one_line(error[1])[:300]})
    return report


def write_json(report: GradeReport, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
