"""Tests of course_utils.grading.foundations: each check passes right answers (the solution's and ones
written differently), names each plausible mistake, rejects forbidden shortcuts and hard-coded answers,
and reports a stub as not attempted.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils import foundations as fd
from course_utils.grading import foundations as gf
from _grading_helpers import stub  # noqa: E402
from _grading_helpers import SEED, Recorder, fails, forbidden, not_attempted, passes, rejects_recorded_answers  # noqa: E402


# ---------------------------------------------------------------- exercise 1
def c_strides_ok(shape, itemsize, perm):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    strides = strides[::-1]
    return tuple(strides[p] for p in perm)


def c_strides_cumprod(shape, itemsize, perm):  # right, written differently
    sizes = np.array(list(shape[1:]) + [1], dtype=np.int64)
    contiguous = np.cumprod(sizes[::-1])[::-1] * itemsize
    return tuple(int(contiguous[p]) for p in perm)


def test_check_c_strides():
    passes(gf.check_c_strides, c_strides_ok)
    passes(gf.check_c_strides, c_strides_cumprod)
    not_attempted(gf.check_c_strides, stub)
    fails(gf.check_c_strides, lambda s, i, p: tuple(v // i for v in c_strides_ok(s, i, p)), "in bytes")
    fails(gf.check_c_strides, lambda s, i, p: c_strides_ok(tuple(s[q] for q in p), i, tuple(range(len(s)))), "permutes the original")
    fails(gf.check_c_strides, lambda s, i, p: c_strides_ok(s, i, tuple(range(len(s)))), "before the transpose")
    fails(gf.check_c_strides, lambda s, i, p: c_strides_ok(s, i, tuple(int(a) for a in np.argsort(p))), "inverse permutation")
    fortran = lambda s, i, p: tuple(c_strides_ok(s[::-1], i, tuple(range(len(s))))[::-1][q] for q in p)  # noqa: E731
    fails(gf.check_c_strides, fortran, "column-major")
    forbidden(gf.check_c_strides, lambda s, i, p: np.empty(s, dtype=f"i{i}").transpose(p).strides, "numpy.empty")
    forbidden(gf.check_c_strides, lambda s, i, p: gf._reference_c_strides(s, i, p), "_reference_c_strides")


def test_check_c_strides_rejects_a_lookup_table():
    table = Recorder(c_strides_ok)
    gf.check_c_strides(table, seed=SEED)
    table.learning = False
    fails(gf.check_c_strides, table, "c_strides", seed=SEED + 1)


# ---------------------------------------------------------------- exercise 2
def windows_ok(x, width, step):
    n = (x.shape[-1] - width) // step + 1
    s0, s1 = x.strides
    return np.lib.stride_tricks.as_strided(x, (x.shape[0], n, width), (s0, step * s1, s1))


def windows_by_indexing(x, width, step):  # right, written differently: a copy by fancy indexing
    n = (x.shape[-1] - width) // step + 1
    return x[:, step * np.arange(n)[:, None] + np.arange(width)[None, :]]


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
    passes(gf.check_strided_windows, windows_ok)
    passes(gf.check_strided_windows, windows_by_indexing)
    not_attempted(gf.check_strided_windows, stub)
    fails(gf.check_strided_windows, windows_no_step, "step * x.strides[-1]")
    fails(gf.check_strided_windows, windows_one_more, "(L - width) // step + 1")
    fails(gf.check_strided_windows, windows_one_fewer, "(L - width) // step + 1")
    fails(gf.check_strided_windows, windows_itemsize, "x.strides instead of computing them")
    forbidden(gf.check_strided_windows, lambda x, w, s: fd.sliding_windows(x, w)[:, ::s, :], "course_utils.foundations.sliding_windows")


# ---------------------------------------------------------------- exercise 3
def pairwise_ok(X, Y):
    diff = X[:, None, :] - Y[None, :, :]
    return (diff**2).sum(-1)


def pairwise_expanded(X, Y):  # right, written differently
    return (X**2).sum(1)[:, None] + (Y**2).sum(1)[None, :] - 2 * X @ Y.T


def test_check_pairwise_sq_dists():
    passes(gf.check_pairwise_sq_dists, pairwise_ok)
    passes(gf.check_pairwise_sq_dists, pairwise_expanded)
    not_attempted(gf.check_pairwise_sq_dists, stub)
    fails(gf.check_pairwise_sq_dists, lambda X, Y: np.sqrt(np.maximum(pairwise_ok(X, Y), 0)), "drop the square root")
    fails(gf.check_pairwise_sq_dists, lambda X, Y: pairwise_ok(Y, X), "output is (m, n)")
    fails(gf.check_pairwise_sq_dists, lambda X, Y: pairwise_expanded(X, Y) + 4 * X @ Y.T, "wrong sign")
    fails(gf.check_pairwise_sq_dists, lambda X, Y: pairwise_expanded(X, Y) + X @ Y.T, "factor 2")
    fails(gf.check_pairwise_sq_dists, lambda X, Y: (X[:, None] - Y[None]).sum(-1), "without squaring")
    from scipy.spatial.distance import cdist
    forbidden(gf.check_pairwise_sq_dists, lambda X, Y: cdist(X, Y, "sqeuclidean"), "scipy.spatial.distance.cdist")

    def rows_by_loop(X, Y):  # right values, but the prompt says "without a Python loop"
        return np.stack([((x - Y) ** 2).sum(-1) for x in X])

    def while_loop(X, Y):
        out, i = np.empty((X.shape[0], Y.shape[0])), 0
        while i < X.shape[0]:
            out[i], i = ((X[i] - Y) ** 2).sum(-1), i + 1
        return out

    forbidden(gf.check_pairwise_sq_dists, rows_by_loop, "Python loop")
    forbidden(gf.check_pairwise_sq_dists, while_loop, "Python loop")
    table = Recorder(pairwise_ok)
    gf.check_pairwise_sq_dists(table, seed=SEED)
    table.learning = False
    fails(gf.check_pairwise_sq_dists, table, "pairwise_sq_dists", seed=SEED + 1)


# ---------------------------------------------------------------- exercise 4
def scores_ok(Q, K):
    return torch.einsum("bthd,bshd->bhts", Q, K) / math.sqrt(Q.shape[-1])


def scores_prescaled(Q, K):  # right, written differently
    return torch.einsum("bthd,bshd->bhts", Q * Q.shape[-1] ** -0.5, K)


def test_check_attention_scores():
    passes(gf.check_attention_scores, scores_ok)
    passes(gf.check_attention_scores, scores_prescaled)
    not_attempted(gf.check_attention_scores, stub)
    root = lambda Q: math.sqrt(Q.shape[-1])  # noqa: E731
    fails(gf.check_attention_scores, lambda Q, K: torch.einsum("bthd,bshd->bhst", Q, K) / root(Q), "(B, H, S, T)")
    fails(gf.check_attention_scores, lambda Q, K: torch.einsum("bthd,bshd->bths", Q, K) / root(Q), "(B, T, H, S)")
    fails(gf.check_attention_scores, lambda Q, K: scores_ok(Q, K) * root(Q), "divide by sqrt(D)")
    fails(gf.check_attention_scores, lambda Q, K: scores_ok(Q, K) / root(Q), "you divided by D")
    fails(gf.check_attention_scores, lambda Q, K: torch.einsum("bthd,bshd->bts", Q, K) / root(Q), "head axis")
    # the lesson's (B, H, T, D) layout applied to (B, T, H, D) inputs: a crash, or a wrong shape when T = 1
    fails(gf.check_attention_scores, lambda Q, K: torch.einsum("bhtd,bhsd->bhts", Q, K) / root(Q), "attention_scores")
    forbidden(gf.check_attention_scores, lambda Q, K: Q.transpose(1, 2) @ K.permute(0, 2, 3, 1) / root(Q), "torch.Tensor.transpose")
    forbidden(gf.check_attention_scores, lambda Q, K: torch.matmul(Q.movedim(2, 1), K.movedim(1, 3)) / root(Q), "torch.matmul")


# ---------------------------------------------------------------- exercise 5
def jacobian_ok(f, x, eps):
    columns = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        columns.append((f(x + e) - f(x - e)) / (2 * eps))
    return np.stack(columns, axis=1)  # (m, n)


def jacobian_in_place(f, x, eps):  # right, the solution's way: perturb and restore
    J = np.empty((np.asarray(f(x)).size, x.size))
    for i in range(x.size):
        original = x[i]
        x[i] = original + eps
        plus = np.asarray(f(x), dtype=np.float64)
        x[i] = original - eps
        J[:, i] = (plus - f(x)) / (2 * eps)
        x[i] = original
    return J


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
    passes(gf.check_numerical_jacobian, jacobian_ok)
    passes(gf.check_numerical_jacobian, jacobian_in_place)
    not_attempted(gf.check_numerical_jacobian, stub)
    fails(gf.check_numerical_jacobian, jacobian_forward, "forward difference")
    fails(gf.check_numerical_jacobian, lambda f, x, e: 2 * jacobian_ok(f, x, e), "divide by 2*eps")
    fails(gf.check_numerical_jacobian, jacobian_not_restored_in_place, "put each perturbed entry back")
    fails(gf.check_numerical_jacobian, jacobian_not_restored_on_copy, "restore x[i] = original")
    fails(gf.check_numerical_jacobian, lambda f, x, e: jacobian_ok(f, x, e).T, "is (n, m)")

    def by_library(f, x, eps):
        rows = [fd.numerical_gradient(lambda v, j=j: f(v)[j], x.copy(), eps) for j in range(np.asarray(f(x)).size)]
        return np.stack(rows)

    forbidden(gf.check_numerical_jacobian, by_library, "course_utils.foundations.numerical_gradient")


# ---------------------------------------------------------------- exercise 6
def normalize_ok(X):
    return (X - X.mean(0)) / X.std(0, correction=0)


def normalize_clone(X):  # right, written differently: in place on a copy
    Y = X.clone()
    Y -= Y.mean(dim=0)
    Y /= Y.pow(2).mean(dim=0).sqrt()
    return Y


def normalize_buggy(X):
    Xc = X.view(-1, X.shape[1])
    Xc -= Xc.mean(dim=0)
    Xc /= Xc.std(dim=0, correction=0)
    return Xc


def test_check_normalize_columns():
    passes(gf.check_normalize_columns, normalize_ok)
    passes(gf.check_normalize_columns, normalize_clone)
    not_attempted(gf.check_normalize_columns, stub)
    fails(gf.check_normalize_columns, normalize_buggy, "changed X")
    rows = lambda X: (X - X.mean(1, keepdim=True)) / X.std(1, keepdim=True, correction=0)  # noqa: E731
    fails(gf.check_normalize_columns, rows, "normalized the rows")
    fails(gf.check_normalize_columns, lambda X: (X - X.mean(0)) / X.std(0), "correction=0")
    fails(gf.check_normalize_columns, lambda X: X / X.std(0, correction=0), "not centred")


def test_checks_draw_fresh_inputs_and_name_the_seed():
    message = fails(gf.check_pairwise_sq_dists, lambda X, Y: pairwise_ok(X, Y) + 1.0, "reproduce with seed=", seed=None)
    seed = int(message.split("seed=")[1].split(")")[0])
    assert fails(gf.check_pairwise_sq_dists, lambda X, Y: pairwise_ok(X, Y) + 1.0, "", seed=seed) == message


def test_check_strided_windows_rejects_sliding_window_view():
    def by_numpy(x, w, s):
        return np.lib.stride_tricks.sliding_window_view(x, w, axis=-1)[:, ::s, :]

    forbidden(gf.check_strided_windows, by_numpy, "numpy.lib.stride_tricks.sliding_window_view")


LOOKUPS = [
    (gf.check_strided_windows, windows_ok), (gf.check_attention_scores, scores_ok),
    (gf.check_numerical_jacobian, jacobian_ok), (gf.check_normalize_columns, normalize_ok),
]


@pytest.mark.parametrize("check, solution", LOOKUPS, ids=[c.__name__ for c, _ in LOOKUPS])
def test_checks_reject_answers_recorded_on_other_inputs(check, solution):
    rejects_recorded_answers(check, solution)
