"""Tests of course_utils.attention_triton: the Triton forward (interpreter on a CPU), its launcher, the
autograd.Function, and the GPU benchmark's dry run."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from course_utils import attention_triton as att


def lse_reference(q, k, causal):
    s = torch.from_numpy(q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.logsumexp(s, -1).numpy()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("l,d,bm,bn", [(40, 16, 16, 16), (72, 32, 32, 16), (50, 16, 16, 32)])
def test_triton_forward_matches_sdpa_on_ragged_lengths(causal, l, d, bm, bn):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, l, d) for _ in range(3))
    o, lse = att.flash_attention_triton(q, k, v, causal, block_m=bm, block_n=bn)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=causal), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), lse_reference(q.double().numpy(), k.double().numpy(), causal),
                               rtol=1e-5, atol=1e-5)


def test_triton_forward_cross_attention_and_every_block_shape():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 33, 32), torch.randn(1, 2, 70, 32), torch.randn(1, 2, 70, 32)  # L_q != L_k
    torch.testing.assert_close(att.flash_attention_triton(q, k, v)[0], F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)
    q, k, v = (torch.randn(1, 1, 70, 16) for _ in range(3))
    for bm, bn in ((16, 64), (64, 16), (32, 32)):  # the causal stage boundary rounds down to a key block
        torch.testing.assert_close(att.flash_attention_triton(q, k, v, True, block_m=bm, block_n=bn)[0],
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-5)


def test_triton_launcher_rejects_illegal_shapes():
    q = torch.randn(1, 1, 16, 16)
    with pytest.raises(ValueError):
        att.flash_attention_triton(q, q, q, block_m=8)  # tl.dot needs >= 16
    with pytest.raises(ValueError):
        att.flash_attention_triton(q[..., :12], q[..., :12], q[..., :12])  # head dim not a power of two
    with pytest.raises(TypeError):
        att.flash_attention_triton(q.bfloat16(), q.bfloat16(), q.bfloat16())  # interpreter bf16 is wrong


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_function_matches_autograd_of_naive(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 2, 40, 16)
    got = torch.autograd.grad(att.flash_attention(q, k, v, causal), (q, k, v), do)
    s = q @ k.transpose(-1, -2) / 4.0  # (1, 2, L, L), 1/sqrt(16)
    if causal:
        s = s.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf)
    want = torch.autograd.grad(torch.softmax(s, -1) @ v, (q, k, v), do)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    qd, kd, vd = (torch.randn(1, 1, 10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: att.flash_attention(a, b, c, causal, None, 4, 4), (qd, kd, vd))


def test_benchmark_dry_run_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_gpu.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("-> ok") == 4 and "MISMATCH" not in out.stdout
    assert "timing needs a CUDA GPU" in out.stdout






def test_forward_kernel_compiles_for_ampere_and_hopper_without_spills():
    """Causal bf16 at d=128: 64x64 tiles at 4 warps for sm_80 use mma.sync, 128x64 at 8 warps for sm_90 (the
    lesson's GPU cell and a benchmark config) wgmma; neither spills, both fit shared memory. 128x64 at 4 warps
    spills on sm_90 (a 128x128 fp32 accumulator over 128 threads)."""
    pytest.importorskip("course_utils.gpu_compile")
    ampere, hopper, hopper_4 = att.compile_attention_forward([
        dict(arch=80, block_m=64, num_warps=4), dict(arch=90, block_m=128, num_warps=8),
        dict(arch=90, block_m=128, num_warps=4)])
    assert ampere.has("mma.sync") and not ampere.has("wgmma") and ampere.has("cp.async")
    assert hopper.has("wgmma")
    for c in (ampere, hopper):
        assert not c.spills and c.fits_shared_memory, c.summary()
    assert hopper_4.spills, hopper_4.summary()
