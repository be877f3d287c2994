"""Tests of course_utils.convolution_blocking: cache sizes, Goto's block sizes, packing and the blocked GEMM (rung 4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import convolution_blocking as blk


def test_cache_sizes_reads_sysfs_layout_and_falls_back(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    got = blk.cache_sizes(tmp_path)
    assert got["L1d"] == 48 * 1024 and got["L2"] == 2 * 1024 ** 2
    assert got["L3"] == blk.FALLBACK_CACHES["L3"] and got["source"] == "sysfs, fallback for L3"
    missing = blk.cache_sizes(tmp_path / "nowhere")
    assert missing["source"] == "fallback" and missing["L1d"] == blk.FALLBACK_CACHES["L1d"]


def test_goto_block_sizes_fit_their_caches():
    caches = {"L1d": 32 * 1024, "L2": 1024 ** 2, "L3": 8 * 1024 ** 2}
    b = blk.goto_block_sizes(caches, itemsize=4, mr=8, nr=8)
    assert b["kc"] % 16 == 0 and (b["mr"] + b["nr"]) * b["kc"] * 4 <= caches["L1d"] // 2
    assert b["mc"] % 8 == 0 and b["mc"] * b["kc"] * 4 <= caches["L2"] // 2
    assert b["nc"] % 8 == 0 and b["nc"] * b["kc"] * 4 <= caches["L3"] // 2
    assert b == {"mc": 512, "kc": 256, "nc": 4096, "mr": 8, "nr": 8}


def test_packing_layout():
    a = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    pa = blk.pack_a(a, 2)  # (3 panels, kc=3, mr=2), zero-padded
    assert pa.shape == (3, 3, 2) and pa.flags.c_contiguous
    np.testing.assert_array_equal(pa[1], a[2:4].T)
    np.testing.assert_array_equal(pa[2], np.stack([a[4], np.zeros(3)], axis=1))
    pb = blk.pack_b(a.T, 2)  # (3, 5) -> (3 panels, 3, 2)
    np.testing.assert_array_equal(pb[0], a.T[:, :2])


@pytest.mark.parametrize("cfg", [dict(mc=16, kc=16, nc=16, mr=4, nr=4), dict(mc=8, kc=32, nc=24, mr=8, nr=8)])
def test_blocked_matmul_handles_ragged_edges(cfg):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((37, 53)), rng.standard_normal((53, 45))
    np.testing.assert_allclose(blk.blocked_matmul(a, b, **cfg), a @ b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError):
        blk.blocked_matmul(a, b.T)


@pytest.mark.parametrize("s,p,d", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_conv2d_blocked_matches_conv2d(s, p, d):
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 9, 8)), rng.standard_normal((4, 3, 3, 2))
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s, padding=p, dilation=d).numpy()
    got = blk.conv2d_blocked(x, w, s, p, d, mc=8, kc=16, nc=16, mr=4, nr=4)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
