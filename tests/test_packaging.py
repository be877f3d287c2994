"""pyproject.toml and environment.yml install the same packages; the Makefile is idempotent."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from course_utils.paths import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_packages() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_name(r) for r in reqs}


def environment_packages() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_name(r) for r in dep.get("pip", []) if not r.startswith("-")}
        else:
            names.add(_name(dep))
    return names - {"python", "pip"}


def test_environment_yml_names_the_same_packages_as_pyproject():
    in_pyproject, in_env = pyproject_packages(), environment_packages()
    assert in_pyproject == in_env, (
        f"only in pyproject.toml: {sorted(in_pyproject - in_env)}; only in environment.yml: {sorted(in_env - in_pyproject)}"
    )


def test_environment_yml_installs_the_course_package_with_its_extras():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[dev]" in pip_section


def test_the_packages_the_course_names_are_importable():
    import importlib

    for module in ("torch", "numpy", "matplotlib", "diffusers", "sklearn", "tqdm", "ipywidgets", "jupyterlab", "nbclient", "nbformat", "nbval", "nbgrader"):
        importlib.import_module(module)


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(), reason="runs only inside the Makefile's .venv")
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_is_idempotent():
    # `make -q` exits 0 only when the target is up to date, i.e. a second `make lab`/`make test` installs nothing.
    result = subprocess.run(["make", "-q", "install"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, "make would reinstall: .venv/.installed is older than pyproject.toml"
    dry = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "pip install" not in dry and "jupyter lab" in dry
