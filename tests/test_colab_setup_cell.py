"""Every patched notebook's first cell installs the course in Colab without it, and does nothing elsewhere.

The cell runs in a fresh interpreter without site-packages (``python -S``: the course is not importable),
with a stand-in ``google.colab`` module and a stand-in ``pip`` that records its command line and "installs"
a tiny ``course_utils`` whose ``setup()`` says it ran. tools/colab_setup_cell.py writes the cell.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import colab_setup_cell as csc  # noqa: E402

# Every lesson, solution and exercise: one lesson and one problem set run the cell here; all are checked patched.
PATCHED = ["notebooks/02_mixed_precision.ipynb", "solutions/12_score_sde.ipynb", "exercises/05_gemm_triton.ipynb"]
EVERY = sorted(str(p.relative_to(ROOT)) for folder in ("notebooks", "solutions", "exercises")
               for p in (ROOT / folder).glob("*.ipynb"))

PIP_STUB = '''import sys, pathlib
here = pathlib.Path(__file__).resolve().parents[2]   # stubs/pip/__main__.py -> the test's folder
(here / "pip_calls.txt").open("a").write(" ".join(sys.argv[1:]) + "\\n")
pkg = here / "site" / "course_utils"
pkg.mkdir(parents=True, exist_ok=True)
(pkg / "__init__.py").write_text("def setup(seed=0):\\n    print('setup ran, seed', seed)\\n    return 'env'\\n")
'''


def _first_cell(path: str) -> str:
    nb = json.loads((ROOT / path).read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def _run(tmp_path: Path, source: str, colab: bool, course_present: bool = False):
    stubs, site = tmp_path / "stubs", tmp_path / "site"
    (stubs / "google" / "colab").mkdir(parents=True)
    (stubs / "google" / "__init__.py").write_text("")
    (stubs / "google" / "colab" / "__init__.py").write_text("")
    (stubs / "pip").mkdir()
    (stubs / "pip" / "__init__.py").write_text("")
    (stubs / "pip" / "__main__.py").write_text(PIP_STUB)
    site.mkdir()
    if course_present:
        (site / "course_utils").mkdir()
        (site / "course_utils" / "__init__.py").write_text("def setup(seed=0):\n    print('setup ran, seed', seed)\n")
    harness = ("import sys\n" + ("import google.colab\n" if colab else "") + f"sys.path[:0] = [{str(site)!r}]\n"
               + "exec(compile(sys.stdin.read(), 'setup cell', 'exec'))\n")
    env = {"PYTHONPATH": str(stubs), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-S", "-c", harness], input=source, env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    calls = (tmp_path / "pip_calls.txt").read_text().splitlines() if (tmp_path / "pip_calls.txt").exists() else []
    return done, calls


@pytest.mark.parametrize("notebook", PATCHED)
def test_in_colab_without_the_course_the_first_cell_installs_it_then_runs_setup(notebook, tmp_path):
    done, calls = _run(tmp_path, _first_cell(notebook), colab=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert calls == [f"install -q --no-deps loops-to-kernels @ {csc.REPO}"]
    assert "setup ran, seed 0" in done.stdout


@pytest.mark.parametrize("notebook", PATCHED)
def test_outside_colab_it_installs_nothing(notebook, tmp_path):
    done, calls = _run(tmp_path, _first_cell(notebook), colab=False)
    assert calls == [] and "ModuleNotFoundError: No module named 'course_utils'" in done.stderr
    (tmp_path / "with").mkdir()
    done, calls = _run(tmp_path / "with", _first_cell(notebook), colab=True, course_present=True)
    assert calls == [] and done.returncode == 0 and "setup ran, seed 0" in done.stdout


def test_the_patch_is_idempotent_and_keeps_the_setup_call(tmp_path):
    plain = "from course_utils import setup\nenv = setup(seed=0)"
    once = csc.patched_source(plain)
    assert csc.patched_source(once) == once and once.endswith(plain) and once.startswith("try:\n    import course_utils")
    for notebook in PATCHED:
        assert csc.patched_source(_first_cell(notebook)) == _first_cell(notebook)
    with pytest.raises(ValueError, match="has no 'from course_utils import setup'"):
        csc.patched_source("import torch")


@pytest.mark.parametrize("notebook", EVERY)
def test_every_notebook_installs_the_course_in_colab(notebook):
    source = _first_cell(notebook)
    assert csc.patched_source(source) == source, f"{notebook}: run python tools/colab_setup_cell.py --all"
