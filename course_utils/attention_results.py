"""Topic 06: reading the recorded GPU runs of ``benchmarks/attention_gpu.py`` (``benchmarks/results/attention_gpu_*.json``).

Used by ``notebooks/06_flash_attention.ipynb`` (the plot of recorded runs) and by ``tests/test_gpu_dry_run.py``,
which feeds it the file a dry run of the benchmark writes. A run holds ``machine`` (``course_utils.provenance``:
``gpu``, ``date``, ...) and ``cases``; a case holds ``head_dim``, ``seq``, ``causal``, ``group`` (query heads per
key/value head: 1 is MHA, more is GQA) and, where it was timed, ``sdpa_fwd_tflops`` / ``triton_fwd_tflops``.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["recorded_runs", "newest_run", "series", "run_label"]


def recorded_runs(folder: Path | str) -> list[dict]:
    """Every readable GPU run in ``folder`` (dry runs excluded), oldest first by the date each run recorded."""
    runs = []
    for path in Path(folder).glob("attention_gpu_*.json"):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if run.get("cases") and not run.get("dry_run") and "date" in run.get("machine", {}):
            runs.append(run)
    return sorted(runs, key=lambda r: r["machine"]["date"])


def newest_run(folder: Path | str) -> dict | None:
    """The most recent run by its recorded date (not by file name), or None."""
    runs = recorded_runs(folder)
    return runs[-1] if runs else None


def _group(case: dict) -> int:
    if "group" in case:
        return int(case["group"])
    return int(case.get("heads_q", 1)) // max(1, int(case.get("heads_kv", 1)))


def series(run: dict, head_dim: int, causal: bool, group: int, key: str) -> tuple[list[int], list[float]]:
    """Sequence lengths and ``key`` (e.g. ``"triton_fwd_tflops"``) of the cases that have it, sorted by length.

    MHA (``group=1``) and GQA (``group>1``) cases are separate series: they do different work per token."""
    rows = sorted((c for c in run["cases"] if c.get("head_dim") == head_dim and c.get("causal") == causal
                   and _group(c) == group and key in c), key=lambda c: c["seq"])
    return [c["seq"] for c in rows], [c[key] for c in rows]


def run_label(run: dict) -> str:
    """``"NVIDIA H200, 2026-12-03"``: the GPU and the date the run recorded."""
    machine = run["machine"]
    return f"{machine.get('gpu', 'unknown GPU')}, {machine['date'][:10]}"
