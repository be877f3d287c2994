"""Grade a learner's notebook per exercise: ``python -m course_utils grade PATH``.

Used by ``make grade NB=...``, by the test suite (solutions grade full marks, untouched exercises
grade zero) and by instructors who do not run nbgrader.

The notebook is read into memory and executed top to bottom in a fresh kernel, in its own folder,
with a time limit per cell; the file itself is never written. Each graded cell (nbgrader metadata
``grade: true``) closes an exercise made of the cells since the previous graded cell. Its status:

=============== ===========================================================================
passed          the graded cell ran without an error: full points
not attempted   it raised ``NotAttempted`` or ``NotImplementedError`` (the untouched stub)
failed          it raised ``CheckFailed`` or another ``AssertionError``; the hint is its message
timed out       a cell of the exercise ran past the limit and was interrupted
error           anything else (a crash in the learner's code, a dead kernel)
=============== ===========================================================================

Exit codes of the command: 0 full marks, 1 graded but not full marks, 2 bad input (missing file,
not a notebook, nothing to grade), 3 the notebook could not be executed (no kernel).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from .assignments import exercise_name, is_graded, nbgrader_meta

EXIT_FULL, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_NO_KERNEL = 0, 1, 2, 3
NOT_ATTEMPTED_ERRORS = {"NotAttempted", "NotImplementedError"}
FAILED_ERRORS = {"CheckFailed", "AssertionError"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GradingInputError(ValueError):
    """The input cannot be graded (missing, not a notebook, no graded cells)."""


class KernelStartError(RuntimeError):
    """No kernel could be started to execute the notebook."""


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


def _classify(cells, graded_index: int, timed_out: set[int], dead_at: int | None, cell_timeout: float) -> tuple[str, str]:
    """Status and hint of the exercise whose cells are ``cells`` (index, cell), graded one last."""
    for index, _cell in cells:
        if index in timed_out:
            return "timed out", f"cell {index} ran longer than {_num(cell_timeout)} s and was interrupted; look for an endless loop."
    if dead_at is not None and dead_at <= graded_index:
        return "error", f"the kernel died while running cell {dead_at} (a crash or running out of memory)."
    graded_cell = cells[-1][1]
    error = _error_of(graded_cell)
    if error is None:
        if not graded_cell.get("outputs") and graded_cell.get("execution_count") is None:
            return "error", "the check cell did not run."
        return "passed", ""
    ename, evalue = error
    if ename in NOT_ATTEMPTED_ERRORS:
        return "not attempted", _one_line(evalue) or "not attempted yet."
    earlier = [(i, _error_of(c)) for i, c in cells[:-1] if _error_of(c) is not None]
    if ename in FAILED_ERRORS:
        return "failed", _one_line(evalue) or "the check failed."
    if earlier:
        i, (e_name, e_value) = earlier[0]
        if e_name in NOT_ATTEMPTED_ERRORS:
            return "not attempted", _one_line(e_value) or "not attempted yet."
        return "error", _one_line(f"cell {i} raised {e_name}: {e_value}")
    return "error", _one_line(f"{ename}: {evalue}")


def grade_notebook(path: Path | str, *, cell_timeout: float = 120, kernel_name: str = "python3", startup_timeout: float = 60) -> GradeReport:
    """Execute a copy of the notebook at ``path`` and grade each exercise; never writes the file."""
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
    nb = read_notebook(path)
    graded = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and is_graded(c)]
    if not graded:
        raise GradingInputError(f"{path}: no graded cells (nbgrader metadata grade: true); is this a problem set?")
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
    timed_out: set[int] = set()
    dead_at: int | None = None
    started = time.monotonic()
    try:
        with client.setup_kernel(stderr=subprocess.DEVNULL):  # kernel log lines are noise to a learner
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                tick = time.monotonic()
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError:
                    dead_at = index
                    break
                if time.monotonic() - tick >= cell_timeout:
                    timed_out.add(index)
    except NoSuchKernel:
        raise KernelStartError(f"no Jupyter kernel named {kernel_name!r}; install ipykernel in this environment.") from None
    except RuntimeError as exc:
        if dead_at is None and "kernel" in str(exc).lower():
            raise KernelStartError(f"the kernel could not start: {_one_line(str(exc))[:200]}") from None
        raise

    report = GradeReport(notebook=str(path), cell_timeout=cell_timeout, seconds=time.monotonic() - started)
    for index, cell in enumerate(nb.cells):
        error = _error_of(cell) if cell.cell_type == "code" else None
        if error is not None:
            report.cell_errors.append({"cell": index, "ename": error[0], "evalue": _one_line(error[1])[:300]})
    previous = -1
    for index in graded:
        cells = [(i, nb.cells[i]) for i in range(previous + 1, index + 1) if nb.cells[i].cell_type == "code"]
        meta = nbgrader_meta(nb.cells[index])
        max_points = float(meta.get("points", 0))
        status, hint = _classify(cells, index, timed_out, dead_at, cell_timeout)
        report.exercises.append(
            ExerciseResult(
                name=exercise_name(meta.get("grade_id", f"cell{index}")),
                grade_id=meta.get("grade_id", f"cell{index}"),
                points=max_points if status == "passed" else 0.0,
                max_points=max_points,
                status=status,
                hint=hint,
            )
        )
        previous = index
    return report


def write_json(report: GradeReport, out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
