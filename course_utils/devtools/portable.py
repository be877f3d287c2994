"""Run the notebooks' nbval checks as other learners' machines would: ``make test-portable``.

Outputs that nbval compares must not depend on the CPU. This machine can stand in for others:
torch picks its CPU kernels by ``ATEN_CPU_CAPABILITY`` (``default`` = no SIMD beyond the baseline,
``avx2``, ``avx512``), NumPy its dispatched SIMD loops unless ``NPY_DISABLE_CPU_FEATURES`` names them,
OpenBLAS its GEMM kernels by ``OPENBLAS_CORETYPE``, and the thread count changes the order of
reductions. Each configuration below runs nbval over every lesson and solved problem set in a
fresh process; a flaky or CPU-dependent output fails it.

``--no-triton`` adds a run in which ``import triton`` fails, as on macOS, Windows or Arm Linux, where
the triton package does not install: every lesson must still run, the Triton rungs printing a notice.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from ..paths import ROOT

__all__ = ["configurations", "no_triton_environment", "run", "main", "NO_TRITON_DIR", "NEEDS_TRITON", "NO_TRITON_ARGS"]

NO_TRITON_DIR = ROOT / "tests" / "no_triton"


def _numpy_dispatch() -> list[str]:
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__
    return list(__cpu_dispatch__)


def configurations() -> list[tuple[str, dict[str, str]]]:
    """(label, environment) for each emulated machine this CPU can stand in for."""
    dispatch = _numpy_dispatch()
    avx512_like = [f for f in dispatch if "512" in f or f == "X86_V4"]
    all_simd = [f for f in dispatch]  # everything above NumPy's baseline
    return [
        ("baseline SIMD, 1 thread (an old or small CPU)", {
            "ATEN_CPU_CAPABILITY": "default", "NPY_DISABLE_CPU_FEATURES": " ".join(all_simd),
            "OPENBLAS_CORETYPE": "Prescott", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}),
        ("AVX2 without AVX-512, 2 threads (an AMD Zen 2/3 or older Intel laptop)", {
            "ATEN_CPU_CAPABILITY": "avx2", "NPY_DISABLE_CPU_FEATURES": " ".join(avx512_like),
            "OPENBLAS_CORETYPE": "Haswell", "OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}),
    ]


def no_triton_environment() -> dict[str, str]:
    """PYTHONPATH with a stand-in ``triton`` package whose import fails."""
    path = os.pathsep.join(p for p in (str(NO_TRITON_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


# Without Triton the Triton rungs print a notice instead of their check lines, so outputs cannot match
# the committed ones: that run executes every cell and fails on any error (nbval's lax mode).
NEEDS_TRITON = ["solutions/05_gemm_triton.ipynb", "solutions/06_flash_attention.ipynb"]
NO_TRITON_ARGS = ["-o", "addopts=", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300"]


def run(paths: list[str], *, no_triton: bool, only_no_triton: bool = False, extra: list[str] | None = None) -> int:
    runs = [] if only_no_triton else configurations()
    if no_triton:
        runs.append(("triton not installed (macOS, Windows, Arm Linux): every cell must run without an error",
                     no_triton_environment()))
    failed = []
    for label, changes in runs:
        env = {**os.environ, **changes}
        env.pop("OPENBLAS_L2_SIZE", None) if "OPENBLAS_CORETYPE" in changes else None
        shown = " ".join(f"{k}={v!r}" for k, v in changes.items())
        print(f"\n== {label}\n   {shown}", flush=True)
        started = time.monotonic()
        no_triton = changes.get("PYTHONPATH", "").startswith(str(NO_TRITON_DIR))
        lax = NO_TRITON_ARGS if no_triton else []
        # Problem sets 05 and 06 have kernel exercises that cannot be done without Triton (their introductions say so); their
        # checks fail with a message saying so, which tests/test_portable.py checks through the grader.
        ignore = [f"--deselect={p}" for p in NEEDS_TRITON] if no_triton else []
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *lax, *paths, *ignore,
                                *(extra or [])], cwd=ROOT, env=env)
        print(f"   -> {'passed' if code == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(label)
    if failed:
        print("\nportable check failed under: " + "; ".join(failed))
        return 1
    print("\nevery configuration passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.portable", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["notebooks", "solutions"], help="what nbval runs over")
    parser.add_argument("--no-triton", action="store_true", help="also run with triton made unimportable")
    parser.add_argument("--only-no-triton", action="store_true", help="run only the no-triton configuration")
    args, extra = parser.parse_known_args(argv)
    return run(args.paths, no_triton=args.no_triton or args.only_no_triton, only_no_triton=args.only_no_triton, extra=extra)


if __name__ == "__main__":
    sys.exit(main())
