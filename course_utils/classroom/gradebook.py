"""Grade a whole class: ``python -m course_utils grade-class SUBMISSIONS_DIR``.

The folder holds one submission per learner, either flat (``LEARNER.ipynb``, the learner is the file's
name) or in nbgrader's layout (``submitted/LEARNER/ASSIGNMENT/*.ipynb`` with its ``timestamp.txt``);
an optional roster CSV (``id,name,email``) adds learners who submitted nothing ("not submitted"). A
notebook of another problem set is "wrong assignment", with a message that names both sets. With a
deadline, each row gets a late flag from nbgrader's timestamp (else the file's modification time). Each is graded by :mod:`course_utils.grader` in its own process
and its own kernel, up to the number of cores at once, under a wall-clock limit; a crashed, hung,
malformed or empty submission gets its row with a status and never stops the batch.

Writes ``gradebook.csv`` (one row per learner: total, late flag, then points, status and message per
exercise), ``gradebook.json`` (the same with statistics) and ``feedback/LEARNER.md`` (or ``.html``):
status, points, hint and reproducing seed per exercise. The terminal gets per-learner totals with
broken submissions flagged, and per exercise the mean points and the shares of every status.
"""
from __future__ import annotations

import collections
import csv
import datetime
import html
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
from .grader import DEFAULT_CELL_TIMEOUT, GradingInputError, find_pristine, read_notebook

__all__ = ["Row", "Submission", "grade_one", "grade_class", "discover", "read_roster", "write_gradebook", "write_feedback",
           "statistics", "statistics_table", "learners_table", "NOT_SUBMITTED", "WRONG_ASSIGNMENT"]


NOT_SUBMITTED = "not submitted"
WRONG_ASSIGNMENT = "wrong assignment"
_SEED = re.compile(r"seed[= ](\d+)")


@dataclass
class Submission:
    """One learner's file: flat (``folder/LEARNER.ipynb``) or nbgrader's ``submitted/LEARNER/ASSIGNMENT/*.ipynb``."""

    learner: str
    path: Path | None
    submitted_at: datetime.datetime | None = None  # nbgrader's timestamp.txt, else the file's modification time


@dataclass
class Row:
    learner: str
    file: str
    status: str  # graded | invalid | timed out | error | wrong assignment | not submitted
    exercises: dict[str, dict] = field(default_factory=dict)  # name -> {points, max_points, status, hint}
    message: str = ""
    seconds: float = 0.0
    name: str = ""
    email: str = ""
    submitted_at: str = ""
    late: bool = False

    @property
    def total(self) -> float:
        return sum(e["points"] for e in self.exercises.values())

    @property
    def broken(self) -> bool:
        """The submission could not be graded as a whole (not a notebook, a crash of the grader, wrong set...)."""
        return self.status not in ("graded", NOT_SUBMITTED)


def _exercises_of(pristine: Path) -> list[tuple[str, float]]:
    nb = nbformat.read(pristine, as_version=4)
    return [(exercise_name(nbgrader_meta(c)["grade_id"]), float(nbgrader_meta(c).get("points", 0)))
            for c in nb.cells if c.cell_type == "code" and is_graded(c)]


def _graded_ids(nb) -> set:
    return {nbgrader_meta(c).get("grade_id") for c in nb.cells if is_graded(c)}


def _empty_row(learner: str, path: Path | None, exercises, status: str, message: str, seconds: float = 0.0) -> Row:
    per = {name: {"points": 0.0, "max_points": pts, "status": status, "hint": message} for name, pts in exercises}
    return Row(learner, path.name if path is not None else "", status, per, message, seconds)


def _which_set(nb) -> str:
    try:
        return f"it holds {find_pristine(Path('submission.ipynb'), nb).stem}"
    except GradingInputError:
        return "its graded cells match no problem set of this course"


