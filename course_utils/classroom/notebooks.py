"""Reading notebooks for the grader: one place for the small helpers the grader, pristine checks and gradebook share.

* :func:`read_notebook` -- a notebook, or :class:`GradingInputError` with a one-line reason;
* :func:`error_of` -- a code cell's error output as ``(ename, evalue)`` without terminal colours;
* :func:`one_line`, :func:`number` -- text for a one-line hint; :func:`normalized_source` -- a cell's source
  compared without trailing spaces and blank edges.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

__all__ = ["GradingInputError", "read_notebook", "error_of", "one_line", "number", "normalized_source"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GradingInputError(ValueError):
    """The input cannot be graded (missing, not a notebook, no graded cells)."""


def read_notebook(path: Path):
    """Read a notebook or raise :class:`GradingInputError` with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise GradingInputError(f"{path}: no such file; check the path.")
    if path.is_dir():
        raise GradingInputError(f"{path}: is a folder; pass one .ipynb file.")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # JSON errors, schema errors, binary files...
        raise GradingInputError(f"{path}: not a Jupyter notebook ({type(exc).__name__}); pass an .ipynb file.") from None
    if not isinstance(nb, dict) or "cells" not in nb:
        raise GradingInputError(f"{path}: not a Jupyter notebook (no cells); pass an .ipynb file.")
    return nb


def error_of(cell) -> tuple[str, str] | None:
    """The first error output of a code cell as ``(ename, evalue)``, terminal colours removed; None if none."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", ""), _ANSI.sub("", output.get("evalue", ""))
    return None


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, newlines included, made one space."""
    return " ".join(text.split())


def number(x: float) -> str:
    """A number as a hint prints it: ``2`` rather than ``2.0``, ``0.5`` as is."""
    return f"{x:g}"


def normalized_source(source: str) -> str:
    """A cell's source without trailing spaces on its lines or blank lines around it."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())
