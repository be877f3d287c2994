"""The GPU tiers' cells, executed on the CPU: every ``cuda`` / ``sm90`` branch of a lesson or solution runs
under Triton's interpreter with the tier simulated (``COURSE_TIER_SIMULATE``, see ``course_utils.env``).

A wrong name, a configuration a launcher rejects (05's warp-specialized rung at 8 warps), a KeyError on a
recorded result or a dtype path that only the GPU branch takes fails here, long before a GPU is lent.
Sizes are the CPU tier's (``env.size``) and compute stays fp32 (``env.low_precision``); what the interpreter
cannot judge (dtypes in compiled kernels, shared memory, spills) is in ``tests/test_compile_kernels.py``.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_BRANCH = re.compile(r"env\.(on_gpu|is_hopper|pick|size|tier|arch|sms|low_precision)\b|torch\.cuda\.")

# Notebooks whose GPU branches run under the simulated tiers (which ones: PLAN below), at the CPU tier's
# sizes (env.size). The one statement a simulated tier cannot run: 08's torch.cuda.reset_peak_memory_stats() (no
# allocator to reset without a CUDA device; the cell guards it with torch.cuda.is_available(), and the counters it
# then reads are 0). The solutions have no GPU branch (checked below).
DRY_RUN = ["notebooks/00_foundations.ipynb", "notebooks/01_floating_point.ipynb", "notebooks/02_mixed_precision.ipynb",
           "notebooks/03_convolution.ipynb", "notebooks/04_upsampling.ipynb", "notebooks/05_gemm_triton.ipynb",
           "notebooks/06_flash_attention.ipynb", "notebooks/08_training_memory.ipynb"]


def _code_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _has_gpu_branch(path: Path) -> bool:
    return any(GPU_BRANCH.search(src) for src in _code_cells(path))


def test_every_notebook_with_gpu_branches_is_dry_run():
    found = {str(p.relative_to(ROOT)) for folder in ("notebooks", "solutions") for p in sorted((ROOT / folder).glob("*.ipynb"))
             if _has_gpu_branch(p)}
    assert found == set(DRY_RUN), f"add to DRY_RUN: {sorted(found - set(DRY_RUN))}; no GPU branch left: {sorted(set(DRY_RUN) - found)}"


@pytest.mark.portable
def test_the_simulated_tiers():
    import subprocess
    import sys

    code = ("from course_utils import setup; e = setup(quiet=True); import os, torch; "
            "print(e.tier, e.arch, e.sms, e.device, e.low_precision, e.simulated, e.size(1, 2), e.pick(1, 2), "
            "os.environ['TRITON_INTERPRET'])")
    expect = {"sm90": "sm90 90 132 cpu torch.float32 True 1 2 1", "cuda-sm75": "cuda 75 40 cpu torch.float32 True 1 2 1"}
    for name, want in expect.items():
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_TIER")}
        out = subprocess.run([sys.executable, "-c", code], env={**env, "COURSE_TIER_SIMULATE": name, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.strip() == want, out.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-c", code], env={**env, "COURSE_TIER_SIMULATE": "sm99", "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "use one of sm90, cuda-sm80, cuda-sm75" in bad.stderr


# What each notebook needs (derived from the sources, so that it cannot drift):
# * every notebook runs under the simulated sm_90;
# * a notebook whose cells read the GPU generation (env.arch, low_precision, is_hopper, sms: bf16 or fp16, the
#   Hopper rungs, per-arch launch configurations) also runs under the simulated T4 (sm_75); in the others the
#   two tiers take the same branches, so a second run would repeat the first;
# * the run stops after the notebook's last cell with a GPU branch: the cells after it take the CPU path that
#   nbval runs, unless a library module the notebook imports reads the tier itself (gemm: detect_tier), in
#   which case the notebook runs to its end.
ARCH_BRANCH = re.compile(r"env\.(arch|is_hopper|sms|low_precision)\b")
TIER_READING = re.compile(r"\b(detect_tier|simulated)\(")


def _tier_reading_modules() -> set[str]:
    return {p.stem for p in (ROOT / "course_utils").glob("*.py") if p.stem != "env" and TIER_READING.search(p.read_text())}


def tiers_for(notebook: str) -> list[str]:
    return ["sm90", "cuda-sm75"] if any(ARCH_BRANCH.search(src) for src in _code_cells(ROOT / notebook)) else ["sm90"]


def stop_after(notebook: str) -> int | None:
    """Index (among all cells) of the last cell the dry run executes; None for the whole notebook."""
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    sources = "".join(_code_cells(ROOT / notebook))
    if any(re.search(rf"\bcourse_utils(\.| import .*\b){m}\b", sources) for m in _tier_reading_modules()):
        return None
    return max(i for i, c in enumerate(cells) if c["cell_type"] == "code" and GPU_BRANCH.search("".join(c["source"])))


def test_the_dry_run_plan():
    """The plan is what the sources say: 02, 05 and 06 read the GPU generation; gemm reads the tier, so 05 runs whole."""
    assert "gemm" in _tier_reading_modules()
    both = {nb for nb in DRY_RUN if len(tiers_for(nb)) == 2}
    assert {"notebooks/02_mixed_precision.ipynb", "notebooks/05_gemm_triton.ipynb", "notebooks/06_flash_attention.ipynb"} <= both
    assert stop_after("notebooks/05_gemm_triton.ipynb") is None
    assert stop_after("notebooks/06_flash_attention.ipynb") < len(json.loads((ROOT / "notebooks/06_flash_attention.ipynb").read_text())["cells"]) - 1


PLAN = [(nb, tier) for nb in DRY_RUN for tier in tiers_for(nb)]


@pytest.mark.slow
@pytest.mark.portable
@pytest.mark.parametrize("notebook,tier", PLAN, ids=[f"{Path(nb).stem}-{tier}" for nb, tier in PLAN])
def test_gpu_cells_run_under_the_simulated_tier(notebook, tier, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("triton")
    monkeypatch.setenv("COURSE_TIER_SIMULATE", tier)
    monkeypatch.delenv("COURSE_TIER", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / notebook, as_version=4)
    last = stop_after(notebook)
    if last is not None:
        nb.cells = nb.cells[: last + 1]
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()          # raises CellExecutionError, naming the cell, on the first failure
    first = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert f"tier={'sm90' if tier == 'sm90' else 'cuda'} (simulated on the CPU)" in first
