"""One results file per benchmark run, rewritten after every check, configuration and case.

Used by ``benchmarks/gemm_gpu.py``, ``attention_gpu.py`` and ``lesson_kernels_gpu.py``. The file is the
usual JSON record (``course_utils.provenance``'s machine record plus the rows), written to a temporary file
and renamed after each :meth:`Record.add`, so a crash, a time limit or a SIGTERM (trapped: the record is
marked ``"interrupted"`` and saved before the process exits with 143) leaves every finished row on disk.
``"complete": true`` only once :meth:`Record.finish` ran. Needs only the standard library.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

# Dense (no sparsity) tensor-core peaks by GPU name, FLOP/s, from the vendors' datasheets:
# NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM: BF16/FP16 1,979 TFLOP/s with sparsity, 989.4 dense;
# PCIe/NVL H100: 1,513 with sparsity, 756.5 dense), NVIDIA A100 datasheet (BF16/FP16 312 dense), NVIDIA L4
# datasheet (242 with sparsity, 121 dense), NVIDIA T4 datasheet (FP16 65 mixed precision; no BF16).
PEAKS = [  # (substring of torch.cuda.get_device_name, {dtype: dense FLOP/s}, source)
    ("H200", {"bfloat16": 989.4e12, "float16": 989.4e12}, "NVIDIA H200 datasheet (SXM), dense = half the sparse figure"),
    ("H100 PCIe", {"bfloat16": 756.5e12, "float16": 756.5e12}, "NVIDIA H100 datasheet (PCIe), dense = half the sparse figure"),
    ("H100", {"bfloat16": 989.4e12, "float16": 989.4e12}, "NVIDIA H100 datasheet (SXM), dense = half the sparse figure"),
    ("A100", {"bfloat16": 312e12, "float16": 312e12}, "NVIDIA A100 datasheet, dense BF16/FP16 tensor core"),
    ("L4", {"bfloat16": 121e12, "float16": 121e12}, "NVIDIA L4 datasheet, dense = half the sparse figure"),
    ("T4", {"float16": 65e12}, "NVIDIA T4 datasheet, FP16 mixed precision (no BF16 tensor cores)"),
]


def peak_for(gpu_name: str, dtype: str) -> tuple[float | None, str]:
    """The dense peak for ``dtype`` (``"bfloat16"``, ``"float16"``) on the GPU named ``gpu_name``, and its source.

    ``(None, reason)`` for a GPU not in :data:`PEAKS`: the share of peak is then left out, not guessed."""
    for key, peaks, source in PEAKS:
        if key.lower() in gpu_name.lower():
            if dtype in peaks:
                return peaks[dtype], source
            return None, f"{source}: no {dtype} figure"
    return None, f"{gpu_name!r} is not in benchmarks/_record.py's PEAKS table"


class Record:
    """``Record(path, header)``: ``add(section, row)`` appends a row and saves; ``finish(**summary)`` closes it."""

    def __init__(self, path: Path, header: dict):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = {**header, "complete": False}
        self.save()
        self._old = signal.signal(signal.SIGTERM, self._on_term) if _main_thread() else None

    def _on_term(self, signum, frame):
        self.data["interrupted"] = f"signal {signum} (SIGTERM): the rows above finished, the rest did not run"
        self.save()
        print(f"interrupted: wrote {self.path} with what finished", flush=True)
        # os._exit, not sys.exit: SystemExit is raised wherever the main thread happens to be, and code that catches
        # BaseException there (autograd calling a Python backward, Triton's interpreter) can swallow it, so that the
        # run went on and exited 0 (a flaky test_sigterm_midway_keeps_the_finished_results). The record is saved.
        sys.stderr.flush()
        os._exit(128 + signum)

    def add(self, section: str, row: dict) -> dict:
        self.data.setdefault(section, []).append(row)
        self.save()
        return row

    def set(self, **fields) -> None:
        self.data.update(fields)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)

    def finish(self, **summary) -> Path:
        self.data.update(summary, complete=True)
        self.save()
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        print(f"wrote {self.path}", flush=True)
        return self.path


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
