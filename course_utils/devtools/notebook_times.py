"""``python -m course_utils times``: per-notebook CPU run time and peak memory, recorded.

Executes every lesson (``notebooks/``) and problem set (``solutions/``) in a fresh kernel, one
after the other, and records wall time and the kernel's peak resident memory. The result is
written as JSON with the machine it ran on (``make times`` writes
``benchmarks/results/notebook_times_cpu.json``), so growth against the budget (about a minute
and under 3 GB per notebook on a 2-core CPU) is visible in review.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import nbformat

from ..paths import ROOT
from ..provenance import machine_info

__all__ = ["default_notebooks", "time_notebook", "run_times"]

_PEAK_CELL = (
    "import resource as _r, sys as _s\n"
    "print('PEAK_RSS_KB', _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * (1 if _s.platform != 'darwin' else 1 / 1024))"
)


def default_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def time_notebook(path: Path, *, cell_timeout: float = 600) -> dict:
    """Execute ``path`` (a copy in memory) and return its wall time, peak RSS and error count."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_PEAK_CELL))
    client = NotebookClient(
        nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(Path(path).resolve().parent)}},
    )
    start = time.monotonic()
    client.execute(stderr=subprocess.DEVNULL)  # kernel log lines are noise here
    seconds = time.monotonic() - start
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    match = re.search(r"PEAK_RSS_KB ([0-9.]+)", text)
    errors = sum(
        1 for c in nb.cells[:-1] if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") == "error"
        and "raises-exception" not in c.metadata.get("tags", [])
    )
    return {
        "notebook": str(Path(path).resolve().relative_to(ROOT)) if Path(path).resolve().is_relative_to(ROOT) else str(path),
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(float(match.group(1)) / 1024, 0) if match else None,
        "unexpected_errors": errors,
    }


def run_times(paths: list[Path] | None = None, output: Path | None = None) -> dict:
    paths = paths or default_notebooks()
    rows = []
    for path in paths:
        row = time_notebook(path)
        rows.append(row)
        print(f"{row['notebook']:<45} {row['seconds']:>7.1f} s {row['peak_rss_mb'] or 0:>7.0f} MB"
              + (f"  ({row['unexpected_errors']} unexpected errors)" if row["unexpected_errors"] else ""), flush=True)
    result = {"recorded_on": machine_info(), "notebooks": rows, "total_seconds": round(sum(r["seconds"] for r in rows), 1)}
    print(f"{'total':<45} {result['total_seconds']:>7.1f} s")
    if output:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"written to {output}")
    return result
