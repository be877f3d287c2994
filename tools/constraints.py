"""The versions the course was last verified with: write constraints.txt, or compare an environment with it.

    python tools/constraints.py freeze [--output constraints.txt]   # record the running environment
    python tools/constraints.py drift  [--constraints constraints.txt]  # what differs (make test-latest prints it)

`freeze` pins every package that pyproject.toml names (dependencies and extras) plus KEY_DEPS, the
dependencies whose releases have broken notebooks before (Jupyter's kernel and format stack, diffusers'
hub client, Sphinx's stack for the site). A local version label (`+cpu`) is dropped so that the same pin
holds for the CPU and the CUDA wheels. `make install` installs with `-c constraints.txt`; `make
test-latest` installs the newest releases into another environment and runs the tests there.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY_DEPS = (
    # the notebook and kernel stack that nbval, nbclient and nbgrader drive
    "ipython", "jupyter-client", "jupyter-core", "jupyter-server", "jupyterlab-server", "nbconvert", "traitlets",
    "tornado", "pyzmq", "jupyterlab-widgets", "widgetsnbextension",
    # what torch and diffusers pull in and the lessons touch
    "scipy", "pillow", "sympy", "networkx", "jinja2", "filelock", "fsspec", "huggingface-hub", "safetensors",
    # the site extra's stack
    "sphinx", "myst-nb", "myst-parser", "sphinx-book-theme", "pydata-sphinx-theme", "sphinx-copybutton",
    "jupyter-server-mathjax", "docutils", "markdown-it-py", "mdit-py-plugins", "jupyter-cache",
    # what pytest-xdist starts its test workers with (`make test` runs in parallel)
    "execnet",
)
MARKERS = {"triton": "platform_system == 'Linux' and platform_machine == 'x86_64'"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def named_in_pyproject() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
    return [_norm(re.split(r"[\s<>=!~;\[]", r.strip(), maxsplit=1)[0]) for r in reqs]


def installed() -> dict[str, str]:
    return {_norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def freeze(output: Path) -> None:
    have = installed()
    names = list(dict.fromkeys([*named_in_pyproject(), *map(_norm, KEY_DEPS)]))
    lines = [
        "# The versions the course was last verified with (`make test` passed with exactly these).",
        f"# Written by `python tools/constraints.py freeze` on {datetime.date.today()}, Python {platform.python_version()},",
        f"# {platform.machine()} {platform.system()}. `make install` uses it as a pip constraints file (-c);",
        "# `make test-latest` ignores it to see what the newest releases break.",
    ]
    missing = []
    for name in names:
        if name not in have:
            missing.append(name)
            continue
        version = have[name].split("+", 1)[0]
        marker = f" ; {MARKERS[name]}" if name in MARKERS else ""
        lines.append(f"{name}=={version}{marker}")
    output.write_text("\n".join(lines) + "\n")
    print(f"wrote {output} ({len(names) - len(missing)} pins)" + (f"; not installed here: {', '.join(missing)}" if missing else ""))


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)", line)
        if m:
            found[_norm(m.group(1))] = m.group(2)
    return found


def drift(path: Path) -> int:
    have = installed()
    rows = [(name, want, have.get(name, "not installed").split("+", 1)[0]) for name, want in pins(path).items()]
    moved = [(n, w, h) for n, w, h in rows if h != w and h != "not installed"]
    for name, want, now in moved:
        print(f"{name:28} verified {want:12} now {now}")
    print(f"{len(moved)} of {len(rows)} pinned packages differ from {path.name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("freeze", help="write the running environment's versions")
    f.add_argument("--output", type=Path, default=ROOT / "constraints.txt")
    d = sub.add_parser("drift", help="list installed versions that differ from the constraints")
    d.add_argument("--constraints", type=Path, default=ROOT / "constraints.txt")
    args = parser.parse_args(argv)
    if args.command == "freeze":
        freeze(args.output)
        return 0
    return drift(args.constraints)


if __name__ == "__main__":
    sys.exit(main())
