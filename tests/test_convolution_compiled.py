"""Tests of course_utils.convolution_machine (the CPU model) and course_utils.convolution_compiled (the compiled Goto
GEMM and convolutions of lesson 03, sections 6 and 7): flags to ISA, the register budget of eq. (8), the peak of
eq. (7), the VM cache sanity check, and every compiled rung against np.matmul / F.conv2d on ragged shapes."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import convolution_compiled as cc
from course_utils import convolution_machine as mach

rng = np.random.default_rng(0)


def test_vector_isa_from_flags():
    spr = mach.vector_isa({"avx2", "fma", "avx512f", "amx_tile", "avx512_fp16"})
    assert (spr["fp32_lanes"], spr["registers"], spr["fma_units"]) == (16, 32, 2)
    assert mach.vector_isa({"avx2", "fma", "avx512f"})["fma_units"] == 1
    assert mach.vector_isa({"avx2", "fma"})[("fp32_lanes")] == 8
    assert mach.vector_isa({"asimd"})["isa"] == "NEON"
    assert mach.vector_isa(set())["isa"] == "SSE"


def test_register_tile_fits_the_registers():
    assert mach.register_tile_shape(32, 16) == (6, 64)                  # AVX-512: 24 + 4 + 1 = 29 <= 32
    assert mach.register_tile_shape(16, 8, nr_vectors=2) == (6, 16)     # AVX2's classic 6 x 16
    for regs, lanes in ((32, 16), (16, 8), (32, 4)):
        mr, nr = mach.register_tile_shape(regs, lanes)
        assert mr * nr // lanes + nr // lanes + 1 <= regs < (mr + 1) * nr // lanes + nr // lanes + 1


def test_derived_peak():
    assert mach.derived_peak_gflops(2, 16, 2, 3.0) == pytest.approx(384.0)


def test_measured_clock_is_plausible():
    assert 0.5 < mach.measure_clock_ghz(n=2_000_000, repeats=3) < 7.0


def test_sane_caches_replaces_a_host_l3():
    vm = {"L1d": 48 << 10, "L2": 2 << 20, "L3": 480 << 20, "source": "sysfs"}
    fixed = mach.sane_caches(vm, cores=2)
    assert fixed["L3"] == 2 * mach.MAX_L3_PER_CORE and "host" in fixed["L3_note"]
    laptop = {"L1d": 32 << 10, "L2": 1 << 20, "L3": 8 << 20, "source": "sysfs"}
    assert mach.sane_caches(laptop, cores=4) == dict(laptop, L3_note="as reported")


def test_aligned_empty_is_cache_line_aligned():
    for shape in ((3, 5), (7, 256, 64), (1,)):
        a = cc.aligned_empty(shape)
        assert a.shape == shape and a.dtype == np.float32 and a.ctypes.data % 64 == 0 and a.flags.c_contiguous


@pytest.mark.parametrize("gemm", [cc.gemm_compiled, cc.gemm_compiled_parallel])
def test_gemm_matches_matmul_on_ragged_shapes(gemm):
    for m, k, n in ((1, 1, 1), (37, 300, 145), (cc.MR, 17, cc.NR), (70, 64, 130)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        for blocks in ({}, dict(mc=cc.MR, kc=16, nc=cc.NR), dict(mc=2 * cc.MR, kc=100, nc=3 * cc.NR)):
            np.testing.assert_allclose(gemm(a, b, **blocks), a @ b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        gemm(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))


def test_packing_layout():
    a = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    out = np.full((2, 5, cc.MR), -1.0, np.float32)
    cc.pack_a_into(a, 0, 0, 7, 5, out)
    np.testing.assert_array_equal(out[0], a[:cc.MR].T)                   # k-major micro-panel
    np.testing.assert_array_equal(out[1, :, :7 - cc.MR], a[cc.MR:].T)
    assert (out[1, :, 7 - cc.MR:] == 0).all()                            # zero padding past the edge
    b = np.arange(3 * (cc.NR + 2), dtype=np.float32).reshape(3, cc.NR + 2)
    outb = np.full((2, 3, cc.NR), -1.0, np.float32)
    cc.pack_b_into(b, 0, 0, 3, cc.NR + 2, outb)
    np.testing.assert_array_equal(outb[0], b[:, :cc.NR])
    np.testing.assert_array_equal(outb[1, :, :2], b[:, cc.NR:])
    assert (outb[1, :, 2:] == 0).all()


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (3, 0, 2)])
def test_convolutions_match_conv2d(stride, padding, dilation):
    x = rng.standard_normal((2, 5, 11, 9)).astype(np.float32)
    w = (rng.standard_normal((7, 5, 3, 2)) / np.sqrt(30)).astype(np.float32)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=padding, dilation=dilation).numpy()
    for got in (cc.conv2d_im2col_compiled(x, w, stride, padding, dilation),
                cc.conv2d_im2col_compiled(x, w, stride, padding, dilation, parallel=True),
                cc.conv2d_direct_compiled(x, w, stride, padding, dilation),
                cc.conv2d_direct_compiled(x, w, stride, padding, dilation, threads=1, mc=cc.MR, kc=16, nc=cc.NR)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_micro_kernel_is_vectorized_on_this_cpu():
    """The claim of eq. (8), in the assembly: on AVX-512 the k-loop's FMAs are on 512-bit registers."""
    if mach.vector_isa()["isa"] != "AVX-512":
        pytest.skip("not an AVX-512 CPU")
    import numba

    loops = numba.njit(fastmath={"contract"})(cc._gemm_loops.py_func)   # uncached, so its assembly can be read
    a = np.ones((8, 8), np.float32)
    c = np.zeros((8, 8), np.float32)
    loops(a, a, c, 6, 8, 64, cc.aligned_empty((2, 8, cc.MR)), cc.aligned_empty((1, 8, cc.NR)))
    asm = loops.inspect_asm(loops.signatures[0])
    assert len(re.findall(r"vfmadd\w*ps\s+[^\n]*zmm", asm)) >= cc.MR * cc.NR // 16
    assert "prefetcht0" in asm                                          # the C tile, before the k loop
    assert re.search(r"vaddps\s+[^\n]*zmm", asm)                        # the write-back through row views


def test_prefetch_is_a_hint_that_changes_nothing():
    import numba

    @numba.njit
    def summed(x):
        total = 0.0
        for i in range(x.shape[0]):
            mach.prefetch(x, i, 0)
            for j in range(x.shape[1]):
                total += x[i, j]
        return total

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert summed(x) == 66.0
    with pytest.raises(numba.core.errors.TypingError):
        numba.njit(lambda v: mach.prefetch(v, 0, 0))(np.zeros(4, np.float32))   # 2-D arrays only


def test_fma_throughput_loop_is_vectorized_and_below_the_derived_peak():
    isa = mach.vector_isa()
    rate, first = mach.fma_throughput_gflops(8, isa["fp32_lanes"], flops=2e7, repeats=3)
    if isa["isa"] == "AVX-512":
        assert re.search(r"vfmadd\w+ps\s+%zmm", first), first
    clock = mach.measure_clock_ghz(n=2_000_000, repeats=3)
    assert 0 < rate < 1.2 * mach.derived_peak_gflops(1, isa["fp32_lanes"], 2, clock)   # never above two FMA units
