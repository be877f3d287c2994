"""Command line of the course: ``python -m course_utils {exercises,grade,grade-class,release,doctor,times}``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _exercises(args) -> int:
    from .classroom.assignments import AssignmentError, diff_summary, generate_exercises
    from .paths import SOLUTIONS

    solutions = [Path(p) for p in args.solutions] if args.solutions else None
    out_dir = Path(args.out) if args.out else None
    try:
        report = generate_exercises(solutions, out_dir, check=args.check)
    except AssignmentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if report.clean:
            print("exercises/ is up to date with solutions/.")
            return 0
        for target in report.differing + report.missing:
            source = (SOLUTIONS / target.name) if solutions is None else next(s for s in solutions if s.name == target.name)
            state = "differs from" if target in report.differing else "is missing for"
            print(f"{target} {state} {source}")
            if target in report.differing:
                print(diff_summary(target, source))
        for target in report.orphaned:
            print(f"{target} has no solution notebook; delete it or add solutions/{target.name}")
        print("run `make exercises` (python -m course_utils exercises) and commit the result; never edit exercises/ by hand.")
        return 1
    for target in report.written:
        print(f"wrote {target}")
    for target in report.orphaned:
        print(f"warning: {target} has no solution notebook")
    if not report.written:
        print("exercises/ was already up to date.")
    return 0


def _grade(args) -> int:
    from .classroom.grader import EXIT_BAD_INPUT, EXIT_FULL, EXIT_NO_KERNEL, EXIT_PARTIAL, GradingInputError, KernelStartError, grade_notebook, write_json

    try:
        report = grade_notebook(Path(args.path), cell_timeout=args.cell_timeout, pristine=args.pristine,
                                sandbox=False if args.no_sandbox else None,
                                progress=lambda e: print(f"  {e.name}: {e.status}", file=sys.stderr, flush=True))
    except GradingInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KernelStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_KERNEL
    print(report.table())
    if args.json:
        write_json(report, Path(args.json))
    return EXIT_FULL if report.full_marks else EXIT_PARTIAL


def _grade_class(args) -> int:
    from .classroom.gradebook import grade_class, learners_table, statistics, statistics_table
    from .classroom.grader import EXIT_BAD_INPUT, EXIT_NO_KERNEL, GradingInputError
    from .classroom.sandbox import sandbox_problem, sandbox_wanted

    if not args.no_sandbox and sandbox_wanted() and sandbox_problem():
        print(f"error: {sandbox_problem()}", file=sys.stderr)
        return EXIT_NO_KERNEL

    deadline = None
    if args.deadline:
        import datetime

        try:
            deadline = datetime.datetime.fromisoformat(args.deadline)
        except ValueError:
            print(f"error: --deadline {args.deadline!r} is not an ISO date; write it like 2026-12-01T23:59+01:00.", file=sys.stderr)
            return EXIT_BAD_INPUT
        if deadline.tzinfo is None:
            deadline = deadline.astimezone()  # the grader's local time zone
    try:
        started = time.monotonic()
        rows = grade_class(Path(args.folder), pristine=args.pristine, out_dir=args.out, workers=args.workers,
                           cell_timeout=args.cell_timeout, sandbox=False if args.no_sandbox else None, roster=args.roster,
                           assignment=args.assignment, deadline=deadline,
                           feedback=None if args.feedback == "none" else args.feedback)
    except GradingInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    exercises = [(name, e["max_points"]) for name, e in rows[0].exercises.items()]
    graded = [r for r in rows if r.status != "not submitted"]
    broken = [r for r in rows if r.broken]
    print(f"{len(graded)} submissions graded in {time.monotonic() - started:.0f} s, {len(broken)} of them broken "
          f"(not graded as a whole), {len(rows) - len(graded)} learners without a submission; gradebook.csv, "
          f"gradebook.json and feedback/ written to {args.out or args.folder}")
    print(learners_table(rows, exercises))
    print(statistics_table(statistics(rows, exercises)))
    return 0


def _release(args) -> int:
    from .classroom.release import ReleaseError, build_release

    try:
        summary = build_release(Path(args.out), modules=args.topics or None)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    banked = sum(sum(v.values()) for v in summary.values())
    total = sum(len(v) for v in summary.values())
    rest = "" if banked == total else ", the others tell learners that the instructor's grader checks them"
    print(f"release written to {args.out}: lessons, exercises and the course package; {banked} of {total} checks "
          f"replay a recorded bank or run as released source{rest}.")
    return 0


def _doctor(args) -> int:
    from .devtools.doctor import run_doctor

    return run_doctor()


def _times(args) -> int:
    from .devtools.notebook_times import run_times

    run_times([Path(p) for p in args.paths] or None, Path(args.output) if args.output else None)
    return 0


def _skip_the_iri_grammar() -> None:
    """Keep jsonschema from building its optional IRI grammar (``rfc3987_syntax``, a Lark parser) when nbformat
    imports it: about 2.5 s of CPU per process, paid by every grader child of ``grade-class``, for a format that
    no notebook schema uses. jsonschema imports it under ``suppress(ImportError)``, so a ``None`` entry reads as
    "not installed". Done here, in the command line's process, never on import of a course module."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)


