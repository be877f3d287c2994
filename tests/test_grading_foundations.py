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
from course_utils.grading import foundations_views as gv
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


# ---------------------------------------------------------------- exercise 7: image patches as one strided view
def patches_ok(x, kh, kw, stride):
    B, C, H, W = x.shape
    Ho, Wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    sB, sC, sH, sW = x.strides
    return np.lib.stride_tricks.as_strided(x, (B, C, Ho, Wo, kh, kw), (sB, sC, stride * sH, stride * sW, sH, sW),
                                           writeable=False)


def patches_two_steps(x, kh, kw, stride):  # right, written differently: row windows, then column windows of them
    B, C, H, W = x.shape
    Ho, Wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    sB, sC, sH, sW = x.strides
    rows = np.lib.stride_tricks.as_strided(x, (B, C, Ho, kh, W), (sB, sC, stride * sH, sH, sW))
    both = np.lib.stride_tricks.as_strided(rows, (B, C, Ho, kh, Wo, kw), rows.strides[:4] + (stride * sW, sW))
    return both.transpose(0, 1, 2, 4, 3, 5)


def patches_from_shape(x, kh, kw, stride):  # strides computed from the shape: wrong on a non-contiguous x
    B, C, H, W = x.shape
    Ho, Wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    i = x.itemsize
    sB, sC, sH, sW = C * H * W * i, H * W * i, W * i, i
    return np.lib.stride_tricks.as_strided(x, (B, C, Ho, Wo, kh, kw), (sB, sC, stride * sH, stride * sW, sH, sW))


