"""One alias per module in every notebook: check it, and fix it.

``python -m course_utils.devtools.aliases [--fix] [NOTEBOOK ...]`` (default: notebooks/ and solutions/; then run
``python -m course_utils exercises``). The aliases come from :func:`course_utils.topics.aliases`: a topic's short name
for its first library module (``cv``), plus the part for the others (``cv_blocking``), ``grading`` for the problem
set's checks. A notebook that imports ``course_utils.<module>`` under another name is reported; ``--fix`` rewrites the
import and every use of the old name in code cells, token by token (strings, comments and markdown are left alone),
and refuses a notebook where the new name is already taken by something else.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from ..paths import NOTEBOOKS, SOLUTIONS
from ..topics import aliases

__all__ = ["Finding", "find", "fix_notebook", "check", "main"]

_IMPORT = re.compile(r"^[ \t]*(?:from course_utils(?P<pkg>\.grading)? import (?P<mod>\w+)(?: as (?P<alias>\w+))?"
                     r"|import course_utils\.(?P<dotted>[\w.]+) as (?P<alias2>\w+))[ \t]*(?:#.*)?$", re.M)


@dataclass(frozen=True)
class Finding:
    notebook: str
    module: str     # "convolution", "grading.convolution"
    old: str        # the alias used
    new: str        # the alias the convention gives


def _imports(source: str, table: dict[str, str]):
    """(module, alias used, span of the alias in ``source``) for each import of a course module with a convention."""
    for m in _IMPORT.finditer(source):
        if m.group("dotted"):
            module, alias, group = m.group("dotted"), m.group("alias2"), "alias2"
        else:
            module = ("grading." if m.group("pkg") else "") + m.group("mod")
            alias, group = m.group("alias") or m.group("mod"), "alias"
        if module in table:
            yield module, alias, (m.span(group) if m.group(group) else None), m


def _cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def find(path: Path) -> list[Finding]:
    """The imports in ``path``'s code cells whose alias is not the convention's."""
    table = aliases()
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for cell in _cells(nb):
        for module, alias, _span, _m in _imports(_source(cell), table):
            if alias != table[module]:
                out.append(Finding(Path(path).name, module, alias, table[module]))
    return out


def _tokens(source: str):
    """Python's tokens of a code cell; IPython magics and shell lines are blanked first."""
    lines = ["\n" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines(keepends=True)]
    try:
        return list(tokenize.generate_tokens(io.StringIO("".join(lines)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise ValueError(f"cannot tokenize a code cell ({exc}); fix it by hand") from None


def _names(source: str) -> list[tuple[int, int, str, bool]]:
    """(line, column, name, follows a dot) for each NAME token."""
    out, previous = [], None
    for tok in _tokens(source):
        if tok.type == tokenize.NAME:
            out.append((tok.start[0], tok.start[1], tok.string, previous == "."))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            previous = tok.string
    return out


def _rename(source: str, old: str, new: str) -> str:
    """``old`` -> ``new`` where it is a name of the code: not after a dot, not in a plain string or a comment;
    inside an f-string's replacement fields (one STRING token before Python 3.12) where it is followed by a dot."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits = []  # (offset, length, text)
    previous = None
    for tok in _tokens(source):
        offset = starts[tok.start[0] - 1] + tok.start[1]
        if tok.type == tokenize.NAME and tok.string == old and previous not in (".", "import"):  # not a module's own name
            edits.append((offset, len(old), new))
        elif tok.type == tokenize.STRING and re.match(r"(?i)[rb]*f", tok.string):
            for m in re.finditer(rf"(?<![\w.]){re.escape(old)}(?=\.\w)", tok.string):
                edits.append((offset + m.start(), len(old), new))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            previous = tok.string
    for offset, length, text in sorted(edits, reverse=True):
        source = source[:offset] + text + source[offset + length:]
    return source


def fix_notebook(path: Path) -> list[Finding]:
    """Rewrite ``path`` so that every course module is imported under its alias; returns what was changed."""
    path = Path(path)
    findings = find(path)
    if not findings:
        return []
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = _cells(nb)
    sources = [_source(c) for c in cells]
    renames = {f.old: f.new for f in findings}
    if len(renames) != len({(f.old, f.new) for f in findings}):
        raise ValueError(f"{path.name}: one alias stands for two modules; fix it by hand")
    # names the code uses outside the course's import lines: a new alias must not collide with one of them
    taken = {name for s in sources for _r, _c, name, dotted in _names(_IMPORT.sub("", s)) if not dotted}
    for new in renames.values():
        if new in taken and new not in renames:
            raise ValueError(f"{path.name}: `{new}` already names something else; rename it, then run the fixer again")
    for i, cell in enumerate(cells):
        text = sources[i]
        # an import without `as` whose alias differs (from course_utils import convolution_blocking) gains its `as` first
        for module, alias, span, m in sorted(_imports(text, aliases()), key=lambda x: -x[3].start()):
            if span is None and alias != aliases()[module]:
                text = text[:m.end("mod")] + f" as {aliases()[module]}" + text[m.end("mod"):]
        for old, new in renames.items():
            text = _rename(text, old, new)
        if text != sources[i]:
            cell["source"] = text.splitlines(keepends=True)
    path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")  # as nbformat writes
    return findings


def check(paths: list[Path] | None = None) -> list[Finding]:
    paths = paths or sorted([*NOTEBOOKS.glob("*.ipynb"), *SOLUTIONS.glob("*.ipynb")])
    return [f for p in paths for f in find(p)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.devtools.aliases", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/ and solutions/)")
    parser.add_argument("--fix", action="store_true", help="rewrite the notebooks (then run `python -m course_utils exercises`)")
    args = parser.parse_args(argv)
    paths = args.paths or sorted([*NOTEBOOKS.glob("*.ipynb"), *SOLUTIONS.glob("*.ipynb")])
    if args.fix:
        for path in paths:
            try:
                for f in fix_notebook(path):
                    print(f"{f.notebook}: course_utils.{f.module} as {f.old} -> {f.new}")
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        return 0
    found = check(paths)
    for f in found:
        print(f"{f.notebook}: imports course_utils.{f.module} as {f.old}; the convention is {f.new}")
    if found:
        print("run `python -m course_utils.devtools.aliases --fix`, then `python -m course_utils exercises`.")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
