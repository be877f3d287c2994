"""Every ``course_utils.<module>[.<name>]`` that the notebooks, docstrings and docs mention names something that exists.

A renamed module or function breaks this test instead of leaving a pointer to nothing in the text.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

import pytest

from course_utils.classroom.forbidden import _resolve
from course_utils.paths import ROOT

REFERENCE = re.compile(r"(?<![\w/.])course_utils(?:\.[A-Za-z_]\w*)+(?![\w*])")  # `check_*` is a pattern, not a name
SOURCES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"), *ROOT.glob("course_utils/**/*.py"),
                  *ROOT.glob("benchmarks/*.py"), *ROOT.glob("site/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("*.md"),
                  *ROOT.glob("docs/*.md"), *ROOT.glob("tests/*.py")])


def text_of(path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"])
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def resolves(dotted: str) -> bool:
    """The by-hand watch's resolver (import as far as a module, then attributes) finds ``dotted``."""
    try:
        _resolve(dotted)
    except (AttributeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("path", SOURCES, ids=[p.relative_to(ROOT).as_posix() for p in SOURCES])
def test_every_course_utils_reference_resolves(path):
    missing = sorted({ref.rstrip(".") for ref in REFERENCE.findall(text_of(path)) if not resolves(ref.rstrip("."))})
    assert not missing, f"{path.relative_to(ROOT)} mentions {missing}, which do not exist; update the text."
