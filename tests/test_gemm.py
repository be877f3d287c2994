"""Tests of course_utils.gemm (launchers) and course_utils.gemm_kernels (the Triton kernels they
launch), and of the GPU benchmark's dry run. On a CPU every kernel runs in Triton's interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from course_utils.paths import ROOT
from course_utils import gemm as G
from course_utils import gemm_kernels as GK


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


def test_persistent_kernel_with_fewer_programs_than_tiles():
    torch.manual_seed(1)
    a, b = torch.randn(70, 40), torch.randn(40, 90)
    torch.testing.assert_close(G.matmul_persistent(a, b, num_programs=3), a @ b, rtol=1e-5, atol=1e-5)


def test_descriptor_rejects_unaligned_strides():
    with pytest.raises(ValueError, match="16 bytes"):
        G.matmul_descriptor(torch.randn(8, 45), torch.randn(45, 8))


def test_launchers_reject_small_blocks_and_16_bit_inputs_in_the_interpreter():
    with pytest.raises(ValueError, match=">= 16"):
        G.matmul_tiled(torch.randn(8, 8), torch.randn(8, 8), G.Config(block_k=8))
    if G.interpreted():
        with pytest.raises(TypeError, match="float32"):
            G.matmul_tiled(torch.randn(8, 8).bfloat16(), torch.randn(8, 8).bfloat16())


def test_tier_comes_from_env():
    from course_utils.env import detect_tier

    assert G.TIER == detect_tier()
    assert G.interpreted() == (G.TIER == "cpu")


def test_kernels_are_jitted():
    for kernel in (GK.matmul_kernel, GK.matmul_persistent_kernel, GK.matmul_descriptor_kernel,
                   GK.matmul_descriptor_persistent_kernel, GK.grouped_pid):
        assert hasattr(kernel, "fn")


def test_warp_specialize_availability_reports_a_reason():
    ok, why = G.warp_specialize_available()
    assert isinstance(ok, bool) and why


def test_wgmma_in_ptx_is_none_without_a_compiled_kernel():
    assert G.wgmma_in_ptx(object()) is None
    assert G.wgmma_in_ptx(type("K", (), {"asm": {"ptx": "wgmma.mma_async.sync"}})()) is True


def test_gpu_benchmark_dry_run_checks_every_variant():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gemm_gpu.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COURSE_TIER": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    for name in G.VARIANTS:                      # the CPU configuration, then every GPU configuration the benchmark times
        assert re.search(rf"{re.escape(name)}\s+cpu default\s+ok", out.stdout), out.stdout
        for cfg in G.gpu_configs(name, 90):
            label = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} g{cfg.group_m} s{cfg.num_stages} w{cfg.num_warps}"
            assert re.search(rf"{re.escape(name)}\s+{label}\s+ok", out.stdout), (name, label)
    assert "GPU timing needs a CUDA device" in out.stdout
    assert "FAILED" not in out.stdout


def test_the_modules_import_without_triton_and_a_launch_says_why_not():
    code = ("import torch\nfrom course_utils import gemm as G, gemm_models, gemm_kernels\nfrom course_utils.grading import gemm\n"
            "from course_utils.env import TritonUnavailable\nassert not G.HAS_TRITON and G.warp_specialize_available()[0] is False\n"
            "try:\n    G.matmul_tiled(torch.randn(4, 4), torch.randn(4, 4))\nexcept TritonUnavailable:\n    print('notice')\n")
    path = os.pathsep.join([str(ROOT / "tests" / "no_triton"), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0 and "notice" in out.stdout, out.stderr[-2000:]
