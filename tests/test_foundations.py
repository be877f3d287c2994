"""Tests of course_utils.foundations: the helpers lessons import, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils.checks import CheckFailed, NotAttempted
from course_utils import foundations as fd
from conftest import stub, fails_with  # noqa: E402


# ---------------------------------------------------------------- helpers
def test_sliding_windows_numpy_is_a_readonly_view():
    x = np.arange(2 * 10, dtype=np.float32).reshape(2, 10)
    w = fd.sliding_windows(x, 4)
    assert w.shape == (2, 7, 4)
    assert np.shares_memory(w, x) and not w.flags.writeable
    np.testing.assert_array_equal(w, np.lib.stride_tricks.sliding_window_view(x, 4, axis=-1))
    strided = x[:, ::2]  # non-contiguous input
    np.testing.assert_array_equal(fd.sliding_windows(strided, 3), np.lib.stride_tricks.sliding_window_view(strided, 3, axis=-1))


def test_sliding_windows_torch_matches_unfold_and_shares_storage():
    x = torch.randn(3, 12)[:, 1:]  # storage offset 1, non-contiguous rows
    w = fd.sliding_windows(x, 5)
    assert w.shape == (3, 7, 5)
    assert w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(w, x.unfold(-1, 5, 1))


def test_sliding_windows_rejects_bad_width():
    with pytest.raises(ValueError):
        fd.sliding_windows(np.zeros(4), 5)
    with pytest.raises(ValueError):
        fd.sliding_windows(np.zeros(4), 0)


def test_numerical_gradient_numpy_and_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2))
    before = x.copy()
    grad = fd.numerical_gradient(lambda v: np.sum(np.sin(v) * v), x)
    np.testing.assert_allclose(grad, np.cos(before) * before + np.sin(before), rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(x, before)  # every entry restored

    w = torch.tensor(rng.standard_normal(4), requires_grad=True)
    loss = lambda: (w.tanh() ** 2).sum()  # noqa: E731 - reads w through the closure
    loss().backward()
    numeric = fd.numerical_gradient(lambda _: loss(), w)
    torch.testing.assert_close(numeric, w.grad, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- exercise 1
def c_strides_ok(shape, itemsize, perm):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    strides = strides[::-1]
    return tuple(strides[p] for p in perm)


def test_check_c_strides():
    fd.check_c_strides(c_strides_ok)
    with pytest.raises(NotAttempted):
        fd.check_c_strides(stub)
    fails_with(fd.check_c_strides, lambda s, i, p: tuple(v // i for v in c_strides_ok(s, i, p)), "in bytes")
    fails_with(fd.check_c_strides, lambda s, i, p: c_strides_ok(tuple(s[q] for q in p), i, tuple(range(len(s)))), "permutes the original")
    fails_with(fd.check_c_strides, lambda s, i, p: c_strides_ok(s, i, tuple(range(len(s)))), "before the transpose")
    fails_with(fd.check_c_strides, lambda s, i, p: c_strides_ok(s, i, tuple(int(a) for a in np.argsort(p))), "inverse permutation")
    fortran = lambda s, i, p: tuple(c_strides_ok(s[::-1], i, tuple(range(len(s))))[::-1][q] for q in p)  # noqa: E731
    fails_with(fd.check_c_strides, fortran, "column-major")


# ---------------------------------------------------------------- exercise 2
def windows_ok(x, width, step):
    n = (x.shape[-1] - width) // step + 1
    s0, s1 = x.strides
    return np.lib.stride_tricks.as_strided(x, (x.shape[0], n, width), (s0, step * s1, s1))


def windows_no_step(x, width, step):
    n = (x.shape[-1] - width) // step + 1
    s0, s1 = x.strides
    return np.lib.stride_tricks.as_strided(x, (x.shape[0], n, width), (s0, s1, s1))


def windows_one_more(x, width, step):
    n = -(-(x.shape[-1] - width) // step) + 1  # ceil: one window too many
    return np.stack([x[:, i * step:i * step + width] for i in range(n - 1)] + [x[:, -width:]], axis=1)


def windows_one_fewer(x, width, step):
    return windows_ok(x, width, step)[:, :-1].copy()


def windows_itemsize(x, width, step):
    n = (x.shape[-1] - width) // step + 1
    i = x.itemsize
    return np.lib.stride_tricks.as_strided(x, (x.shape[0], n, width), (x.shape[-1] * i, step * i, i))


def test_check_strided_windows():
    fd.check_strided_windows(windows_ok)
    fd.check_strided_windows(lambda x, w, s: fd.sliding_windows(x, w)[:, ::s, :])  # a view of a view is fine
    with pytest.raises(NotAttempted):
        fd.check_strided_windows(stub)
    fails_with(fd.check_strided_windows, windows_no_step, "step * x.strides[-1]")
    fails_with(fd.check_strided_windows, windows_one_more, "(L - width) // step + 1")
    fails_with(fd.check_strided_windows, windows_one_fewer, "(L - width) // step + 1")
    fails_with(fd.check_strided_windows, windows_itemsize, "x.strides instead of computing them from x.itemsize")

    def chunks(x, width, step):  # windows `width` apart, zero-padded where they run past the end
        n = (x.shape[-1] - width) // step + 1
        padded = np.concatenate([x, np.zeros((x.shape[0], n * width), x.dtype)], axis=1)
        return np.stack([padded[:, i * width:(i + 1) * width] for i in range(n)], axis=1)

    with pytest.raises(CheckFailed):
        fd.check_strided_windows(chunks)


# ---------------------------------------------------------------- exercise 3
def pairwise_ok(X, Y):
    return (X**2).sum(1)[:, None] + (Y**2).sum(1)[None, :] - 2 * X @ Y.T


def test_check_pairwise_sq_dists():
    fd.check_pairwise_sq_dists(pairwise_ok)
    with pytest.raises(NotAttempted):
        fd.check_pairwise_sq_dists(stub)
    fails_with(fd.check_pairwise_sq_dists, lambda X, Y: np.sqrt(np.maximum(pairwise_ok(X, Y), 0)), "drop the square root")
    fails_with(fd.check_pairwise_sq_dists, lambda X, Y: pairwise_ok(Y, X), "output is (m, n)")
    fails_with(fd.check_pairwise_sq_dists, lambda X, Y: pairwise_ok(X, Y) + 4 * X @ Y.T, "wrong sign")
    fails_with(fd.check_pairwise_sq_dists, lambda X, Y: (X[:, None] - Y[None]).sum(-1), "without squaring")


# ---------------------------------------------------------------- exercise 4
def scores_ok(Q, K):
    q, k = Q.transpose(1, 2), K.transpose(1, 2)  # (B, H, T, D), (B, H, S, D)
    return q @ k.transpose(-1, -2) / math.sqrt(Q.shape[-1])


def test_check_attention_scores():
    fd.check_attention_scores(scores_ok)
    fd.check_attention_scores(lambda Q, K: torch.einsum("bthd,bshd->bhts", Q / Q.shape[-1] ** 0.5, K))
    with pytest.raises(NotAttempted):
        fd.check_attention_scores(stub)
    root = lambda Q: math.sqrt(Q.shape[-1])  # noqa: E731
    fails_with(fd.check_attention_scores, lambda Q, K: scores_ok(Q, K).transpose(-1, -2), "(B, H, S, T)")
    fails_with(fd.check_attention_scores, lambda Q, K: torch.einsum("bthd,bshd->bths", Q, K) / root(Q), "(B, T, H, S)")
    fails_with(fd.check_attention_scores, lambda Q, K: scores_ok(Q, K) * root(Q), "divide by sqrt(D)")
    fails_with(fd.check_attention_scores, lambda Q, K: scores_ok(Q, K) / root(Q), "you divided by D")
    fails_with(fd.check_attention_scores, lambda Q, K: torch.einsum("bthd,bshd->bts", Q, K) / root(Q), "head axis")
    # a crash (the lesson's (B, H, T, D) layout applied to (B, T, H, D) inputs) is reported in one line
    fails_with(fd.check_attention_scores, lambda Q, K: torch.einsum("bhtd,bhsd->bhts", Q, K) / root(Q), "raised RuntimeError")


# ---------------------------------------------------------------- exercise 5
def jacobian_ok(f, x, eps):
    columns = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        columns.append((f(x + e) - f(x - e)) / (2 * eps))
    return np.stack(columns, axis=1)  # (m, n)


def jacobian_forward(f, x, eps):
    fx = f(x)
    return np.stack([(f(x + eps * np.eye(x.size)[i]) - fx) / eps for i in range(x.size)], axis=1)


def jacobian_not_restored_in_place(f, x, eps):
    cols = []
    for i in range(x.size):
        x[i] += eps
        plus = f(x)
        x[i] -= 2 * eps
        cols.append((plus - f(x)) / (2 * eps))
    return np.stack(cols, axis=1)


def jacobian_not_restored_on_copy(f, x, eps):
    return jacobian_not_restored_in_place(f, x.copy(), eps)


def test_check_numerical_jacobian():
    fd.check_numerical_jacobian(jacobian_ok)
    with pytest.raises(NotAttempted):
        fd.check_numerical_jacobian(stub)
    fails_with(fd.check_numerical_jacobian, jacobian_forward, "forward difference")
    fails_with(fd.check_numerical_jacobian, lambda f, x, e: 2 * jacobian_ok(f, x, e), "divide by 2*eps")
    fails_with(fd.check_numerical_jacobian, jacobian_not_restored_in_place, "put each perturbed entry back")
    fails_with(fd.check_numerical_jacobian, jacobian_not_restored_on_copy, "restore x[i] = original")
    fails_with(fd.check_numerical_jacobian, lambda f, x, e: jacobian_ok(f, x, e).T, "is (n, m)")


# ---------------------------------------------------------------- exercise 6
def normalize_ok(X):
    return (X - X.mean(0)) / X.std(0, unbiased=False)


def normalize_buggy(X):
    Xc = X.view(-1, X.shape[1])
    Xc -= Xc.mean(dim=0)
    Xc /= Xc.std(dim=0, unbiased=False)
    return Xc


def test_check_normalize_columns():
    fd.check_normalize_columns(normalize_ok)
    with pytest.raises(NotAttempted):
        fd.check_normalize_columns(stub)
    fails_with(fd.check_normalize_columns, normalize_buggy, "changed X")
    rows = lambda X: (X - X.mean(1, keepdim=True)) / X.std(1, keepdim=True, unbiased=False)  # noqa: E731
    fails_with(fd.check_normalize_columns, rows, "normalized the rows")
    fails_with(fd.check_normalize_columns, lambda X: (X - X.mean(0)) / X.std(0), "correction=0")
    fails_with(fd.check_normalize_columns, lambda X: X / X.std(0, unbiased=False), "not centred")
