"""Small synthetic problem sets for testing the assignment pipeline and the grader (tests/test_grader*.py, ...)."""
from __future__ import annotations

import nbformat

__all__ = ["nbgrader", "toy_problem_set", "CHECK_DOUBLE", "CHECK_TRIPLE"]


def nbgrader(grade_id: str, *, solution: bool = False, grade: bool = False, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3, "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


CHECK_DOUBLE = (
    "from course_utils import check_function, Mistake\n"
    "check_function(double, lambda x: 2 * x, lambda rng: rng.standard_normal(4), name='double',\n"
    "               mistakes=[Mistake('square', 'you squared x; multiply it by 2 instead.', lambda x: x * x)])"
)
CHECK_TRIPLE = (
    "from course_utils import check_function\n"
    "check_function(triple, lambda x: 3 * x, lambda rng: rng.standard_normal(4), name='triple')"
)


def toy_problem_set(double_body: str = "return 2 * x", triple_body: str = "return 3 * x", *, hidden: bool = True):
    """A two-exercise solution notebook; the bodies replace the solution regions' contents."""
    def solution_cell(name: str, body: str, grade_id: str):
        src = f"def {name}(x):\n    ### BEGIN SOLUTION\n" + "\n".join("    " + line for line in body.split("\n")) + "\n    ### END SOLUTION\n"
        return nbformat.v4.new_code_cell(src, metadata=nbgrader(grade_id, solution=True))

    check_double = CHECK_DOUBLE
    if hidden:
        check_double += "\n### BEGIN HIDDEN TESTS\nassert double(1.5) == 3.0\n### END HIDDEN TESTS"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Toy problem set", metadata=nbgrader("intro")),
        nbformat.v4.new_code_cell("import numpy as np"),
        nbformat.v4.new_markdown_cell("Exercise 1: double x."),
        solution_cell("double", double_body, "ex1_double"),
        nbformat.v4.new_code_cell(check_double, metadata=nbgrader("ex1_double_check", grade=True, points=2)),
        nbformat.v4.new_markdown_cell("Exercise 2: triple x."),
        solution_cell("triple", triple_body, "ex2_triple"),
        nbformat.v4.new_code_cell(CHECK_TRIPLE, metadata=nbgrader("ex2_triple_check", grade=True, points=3)),
    ]
    return nb


def cut_after(nb, grade_id: str):
    """``nb`` without the cells after the one whose nbgrader grade_id is ``grade_id``: a test that asks about the
    first exercises of a real problem set grades only that far (a grading costs the set's run time)."""
    last = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells = nb.cells[:last + 1]
    return nb


def nbval_differences(executed, committed, *, skip_cells=()) -> list[str]:
    """How the fresh outputs of ``executed`` differ from the committed outputs of ``committed``, compared as
    ``pytest --nbval`` compares them (the same option tags and comment markers, the same stream handling, the
    sanitizers of tests/nbval_sanitize.cfg, images not compared). Code cells in ``skip_cells`` (indices into
    ``cells``) are not compared: the grader runs graded cells in its own process, not in the kernel.

    Used where a solution's full-marks grading already executes every cell, so that nbval need not run it again."""
    import re
    from collections import defaultdict

    from nbval.plugin import coalesce_streams, find_comment_markers, find_metadata_tags, get_sanitize_patterns
    from nbval.plugin import transform_streams_for_comparison

    from course_utils.paths import ROOT

    patterns = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())
    skip = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count", "image/png",
            "image/jpeg", "application/vnd.jupyter.widget-view+json"}

    def sanitize(value):
        if isinstance(value, str):
            for regex, replace in patterns:
                value = re.sub(regex, replace, value)
        return value

    def flat(outputs):
        out = defaultdict(list)
        for output in transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs])):
            for key, value in output.items():
                if key in skip:
                    continue
                if key == "data":
                    for mime, data in value.items():
                        if mime not in skip:
                            out[mime].append(sanitize(data))
                else:
                    out[key].append(sanitize(value))
        return dict(out)

    problems, number = [], -1
    for index, (ran, ref) in enumerate(zip(executed.cells, committed.cells)):
        if ref.cell_type != "code":
            continue
        number += 1
        options = dict(find_metadata_tags(ref.metadata))
        options.update(dict(find_comment_markers(ref.source)))
        if index in skip_cells or options.get("skip"):
            continue
        errors = [o for o in ran.outputs if o.get("output_type") == "error"]
        if errors and not options.get("check_exception"):
            problems.append(f"Cell {number} raised {errors[0].get('ename')}: {str(errors[0].get('evalue'))[:200]}")
        if options.get("check", True) is False or ref.execution_count is None:  # nbval compares no unrun cell
            continue
        got, want = flat(ran.outputs), flat(ref.outputs)
        if got != want:
            keys = sorted(set(got) | set(want))
            diff = next(k for k in keys if got.get(k) != want.get(k))
            problems.append(f"Cell {number} ({diff}) differs: committed {str(want.get(diff))[:300]!r}, "
                            f"fresh {str(got.get(diff))[:300]!r}")
    if len(executed.cells) != len(committed.cells):
        problems.append(f"{len(executed.cells)} cells ran, {len(committed.cells)} committed")
    return problems
