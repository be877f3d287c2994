"""Cross-references to equations: every "eq. (N)" a lesson, a ``course_utils`` module or a doc mentions names a tag
that exists in the lesson it refers to, and each lesson's tags run in order.

A tag is ``\\tag{N}`` in a markdown cell's display math, or the older ``\\qquad (N)$$`` form. A mention is
``eq. (N)``, ``eq. N``, ``eqs. N-M``, ``eqs. (N) and (M)``, ``eqs. N, M`` (case-insensitive). The lesson a mention
refers to is, in this order: a ``lesson NN`` (or ``NN_slug.ipynb``) written at most 25 characters before it
("lesson 08's eq. 5", "(lesson 03, section 6, eq. 8)", "lesson 11's bound (its eq. 13)"),
then the lesson of the file (a notebook's own number; for a module, the first ``notebooks/NN_...`` or
``Topic NN``/``lesson NN`` of its docstring). Modules that name no lesson (infrastructure) are skipped.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
TAG = re.compile(r"\\tag\{([0-9]+[a-z]?)\}|\\q?quad\s*\(([0-9]+[a-z]?)\)\s*\$")
NUM = r"\(?([0-9]+[a-z]?)\)?"
MENTION = re.compile(rf"\b(eqs?)\.\s*{NUM}((?:\s*(?:-|–|,|and|to)\s*{NUM})*)", re.IGNORECASE)
MORE = re.compile(rf"(?:-|–|,|and|to)\s*{NUM}")
CONTEXT = re.compile(r"(?:lesson|topic)\s+([0-9]{2}[a-c]?)|\b([0-9]{2}[a-c]?)_[a-z_]+\.ipynb", re.IGNORECASE)

# Lessons whose tags are known to run out of order, with the sequence they have today: the test fails when the
# sequence changes, so whoever renumbers a lesson removes it from here. None today: 03, 05, 06 and 11 were
# renumbered.
KNOWN_OUT_OF_ORDER: dict[str, list[str]] = {}


# Mentions known not to resolve today (lesson -> the numbers), owned by other helpers; the test fails when they change.
KNOWN_UNRESOLVED = {"05": {"7"}}


def lesson_of(path: Path) -> str:
    return re.match(r"([0-9]{2}[a-c]?)_", path.name).group(1)


def markdown(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def tags_in(path: Path) -> list[str]:
    return [m.group(1) or m.group(2) for m in TAG.finditer(markdown(path))]


TAGS = {lesson_of(p): tags_in(p) for p in NOTEBOOKS}


def mentions(text: str, default: str | None):
    """``(lesson, number, snippet)`` for every equation mention in ``text``."""
    for m in MENTION.finditer(text):
        before = text[max(0, m.start() - 40):m.start()]
        found = [c for c in CONTEXT.finditer(before)  # close before the mention, in the same sentence and line
                 if len(before) - c.end() <= 25 and not re.search(r"\.\s|\n", before[c.end():])]
        lesson = (found[-1].group(1) or found[-1].group(2)) if found else default
        plural = m.group(1).lower() == "eqs"  # only "eqs." continues with more numbers ("eqs. 12-13", "eqs. 7 and 8")
        numbers = [m.group(2)] + ([n.group(1) for n in MORE.finditer(m.group(3) or "")] if plural else [])
        for number in numbers:
            yield lesson, number, text[max(0, m.start() - 40):m.end() + 10].replace("\n", " ")


def resolve(lesson: str, number: str) -> bool:
    candidates = [k for k in TAGS if k == lesson or (len(lesson) == 2 and k.startswith(lesson))]
    return any(number in TAGS[k] for k in candidates)


def module_lesson(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = (re.search(r"notebooks/([0-9]{2}[a-c]?)_", doc) or re.search(r"(?:[Tt]opic|[Ll]esson)\s+([0-9]{2}[a-c]?)\b", doc.split("\n")[0])
         or re.search(r"solutions/([0-9]{2})_", doc))
    return m.group(1) if m else None


def test_every_lesson_has_tags_and_they_are_found():
    assert len(TAGS) >= 13 and all(TAGS[k] for k in ("03", "09", "12"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_equation_tags_run_in_order(path):
    tags = TAGS[lesson_of(path)]
    key = [(int(re.match(r"[0-9]+", t).group()), t) for t in tags]
    in_order = all(a < b for a, b in zip(key, key[1:]))
    known = KNOWN_OUT_OF_ORDER.get(lesson_of(path))
    if known is None:
        assert in_order, f"{path.name}: equation tags out of order: {tags}; renumber so each lesson counts up"
    else:
        assert not in_order and tags == known, (
            f"{path.name}: tags are now {tags}; if they run in order, delete its KNOWN_OUT_OF_ORDER entry")


def _unresolved(text: str, default: str | None):
    return [f"{lesson}: eq. {n} in '...{snip}...'" for lesson, n, snip in mentions(text, default)
            if lesson is not None and not resolve(lesson, n)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_equation_mentions_resolve(path):
    lesson = lesson_of(path)
    known = KNOWN_UNRESOLVED.get(lesson, set())
    bad = [b for lesson_, n, snip in mentions(markdown(path) + "\n\n" + code(path), lesson)
           if lesson_ is not None and not resolve(lesson_, n) and not (lesson_ == lesson and n in known)
           for b in [f"{lesson_}: eq. {n} in '...{snip}...'"]]
    assert not bad, f"{path.name} cites equations its lesson does not tag: {bad}"
    for n in known:  # a known gap that got fixed: delete it from KNOWN_UNRESOLVED
        assert not resolve(lesson, n) and any(n == m for _, m, _ in mentions(markdown(path), lesson)), (lesson, n)


MODULES = sorted(p for p in (ROOT / "course_utils").rglob("*.py") if module_lesson(p))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_equation_mentions_resolve(path):
    bad = _unresolved(path.read_text(), module_lesson(path))
    assert not bad, f"{path.relative_to(ROOT)} cites equations its lesson does not tag: {bad}"


def test_doc_equation_mentions_resolve():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.py"))]:
        default = module_lesson(path) if path.suffix == ".py" else None
        bad = _unresolved(path.read_text(), default)
        assert not bad, f"{path.relative_to(ROOT)} cites equations that do not exist: {bad}"


def test_the_resolver_catches_a_wrong_number():
    assert _unresolved("the register tile (lesson 03, eq. 99)", None)
    assert _unresolved("see eqs. 12-77", "12")
    assert not _unresolved("lesson 11's bound (its eq. 13) and eqs. (12) and (13)", "12")