def test_check_image_patches():
    passes(gf.check_image_patches, patches_ok)
    passes(gf.check_image_patches, patches_two_steps)
    passes(gf.check_image_patches, lambda x, kh, kw, s: patches_ok(np.ascontiguousarray(x), kh, kw, s))  # a copy of x is fine
    not_attempted(gf.check_image_patches, stub)
    fails(gf.check_image_patches, lambda x, kh, kw, s: patches_ok(x, kh, kw, s).transpose(0, 1, 4, 5, 2, 3), "(B, C, kh, kw, Ho, Wo)")
    no_stride = lambda x, kh, kw, s: patches_ok(x, kh, kw, 1)[:, :, :(x.shape[2] - kh) // s + 1, :(x.shape[3] - kw) // s + 1]  # noqa: E731
    fails(gf.check_image_patches, no_stride, "one pixel apart")
    fails(gf.check_image_patches, patches_from_shape, "take the strides from x.strides")


def test_check_image_patches_names_swapped_strides():
    def swapped(x, kh, kw, s):  # position strides sH, sW and tap strides s*sH, s*sW: in bounds at the check's sizes
        B, C, H, W = x.shape
        Ho, Wo = (H - kh) // s + 1, (W - kw) // s + 1
        sB, sC, sH, sW = x.strides
        assert Ho - 1 + s * (kh - 1) < H and Wo - 1 + s * (kw - 1) < W
        return np.lib.stride_tricks.as_strided(x, (B, C, Ho, Wo, kh, kw), (sB, sC, sH, sW, s * sH, s * sW))

    for seed in range(SEED, SEED + 8):  # identical to the right answer at stride 1: a seed with a stride-2 trial shows it
        try:
            gf.check_image_patches(swapped, seed=seed, quiet=True)
        except AssertionError as failure:
            assert "are swapped" in str(failure), str(failure)
            return
    raise AssertionError("the swapped strides passed eight seeds")


def test_check_image_patches_refuses_copies_and_window_functions():
    def gathered(x, kh, kw, s):  # a right answer that copies the patches: the exercise asks for a view
        return np.ascontiguousarray(patches_ok(x, kh, kw, s))

    forbidden(gf.check_image_patches, gathered, "a copy of the patches")
    forbidden(gf.check_image_patches, lambda x, kh, kw, s: np.lib.stride_tricks.sliding_window_view(
        x, (kh, kw), axis=(2, 3))[:, :, ::s, ::s], "sliding_window_view")
    forbidden(gf.check_image_patches, lambda x, kh, kw, s: torch.from_numpy(np.ascontiguousarray(x)).unfold(
        2, kh, s).unfold(3, kw, s).numpy(), "unfold")
    forbidden(gf.check_image_patches, lambda x, kh, kw, s: fd.sliding_windows(
        fd.sliding_windows(x, kh)[:, :, ::s].swapaxes(2, 3), kw)[:, :, :, ::s].transpose(0, 1, 3, 4, 2, 5),
        "course_utils.foundations")
    forbidden(gf.check_image_patches, gv._reference_image_patches, "_reference_image_patches")
    forbidden(gf.check_image_patches, lambda *a: gv._reference_image_patches(*a), "_reference_image_patches")


# ---------------------------------------------------------------- exercise 8: segment mean by broadcasting
def segment_mean_ok(values, ids, S):
    onehot = (ids[:, None] == torch.arange(S)[None, :]).to(values.dtype)  # (N, S)
    counts = onehot.sum(0)  # (S,)
    return torch.einsum("ns,nd->sd", onehot, values) / counts.clamp(min=1)[:, None]


def segment_mean_sorted(values, ids, S):  # right, written differently: sort, prefix sums, boundaries
    order = torch.argsort(ids, stable=True)
    prefix = torch.cat([torch.zeros(1, values.shape[1], dtype=values.dtype), values[order].cumsum(0)])
    bounds = torch.searchsorted(ids[order], torch.arange(S + 1))
    counts = (bounds[1:] - bounds[:-1]).clamp(min=1)
    return (prefix[bounds[1:]] - prefix[bounds[:-1]]) / counts[:, None]


def segment_sums(values, ids, S):
    onehot = (ids[:, None] == torch.arange(S)[None, :]).to(values.dtype)
    return onehot.T @ values


def test_check_segment_mean():
    passes(gf.check_segment_mean, segment_mean_ok)
    passes(gf.check_segment_mean, segment_mean_sorted)
    not_attempted(gf.check_segment_mean, stub)
    onehot = lambda ids, S: (ids[:, None] == torch.arange(S)[None, :]).double()  # noqa: E731
    fails(gf.check_segment_mean, segment_sums, "sums of each segment")
    fails(gf.check_segment_mean, lambda v, i, S: segment_sums(v, i, S) / onehot(i, S).sum(0)[:, None], "0 / 0 = NaN")
    fails(gf.check_segment_mean, lambda v, i, S: segment_sums(v, i, S) / v.shape[0], "divided every segment by N")
    fails(gf.check_segment_mean, lambda v, i, S: segment_mean_ok(v, i, S).T, "(D, S)")
    def last_write(v, i, S):
        out = torch.zeros(S, v.shape[1], dtype=v.dtype)
        out[i] = v  # one write per index survives
        return out

    fails(gf.check_segment_mean, last_write, "one write per index")


def test_check_segment_mean_refuses_scatters_counts_and_loops():
    S_ = gf.check_segment_mean
    forbidden(S_, lambda v, i, S: torch.zeros(S, v.shape[1], dtype=v.dtype).index_add_(0, i, v) / 1, "index_add")
    forbidden(S_, lambda v, i, S: torch.zeros(S, v.shape[1], dtype=v.dtype).scatter_reduce(
        0, i[:, None].expand_as(v), v, "mean", include_self=False), "scatter_reduce")
    forbidden(S_, lambda v, i, S: segment_sums(v, i, S) / torch.bincount(i, minlength=S).clamp(min=1)[:, None], "bincount")
    forbidden(S_, lambda v, i, S: torch.nn.functional.one_hot(i, S).double().T @ v, "one_hot")
    forbidden(S_, lambda v, i, S: torch.zeros(S, v.shape[1], dtype=v.dtype).index_put_((i,), v, accumulate=True), "index_put_")

    def add_at(v, i, S):
        out = np.zeros((S, v.shape[1]))
        np.add.at(out, i.numpy(), v.numpy())
        return torch.from_numpy(out)

    forbidden(S_, add_at, "numpy.add.at")
    forbidden(S_, lambda v, i, S: segment_sums(v, i, S) / torch.from_numpy(
        np.maximum(np.bincount(i.numpy(), minlength=S), 1))[:, None], "numpy.bincount")
    forbidden(S_, lambda v, i, S: torch.stack([v[i == k].sum(0) for k in range(S)]), "Python loop")
    forbidden(S_, gv._reference_segment_mean, "_reference_segment_mean")
    forbidden(S_, lambda v, i, S: segment_mean_ok(v, i, S) + 0 * fd.numerical_gradient(lambda t: 0.0, np.zeros(1))[0],
              "course_utils.foundations")


def test_the_new_checks_take_the_pasted_reference_as_the_learners_own():
    from _grading_helpers import pasted
    own = pasted(gv)
    passes(gf.check_segment_mean, lambda *a: own._reference_segment_mean(*a) if False else segment_mean_ok(*a))
    forbidden(gf.check_segment_mean, own._reference_segment_mean, "index_add")  # pasted, it still scatters


def test_check_segment_mean_rejects_answers_recorded_on_other_inputs():
    rejects_recorded_answers(gf.check_segment_mean, segment_mean_ok)


def test_check_image_patches_rejects_answers_recorded_on_other_inputs():
    table, learning = {}, [True]

    def lookup(x, kh, kw, s):  # keyed by the bytes of x (a copy of x is within the memory the check allows)
        key = (hash(x.tobytes()), kh, kw, s)
        if learning[0]:
            table[key] = patches_ok(x, kh, kw, s)
        return table.get(key, next(iter(table.values())))

    gf.check_image_patches(lookup, seed=SEED)
    learning[0] = False
    with pytest.raises(AssertionError):
        gf.check_image_patches(lookup, seed=SEED + 1)
