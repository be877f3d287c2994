"""Where a measurement came from: one record of the machine, the software and the course's commit.

Used by every script in ``benchmarks/`` and by :mod:`course_utils.devtools.notebook_times`, so that each file
under ``benchmarks/results/`` names its machine the same way, and by :func:`results_path`, which
dates result files so that a rerun never overwrites an earlier one.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

from .paths import BENCHMARK_RESULTS, ROOT

__all__ = ["machine_info", "results_path", "cpu_model", "course_commit", "gpu_driver"]


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def course_commit() -> str | None:
    """The course's git commit (with ``+dirty`` when the tree has changes); outside a checkout (a copied tree
    without ``.git``) the ``COURSE_COMMIT`` environment variable, else None."""
    fallback = os.environ.get("COURSE_COMMIT") or None
    if not (ROOT / ".git").exists():
        return fallback
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return fallback
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


def gpu_clocks() -> dict:
    """SM and memory clocks (now and maximum, MHz) and the power limit (W) from ``nvidia-smi``; {} without it."""
    fields = ["clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit", "power.max_limit",
              "temperature.gpu", "persistence_mode"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return dict(zip(fields, values)) if len(values) == len(fields) else {}


def gpu_driver() -> str:
    """The NVIDIA driver version from ``nvidia-smi``, or "unknown"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_info(*, threads: int | None = None, extra: dict | None = None) -> dict:
    """The machine, the library versions, the tier, the course commit and the UTC date and time."""
    import numpy
    import torch

    from .env import detect_tier

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info = {
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "tier": detect_tier(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_available": torch.cuda.is_available(),
        "course_commit": course_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if threads is not None:
        info["threads_used"] = threads
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update({
            "gpu": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "sms": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "driver": gpu_driver(),
            "nvidia_smi": gpu_clocks(),
            "cuda": torch.version.cuda,
        })
    info.update(extra or {})
    return info


def results_path(name: str, *, folder: Path | None = None, suffix: str = ".json") -> Path:
    """``benchmarks/results/NAME_YYYY-MM-DD[_HHMM].json``: dated, never overwriting an earlier record."""
    folder = folder or BENCHMARK_RESULTS
    now = dt.datetime.now(dt.timezone.utc)
    path = folder / f"{name}_{now:%Y-%m-%d}{suffix}"
    if path.exists():
        path = folder / f"{name}_{now:%Y-%m-%d_%H%M%S}{suffix}"
    return path
