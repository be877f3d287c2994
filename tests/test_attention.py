"""Tests of course_utils.attention: the rungs lesson 06 imports, the benchmark's dry run, and every check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import attention as at
from course_utils.checks import NotAttempted
from conftest import ROOT, stub, fails_with  # noqa: E402


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((2, 3, 37, 8)) for _ in range(3))  # (B, H, L, D), L ragged


def lse_reference(q, k, causal):
    s = torch.from_numpy(q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.logsumexp(s, -1).numpy()


# ---------------------------------------------------------------- rungs
@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_tiled_forward_match_sdpa(qkv, causal):
    q, k, v = qkv
    want = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in qkv), is_causal=causal).numpy()
    np.testing.assert_allclose(at.attention_naive(q, k, v, causal), want, rtol=1e-10, atol=1e-12)
    for bm, bn in ((8, 16), (16, 8), (64, 64)):
        o, lse = at.flash_attention_forward_numpy(q, k, v, causal, block_m=bm, block_n=bn)
        np.testing.assert_allclose(o, want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse, lse_reference(q, k, causal), rtol=1e-10, atol=1e-12)


def test_tiled_forward_accepts_tensors(qkv):
    q, k, v = (torch.from_numpy(x) for x in qkv)
    o, lse = at.flash_attention_forward_numpy(q, k, v, True, block_m=16, block_n=8)
    assert isinstance(o, torch.Tensor) and o.shape == q.shape and lse.shape == q.shape[:-1]
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_softmaxes():
    s = np.array([[1.0, 2.0, 3.0], [1000.0, 1001.0, 999.0]])
    p = at.softmax_safe(s)
    np.testing.assert_allclose(p, torch.softmax(torch.from_numpy(s), -1).numpy(), rtol=1e-12)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(at.softmax_unsafe(s)[1]).all()  # exp(1000) overflows
    for block in (1, 2, 3):
        p_online, m, l = at.online_softmax(s, block)
        np.testing.assert_allclose(p_online, p, rtol=1e-12)
        np.testing.assert_allclose(m, s.max(-1))


def test_merge_states_equals_one_pass():
    rng = np.random.default_rng(1)
    s, v = rng.standard_normal((4, 10)) * 3, rng.standard_normal((10, 5))

    def state(cols):
        m = s[:, cols].max(-1)
        e = np.exp(s[:, cols] - m[:, None])
        return m, e.sum(-1), e @ v[cols]

    m, l, acc = at.merge_softmax_states(*state(slice(0, 3)), *state(slice(3, 10)))
    np.testing.assert_allclose(acc / l[:, None], at.softmax_safe(s) @ v, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_naive_and_tiled_match_autograd(qkv, causal):
    q, k, v = qkv
    do = np.random.default_rng(2).standard_normal(q.shape)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in qkv)
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(torch.from_numpy(do))
    want = [t.grad.numpy() for t in (tq, tk, tv)]
    for got in at.attention_backward_naive(q, k, v, do, causal), \
            at.flash_attention_backward_tiles(q, k, v, *at.flash_attention_forward_numpy(q, k, v, causal), do, causal,
                                              block_m=16, block_n=8):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("l,d,bm,bn", [(40, 16, 16, 16), (72, 32, 32, 16), (50, 16, 16, 32)])
def test_triton_forward_matches_sdpa_on_ragged_lengths(causal, l, d, bm, bn):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, l, d) for _ in range(3))
    o, lse = at.flash_attention_triton(q, k, v, causal, block_m=bm, block_n=bn)
    torch.testing.assert_close(o, F.scaled_dot_product_attention(q, k, v, is_causal=causal), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.numpy(), lse_reference(q.double().numpy(), k.double().numpy(), causal),
                               rtol=1e-5, atol=1e-5)


def test_triton_forward_cross_attention_and_every_block_shape():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 33, 32), torch.randn(1, 2, 70, 32), torch.randn(1, 2, 70, 32)  # L_q != L_k
    torch.testing.assert_close(at.flash_attention_triton(q, k, v)[0], F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)
    q, k, v = (torch.randn(1, 1, 70, 16) for _ in range(3))
    for bm, bn in ((16, 64), (64, 16), (32, 32)):  # the causal stage boundary rounds down to a key block
        torch.testing.assert_close(at.flash_attention_triton(q, k, v, True, block_m=bm, block_n=bn)[0],
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-5)


def test_triton_launcher_rejects_illegal_shapes():
    q = torch.randn(1, 1, 16, 16)
    with pytest.raises(ValueError):
        at.flash_attention_triton(q, q, q, block_m=8)  # tl.dot needs >= 16
    with pytest.raises(ValueError):
        at.flash_attention_triton(q[..., :12], q[..., :12], q[..., :12])  # head dim not a power of two
    with pytest.raises(TypeError):
        at.flash_attention_triton(q.bfloat16(), q.bfloat16(), q.bfloat16())  # interpreter bf16 is wrong


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_function_matches_autograd_of_naive(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 2, 40, 16)
    got = torch.autograd.grad(at.flash_attention(q, k, v, causal), (q, k, v), do)
    s = q @ k.transpose(-1, -2) / 4.0  # (1, 2, L, L), 1/sqrt(16)
    if causal:
        s = s.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf)
    want = torch.autograd.grad(torch.softmax(s, -1) @ v, (q, k, v), do)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    qd, kd, vd = (torch.randn(1, 1, 10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: at.flash_attention(a, b, c, causal, None, 4, 4), (qd, kd, vd))


def test_io_accounting():
    assert at.naive_attention_io(1024, 64) == 4 * 1024 * 64 + 4 * 1024 ** 2
    b = at.sram_block_size(100_000 // 2, 64)  # 100 KB of bf16
    assert 4 * b * 64 + b * b <= 50_000 < 4 * (2 * b) * 64 + (2 * b) ** 2
    assert at.flash_attention_io(4096, 64, 50_000) == 2 * 4096 * 64 + 4096 + 2 * 4096 * 64 * math.ceil(4096 / b)
    assert at.flash_attention_io(4096, 64, 50_000) < at.naive_attention_io(4096, 64)
    assert at.score_matrix_bytes(2, 3, 10, 4) == 2 * 2 * 3 * 100 * 4
    assert at.attention_flops(1, 1, 8, 8, 4) == 4 * 64 * 4
    assert at.attention_flops(1, 1, 8, 8, 4, causal=True, backward=True) == 4 * 64 * 4 * 2.5 / 2


def test_causal_blocks_visited_counts_nonempty_tiles():
    for l, bm, bn in ((100, 16, 32), (64, 32, 16), (37, 16, 16)):
        mask = np.tril(np.ones((l, l), bool))
        count = sum(mask[i:i + bm, j:j + bn].any() for i in range(0, l, bm) for j in range(0, l, bn))
        assert at.causal_blocks_visited(l, bm, bn) == count


def test_benchmark_dry_run_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_gpu.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("-> ok") == 4 and "MISMATCH" not in out.stdout
    assert "timing needs a CUDA GPU" in out.stdout


# ---------------------------------------------------------------- exercise checks
def _merge_no_acc_rescale(m1, l1, a1, m2, l2, a2):
    m, l, _ = at.merge_softmax_states(m1, l1, a1, m2, l2, a2)
    return m, l, a1 + a2


def test_check_merge_softmax_states():
    at.check_merge_softmax_states(at.merge_softmax_states, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_merge_softmax_states(stub)
    fails_with(at.check_merge_softmax_states, _merge_no_acc_rescale, "forgot to rescale the accumulator")
    fails_with(at.check_merge_softmax_states, lambda m1, l1, a1, m2, l2, a2: (np.maximum(m1, m2), l1 + l2, a1 + a2),
               "without rescaling")
    fails_with(at.check_merge_softmax_states,
               lambda *s: (lambda m, l, a: (m, l, a / l[:, None]))(*at.merge_softmax_states(*s)), "unnormalised")


def _causal(q, k, v, *, diag=0, scale=True, axis=-1, fill=-np.inf):
    s = q @ k.T / (math.sqrt(q.shape[1]) if scale else 1.0)
    s = np.where(np.tril(np.ones(s.shape, bool), k=diag), s, fill)
    with np.errstate(invalid="ignore"):  # an all -inf row gives NaN, as a learner's would
        e = np.exp(s - s.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True) @ v


def test_check_causal_attention():
    at.check_causal_attention(_causal, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_causal_attention(stub)
    fails_with(at.check_causal_attention, lambda q, k, v: _causal(q, k, v, diag=-1), "off by one")  # NaN row 0
    fails_with(at.check_causal_attention, lambda q, k, v: _causal(q, k, v, diag=-1, fill=-1e9), "off by one")
    fails_with(at.check_causal_attention, lambda q, k, v: _causal(q, k, v, diag=1), "off by one")
    fails_with(at.check_causal_attention, lambda q, k, v: _causal(q, k, v, scale=False), "missing 1/sqrt(d)")
    fails_with(at.check_causal_attention, lambda q, k, v: _causal(q, k, v, axis=0), "wrong axis")
    fails_with(at.check_causal_attention, lambda q, k, v: at.attention_naive(q, k, v), "no causal mask")


def test_check_causal_blocks_visited():
    at.check_causal_blocks_visited(at.causal_blocks_visited, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_causal_blocks_visited(stub)
    cd = lambda a, b: -(-a // b)  # noqa: E731
    fails_with(at.check_causal_blocks_visited, lambda L, bm, bn: cd(L, bm) * cd(L, bn), "counted every tile")
    fails_with(at.check_causal_blocks_visited, lambda L, bm, bn: sum(cd(i * bm, bn) for i in range(cd(L, bm))),
               "off by one")
    fails_with(at.check_causal_blocks_visited, lambda L, bm, bn: sum(((i + 1) * bm) // bn for i in range(L // bm)),
               "not floor")
    fails_with(at.check_causal_blocks_visited,
               lambda L, bm, bn: sum(min((i + 1) * bm, L) // bn for i in range(cd(L, bm))), "round up")
    fails_with(at.check_causal_blocks_visited, lambda L, bm, bn: sum(cd((i + 1) * bm, bn) for i in range(cd(L, bm))),
               "clamp")


def _flash_forward(q, k, v, block_n, *, rescale=True, lse_mode="running", scale=True):
    tau = 1 / math.sqrt(q.shape[1]) if scale else 1.0
    m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros_like(q)
    for j in range(0, k.shape[0], block_n):
        s = tau * q @ k[j:j + block_n].T
        m_new = np.maximum(m, s.max(-1))
        p = np.exp(s - m_new[:, None])
        alpha = np.exp(m - m_new)
        l, acc = alpha * l + p.sum(-1), (alpha[:, None] if rescale else 1.0) * acc + p @ v[j:j + block_n]
        m = m_new
        last = s.max(-1) + np.log(np.exp(s - s.max(-1)[:, None]).sum(-1))
    lse = {"running": m + np.log(l), "last": last, "nomax": np.log(l), "max": m}[lse_mode]
    return acc / l[:, None], lse


def test_check_flash_forward_lse():
    at.check_flash_forward_lse(_flash_forward, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_flash_forward_lse(stub)
    fails_with(at.check_flash_forward_lse, lambda *a: _flash_forward(*a, rescale=False), "rescale the accumulator")
    fails_with(at.check_flash_forward_lse, lambda *a: _flash_forward(*a, lse_mode="last"), "wrong block")
    fails_with(at.check_flash_forward_lse, lambda *a: _flash_forward(*a, lse_mode="nomax"), "misses the max")
    fails_with(at.check_flash_forward_lse, lambda *a: _flash_forward(*a, scale=False), "missing 1/sqrt(d)")
    fails_with(at.check_flash_forward_lse, lambda *a: _flash_forward(*a, lse_mode="max"), "not the running max m alone")


def _flash_backward(q, k, v, o, lse, do, block, *, delta=True, tau_grad=True, tau_p=True, pt=True):
    tau = 1 / math.sqrt(q.shape[1])
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dlt = (do * o).sum(-1) if delta else np.zeros(q.shape[0])
    g = tau if tau_grad else 1.0
    for j in range(0, k.shape[0], block):
        for i in range(0, q.shape[0], block):
            p = np.exp((tau if tau_p else 1.0) * q[i:i + block] @ k[j:j + block].T - lse[i:i + block, None])
            if pt:
                dv[j:j + block] += p.T @ do[i:i + block]
            else:  # P dO, tile by tile
                dv[i:i + block] += p @ do[j:j + block]
            ds = p * (do[i:i + block] @ v[j:j + block].T - dlt[i:i + block, None])
            dq[i:i + block] += g * ds @ k[j:j + block]
            dk[j:j + block] += g * ds.T @ q[i:i + block]
    return dq, dk, dv


def test_check_flash_backward_tiles():
    at.check_flash_backward_tiles(_flash_backward, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_flash_backward_tiles(stub)
    fails_with(at.check_flash_backward_tiles, lambda *a: _flash_backward(*a, delta=False), "delta")
    fails_with(at.check_flash_backward_tiles, lambda *a: _flash_backward(*a, tau_grad=False), "dQ and dK")
    fails_with(at.check_flash_backward_tiles, lambda *a: _flash_backward(*a, tau_p=False), "recomputing P")
    fails_with(at.check_flash_backward_tiles, lambda *a: _flash_backward(*a, pt=False), "not P dO")


def _sliding(q, k, v, w, lo=0):
    i, j = np.arange(q.shape[0])[:, None], np.arange(q.shape[0])[None, :]
    s = np.where((j <= i) & (j > i - w - lo), q @ k.T / math.sqrt(q.shape[1]), -np.inf)
    return at.softmax_safe(s) @ v


def test_check_sliding_window_attention():
    at.check_sliding_window_attention(_sliding, quiet=True)
    with pytest.raises(NotAttempted):
        at.check_sliding_window_attention(stub)
    fails_with(at.check_sliding_window_attention, lambda q, k, v, w: _sliding(q, k, v, w, lo=1), "window + 1")
    fails_with(at.check_sliding_window_attention, lambda q, k, v, w: _sliding(q, k, v, w, lo=-1), "window - 1")
    fails_with(at.check_sliding_window_attention, lambda q, k, v, w: at.attention_naive(q, k, v, causal=True),
               "plain causal")
