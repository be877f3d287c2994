"""Grade a whole class: ``python -m course_utils grade-class SUBMISSIONS_DIR``.

Every file in the folder is one learner's submission of the same problem set (the learner is the
file's name without its extension). Each is graded by :mod:`course_utils.grader` in its own process
and its own kernel, up to the number of cores at once, under a wall-clock limit; a crashed, hung,
malformed or empty submission gets its row with a status and never stops the batch.

Writes ``gradebook.csv`` (one row per learner: total, then points and status per exercise) and
``gradebook.json`` (the same with hints), and prints per-exercise statistics: mean points, the share
that passed, and the most common named mistake among those who failed.
"""
from __future__ import annotations

import collections
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .assignments import exercise_name, is_graded, nbgrader_meta
from .grader import GradingInputError, find_pristine, read_notebook

__all__ = ["Row", "grade_one", "grade_class", "write_gradebook", "statistics", "statistics_table"]


@dataclass
class Row:
    learner: str
    file: str
    status: str  # graded | invalid | timed out | error
    exercises: dict[str, dict] = field(default_factory=dict)  # name -> {points, max_points, status, hint}
    message: str = ""
    seconds: float = 0.0

    @property
    def total(self) -> float:
        return sum(e["points"] for e in self.exercises.values())


def _exercises_of(pristine: Path) -> list[tuple[str, float]]:
    nb = nbformat.read(pristine, as_version=4)
    return [(exercise_name(nbgrader_meta(c)["grade_id"]), float(nbgrader_meta(c).get("points", 0)))
            for c in nb.cells if c.cell_type == "code" and is_graded(c)]


def _empty_row(learner: str, path: Path, exercises, status: str, message: str, seconds: float = 0.0) -> Row:
    per = {name: {"points": 0.0, "max_points": pts, "status": status, "hint": message} for name, pts in exercises}
    return Row(learner, path.name, status, per, message, seconds)


def grade_one(path: Path, pristine: Path, exercises, cell_timeout: float, wall_limit: float) -> Row:
    """Grade one submission in a child process; whatever happens, return its row."""
    learner = path.stem
    started = time.monotonic()
    try:
        read_notebook(path)
    except GradingInputError as exc:
        return _empty_row(learner, path, exercises, "invalid", str(exc).split(": ", 1)[-1])
    with tempfile.TemporaryDirectory(prefix="l2k-class-") as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "course_utils", "grade", str(path), "--pristine", str(pristine),
                   "--cell-timeout", str(cell_timeout), "--json", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=wall_limit,
                                  start_new_session=True, cwd=path.parent)
        except subprocess.TimeoutExpired:
            return _empty_row(learner, path, exercises, "timed out",
                              f"grading took longer than {wall_limit:g} s", time.monotonic() - started)
        seconds = time.monotonic() - started
        if not out.exists():
            last = (done.stderr.strip().splitlines() or ["no report"])[-1]
            status = "invalid" if done.returncode == 2 else "error"
            return _empty_row(learner, path, exercises, status, last[:300], seconds)
        report = json.loads(out.read_text())
    row = Row(learner, path.name, "graded", seconds=seconds)
    by_name = {e["name"]: e for e in report["exercises"]}
    for name, pts in exercises:
        e = by_name.get(name, {"points": 0.0, "status": "error", "hint": "not graded"})
        row.exercises[name] = {"points": float(e["points"]), "max_points": pts, "status": e["status"], "hint": e.get("hint", "")}
    return row


