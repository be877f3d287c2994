"""The course without Triton (macOS, Windows, Arm Linux), and the emulated-CPU configurations of make test-portable.

The full matrix (every notebook under two emulated CPUs and without Triton) is `make test-portable`,
about 15 minutes on the 2-core CI machine; `make test` runs the part that changes most often: the
Triton lessons and problem set with `import triton` failing.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from course_utils import portable

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
def test_triton_lessons_run_without_an_error_when_triton_is_missing():
    done = subprocess.run([sys.executable, "-m", "course_utils.portable", "--only-no-triton", *TRITON_NOTEBOOKS],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "every configuration passed" in done.stdout
