"""The package's layers (course_utils/__init__.py): who may import whom, and the interface of the infrastructure.

bottom (errors, paths) < lesson-facing runtime < topic modules < classroom, grading, devtools.
A module imports only from its own layer or below, with no cycle; imports inside functions count too.
The only exception are the lazy ``__getattr__`` hooks that keep old addresses working (checks.check_function,
gemm_compile.compile_matrix, course_utils.check_value): they run only when an old name is used.
"""
from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import course_utils

PACKAGE = Path(course_utils.__file__).resolve().parent
ROOT = PACKAGE.parent
BOTTOM = {"errors", "paths", "topics"}
RUNTIME = {"env", "checks", "tolerances", "bench", "plotting", "progress", "gpu_compile", "gemm_compile", "provenance"}
INFRASTRUCTURE = BOTTOM | RUNTIME
RANK = {"bottom": 0, "runtime": 1, "topic": 2, "classroom": 3, "grading": 4, "devtools": 4, "cli": 5, "shim": 5}
# what each layer may import, beyond its own layer and those of lower rank
FORBIDDEN = {"classroom": {"grading", "devtools"}, "grading": {"devtools"}, "devtools": set()}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "runtime"  # the package's __init__: setup() from env, the exceptions
    head = parts[1]
    if head in ("classroom", "grading", "devtools"):
        return head
    if head == "_shims":
        return "shim"
    if head == "__main__":
        return "cli"
    if head in BOTTOM:
        return "bottom"
    return "runtime" if head in RUNTIME else "topic"


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """course_utils modules that ``name`` imports anywhere (module level or inside functions), except in
    a module-level ``__getattr__`` (the lazy old-address hooks)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    lazy = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for n in ast.walk(f)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.startswith("course_utils"):
                while target not in MODULES and "." in target:
                    target = target.rpartition(".")[0]
                if target in MODULES and target != name:
                    found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def upward(name: str, target: str) -> bool:
    mine, theirs = layer(name), layer(target)
    if target == "course_utils":  # the package itself: every import of a submodule runs it
        return False
    if theirs in FORBIDDEN.get(mine, set()):
        return True
    return RANK[theirs] > RANK[mine] and mine != theirs


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_upward(name):
    bad = sorted(t for t in GRAPH[name] if upward(name, t))
    assert not bad, f"{name} ({layer(name)}) imports {bad} from a higher layer; move the shared code down (errors, paths, checks)."


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node] - {"course_utils"}):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle) + "; move what both need into a lower module.")
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def infrastructure_modules() -> list[str]:
    return sorted(n for n in MODULES if layer(n) in ("bottom", "runtime", "classroom", "devtools", "cli") and n != "course_utils")


@pytest.mark.parametrize("name", infrastructure_modules())
def test_every_infrastructure_module_declares_its_interface(name):
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__; list its public names."
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define."


def test_importing_a_lesson_facing_module_imports_no_classroom_or_devtools():
    import subprocess
    import sys

    code = ("import sys, course_utils, course_utils.checks, course_utils.env, course_utils.bench, course_utils.gemm_compile; "
            "print(sorted(m for m in sys.modules if m.startswith(('course_utils.classroom', 'course_utils.devtools', "
            "'course_utils.grading'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("old,new", [("course_utils.grader", "course_utils.classroom.grader"),
                                     ("course_utils.remote", "course_utils.classroom.remote"),
                                     ("course_utils.assignments", "course_utils.classroom.assignments"),
                                     ("course_utils.doctor", "course_utils.devtools.doctor")])
def test_an_old_module_path_is_the_moved_module_itself(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_old_names_of_the_checks_still_resolve():
    from course_utils import checks, gemm_compile
    from course_utils.classroom import checking
    from course_utils.devtools import compile_matrix

    assert checks.check_function is checking.check_function and course_utils.Mistake is checking.Mistake
    assert gemm_compile.compile_matrix is compile_matrix.compile_matrix
    with pytest.raises(AttributeError):
        checks.no_such_name  # noqa: B018


def test_no_lesson_imports_the_classroom():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert "course_utils.classroom" not in source and "course_utils.devtools" not in source, path.name


SHIMS = {p.stem for p in (PACKAGE / "_shims").glob("*.py")} - {"__init__"}
OLD_NAMES = {"checks": {"Mistake", "check_function", "check_value", "call_learner", "fresh_seed"},
             "gemm_compile": {"compile_matrix", "attention_configs"}}


def test_no_committed_notebook_imports_through_a_shim():
    old_module = re.compile(r"\bcourse_utils\.(%s)\b|from course_utils import ([\w, ]+)" % "|".join(sorted(SHIMS)))
    notebooks = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"), *ROOT.glob("exercises/*.ipynb")])
    found = []
    for path in notebooks:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            for match in old_module.finditer(source):
                names = {n.strip() for n in (match.group(2) or "").split(",")}
                if match.group(1) or names & (SHIMS | _CLASSROOM_AT_TOP):
                    found.append(f"{path.name}: {match.group(0)}")
            for module, names in OLD_NAMES.items():
                for name in names:
                    if re.search(rf"\b{module}\.{name}\b|from course_utils\.{module} import [^\n]*\b{name}\b", source):
                        found.append(f"{path.name}: {module}.{name}")
    assert not found, f"notebooks import through an old path; use the new one (course_utils/_shims/): {found}"


_CLASSROOM_AT_TOP = {"Mistake", "check_function", "check_value"}


def test_no_test_file_imports_conftest():
    """Shared test helpers live in modules of their own (_notebook_helpers, _grading_helpers); conftest only sets up."""
    offenders = [p.name for p in sorted((ROOT / "tests").glob("*.py"))
                 if re.search(r"^\s*(from conftest import|import conftest)", p.read_text(), re.M)]
    assert not offenders, f"import helpers from _notebook_helpers/_grading_helpers, not conftest: {offenders}"
