"""The wheel that `pip install git+...` (the Colab path) builds holds every course_utils module, and each imports from it.

Built from a copy of the package and pyproject (no build folder left in the checkout), unpacked into a fresh folder,
and every module imported in a fresh interpreter whose only course_utils is that folder.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from course_utils.paths import ROOT

pytestmark = pytest.mark.slow  # building the wheel takes several seconds


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory):
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools (pip install setuptools)")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "course_utils", source / "course_utils", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                            "-w", str(dist), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = dist.glob("*.whl")
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return target


def test_the_wheel_holds_every_module_of_the_checkout(unpacked_wheel):
    in_checkout = {p.relative_to(ROOT).as_posix() for p in (ROOT / "course_utils").rglob("*.py")}
    in_wheel = {p.relative_to(unpacked_wheel).as_posix() for p in (unpacked_wheel / "course_utils").rglob("*.py")}
    assert in_checkout - in_wheel == set(), "pyproject.toml's package list misses these"


def test_every_module_imports_from_the_wheel_alone(unpacked_wheel, tmp_path):
    code = (
        "import importlib, pkgutil, sys\n"
        "import course_utils\n"
        f"assert course_utils.__file__.startswith({str(unpacked_wheel)!r}), course_utils.__file__\n"
        "names = [m.name for m in pkgutil.walk_packages(course_utils.__path__, 'course_utils.')]\n"
        "for name in names:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(unpacked_wheel)!r}), module.__file__\n"
        "import course_utils.grader, course_utils.classroom.grader as g\n"
        "assert course_utils.grader is g\n"
        "print(len(names))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(unpacked_wheel), "COURSE_TIER": "cpu", "HOME": str(tmp_path),
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 60
