"""Tests of course_utils.gemm_models: the NumPy rungs and the models lesson 05 derives by hand."""
from __future__ import annotations

import numpy as np
import pytest

from course_utils import gemm_models as GM


def test_numpy_rungs():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((9, 13)).astype(np.float32), rng.standard_normal((13, 7)).astype(np.float32)
    np.testing.assert_allclose(GM.matmul_naive(a, b), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(GM.matmul_tiled_numpy(a, b, 4, 2, 5), a @ b, rtol=1e-5, atol=1e-5)


def test_intensity_and_roofline():
    assert GM.gemm_flops(2, 3, 4) == 48
    assert GM.gemm_min_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2
    assert GM.roofline_bound(1, 4096, 4096, 2, 1e15, 4e12)[1] == "memory"
    assert GM.roofline_bound(8192, 8192, 8192, 2, 1e15, 4e12) == (1e15, "compute")


def test_grouped_order_is_a_permutation_and_group_1_is_row_major():
    for pm, pn, g in [(7, 5, 3), (8, 4, 8), (3, 9, 1)]:
        order = GM.tile_order(pm, pn, g)
        assert sorted(order.ravel()) == list(range(pm * pn))
    np.testing.assert_array_equal(GM.tile_order(3, 4, 1), np.arange(12).reshape(3, 4))
    assert GM.tile_order(5, 4, 2)[:2, 0].tolist() == [0, 1]  # walks down the group first


def test_panel_loads_model():
    assert GM.panel_loads(32, 32, 1, 128) == (32, 256)   # 4 rows x all 32 columns per wave
    assert GM.panel_loads(32, 32, 8, 128) == (64, 128)   # 8 rows x 16 columns per wave
    assert GM.panel_loads(4, 4, 1, 16) == (4, 4)         # one wave: every panel read once


def test_pipeline_model():
    end = lambda s, l=1.0, c=0.6, lat=0.0: max(e.end for e in GM.pipeline_timeline(8, l, c, s, lat))  # noqa: E731
    assert end(1) == pytest.approx(8 * 1.6)             # nothing overlaps
    assert end(2) == pytest.approx(8 * 1.0 + 0.6)       # load-bound: loads back to back, then the last MMA
    assert end(3, 0.6, 1.0) == pytest.approx(0.6 + 8 * 1.0)  # MMA-bound
    assert end(1, 0.4, 0.6, 1.0) == pytest.approx(8 * 2.0)    # latency adds to every step without overlap
    assert end(4, 0.4, 0.6, 1.0) == pytest.approx(1.4 + 8 * 0.6)  # enough stages hide the latency
    for e in GM.pipeline_timeline(6, 1.0, 0.5, 2):
        assert e.end > e.start
    with pytest.raises(ValueError):
        GM.pipeline_timeline(4, 1.0, 1.0, 0)


def test_swizzle_and_bank_conflicts():
    addr = np.arange(0, 1024, 16)
    np.testing.assert_array_equal(GM.swizzle(addr, 0), addr)
    for mode in (32, 64, 128):
        out = GM.swizzle(addr, mode)
        assert sorted(out.tolist()) == addr.tolist()      # a permutation
        np.testing.assert_array_equal(out >> 7, addr >> 7)  # stays in its 128-byte line
    assert GM.swizzle(np.array([128 + 0]), 128)[0] == 128 + 16
    with pytest.raises(ValueError):
        GM.swizzle(addr, 16)
    assert GM.wavefronts(np.arange(8) * 16) == 1           # 128 contiguous bytes
    assert GM.wavefronts(np.arange(8) * 128) == 8          # one column of a 128-byte-pitch tile
    assert GM.wavefronts(np.zeros(32, dtype=int), 4) == 1  # a broadcast
    table = GM.conflict_table()
    assert table["rowmajor"] == {"row": 1, "column": 8}
    assert table[128] == {"row": 1, "column": 1}
    assert table[0]["row"] == 8 and table[32]["row"] == 4 and table[64]["row"] == 2
