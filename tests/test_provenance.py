"""course_utils.provenance: every recorded result names its machine, its software and the course's commit."""
from __future__ import annotations

import datetime as dt
import platform
import re
import subprocess

import numpy
import torch

from course_utils import provenance
from course_utils.paths import BENCHMARK_RESULTS, ROOT


def test_machine_info_names_the_machine_the_versions_the_commit_and_a_utc_date(monkeypatch):
    monkeypatch.setenv("COURSE_TIER", "cpu")
    info = provenance.machine_info(threads=2, extra={"benchmark": "unit"})
    assert info["machine"] == platform.machine() and info["cpu"] == provenance.cpu_model() and info["cpu"]
    assert info["numpy"] == numpy.__version__ and info["torch"] == torch.__version__ and info["tier"] == "cpu"
    assert info["threads_used"] == 2 and info["benchmark"] == "unit"
    when = dt.datetime.fromisoformat(info["date"])
    assert when.utcoffset() == dt.timedelta(0) and abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 600


def test_course_commit_is_head_and_says_when_the_tree_is_dirty():
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    commit = provenance.course_commit()
    if head.returncode != 0:  # not a checkout (an installed wheel): nothing to name
        assert commit is None
        return
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", commit) and commit.startswith(head.stdout.strip())
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True)
    assert commit.endswith("+dirty") == bool(dirty.stdout.strip())


def test_course_commit_outside_a_checkout_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    assert provenance.course_commit() is None


def test_results_path_is_dated_and_never_overwrites(tmp_path):
    first = provenance.results_path("bench", folder=tmp_path)
    assert re.fullmatch(r"bench_\d{4}-\d{2}-\d{2}\.json", first.name) and first.parent == tmp_path
    first.write_text("{}")
    second = provenance.results_path("bench", folder=tmp_path)
    assert second != first and re.fullmatch(r"bench_\d{4}-\d{2}-\d{2}_\d{6}\.json", second.name)
    assert provenance.results_path("bench").parent == BENCHMARK_RESULTS


def test_gpu_driver_without_nvidia_smi_is_unknown(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert provenance.gpu_driver() == "unknown"
