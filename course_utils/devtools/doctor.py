"""``python -m course_utils doctor``: is everything the course needs installed and working?

Prints OK/FAIL with the version of each package, the device tier, and whether Triton runs
compiled or under its interpreter (after actually running a tiny kernel). Exit code 1 when a
required package is missing or the Triton smoke test fails. Used by ``make doctor`` and by
learners who ask "why does my notebook not run?".
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import sys

__all__ = ["PACKAGES", "check_package", "triton_smoke_test", "run_doctor"]

# (import name, distribution name, required?) -- mirrors pyproject.toml.
PACKAGES = [
    ("torch", "torch", True),
    ("numpy", "numpy", True),
    ("matplotlib", "matplotlib", True),
    ("triton", "triton", platform.system() == "Linux" and platform.machine() == "x86_64"),
    ("diffusers", "diffusers", True),
    ("sklearn", "scikit-learn", True),
    ("tqdm", "tqdm", True),
    ("ipywidgets", "ipywidgets", True),
    ("ipykernel", "ipykernel", True),
    ("jupyterlab", "jupyterlab", True),
    ("nbclient", "nbclient", True),
    ("nbformat", "nbformat", True),
    ("pytest", "pytest", False),
    ("nbval", "nbval", False),
    ("nbgrader", "nbgrader", False),
]


def check_package(module: str, dist: str) -> tuple[bool, str]:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising something else
        return False, f"cannot import {module} ({type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''})"
    try:
        return True, importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return True, "version unknown"


def triton_smoke_test() -> tuple[bool, str]:
    """Run a one-block vector add in Triton (compiled on CUDA, interpreted otherwise)."""
    from ..env import _configure_triton, detect_tier

    tier = detect_tier()
    mode = _configure_triton(tier)
    if mode == "missing":
        return False, "triton is not installed"
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    device = "cpu" if tier == "cpu" else "cuda"
    x = torch.arange(10, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    try:
        _add[(1,)](x, x, out, 10, BLOCK=16)
    except Exception as exc:
        return False, f"{mode}: kernel failed ({type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''})"
    if not torch.equal(out, 2 * x):
        return False, f"{mode}: kernel ran but gave wrong results"
    return True, f"{mode} (a test kernel ran and was correct)"


def run_doctor(stream=None) -> int:
    stream = stream or sys.stdout
    failures = 0
    print(f"python {platform.python_version()} at {sys.executable}", file=stream)
    for module, dist, required in PACKAGES:
        ok, info = check_package(module, dist)
        if ok:
            print(f"OK    {dist:<14} {info}", file=stream)
        elif required:
            failures += 1
            print(f"FAIL  {dist:<14} {info}; run `make install` (or pip install -e '.[dev]')", file=stream)
        else:
            print(f"WARN  {dist:<14} {info}; needed only for tests/grading: pip install -e '.[dev]'", file=stream)
    from ..env import detect_tier

    tier = detect_tier()
    print(f"OK    tier           {tier}" + ("" if tier != "cpu" else " (no CUDA device: small sizes, fp32)"), file=stream)
    if any(m == "triton" and r for m, _, r in PACKAGES) or os.environ.get("TRITON_INTERPRET"):
        ok, info = triton_smoke_test()
        print(f"{'OK  ' if ok else 'FAIL'}  triton mode    {info}", file=stream)
        failures += 0 if ok else 1
    print("all good" if failures == 0 else f"{failures} problem(s) found", file=stream)
    return 0 if failures == 0 else 1
