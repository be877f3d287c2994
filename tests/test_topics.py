"""The registry of topics (course_utils/topics.py) agrees with the files, the modules, the README and the package index."""
from __future__ import annotations

import importlib
import json
import re

import pytest

import course_utils
from course_utils import topics
from course_utils.paths import EXERCISES, NOTEBOOKS, PACKAGE, ROOT, SOLUTIONS

TOPICS = topics.TOPICS
INFRASTRUCTURE = {"__init__", "__main__", "errors", "paths", "topics", "env", "checks", "tolerances", "bench", "plotting",
                  "progress", "gpu_compile", "gemm_compile", "provenance"}


def test_topics_are_numbered_in_order_and_slugs_carry_their_number():
    assert [t.number for t in TOPICS] == [f"{i:02d}" for i in range(len(TOPICS))]
    for t in TOPICS:
        assert t.slug.startswith(t.number + "_") and all(stem.startswith(t.number) for stem in t.lessons), t


def test_every_notebook_is_registered_and_every_registered_notebook_exists():
    lessons = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert lessons == {stem for t in TOPICS for stem in t.lessons}, "register new lessons in course_utils/topics.py"
    for folder in (SOLUTIONS, EXERCISES):
        assert {p.name for p in folder.glob("*.ipynb")} == {t.problem_set for t in TOPICS}, folder


def test_every_topic_module_belongs_to_exactly_one_topic():
    on_disk = {p.stem for p in PACKAGE.glob("*.py")} - INFRASTRUCTURE
    registered = [m for t in TOPICS for m in t.library]
    assert len(registered) == len(set(registered)), "a module is registered under two topics"
    assert on_disk == set(registered), (f"unregistered: {sorted(on_disk - set(registered))}; "
                                        f"missing: {sorted(set(registered) - on_disk)} (course_utils/topics.py)")
    for t in TOPICS:
        assert set(t.subprocess_modules) <= set(t.library), t.number


@pytest.mark.parametrize("topic", TOPICS, ids=[t.slug for t in TOPICS])
def test_a_problem_set_imports_exactly_its_registered_grading_modules(topic):
    importlib.import_module(f"course_utils.grading.{topic.grading[0]}")
    nb = json.loads((SOLUTIONS / topic.problem_set).read_text())
    source = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    used = set(re.findall(r"from course_utils\.grading import (\w+)", source))
    used |= set(re.findall(r"course_utils\.grading\.(\w+)", source))
    assert used == set(topic.grading), f"{topic.problem_set} imports {sorted(used)}; course_utils/topics.py says {topic.grading}"


def test_the_compile_matrix_compiles_exactly_the_registered_kernels():
    from course_utils.devtools.compile_matrix import compile_matrix

    assert {case.kernel for case in compile_matrix(full=True)} == topics.kernels()


def test_the_readme_syllabus_lists_every_topic_with_its_lessons():
    import sys

    sys.path.insert(0, str(ROOT / "site"))
    try:
        import build
    finally:
        sys.path.remove(str(ROOT / "site"))
    assert list(build.readme_syllabus()) == [t.number for t in TOPICS], "README's syllabus and course_utils/topics.py differ"
    syllabus = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    for t in TOPICS:
        row = next(line for line in syllabus.splitlines() if line.startswith(f"| {t.number} |"))
        assert all(f"({path})" in row for path in t.lesson_paths) and f"(exercises/{t.problem_set})" in row, row


def test_the_package_index_lists_every_topic_module():
    doc = " ".join(course_utils.__doc__.split())
    assert topics.package_index() in doc, f"course_utils/__init__.py's index should read: {topics.package_index()}"