def grade_one(path: Path, pristine: Path, exercises, cell_timeout: float, wall_limit: float, sandbox: bool | None = None,
              learner: str | None = None) -> Row:
    """Grade one submission in a child process; whatever happens, return its row."""
    learner = learner or path.stem
    started = time.monotonic()
    try:
        nb = read_notebook(path)
    except GradingInputError as exc:
        return _empty_row(learner, path, exercises, "invalid", str(exc).split(": ", 1)[-1])
    if not (_graded_ids(nb) & _graded_ids(nbformat.read(pristine, as_version=4))):
        other = _which_set(nb)
        return _empty_row(learner, path, exercises, WRONG_ASSIGNMENT,
                          f"this file is not {Path(pristine).stem} ({other}); submit {Path(pristine).stem} "
                          f"(nothing in it was graded).")
    with tempfile.TemporaryDirectory(prefix="l2k-class-") as tmp:
        out = Path(tmp) / "report.json"
        # the child runs in its own temporary folder: paths relative to the caller's folder would not resolve there
        command = [sys.executable, "-m", "course_utils", "grade", str(Path(path).resolve()), "--pristine", str(Path(pristine).resolve()),
                   "--cell-timeout", str(cell_timeout), "--json", str(out)] + (["--no-sandbox"] if sandbox is False else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=wall_limit,
                                  start_new_session=True, cwd=tmp)
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


def _timestamp(folder: Path, path: Path) -> datetime.datetime:
    stamp = folder / "timestamp.txt"
    if stamp.is_file():
        text = stamp.read_text().strip().replace(" UTC", "+00:00")
        try:
            moment = datetime.datetime.fromisoformat(text)
            return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    return datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.timezone.utc)


def discover(folder: Path, assignment: str | None = None, pristine: Path | None = None) -> list[Submission]:
    """The submissions in ``folder``: files directly in it (the learner is the file name) and nbgrader's
    ``LEARNER/ASSIGNMENT/*.ipynb`` folders (``folder`` may also be the course folder holding ``submitted/``)."""
    folder = Path(folder)
    if (folder / "submitted").is_dir() and not any(p.is_file() and p.suffix == ".ipynb" for p in folder.iterdir()):
        folder = folder / "submitted"
    found: list[Submission] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name in ("gradebook.csv", "gradebook.json", "feedback"):
            continue
        if entry.is_file():
            found.append(Submission(entry.stem, entry, _timestamp(folder / "__none__", entry)))
        elif entry.is_dir():
            sets = [d for d in sorted(entry.iterdir()) if d.is_dir() and not d.name.startswith(".")]
            if assignment is not None:
                sets = [d for d in sets if d.name == assignment]
            for d in sets[:1] if assignment is None and len(sets) == 1 else sets:
                notebooks = sorted(p for p in d.glob("*.ipynb") if not p.name.startswith("."))
                if not notebooks:
                    continue
                named = [p for p in notebooks if pristine is not None and p.name == Path(pristine).name]
                chosen = (named or notebooks)[0]
                found.append(Submission(entry.name, chosen, _timestamp(d, chosen)))
            if assignment is None and len(sets) > 1:
                raise GradingInputError(f"{entry}: holds several assignments ({', '.join(d.name for d in sets)}); "
                                        "pass --assignment NAME.")
    return found


