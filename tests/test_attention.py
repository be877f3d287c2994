"""Tests of course_utils.attention: the NumPy rungs lesson 06 writes by hand (forward, softmaxes, merging, backward)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import attention as at


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

    m, l, acc = at.merge_states(*state(slice(0, 3)), *state(slice(3, 10)))
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


