"""The course without Triton (macOS, Windows, Arm Linux), and the emulated-CPU configurations of make test-portable.

The full matrix (every notebook under two emulated CPUs and without Triton) is `make test-portable`,
about 15 minutes on the 2-core CI machine; `make test` runs the part that changes most often: the
Triton lessons and problem set with `import triton` failing.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from course_utils.paths import ROOT
from course_utils.devtools import portable

TRITON_NOTEBOOKS = ["notebooks/03_convolution.ipynb", "notebooks/05_gemm_triton.ipynb", "notebooks/06_flash_attention.ipynb",
                    "solutions/05_gemm_triton.ipynb"]


def test_the_stand_in_makes_import_triton_fail():
    env = {**portable.no_triton_environment()}
    done = subprocess.run([sys.executable, "-c", "import triton"], env={**__import__("os").environ, **env},
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and "simulated by tests/no_triton" in done.stderr


def test_configurations_emulate_older_cpus_and_other_thread_counts():
    configs = dict(portable.configurations())
    capabilities = {c["ATEN_CPU_CAPABILITY"] for c in configs.values()}
    threads = {c["OMP_NUM_THREADS"] for c in configs.values()}
    assert capabilities == {"default", "avx2"} and threads == {"1", "2"}
    assert all(c["NPY_DISABLE_CPU_FEATURES"] for c in configs.values())


@pytest.mark.slow
@pytest.mark.portable
def test_triton_lessons_run_without_an_error_when_triton_is_missing():
    done = subprocess.run([sys.executable, "-m", "course_utils.devtools.portable", "--only-no-triton", *TRITON_NOTEBOOKS],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "every configuration passed" in done.stdout


@pytest.mark.slow
@pytest.mark.portable
def test_problem_set_05_without_triton_grades_the_other_exercises_and_says_why_not_the_kernels():
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        env = {**os.environ, **portable.no_triton_environment()}
        # --no-sandbox: the sandbox builds its own environment, where the stand-in that hides Triton is not on the path
        done = subprocess.run([sys.executable, "-m", "course_utils", "grade", "solutions/05_gemm_triton.ipynb", "--json", out,
                               "--no-sandbox"],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        assert done.returncode == 1, done.stderr[-2000:]
        report = json.loads(open(out).read())
    by_status = {e["name"]: (e["status"], e["hint"]) for e in report["exercises"]}
    kernels = [name for name in by_status if name.startswith(("ex2", "ex5", "ex7"))]   # the three Triton kernels
    assert len(kernels) == 3 and all(by_status[n][0] == "failed" and "needs Triton" in by_status[n][1] for n in kernels)
    assert all(status == "passed" for name, (status, _) in by_status.items() if name not in kernels)
