"""`make times`: each notebook's wall time and the kernel's peak memory are measured and recorded."""
from __future__ import annotations

import json

import nbformat
import pytest

from course_utils.devtools.notebook_times import run_times, time_notebook

pytestmark = pytest.mark.slow


def test_times_and_peak_memory_are_measured(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("import time; time.sleep(0.5)"),
        nbformat.v4.new_code_cell("block = bytearray(300 * 2**20)  # touch 300 MB"),
        nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]}),
    ]
    path = tmp_path / "toy.ipynb"
    nbformat.write(nb, path)
    row = time_notebook(path)
    assert row["seconds"] >= 0.5
    assert row["peak_rss_mb"] >= 300
    assert row["unexpected_errors"] == 0

    nb.cells[2].metadata = {}
    nbformat.write(nb, path)
    out = tmp_path / "times.json"
    result = run_times([path], out)
    assert result["notebooks"][0]["unexpected_errors"] == 1
    recorded = json.loads(out.read_text())
    assert recorded["recorded_on"]["cpu_count"] >= 1 and "torch" in recorded["recorded_on"]
    assert "unexpected errors" in capsys.readouterr().out