def main(argv: list[str] | None = None) -> int:
    _skip_the_iri_grammar()
    from .classroom.grader import DEFAULT_CELL_TIMEOUT

    parser = argparse.ArgumentParser(prog="python -m course_utils", description="Loops to Kernels course tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("exercises", help="regenerate exercises/ from solutions/ (nbgrader delimiters -> stubs)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 and list notebooks that differ")
    p.add_argument("--solutions", nargs="*", help="solution notebooks (default: all of solutions/)")
    p.add_argument("--out", help="output folder (default: exercises/)")
    p.set_defaults(func=_exercises)

    p = sub.add_parser("grade", help="execute a notebook in a fresh kernel and grade each exercise")
    p.add_argument("path", help="the learner's notebook (.ipynb); it is never modified")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    p.add_argument("--cell-timeout", type=float, default=DEFAULT_CELL_TIMEOUT, metavar="S",
                   help=f"seconds per cell before it is interrupted (default {DEFAULT_CELL_TIMEOUT})")
    p.add_argument("--no-sandbox", action="store_true", help="run the learner's kernel without the bubblewrap sandbox "
                   "(only for notebooks you trust: it could read the answers)")
    p.add_argument("--pristine", metavar="SOLUTION", help="the course's solution notebook whose graded cells are used "
                   "(default: solutions/ with the same file name)")
    p.set_defaults(func=_grade)

    p = sub.add_parser("grade-class", help="grade a folder of submissions into a gradebook (CSV, JSON) with class statistics")
    p.add_argument("folder", help="LEARNER.ipynb files, or nbgrader's submitted/LEARNER/ASSIGNMENT/ folders")
    p.add_argument("--pristine", metavar="SOLUTION", help="the problem set's solution notebook (default: found by grade ids)")
    p.add_argument("--out", metavar="DIR", help="where to write gradebook.csv/json (default: the folder)")
    p.add_argument("--workers", type=int, metavar="N", help="submissions graded at once (default: the number of cores)")
    p.add_argument("--cell-timeout", type=float, default=DEFAULT_CELL_TIMEOUT, metavar="S",
                   help=f"seconds per cell (default {DEFAULT_CELL_TIMEOUT})")
    p.add_argument("--no-sandbox", action="store_true", help="grade without the bubblewrap sandbox (trusted notebooks only)")
    p.add_argument("--roster", metavar="CSV", help="learners (columns id,name,email); those without a submission get a row")
    p.add_argument("--assignment", metavar="NAME", help="in nbgrader's layout, the assignment folder to grade")
    p.add_argument("--deadline", metavar="ISO", help="e.g. 2026-12-01T23:59+01:00: rows submitted later are flagged late")
    p.add_argument("--feedback", choices=["md", "html", "none"], default="md", help="per-learner feedback files (default md)")
    p.set_defaults(func=_grade_class)

    p = sub.add_parser("release", help="write the learners' release: lessons, exercises, self-checks without references")
    p.add_argument("out", help="a new folder outside the repository")
    p.add_argument("--topics", nargs="*", metavar="MODULE", help="grading modules to release (default: all), e.g. foundations")
    p.set_defaults(func=_release)

    p = sub.add_parser("doctor", help="check packages, device tier and Triton mode")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("times", help="execute every notebook and record CPU time and peak memory")
    p.add_argument("paths", nargs="*", help="notebooks (default: notebooks/ and solutions/)")
    p.add_argument("--output", help="write the JSON record here")
    p.set_defaults(func=_times)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
