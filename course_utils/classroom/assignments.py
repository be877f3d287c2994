"""The assignment pipeline: ``solutions/`` (the single source) -> ``exercises/`` (generated).

Used by ``python -m course_utils exercises [--check]`` (``make exercises``), by CI's drift check
and by the grader, which reads the nbgrader metadata of the same notebooks.

Generation follows nbgrader's conventions, so an instructor can use either tool:

* in code cells, each region between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes
  ``raise NotImplementedError("...")`` at the region's indentation (the region sits inside a
  function body, so the exercise still defines every name);
* in markdown cells, such a region becomes ``YOUR ANSWER HERE``;
* regions between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS`` are removed;
* outputs, execution counts and execution timestamps are cleared; other metadata (nbgrader's,
  tags) is kept, and so is the notebook's, less saved widget state.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..paths import ROOT

__all__ = ["AssignmentError", "DriftReport", "BEGIN_SOLUTION", "END_SOLUTION", "BEGIN_HIDDEN", "END_HIDDEN", "STUB_CODE", "STUB_MARKDOWN", "nbgrader_meta", "is_graded", "is_solution", "validate_solution_notebook", "make_exercise", "exercise_text", "generate_exercises", "diff_summary", "exercise_name"]

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
STUB_CODE = 'raise NotImplementedError("Exercise not attempted yet: replace this line with your code.")'
STUB_MARKDOWN = "YOUR ANSWER HERE"



class AssignmentError(ValueError):
    """A solution notebook is malformed (unbalanced delimiters, duplicate grade ids...)."""


def _strip_regions(lines: list[str], begin: str, end: str, replacement: str | None, where: str) -> list[str]:
    out: list[str] = []
    inside = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == begin:
            if inside:
                raise AssignmentError(f"{where}: line {number} opens '{begin}' inside another one; close the first with '{end}'.")
            inside = True
            if replacement is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(indent + replacement)
            continue
        if stripped == end:
            if not inside:
                raise AssignmentError(f"{where}: line {number} has '{end}' without a matching '{begin}'.")
            inside = False
            continue
        if not inside:
            out.append(line)
    if inside:
        raise AssignmentError(f"{where}: '{begin}' is never closed; add a '{end}' line.")
    return out


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_graded(cell) -> bool:
    return bool(nbgrader_meta(cell).get("grade"))


def is_solution(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def validate_solution_notebook(nb, where: str) -> None:
    """Raise :class:`AssignmentError` for what would break nbgrader or the grader."""
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        source = cell.source
        if meta:
            grade_id = meta.get("grade_id")
            if not grade_id:
                raise AssignmentError(f"{where}: cell {index} has nbgrader metadata but no grade_id; add one.")
            if grade_id in seen:
                raise AssignmentError(f"{where}: grade_id {grade_id!r} is used twice; grade ids must be unique.")
            seen.add(grade_id)
            if meta.get("grade") and cell.cell_type == "code" and "points" not in meta:
                raise AssignmentError(f"{where}: graded cell {grade_id!r} has no points; add 'points' to its metadata.")
        if BEGIN_SOLUTION in source and not meta.get("solution"):
            raise AssignmentError(
                f"{where}: cell {index} has a solution region but is not marked as a solution cell; "
                "set nbgrader metadata solution: true."
            )
        if BEGIN_HIDDEN in source and not meta.get("grade"):
            raise AssignmentError(f"{where}: cell {index} has hidden tests but is not a graded cell; set grade: true.")


def make_exercise(nb, where: str = "notebook"):
    """Return a new notebook: solutions replaced by stubs, hidden tests removed, outputs cleared."""
    validate_solution_notebook(nb, where)
    out = nbformat.from_dict(nbformat.v4.new_notebook())
    out.metadata = {k: v for k, v in nb.metadata.items() if k != "widgets"}  # widget state is output
    out.nbformat, out.nbformat_minor = nb.nbformat, nb.nbformat_minor
    for index, cell in enumerate(nb.cells):
        cell_where = f"{where}, cell {index}"
        metadata = {k: v for k, v in cell.metadata.items() if k != "execution"}  # run timestamps are output
        lines = cell.source.split("\n")
        if cell.cell_type == "code":
            lines = _strip_regions(lines, BEGIN_SOLUTION, END_SOLUTION, STUB_CODE, cell_where)
            lines = _strip_regions(lines, BEGIN_HIDDEN, END_HIDDEN, None, cell_where)
            new = nbformat.v4.new_code_cell("\n".join(lines).rstrip("\n"), metadata=metadata)
        elif cell.cell_type == "markdown":
            lines = _strip_regions(lines, BEGIN_SOLUTION, END_SOLUTION, STUB_MARKDOWN, cell_where)
            new = nbformat.v4.new_markdown_cell("\n".join(lines), metadata=metadata)
        else:
            new = nbformat.v4.new_raw_cell(cell.source, metadata=metadata)
        if "id" in cell:
            new["id"] = cell["id"]
        out.cells.append(new)
    return out


def exercise_text(solution_path: Path) -> str:
    """The exact file content ``exercises/`` should hold for ``solution_path``."""
    nb = nbformat.read(solution_path, as_version=4)
    exercise = make_exercise(nb, str(solution_path))
    return nbformat.writes(exercise) + "\n"


@dataclass
class DriftReport:
    written: list[Path]
    differing: list[Path]
    missing: list[Path]
    orphaned: list[Path]

    @property
    def clean(self) -> bool:
        return not (self.differing or self.missing or self.orphaned)


def _target_for(solution: Path, out_dir: Path) -> Path:
    return out_dir / solution.name


def generate_exercises(
    solutions: list[Path] | None = None,
    out_dir: Path | None = None,
    *,
    check: bool = False,
) -> DriftReport:
    """Write (or with ``check``, only compare) the exercise for each solution notebook."""
    whole_folder = solutions is None  # orphans can only be judged against the whole solutions/ folder
    solutions = sorted(solutions if solutions is not None else (ROOT / "solutions").glob("*.ipynb"))
    out_dir = out_dir or ROOT / "exercises"
    report = DriftReport([], [], [], [])
    for solution in solutions:
        target = _target_for(solution, out_dir)
        text = exercise_text(solution)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if check:
            (report.differing if current is not None else report.missing).append(target)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            report.written.append(target)
    if whole_folder and out_dir.exists():
        expected = {_target_for(s, out_dir).name for s in solutions}
        report.orphaned = [p for p in sorted(out_dir.glob("*.ipynb")) if p.name not in expected]
    return report


def diff_summary(target: Path, solution: Path, limit: int = 12) -> str:
    """A short unified diff between an exercise on disk and what would be generated."""
    want = exercise_text(solution).splitlines()
    have = target.read_text(encoding="utf-8").splitlines() if target.exists() else []
    lines = list(difflib.unified_diff(have, want, str(target), "generated", lineterm="", n=1))
    return "\n".join(lines[:limit] + (["..."] if len(lines) > limit else []))


_GRADE_ID = re.compile(r"_check$")


def exercise_name(grade_id: str) -> str:
    """``ex1_windows_check`` -> ``ex1_windows``: the name the grader reports."""
    return _GRADE_ID.sub("", grade_id)
