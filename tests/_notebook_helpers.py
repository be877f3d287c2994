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
