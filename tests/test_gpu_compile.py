"""course_utils.gpu_compile: kernels compiled for sm_75/80/90 on a machine without a GPU."""
from __future__ import annotations

import pytest

from course_utils.env import import_triton

pytest.importorskip("triton")
triton, tl = import_triton()
gc = pytest.importorskip("course_utils.gpu_compile")


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def _tile_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :])
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(tl.float16))


MATMUL_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
              "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
              "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
DIVISIBLE = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"]


def matmul(arch, **kw):
    return gc.compile_for(_tile_matmul, arch=arch, signature=MATMUL_SIG, divisible=DIVISIBLE,
                          constexprs={"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, **kw)


def test_a_simple_kernel_compiles_for_every_arch_and_reports_resources():
    for arch in (75, 80, 90):
        c = gc.compile_for(_scale, arch=arch, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                           constexprs={"BLOCK": 1024}, divisible=["x_ptr", "y_ptr", "n"])
        assert 0 < c.registers <= 255 and not c.spills and c.shared_bytes == 0
        assert c.blocks_per_sm >= 1 and 0 < c.occupancy <= 1
        assert f"sm_{arch}" in c.ptx and "ld.global" in c.ptx and c.sass


def test_a_tile_matmul_uses_mma_sync_on_ampere_and_wgmma_on_hopper():
    ampere, hopper = matmul(80, num_warps=4, num_stages=3), matmul(90, num_warps=4, num_stages=3)
    assert ampere.has("mma.sync") and not ampere.has("wgmma")
    assert ampere.has("cp.async")                                  # pipelined pointer loads on Ampere
    assert hopper.has("wgmma") and not hopper.has("tma")           # plain pointers: no TMA, even on Hopper
    assert "wgmma" in hopper.excerpt(r"wgmma\.mma_async", context=2)


def test_more_stages_need_more_shared_memory():
    two, four = matmul(80, num_stages=2), matmul(80, num_stages=4)
    assert four.shared_bytes > two.shared_bytes


def test_shared_memory_over_the_block_limit_is_reported():
    big = gc.compile_for(_tile_matmul, arch=80, signature=MATMUL_SIG, divisible=DIVISIBLE, num_stages=5, num_warps=8,
                         constexprs={"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64})
    assert big.shared_bytes > gc.ARCH_LIMITS[80]["smem_per_block"] and not big.fits_shared_memory


def test_bad_arguments_get_one_line_errors():
    with pytest.raises(ValueError, match="give a type for"):
        gc.compile_for(_scale, arch=90, signature={"x_ptr": "*fp32"})
    with pytest.raises(ValueError, match="arch 61 unknown"):
        gc.compile_for(_scale, arch=61, signature={})


def test_several_archs_in_one_helper_process():
    both = gc.compile_for_each(_tile_matmul, (80, 90), signature=MATMUL_SIG, divisible=DIVISIBLE,
                               constexprs={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=2)
    assert both[80].has("mma.sync") and both[90].has("wgmma") and both[80].arch == 80
