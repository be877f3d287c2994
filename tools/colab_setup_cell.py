"""Make every notebook's setup cell install the course by itself in Colab (and do nothing elsewhere).

    python tools/colab_setup_cell.py notebooks/05_gemm_triton.ipynb ...   # patch these
    python tools/colab_setup_cell.py --all                                # notebooks/ and solutions/
    python tools/colab_setup_cell.py --check --all                        # exit 1 if any is not patched

Idempotent: the first code cell's lines before ``from course_utils import setup`` are replaced by
:data:`INSTALL` (a cell already patched is rewritten to the same text); the rest of the cell, which calls
``setup()``, is kept. Only that cell's source changes. Exercises are generated from solutions
(``python -m course_utils exercises`` copies code cells as they are), so patch solutions and regenerate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = "git+https://github.com/loops-to-kernels/loops-to-kernels"
MARK = "# Colab without the course: install it once"
INSTALL = f'''try:
    import course_utils  # noqa: F401
except ImportError:  # {MARK[2:]} (elsewhere: `make install`, see README)
    import sys

    if "google.colab" not in sys.modules:
        raise
    import importlib
    import subprocess

    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "loops-to-kernels @ {REPO}"])
    importlib.invalidate_caches()
'''
SETUP_LINE = "from course_utils import setup"


def patched_source(source: str) -> str:
    """The setup cell's source with :data:`INSTALL` in front of ``from course_utils import setup``."""
    if SETUP_LINE not in source:
        raise ValueError(f"the first code cell has no {SETUP_LINE!r}: add it (and env = setup(seed=0)) first")
    return INSTALL + source[source.index(SETUP_LINE):]


def _first_code_cell(nb: dict) -> dict:
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


def patch(path: Path, check: bool = False) -> bool:
    """Patch one notebook in place (keeping its JSON layout); True when it changed (or, with ``check``, would)."""
    text = path.read_text()
    nb = json.loads(text)
    cell = _first_code_cell(nb)
    old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    new = patched_source(old)
    if new == old:
        return False
    if not check:
        cell["source"] = new.splitlines(keepends=True)
        indent = 1 if text.startswith("{\n \"") else 2
        path.write_text(json.dumps(nb, indent=indent, ensure_ascii=False) + "\n")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", type=Path)
    p.add_argument("--all", action="store_true", help="every notebook in notebooks/ and solutions/")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is not patched")
    args = p.parse_args(argv)
    paths = list(args.paths)
    if args.all:
        paths += sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
    if not paths:
        p.error("name notebooks, or pass --all")
    changed = [path for path in paths if patch(path, check=args.check)]
    for path in changed:
        print(("not patched: " if args.check else "patched: ") + str(path))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
