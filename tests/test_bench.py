"""Timing, counters, ceilings, the ladder table and its plots."""
from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_utils import bench  # noqa: E402


def test_time_cpu_warms_up_and_repeats():
    calls = []
    timing = bench.time_cpu(lambda: calls.append(1), warmup=2, repeats=4)
    assert len(calls) == 6 and len(timing.times) == 4
    assert timing.best <= timing.median


def test_time_cpu_stops_early_on_slow_functions():
    timing = bench.time_cpu(lambda: time.sleep(0.02), warmup=0, repeats=100, max_seconds=0.05)
    assert 1 <= len(timing.times) < 10
    assert timing.median >= 0.02


def test_counters_and_units():
    assert bench.matmul_flops(2, 3, 4) == 48
    assert bench.matmul_bytes(2, 3, 4, 4) == (8 + 12 + 6) * 4
    assert bench.conv1d_flops(1, 1, 1, 10, 3) == 60
    assert bench.conv2d_flops(1, 4, 8, 5, 5, 3, 3, groups=2) == 2 * 8 * 25 * 2 * 9
    assert bench.gflops(2e9, 2.0) == 1.0 and bench.gbps(3e9, 1.5) == 2.0
    assert bench.format_seconds(0.00123) == "1.23 ms" and bench.format_seconds(2.5) == "2.5 s"


def test_measure_ceilings_is_positive_and_cached():
    c = bench.measure_ceilings("cpu", size=256)
    assert c.peak_gflops > 0 and c.bandwidth_gbps > 0 and c.ridge_intensity() > 0
    assert bench.measure_ceilings("cpu", size=256) is c


def test_ladder_table_and_plots():
    ladder = bench.Ladder("toy")
    ladder.add("python loops", 1.0, flops=1e6, nbytes=1e6)
    ladder.add("numpy", bench.Timing((0.01, 0.02, 0.03)), flops=1e6, nbytes=1e6)
    ladder.add("torch reference", 0.005, flops=1e6, nbytes=1e5)
    text = ladder.table(reference="torch reference")
    assert "python loops" in text and "50x" in text.replace(" ", "")  # numpy: 1.0 / 0.02
    assert "GFLOP/s" in text and "GFLOP/s" not in bench.Ladder("no counts", [bench.Rung("a", 1.0)]).table()
    ladder.add("numpy", 0.04)  # re-timing a rung replaces it
    assert [r.name for r in ladder.rungs] == ["python loops", "torch reference", "numpy"]
    ax = bench.plot_ladder(ladder)
    assert len(ax.patches) == 3 and ax.get_xscale() == "log"
    low, high = ax.get_xlim()
    assert low <= min(r.seconds for r in ladder.rungs) / 3 and high >= max(r.seconds for r in ladder.rungs)
    ceil = bench.Ceilings("cpu", "float32", peak_gflops=100.0, bandwidth_gbps=10.0, how="test")
    ax = bench.plot_roofline(ladder, ceil)
    assert len(ax.collections) == 2  # the two rungs with FLOPs and bytes
    plt.close("all")
    with pytest.raises(ValueError, match="metric"):
        bench.plot_ladder(ladder, metric="speed")


def test_single_thread_limits_torch_and_restores():
    import torch

    before = torch.get_num_threads()
    with bench.single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with bench.single_thread():
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