def read_roster(path: Path) -> dict[str, dict]:
    """A roster CSV with columns id, name, email (extra columns are kept); id is the learner's folder or file name."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise GradingInputError(f"{path}: cannot read the roster ({exc.strerror}); pass a CSV file with columns id,name,email.") from None
    if not rows or "id" not in rows[0]:
        raise GradingInputError(f"{path}: the roster needs a header line with an 'id' column (id,name,email).")
    return {r["id"].strip(): r for r in rows if r.get("id", "").strip()}


def grade_class(folder: Path | str, *, pristine: Path | str | None = None, out_dir: Path | str | None = None,
                workers: int | None = None, cell_timeout: float = DEFAULT_CELL_TIMEOUT, wall_limit: float | None = None,
                progress: bool = True, sandbox: bool | None = None, roster: Path | str | None = None,
                assignment: str | None = None, deadline: datetime.datetime | None = None,
                feedback: str | None = "md") -> list[Row]:
    """Grade every submission in ``folder``; write the gradebook (and feedback files) to ``out_dir`` (default: the folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingInputError(f"{folder}: not a folder; pass the folder that holds the submissions.")
    submissions = discover(folder, assignment, Path(pristine) if pristine else None)
    people = read_roster(Path(roster)) if roster else {}
    if not submissions and not people:
        raise GradingInputError(f"{folder}: no submissions in it (expected LEARNER.ipynb files or nbgrader's "
                                "submitted/LEARNER/ASSIGNMENT/*.ipynb).")
    if pristine is None:
        pristine = _infer_pristine([s.path for s in submissions])
    pristine = Path(pristine)
    exercises = _exercises_of(pristine)
    workers = workers or os.cpu_count() or 1
    wall_limit = wall_limit or max(120.0, cell_timeout * (4 + 2 * len(exercises)))
    rows: list[Row] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(grade_one, s.path, pristine, exercises, cell_timeout, wall_limit, sandbox, s.learner)
                   for s in submissions]
        for i, (sub, future) in enumerate(zip(submissions, futures), 1):
            row = future.result()
            if sub.submitted_at is not None:
                row.submitted_at = sub.submitted_at.isoformat(timespec="seconds")
                row.late = deadline is not None and sub.submitted_at > deadline
            rows.append(row)
            if progress:
                print(f"graded {i}/{len(submissions)}: {row.learner} {row.total:g}/{sum(p for _, p in exercises):g} "
                      f"({row.status})", file=sys.stderr, flush=True)
    for learner in people:
        if learner not in {r.learner for r in rows}:
            rows.append(_empty_row(learner, None, exercises, NOT_SUBMITTED, "no submission was found for this learner."))
    for row in rows:
        person = people.get(row.learner, {})
        row.name, row.email = person.get("name", ""), person.get("email", "")
        if people and not person:
            row.message = (row.message + " " if row.message else "") + "not on the roster."
    rows.sort(key=lambda r: r.learner)
    out_dir = Path(out_dir) if out_dir is not None else folder
    write_gradebook(rows, exercises, out_dir, pristine, deadline=deadline)
    if feedback:
        write_feedback(rows, exercises, out_dir / "feedback", pristine, fmt=feedback, deadline=deadline)
    return rows


def _infer_pristine(files: list[Path]) -> Path:
    for path in files:
        try:
            return find_pristine(path, read_notebook(path))
        except GradingInputError:
            continue
    raise GradingInputError("no submission matches a problem set in solutions/; pass --pristine SOLUTION.ipynb.")


def _seed(hint: str) -> str:
    match = _SEED.search(hint or "")
    return match.group(1) if match else ""


