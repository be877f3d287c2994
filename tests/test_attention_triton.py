"""Tests of course_utils.attention_triton and attention_triton_backward: the Triton forward and backward
(interpreter on a CPU), GQA/MQA, their launchers, the autograd.Function, compiling the kernels for
sm_80/sm_90, and the GPU benchmark's dry run."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils.paths import ROOT
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
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok, within") >= 8 and "MISMATCH" not in out.stdout
    assert "backward" in out.stdout and "GQA" in out.stdout
    assert "timing needs a CUDA GPU" in out.stdout


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,l,d,bm,bn", [(2, 2, 40, 16, 16, 16), (4, 2, 72, 32, 32, 16), (4, 1, 50, 16, 16, 32),
                                              (2, 2, 33, 16, 16, 64)])
def test_triton_backward_matches_sdpa_gqa_and_ragged(causal, hq, hkv, l, d, bm, bn):
    """Gradients of the Triton path (forward and backward kernels) against SDPA with enable_gqa, and against the
    backward kernels called directly on autograd-of-naive's forward state."""
    torch.manual_seed(0)
    q = torch.randn(1, hq, l, d, requires_grad=True)
    k, v = (torch.randn(1, hkv, l, d, requires_grad=True) for _ in range(2))
    do = torch.randn(1, hq, l, d)
    got = torch.autograd.grad(att.flash_attention(q, k, v, causal, None, bm, bn), (q, k, v), do)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True), (q, k, v), do)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=2e-5)


def test_triton_backward_gradcheck_float64():
    """float64: finite differences of the float64 forward against the Triton backward kernels (fast mode: a few
    random directions, since the interpreter is slow), GQA, causal and not."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 20, 16, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 20, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for causal in (False, True):
        assert torch.autograd.gradcheck(lambda a, b, c: att.flash_attention(a, b, c, causal), (q, k, v), fast_mode=True)


def test_triton_backward_kernels_skip_causal_tiles_and_sum_the_group():
    """The backward launcher alone: zero dO gives zero gradients; an MQA group's dK/dV is the sum of each query
    head's dK/dV computed separately."""
    from course_utils.attention_triton_backward import flash_attention_backward_triton as bwd

    torch.manual_seed(0)
    q, do = torch.randn(1, 3, 48, 16), torch.randn(1, 3, 48, 16)
    k, v = torch.randn(1, 1, 48, 16), torch.randn(1, 1, 48, 16)
    o, lse = att.flash_attention_triton(q, k, v, True)
    dq, dk, dv = bwd(q, k, v, o, lse, do, True)
    parts = [bwd(q[:, h:h + 1], k, v, o[:, h:h + 1], lse[:, h:h + 1], do[:, h:h + 1], True) for h in range(3)]
    torch.testing.assert_close(dk, sum(p[1] for p in parts), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dv, sum(p[2] for p in parts), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dq, torch.cat([p[0] for p in parts], 1), rtol=1e-5, atol=1e-5)
    zero = bwd(q, k, v, o, lse, torch.zeros_like(do), True)
    assert all(not g.any() for g in zero)


def test_gqa_forward_and_shape_errors():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 40, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    for causal in (False, True):
        torch.testing.assert_close(att.flash_attention_triton(q, k, v, causal)[0],
                                   F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        att.flash_attention_triton(q, k[:, :1].expand(2, 3, 40, 16), v[:, :1].expand(2, 3, 40, 16))  # 4 % 3
    with pytest.raises(ValueError):
        att.flash_attention_triton(q, k[:1], v[:1])  # batch sizes differ


def test_backward_kernels_compile_for_ampere_and_hopper_without_spills():
    """bf16, d=128, causal, 64x64 tiles: the dK/dV kernel (K, V and two fp32 accumulators resident) at 8 warps
    and the dQ kernel at 4 (the lesson's configurations): mma.sync on sm_80, wgmma on sm_90, no spills, shared
    memory within the limit; dK/dV at 4 warps spills on sm_90."""
    pytest.importorskip("course_utils.gpu_compile")
    configs = [dict(arch=arch, kernel=kernel, block_m=64, block_n=64, num_warps=warps, num_stages=2)
               for arch in (80, 90) for kernel, warps in (("dkdv", 8), ("dq", 4))]
    results = att.compile_attention_kernels(configs + [dict(arch=90, kernel="dkdv", block_m=64, block_n=64,
                                                            num_warps=4, num_stages=2)])
    for config, c in zip(configs, results):
        assert c.has("wgmma") == (config["arch"] == 90), c.summary()
        assert c.has("mma.sync") == (config["arch"] == 80), c.summary()
        assert not c.spills and c.fits_shared_memory, c.summary()
    assert results[-1].spills, results[-1].summary()


def test_benchmark_case_logic_runs_on_cpu(monkeypatch):
    """The GPU sweep's per-case logic (configs, error checks, FLOP and peak shares) on fp32 CPU tensors with a
    stand-in timer: both backward variants pass, GQA halves the KV bytes."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("attention_gpu", ROOT / "benchmarks" / "attention_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "_bench", lambda fn, grad_to_none=None: (fn(), 1e-3)[1])
    monkeypatch.setattr(bench, "FWD_CONFIGS", [(16, 16, None, None)])
    monkeypatch.setattr(bench, "BWD_CONFIGS", [(16, 32, None, None)])
    args = argparse.Namespace(tokens=40, width=64, backward_max_seq=100, peak=989.4e12)
    case = bench.one_case(16, 40, True, 2, args, device="cpu", dtype=torch.float32)
    assert "failed" not in case and case["triton_bwd_config"] == [16, 32, None, None]
    assert case["kv_bytes"] * 2 == case["kv_bytes_mha"] and case["heads_q"] == 4 and case["heads_kv"] == 2
    assert 0 < case["triton_fwd_bwd_peak_share"] < 1e-3
