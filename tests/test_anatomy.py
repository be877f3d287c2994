"""The shape every lesson and problem set keeps (CONTRIBUTING.md, "Anatomy of a lesson" and "Problem sets"), checked on the committed files.

* a lesson's header: `# NN · Title`, learning goals, prerequisites that name notebooks which exist,
  and a run time within 2x of the recorded CPU time (benchmarks/results/notebook_times_cpu.json);
* its sections: `## 1. ...`, `## 2. ...` consecutively, one of them "Measure the claim...", then
  `## Summary`, `## Check yourself`, `## Further reading`;
* the learner holds the code: no lesson prints source code or redefines a name `course_utils` exports,
  and no problem-set answer can be imported from `course_utils` under its exercise's name;
* one tolerance table: no literal `rtol=`/`atol=` numbers in lessons;
* thread counts change only inside `bench.single_thread()`.
"""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from functools import lru_cache

import nbformat
import pytest

import course_utils
from course_utils.paths import ROOT
from course_utils import topics

LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
CLOSING = ["Summary", "Check yourself", "Further reading"]
# run as their own processes (course_utils/topics.py registers a topic's), or the command line
NOT_LIBRARY = {"course_utils.__main__", "course_utils.portable", "course_utils.devtools.portable"} | topics.subprocess_modules()


def ids(paths):
    return [p.name for p in paths]


def topic(path) -> str:
    return path.name[:2]


def code_of(cell) -> str:
    """A code cell's Python, with IPython magics and shell escapes blanked out."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())


def top_level_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
    return names


@lru_cache(maxsize=1)
def library_exports() -> dict[str, str]:
    """Every public function and class defined in a course_utils module -> the module that defines it."""
    out: dict[str, str] = {}
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        if info.name in NOT_LIBRARY:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not callable(obj):
                continue
            if (getattr(obj, "__module__", "") or "").startswith("course_utils") or hasattr(obj, "fn"):  # triton JITFunction
                home = getattr(obj, "__module__", info.name)
                if home == info.name or hasattr(obj, "fn"):
                    out.setdefault(name, info.name)
    return out


def header(nb) -> str:
    return nb.cells[0].source


def h2_titles(nb) -> list[str]:
    return [line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if line.startswith("## ")]


@lru_cache(maxsize=1)
def recorded_seconds() -> dict[str, float]:
    path = ROOT / "benchmarks" / "results" / "notebook_times_cpu.json"
    data = json.loads(path.read_text())
    return {row["notebook"]: row["seconds"] for row in data["notebooks"]}


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_header_has_title_goals_prerequisites_and_run_time(path):
    nb = nbformat.read(path, as_version=4)
    text = header(nb)
    assert re.match(rf"# {path.name[:3].rstrip('_')} · \S", text), f"{path.name}: the first cell starts with '# {topic(path)} · Title'"
    for part in ("**Learning goals.**", "**Prerequisites.**", "**Run time.**"):
        assert part in text, f"{path.name}: the header needs a paragraph starting with {part}"


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_prerequisites_name_notebooks_that_exist(path):
    text = header(nbformat.read(path, as_version=4))
    paragraph = text.split("**Prerequisites.**", 1)[1].split("\n\n", 1)[0]
    existing = {p.name[:2] for p in LESSONS}
    named = set(re.findall(r"\b(\d\d)\b", paragraph))
    missing = sorted(named - existing)
    assert not missing, f"{path.name}: prerequisites name lesson(s) {missing}, which do not exist"


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_stated_run_time_is_within_2x_of_the_recorded_one(path):
    text = header(nbformat.read(path, as_version=4))
    paragraph = text.split("**Run time.**", 1)[1].split("\n\n", 1)[0]
    match = re.search(r"[Aa]bout (\d+(?:\.\d+)?) ?(s|min)\b", paragraph)
    assert match, f"{path.name}: state the CPU run time as 'About N s' (or 'About N min') in the Run time paragraph"
    stated = float(match.group(1)) * (60 if match.group(2) == "min" else 1)
    recorded = recorded_seconds().get(f"notebooks/{path.name}")
    if recorded is None:
        pytest.skip(f"{path.name}: no recorded time yet (run `make times`)")
    assert recorded / 2 <= stated <= recorded * 2, (
        f"{path.name}: the header says about {stated:g} s but `make times` recorded {recorded:g} s; state what was measured")


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_sections_are_numbered_and_close_with_summary_check_yourself_further_reading(path):
    titles = h2_titles(nbformat.read(path, as_version=4))
    assert titles[-3:] == CLOSING, f"{path.name}: the last three sections must be ## {', ## '.join(CLOSING)} (got {titles[-3:]})"
    body = titles[:-3]
    numbers = []
    for title in body:
        match = re.match(r"(\d+)\. \S", title)
        assert match, f"{path.name}: section '## {title}' must be numbered like '## 3. Title'"
        numbers.append(int(match.group(1)))
    assert numbers == list(range(1, len(numbers) + 1)), f"{path.name}: sections are numbered {numbers}; number them 1, 2, 3, ..."
    assert any(re.match(r"\d+\. Measure the claim", t) for t in body), f"{path.name}: one numbered section is 'Measure the claim(s)'"


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_no_lesson_prints_source_code(path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert "getsource" not in cell.source and "getsourcelines" not in cell.source, (
                f"{path.name}: cell {index} prints source code; put the code itself in a cell the learner can edit")


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_no_lesson_redefines_a_name_course_utils_exports(path):
    nb = nbformat.read(path, as_version=4)
    exports = library_exports()
    clashes = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            clashes += [f"{name} (cell {index}, exported by {exports[name]})" for name in top_level_names(code_of(cell)) if name in exports]
    assert not clashes, (f"{path.name}: redefines {', '.join(clashes)}; name the lesson's version for how it is written "
                         f"(*_loops, *_by_hand, *_numpy) and assert it equals the library's")


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_no_problem_set_answer_can_be_imported_under_its_exercise_name(path):
    nb = nbformat.read(path, as_version=4)
    answers = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            answers |= top_level_names(code_of(cell))
    exports = library_exports()
    leaks = sorted(f"{name} ({exports[name]})" for name in answers if name in exports)
    assert not leaks, f"{path.name}: course_utils exports answers under the exercise's name: {leaks}; rename or make them private"


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_tolerances_come_from_the_one_table(path):
    nb = nbformat.read(path, as_version=4)
    literal = re.compile(r"\b[ra]tol\s*=\s*[0-9.]")
    bad = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and literal.search(c.source)]
    assert not bad, (f"{path.name}: cells {bad} write rtol/atol numbers; use course_utils.checks.tolerance_for(dtype[, n]) "
                     f"or checks.assert_close so that every tolerance comes from checks.TOLERANCES")


@pytest.mark.parametrize("path", LESSONS + SOLUTIONS, ids=ids(LESSONS + SOLUTIONS))
def test_thread_counts_change_only_inside_bench_single_thread(path):
    nb = nbformat.read(path, as_version=4)
    bad = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
           and re.search(r"set_num_threads|threadpool_limits|OMP_NUM_THREADS", c.source)]
    assert not bad, f"{path.name}: cells {bad} set a process-wide thread count; time single-threaded inside `with bench.single_thread():`"