def grade_class(folder: Path | str, *, pristine: Path | str | None = None, out_dir: Path | str | None = None,
                workers: int | None = None, cell_timeout: float = 60, wall_limit: float | None = None,
                progress: bool = True) -> list[Row]:
    """Grade every submission in ``folder``; write the gradebook to ``out_dir`` (default: the folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingInputError(f"{folder}: not a folder; pass the folder that holds the submissions.")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.name not in ("gradebook.csv", "gradebook.json"))
    if not files:
        raise GradingInputError(f"{folder}: no submissions in it.")
    if pristine is None:
        pristine = _infer_pristine(files)
    pristine = Path(pristine)
    exercises = _exercises_of(pristine)
    workers = workers or os.cpu_count() or 1
    wall_limit = wall_limit or max(120.0, cell_timeout * (4 + 2 * len(exercises)))
    rows: list[Row] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(grade_one, p, pristine, exercises, cell_timeout, wall_limit) for p in files]
        for i, future in enumerate(futures, 1):
            rows.append(future.result())
            if progress:
                print(f"\rgraded {i}/{len(files)}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    out_dir = Path(out_dir) if out_dir is not None else folder
    write_gradebook(rows, exercises, out_dir, pristine)
    return rows


def _infer_pristine(files: list[Path]) -> Path:
    for path in files:
        try:
            return find_pristine(path, read_notebook(path))
        except GradingInputError:
            continue
    raise GradingInputError("no submission matches a problem set in solutions/; pass --pristine SOLUTION.ipynb.")


def write_gradebook(rows: list[Row], exercises, out_dir: Path, pristine: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in exercises]
    with open(out_dir / "gradebook.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["learner", "file", "submission", "total", "max_total"]
                        + [c for n in names for c in (f"{n} points", f"{n} status")])
        for row in rows:
            writer.writerow([row.learner, row.file, row.status, f"{row.total:g}", f"{sum(p for _, p in exercises):g}"]
                            + [c for n in names for c in (f"{row.exercises[n]['points']:g}", row.exercises[n]["status"])])
    data = {"problem_set": str(pristine), "exercises": [{"name": n, "max_points": p} for n, p in exercises],
            "learners": [{"learner": r.learner, "file": r.file, "submission": r.status, "message": r.message,
                          "seconds": round(r.seconds, 1), "total": r.total, "exercises": r.exercises} for r in rows],
            "statistics": statistics(rows, exercises)}
    (out_dir / "gradebook.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


_INPUTS = re.compile(r"\s*\((trial|reproduce|tolerance|got)[^)]*\)|;? ?reproduce with seed=\d+")
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")


def _mistake_key(hint: str) -> str:
    """A hint without the inputs and measured numbers that differ from learner to learner.

    Named mistakes keep their text whole; in the generic "values differ ... by up to X at index I" and
    "got A, expected B" messages the numbers are blanked so that equal mistakes count together."""
    text = _INPUTS.sub("", hint)
    if "values differ" in text or " got " in text or text.startswith("got "):
        text = _NUMBER.sub("#", text)
    return " ".join(text.split())[:160]


def statistics(rows: list[Row], exercises) -> list[dict]:
    out = []
    for name, pts in exercises:
        results = [r.exercises[name] for r in rows]
        failed = [_mistake_key(e["hint"]) for e in results if e["status"] == "failed" and e["hint"]]
        common = collections.Counter(failed).most_common(1)
        out.append({
            "exercise": name, "max_points": pts,
            "mean_points": round(sum(e["points"] for e in results) / len(results), 3) if results else 0.0,
            "share_passed": round(sum(e["status"] == "passed" for e in results) / len(results), 3) if results else 0.0,
            "statuses": dict(collections.Counter(e["status"] for e in results)),
            "most_common_mistake": {"hint": common[0][0], "learners": common[0][1]} if common else None,
        })
    return out


def statistics_table(stats: list[dict]) -> str:
    width = max([len("exercise")] + [len(s["exercise"]) for s in stats]) + 2
    lines = [f"{'exercise':<{width}}{'mean':>8}{'passed':>8}   most common mistake among those who failed"]
    for s in stats:
        mistake = s["most_common_mistake"]
        text = f"{mistake['learners']}x {mistake['hint']}" if mistake else "-"
        lines.append(f"{s['exercise']:<{width}}{s['mean_points']:>6.2f}/{s['max_points']:<2g}{s['share_passed']:>7.0%}   {text[:100]}")
    return "\n".join(lines)