def write_gradebook(rows: list[Row], exercises, out_dir: Path, pristine: Path, deadline=None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in exercises]
    with open(out_dir / "gradebook.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["learner", "name", "email", "file", "submission", "submitted_at", "late", "total", "max_total", "message"]
                        + [c for n in names for c in (f"{n} points", f"{n} status", f"{n} message")])
        for row in rows:
            writer.writerow([row.learner, row.name, row.email, row.file, row.status, row.submitted_at, "late" if row.late else "",
                             f"{row.total:g}", f"{sum(p for _, p in exercises):g}", row.message]
                            + [c for n in names for c in (f"{row.exercises[n]['points']:g}", row.exercises[n]["status"],
                                                          row.exercises[n]["hint"])])
    data = {"problem_set": str(pristine), "deadline": deadline.isoformat() if deadline else None,
            "exercises": [{"name": n, "max_points": p} for n, p in exercises],
            "learners": [{"learner": r.learner, "name": r.name, "email": r.email, "file": r.file, "submission": r.status,
                          "message": r.message, "submitted_at": r.submitted_at, "late": r.late,
                          "seconds": round(r.seconds, 1), "total": r.total, "exercises": r.exercises} for r in rows],
            "statistics": statistics(rows, exercises)}
    (out_dir / "gradebook.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def feedback_text(row: Row, exercises, pristine: Path, fmt: str = "md", deadline=None) -> str:
    """One learner's feedback: per exercise the status, points, hint and the seed that reproduces it."""
    total = sum(p for _, p in exercises)
    head = [f"Feedback on {Path(pristine).stem} for {row.name or row.learner}",
            f"Total: {row.total:g} / {total:g} points."]
    if row.status != "graded":
        head.append(f"Submission: {row.status}. {row.message}".strip())
    elif row.message:
        head.append(row.message)
    if row.submitted_at:
        late = " (after the deadline)" if row.late else (" (on time)" if deadline else "")
        head.append(f"Submitted: {row.submitted_at}{late}.")
    items = []
    for name, pts in exercises:
        e = row.exercises[name]
        seed = _seed(e["hint"])
        items.append((name, f"{e['points']:g}/{pts:g}", e["status"], e["hint"], seed))
    if fmt == "html":
        esc = html.escape
        body = "".join(f"<tr><td>{esc(n)}</td><td>{esc(p)}</td><td>{esc(s)}</td><td>{esc(h)}</td><td>{esc(d)}</td></tr>"
                       for n, p, s, h, d in items)
        return ("<!doctype html><meta charset='utf-8'><title>" + esc(head[0]) + "</title><h1>" + esc(head[0]) + "</h1>"
                + "".join(f"<p>{esc(line)}</p>" for line in head[1:])
                + "<table><tr><th>exercise</th><th>points</th><th>status</th><th>hint</th><th>seed</th></tr>" + body + "</table>\n")
    lines = [f"# {head[0]}", "", *[f"{line}  " for line in head[1:]], "", "| exercise | points | status | hint | seed |",
             "|---|---|---|---|---|"]
    for n, p, s, h, d in items:
        lines.append(f"| {n} | {p} | {s} | {h.replace('|', '/')} | {d} |")
    lines += ["", "A seed reproduces the inputs of a failed check: call the exercise's check with `seed=SEED` in your notebook.",
              ""]
    return "\n".join(lines)


def write_feedback(rows: list[Row], exercises, folder: Path, pristine: Path, fmt: str = "md", deadline=None) -> None:
    if fmt not in ("md", "html"):
        raise GradingInputError(f"feedback format {fmt!r} is not known; pass md or html.")
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        safe = re.sub(r"[^\w.-]+", "_", row.learner) or "learner"
        (folder / f"{safe}.{fmt}").write_text(feedback_text(row, exercises, pristine, fmt, deadline), encoding="utf-8")


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
            "shares": {k: round(v / len(results), 3) for k, v in collections.Counter(e["status"] for e in results).items()}
            if results else {},
            "most_common_mistake": {"hint": common[0][0], "learners": common[0][1]} if common else None,
        })
    return out


STATUS_ORDER = ("passed", "failed", "not attempted", "timed out", "tampered", "error", "invalid", WRONG_ASSIGNMENT, NOT_SUBMITTED)


def statistics_table(stats: list[dict]) -> str:
    width = max([len("exercise")] + [len(s["exercise"]) for s in stats]) + 2
    lines = [f"{'exercise':<{width}}{'mean':>8}   shares by status"]
    for s in stats:
        shares = s.get("shares", {})
        split = ", ".join(f"{k} {shares[k]:.0%}" for k in STATUS_ORDER if k in shares)
        lines.append(f"{s['exercise']:<{width}}{s['mean_points']:>6.2f}/{s['max_points']:<2g}  {split}")
    lines.append("most common mistake among those who failed:")
    for s in stats:
        mistake = s["most_common_mistake"]
        if mistake:
            lines.append(f"  {s['exercise']}: {mistake['learners']}x {mistake['hint'][:100]}")
    return "\n".join(lines)


def learners_table(rows: list[Row], exercises) -> str:
    """Per learner: total, late flag, and a flag for a broken submission."""
    total = sum(p for _, p in exercises)
    width = max([len("learner")] + [len(r.learner) for r in rows]) + 2
    lines = [f"{'learner':<{width}}{'total':>10}  flags"]
    for r in rows:
        flags = []
        if r.broken:
            flags.append(f"BROKEN: {r.status}: {r.message[:80]}")
        elif r.status == NOT_SUBMITTED:
            flags.append("no submission")
        if r.late:
            flags.append("late")
        lines.append(f"{r.learner:<{width}}{r.total:>6g}/{total:<3g}  {'; '.join(flags)}".rstrip())
    return "\n".join(lines)
