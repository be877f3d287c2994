"""Tests of course_utils.gemm: the kernels and models the lesson imports, every exercise check, and
the GPU benchmark's dry run.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers (wrong kernels are one test kernel with a
``MISTAKE`` switch, run under the Triton interpreter on the CPU).
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from course_utils import gemm as G
from course_utils.checks import NotAttempted
from conftest import ROOT, fails_with, stub  # noqa: E402

import triton  # noqa: E402  (after course_utils.gemm chose the interpreter on a CPU)
import triton.language as tl  # noqa: E402


# ---------------------------------------------------------------- helpers the lesson imports
@pytest.mark.parametrize("variant", list(G.VARIANTS))
@pytest.mark.parametrize("m,n,k", [(50, 40, 68), (33, 16, 20)])
def test_every_variant_matches_torch_on_ragged_shapes(variant, m, n, k):
    torch.manual_seed(m + n + k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.testing.assert_close(G.VARIANTS[variant](a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_tiled_kernel_respects_strides():
    torch.manual_seed(0)
    a = torch.randn(40, 70)[:, 3:53]          # (40, 50), row stride 70
    b = torch.randn(36, 50).t()               # (50, 36), column-major
    torch.testing.assert_close(G.matmul_tiled(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_descriptor_rejects_unaligned_strides():
    with pytest.raises(ValueError, match="16 bytes"):
        G.matmul_descriptor(torch.randn(8, 45), torch.randn(45, 8))


def test_launchers_reject_small_blocks():
    with pytest.raises(ValueError, match=">= 16"):
        G.matmul_tiled(torch.randn(8, 8), torch.randn(8, 8), G.Config(block_k=8))


def test_numpy_rungs():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((9, 13)).astype(np.float32), rng.standard_normal((13, 7)).astype(np.float32)
    np.testing.assert_allclose(G.matmul_naive(a, b), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(G.matmul_tiled_numpy(a, b, 4, 2, 5), a @ b, rtol=1e-5, atol=1e-5)


def test_intensity_and_roofline():
    assert G.gemm_flops(2, 3, 4) == 48
    assert G.gemm_min_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2
    assert G.roofline_bound(1, 4096, 4096, 2, 1e15, 4e12)[1] == "memory"
    assert G.roofline_bound(8192, 8192, 8192, 2, 1e15, 4e12) == (1e15, "compute")


def test_grouped_order_is_a_permutation_and_group_1_is_row_major():
    for pm, pn, g in [(7, 5, 3), (8, 4, 8), (3, 9, 1)]:
        order = G.tile_order(pm, pn, g)
        assert sorted(order.ravel()) == list(range(pm * pn))
    np.testing.assert_array_equal(G.tile_order(3, 4, 1), np.arange(12).reshape(3, 4))
    assert G.tile_order(5, 4, 2)[:2, 0].tolist() == [0, 1]  # walks down the group first


def test_panel_loads_model():
    assert G.panel_loads(32, 32, 1, 128) == (32, 256)   # 4 rows x all 32 columns per wave
    assert G.panel_loads(32, 32, 8, 128) == (64, 128)   # 8 rows x 16 columns per wave
    assert G.panel_loads(4, 4, 1, 16) == (4, 4)         # one wave: every panel read once


def test_pipeline_model():
    end = lambda s, l=1.0, c=0.6, lat=0.0: max(e.end for e in G.pipeline_timeline(8, l, c, s, lat))  # noqa: E731
    assert end(1) == pytest.approx(8 * 1.6)             # nothing overlaps
    assert end(2) == pytest.approx(8 * 1.0 + 0.6)       # load-bound: loads back to back, then the last MMA
    assert end(3, 0.6, 1.0) == pytest.approx(0.6 + 8 * 1.0)  # MMA-bound
    assert end(1, 0.4, 0.6, 1.0) == pytest.approx(8 * 2.0)    # latency adds to every step without overlap
    assert end(4, 0.4, 0.6, 1.0) == pytest.approx(1.4 + 8 * 0.6)  # enough stages hide the latency
    for e in G.pipeline_timeline(6, 1.0, 0.5, 2):
        assert e.end > e.start


def test_swizzle_and_bank_conflicts():
    addr = np.arange(0, 1024, 16)
    np.testing.assert_array_equal(G.swizzle(addr, 0), addr)
    for mode in (32, 64, 128):
        out = G.swizzle(addr, mode)
        assert sorted(out.tolist()) == addr.tolist()      # a permutation
        np.testing.assert_array_equal(out >> 7, addr >> 7)  # stays in its 128-byte line
    assert G.swizzle(np.array([128 + 0]), 128)[0] == 128 + 16
    assert G.wavefronts(np.arange(8) * 16) == 1           # 128 contiguous bytes
    assert G.wavefronts(np.arange(8) * 128) == 8          # one column of a 128-byte-pitch tile
    table = G.conflict_table()
    assert table["rowmajor"] == {"row": 1, "column": 8}
    assert table[128] == {"row": 1, "column": 1}
    assert table[0]["row"] == 8 and table[32]["row"] == 4 and table[64]["row"] == 2


def test_warp_specialize_availability_reports_a_reason():
    ok, why = G.warp_specialize_available()
    assert isinstance(ok, bool) and why


def test_wgmma_in_ptx_is_none_without_a_compiled_kernel():
    assert G.wgmma_in_ptx(object()) is None
    assert G.wgmma_in_ptx(type("K", (), {"asm": {"ptx": "wgmma.mma_async.sync"}})()) is True


# ---------------------------------------------------------------- the kernel exercises (C = X @ W^T)
@triton.jit
def linear_kernel(x_ptr, w_ptr, c_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MISTAKE: tl.constexpr = ""):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if MISTAKE == "fp16 accumulator":
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    steps = K // BLOCK_K if MISTAKE == "drop remainder" else tl.cdiv(K, BLOCK_K)
    for s in range(0, steps):
        kk = s * BLOCK_K + offs_k
        if MISTAKE == "swap x strides":
            x_off = offs_m[:, None] * stride_xk + kk[None, :] * stride_xm
        else:
            x_off = offs_m[:, None] * stride_xm + kk[None, :] * stride_xk
        if MISTAKE == "swap w strides":  # the lesson's (K, N) pointer formula applied to a (N, K) matrix
            w_off = kk[:, None] * stride_wn + offs_n[None, :] * stride_wk
        else:
            w_off = kk[:, None] * stride_wk + offs_n[None, :] * stride_wn
        k_bound = K + BLOCK_K if MISTAKE == "no k mask" else K
        x = tl.load(x_ptr + x_off, mask=(offs_m[:, None] < M) & (kk[None, :] < k_bound), other=0.0)
        w = tl.load(w_ptr + w_off, mask=(kk[:, None] < k_bound) & (offs_n[None, :] < N), other=0.0)
        if MISTAKE == "fp16 accumulator":
            acc = (acc.to(tl.float32) + tl.dot(x.to(tl.float16), w.to(tl.float16), out_dtype=tl.float32)).to(tl.float16)
        else:
            acc = tl.dot(x, w, acc, input_precision="ieee")
    if MISTAKE == "store mask axes":
        mask = (offs_m[:, None] < N) & (offs_n[None, :] < M)
    elif MISTAKE == "no store mask":
        mask = (offs_m[:, None] < M + BLOCK_M) & (offs_n[None, :] < N + BLOCK_N)  # always true: stores whole tiles
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(tl.float32), mask=mask)


def with_mistake(kernel, mistake):
    """The kernel with its MISTAKE switch bound (the check launches ``kernel[grid](...)``)."""
    class Bound:
        def __getitem__(self, grid):
            return lambda *args, **kw: kernel[grid](*args, **kw, MISTAKE=mistake)
    return Bound()


@triton.jit
def linear_stub(x_ptr, w_ptr, c_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    raise NotImplementedError("Exercise not attempted yet: replace this line with your code.")


def test_check_linear_kernel_passes_reference(capsys):
    G.check_linear_kernel(linear_kernel)
    assert "✅" in capsys.readouterr().out


def test_check_linear_kernel_stub():
    with pytest.raises(NotAttempted):
        G.check_linear_kernel(linear_stub)


@pytest.mark.parametrize("mistake,fragment", [
    ("drop remainder", "K remainder was dropped"),
    ("no k mask", "read past K"),
    ("swap x strides", "X's strides are swapped"),
    ("swap w strides", "W's strides are swapped"),
    ("store mask axes", "store mask is on the wrong axes"),
    ("no store mask", "stored outside it"),
    ("fp16 accumulator", "accumulator is in low precision"),
])
def test_check_linear_kernel_names_mistakes(mistake, fragment):
    fails_with(G.check_linear_kernel, with_mistake(linear_kernel, mistake), fragment)


@triton.jit
def bias_kernel(x_ptr, w_ptr, c_ptr, bias_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MISTAKE: tl.constexpr = ""):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk, mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + kk[:, None] * stride_wk + offs_n[None, :] * stride_wn, mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")
        if MISTAKE == "bias in loop":
            acc += bias[None, :]
    if MISTAKE == "activation first":
        acc = tl.where(acc > 0, acc, 0.1 * acc) + bias[None, :]
    elif MISTAKE == "relu":
        acc = tl.maximum(acc + bias[None, :], 0.0)
    elif MISTAKE == "bias in loop":
        acc = tl.where(acc > 0, acc, 0.1 * acc)
    else:
        acc = acc + bias[None, :]
        acc = tl.where(acc > 0, acc, 0.1 * acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def bias_stub(x_ptr, w_ptr, c_ptr, bias_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    raise NotImplementedError("Exercise not attempted yet: replace this line with your code.")


def test_check_bias_kernel(capsys):
    G.check_linear_bias_leaky_kernel(bias_kernel)
    assert "✅" in capsys.readouterr().out
    with pytest.raises(NotAttempted):
        G.check_linear_bias_leaky_kernel(bias_stub)
    fails_with(G.check_linear_bias_leaky_kernel, with_mistake(bias_kernel, "bias in loop"), "inside the K loop")
    fails_with(G.check_linear_bias_leaky_kernel, with_mistake(bias_kernel, "activation first"), "before the bias")
    fails_with(G.check_linear_bias_leaky_kernel, with_mistake(bias_kernel, "relu"), "plain ReLU")


def test_kernel_check_rejects_a_plain_function():
    fails_with(G.check_linear_kernel, lambda *a: None, "@triton.jit")


# ---------------------------------------------------------------- the NumPy exercises
def test_check_grouped_tile_n():
    G.check_grouped_tile_n(G.grouped_tile_n, quiet=True)
    with pytest.raises(NotAttempted):
        G.check_grouped_tile_n(stub)
    fails_with(G.check_grouped_tile_n, lambda pid, pm, pn, g: (pid // pn, pid % pn), "row-major")
    fails_with(G.check_grouped_tile_n, lambda pid, pm, pn, g: G.grouped_tile(pid, pm, pn, g), "groups along M")
    fails_with(G.check_grouped_tile_n, lambda pid, pm, pn, g: ((pid % (g * pm)) // g, (pid // (g * pm)) * g + (pid % (g * pm)) % g), "narrower")
    fails_with(G.check_grouped_tile_n, lambda pid, pm, pn, g: G.grouped_tile_n(pid, pm, pn, g)[::-1], "swapped")


def test_grouped_tile_n_walks_columns_first():
    pm, pn = G.grouped_tile_n(np.arange(6), 3, 4, 2)
    assert list(zip(pm.tolist(), pn.tolist()))[:3] == [(0, 0), (0, 1), (1, 0)]


def test_check_smem_address():
    ref = lambda r, c, rows, mode: G.smem_layout_addresses(rows, 128, mode)[r, c]  # noqa: E731
    G.check_smem_address(ref, quiet=True)
    with pytest.raises(NotAttempted):
        G.check_smem_address(stub)
    fails_with(G.check_smem_address, lambda r, c, rows, mode: G.swizzle(r * 128 + c * 16, mode), "not cut into atoms")
    unswizzled = lambda r, c, rows, mode: (c // (mode // 16)) * rows * mode + r * mode + (c % (mode // 16)) * 16  # noqa: E731
    fails_with(G.check_smem_address, unswizzled, "swizzle is missing")
    fails_with(G.check_smem_address, lambda r, c, rows, mode: G.swizzle(unswizzled(r, c, rows, mode), 128), "same mode")


def test_check_wavefronts():
    G.check_wavefronts(G.wavefronts, quiet=True)
    with pytest.raises(NotAttempted):
        G.check_wavefronts(stub)
    words = lambda a, acc: (np.asarray(a)[:, None] // 4 + np.arange(acc // 4)).ravel()  # noqa: E731
    fails_with(G.check_wavefronts, lambda a, acc: int(np.bincount(words(a, acc) % 32).max()), "broadcast")
    fails_with(G.check_wavefronts, lambda a, acc: int(np.unique(words(a, acc) % 32).size), "distinct banks")
    fails_with(G.check_wavefronts, lambda a, acc: int(np.bincount(np.unique((np.asarray(a)[:, None] + 4 * np.arange(acc // 4)).ravel()) % 32).max()), "4 bytes wide")


def test_check_roofline_bound():
    G.check_roofline_bound(lambda *a: G.roofline_bound(*a)[0], quiet=True)
    with pytest.raises(NotAttempted):
        G.check_roofline_bound(stub)
    fails_with(G.check_roofline_bound, lambda m, n, k, s, p, bw: min(p, m * n * k / G.gemm_min_bytes(m, n, k, s) * bw), "2 FLOPs")
    fails_with(G.check_roofline_bound, lambda m, n, k, s, p, bw: G.gemm_intensity(m, n, k, s) * bw, "min(peak")
    fails_with(G.check_roofline_bound, lambda m, n, k, s, p, bw: min(p, 2 * m * n * k / ((m * k + k * n) * s) * bw), "C must be written")


# ---------------------------------------------------------------- the benchmark's dry run
def test_gpu_benchmark_dry_run_checks_every_variant():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gemm_gpu.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    for name in G.VARIANTS:
        assert f"{name:<21} ok" in out.stdout, out.stdout
    assert "GPU timing needs a CUDA device" in out.stdout
    assert "FAILED" not in out.stdout
