"""Grading for topic 00 (foundations): the checks, named mistakes and references of ``solutions/00_foundations.ipynb``.

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``; a failure names
the seed that reproduces it) and names the likely mistake. Reference answers are private. Exercises 7 and 8
live in :mod:`course_utils.grading.foundations_views` (re-exported here).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, call_learner, check_function
from ..classroom.forbidden import ByHand
from ..classroom.released import SmoothMap, call_restoring
from ..errors import CheckFailed
from ..foundations import sliding_windows
from .foundations_views import check_image_patches, check_segment_mean  # exercises 7 and 8

__all__ = [
    "check_c_strides",
    "check_strided_windows",
    "check_pairwise_sq_dists",
    "check_attention_scores",
    "check_numerical_jacobian",
    "check_normalize_columns",
    "check_image_patches",
    "check_segment_mean",
]


# ---------------------------------------------------------------- exercise 1: strides by hand
def _reference_c_strides(shape, itemsize, perm):
    dtype = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[itemsize]
    return tuple(int(s) for s in np.empty(shape, dtype=dtype).transpose(perm).strides)


def _contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


# "without creating an array": the array constructors and the course's reference
C_STRIDES_FORBIDDEN = ("numpy.empty", "numpy.zeros", "numpy.ones", "numpy.full", "numpy.arange", "torch.empty",
                       "torch.zeros", "course_utils.grading.foundations._reference_c_strides")


def check_c_strides(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: byte strides of a C-contiguous array of ``shape`` after ``.transpose(perm)``."""

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        first = next(counter) == 0
        ndim = int(rng.integers(3 if first else 2, 5))
        shape = [int(n) for n in (rng.choice(np.arange(2, 9), ndim, replace=False) if first else rng.integers(2, 7, size=ndim))]
        if not first and rng.random() < 0.3:  # an axis of length 1 (its stride is still the product of the sizes after it)
            shape[int(rng.integers(ndim))] = 1
        shape = tuple(shape)
        perm = tuple(int(p) for p in rng.permutation(ndim))
        while perm == tuple(range(ndim)) or (first and tuple(perm[p] for p in perm) == tuple(range(ndim))):
            perm = tuple(int(p) for p in rng.permutation(ndim))  # the first trial's perm is not its own inverse
        return shape, int(rng.choice([1, 2, 4, 8])), perm

    def elements(shape, itemsize, perm):
        return tuple(s // itemsize for s in _reference_c_strides(shape, itemsize, perm))

    def of_new_shape(shape, itemsize, perm):
        return _contiguous_strides(tuple(shape[p] for p in perm), itemsize)

    def fortran(shape, itemsize, perm):
        f = tuple(reversed(_contiguous_strides(tuple(reversed(shape)), itemsize)))
        return tuple(f[p] for p in perm)

    def not_permuted(shape, itemsize, perm):
        return _contiguous_strides(shape, itemsize)

    def inverse_perm(shape, itemsize, perm):
        c = _contiguous_strides(shape, itemsize)
        inverse = tuple(int(i) for i in np.argsort(perm))
        return tuple(c[i] for i in inverse)

    check_function(
        fn, _reference_c_strides, make_inputs, name="c_strides", trials=trials, seed=seed,
        forbidden=C_STRIDES_FORBIDDEN,
        mistakes=[
            Mistake("elements", "these are strides in elements; NumPy strides are in bytes, so multiply by itemsize.", elements),
            Mistake("new_shape", "these are the strides of a fresh contiguous array of the permuted shape; a transpose "
                    "copies nothing, it permutes the original strides: out[i] = strides[perm[i]].", of_new_shape),
            Mistake("fortran", "these are column-major (Fortran) strides; in C order the LAST axis has stride itemsize.", fortran),
            Mistake("not_permuted", "you returned the strides before the transpose; permute them with perm.", not_permuted),
            Mistake("inverse", "you applied the inverse permutation; transpose(perm) puts old axis perm[i] at position i, "
                    "so out[i] = strides[perm[i]].", inverse_perm),
        ], quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 2: windows with a step
def _reference_strided_windows(x, width, step):
    return np.ascontiguousarray(sliding_windows(x, width)[..., ::step, :])


def _window_count(length, width, step):
    return (length - width) // step + 1


def _gather_windows(x, starts, offsets):
    """x[..., starts[i] + offsets[k]] with a bounds check (mistakes must never read past x)."""
    index = np.asarray(starts)[:, None] + np.asarray(offsets)[None, :]
    if index.size == 0 or index.max() >= x.shape[-1]:
        return None
    return x[..., index]


# the production op and the course's own window view
STRIDED_WINDOWS_FORBIDDEN = ("numpy.lib.stride_tricks.sliding_window_view", "course_utils.foundations.sliding_windows",
                             "course_utils.grading.foundations._reference_strided_windows")


def check_strided_windows(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``(B, L) -> (B, (L - width) // step + 1, width)`` windows starting every ``step`` elements.

    Trials rotate through a C-contiguous ``x``, a Fortran-ordered one and a strided view
    ``parent[:, ::2]`` (strides must come from ``x.strides``), with a count that divides exactly, one
    that does not, and a single window.
    """
    counter = iter(range(1 << 30))

    def make_inputs(rng):
        k = next(counter)
        batch, width, step = int(rng.integers(1, 4)), int(rng.integers(3, 7)), int(rng.integers(2, 5))
        length = width + step * int(rng.integers(4, 9))  # (L - width) divisible by step: an exact count
        if k % 3 == 1:
            length += int(rng.integers(1, step))  # floor and ceil differ: off-by-one counts show
        elif k % 3 == 2 and k % 2 == 1:
            length = width + int(rng.integers(0, step))  # exactly one window
        layout = k % 4  # 0, 3: C order; 1: Fortran order; 2: a strided view of a wider parent
        if layout == 2:
            x = rng.standard_normal((batch, 2 * length)).astype(np.float32)[:, ::2]
        else:
            x = rng.standard_normal((batch, length)).astype(np.float32)
            if layout == 1:
                x = np.asfortranarray(x)
        return x, width, step

    def shape_guard(x, width, step):
        got = call_learner("strided_windows", fn, (x, width, step), forbidden=STRIDED_WINDOWS_FORBIDDEN)
        want = _window_count(x.shape[-1], width, step)
        if isinstance(got, np.ndarray) and got.ndim == 3 and got.shape[-1] == width and got.shape[1] != want:
            raise CheckFailed(
                f"strided_windows: {got.shape[1]} windows instead of {want} (L={x.shape[-1]}, width={width}, step={step}); "
                "the last window must end inside x, so there are (L - width) // step + 1 of them."
            )
        if isinstance(got, np.ndarray) and got.shape == (x.shape[0], want, width) and not x.flags.c_contiguous:
            if not np.array_equal(got, _reference_strided_windows(x, width, step)):
                layout = "a Fortran-ordered x" if x.flags.f_contiguous else "a strided view x = parent[:, ::2]"
                raise CheckFailed(f"strided_windows: wrong on {layout}; take the strides from x.strides instead of "
                                  "computing them from x.itemsize and the shape.")
        return got

    def count(x, width, step):
        return _window_count(x.shape[-1], width, step)

    mistakes = [
        Mistake("no_step", "your windows start 1 element apart: the window-start stride must be step * x.strides[-1].",
                lambda x, w, s: _gather_windows(x, np.arange(count(x, w, s)), np.arange(w))),
        Mistake("chunks", "your windows start `width` elements apart (non-overlapping chunks): the window-start stride "
                "is step * x.strides[-1], not width * x.strides[-1].",
                lambda x, w, s: _gather_windows(x, w * np.arange(count(x, w, s)), np.arange(w))),
        Mistake("swapped", "your two new strides are swapped: within a window, elements are x.strides[-1] apart; "
                "window starts are step * x.strides[-1] apart.",
                lambda x, w, s: _gather_windows(x, np.arange(count(x, w, s)), s * np.arange(w))),
    ]
    check_function(shape_guard, _reference_strided_windows, make_inputs, name="strided_windows",
                   trials=trials, seed=seed, mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 3: pairwise distances
def _reference_pairwise_sq_dists(X, Y):
    diff = X[:, None, :] - Y[None, :, :]  # (n, m, d)
    return (diff**2).sum(axis=-1)  # (n, m)


# the library routines that compute the whole answer, and the course's reference
PAIRWISE_FORBIDDEN = ("scipy.spatial.distance.cdist", "sklearn.metrics.pairwise.euclidean_distances", "torch.cdist",
                      "course_utils.grading.foundations._reference_pairwise_sq_dists")


# "without a Python loop", checked: no loop iteration (for, while, comprehension) in the learner's own code
BY_HAND_PAIRWISE = ByHand(max_loop_iterations=0, loops="Python loop (the prompt asks for broadcasting)")


def check_pairwise_sq_dists(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``(n, d), (m, d) -> (n, m)`` squared Euclidean distances by broadcasting."""

    def make_inputs(rng):
        n, m, d = int(rng.integers(3, 8)), int(rng.integers(8, 12)), int(rng.integers(1, 6))
        if rng.random() < 0.25:  # a single query point
            n = 1
        return rng.standard_normal((n, d)), rng.standard_normal((m, d))

    def norms(X, Y):
        return (X**2).sum(1)[:, None], (Y**2).sum(1)[None, :]  # (n, 1), (1, m)

    check_function(
        fn, _reference_pairwise_sq_dists, make_inputs, name="pairwise_sq_dists",
        trials=trials, seed=seed, forbidden=PAIRWISE_FORBIDDEN, by_hand=BY_HAND_PAIRWISE,
        mistakes=[
            Mistake("sqrt", "these are distances, not squared distances: drop the square root.",
                    lambda X, Y: np.sqrt(_reference_pairwise_sq_dists(X, Y))),
            Mistake("transposed", "your output is (m, n): put X's axis first, X[:, None, :] - Y[None, :, :].",
                    lambda X, Y: _reference_pairwise_sq_dists(X, Y).T),
            Mistake("plus_2xy", "the cross term has the wrong sign: |x - y|^2 = |x|^2 + |y|^2 - 2 x.y.",
                    lambda X, Y: sum(norms(X, Y)) + 2 * X @ Y.T),
            Mistake("missing_2", "the cross term lacks its factor 2: |x - y|^2 = |x|^2 + |y|^2 - 2 x.y.",
                    lambda X, Y: sum(norms(X, Y)) - X @ Y.T),
            Mistake("no_square", "you summed the differences without squaring them: square before the sum over d.",
                    lambda X, Y: (X[:, None, :] - Y[None, :, :]).sum(-1)),
        ], quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 4: attention scores by einsum
def _reference_attention_scores(Q, K):
    return torch.einsum("bthd,bshd->bhts", Q, K) / math.sqrt(Q.shape[-1])  # (B, T, H, D), (B, S, H, D) -> (B, H, T, S)


# "one einsum, no transpose/permute": the reordering ops, matmuls, fused attention and the course's reference
ATTENTION_FORBIDDEN = ("torch.Tensor.transpose", "torch.Tensor.permute", "torch.transpose", "torch.permute",
                       "torch.matmul", "torch.Tensor.__matmul__", "torch.bmm",
                       "torch.nn.functional.scaled_dot_product_attention",
                       "course_utils.grading.foundations._reference_attention_scores")


def check_attention_scores(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: ``(B, T, H, D), (B, S, H, D) -> (B, H, T, S)``, scores = Q K^T / sqrt(D) per head."""

    def make_inputs(rng):
        b, h = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        t, s, d = int(rng.integers(5, 8)), int(rng.integers(9, 12)), int(rng.integers(12, 17))
        if rng.random() < 0.3:  # one query position (a decoding step)
            t = 1
        q = torch.from_numpy(rng.standard_normal((b, t, h, d)).astype(np.float32))
        k = torch.from_numpy(rng.standard_normal((b, s, h, d)).astype(np.float32))
        return q, k

    def scaled(spec):
        return lambda Q, K: torch.einsum(spec, Q, K) / math.sqrt(Q.shape[-1])

    check_function(
        fn, _reference_attention_scores, make_inputs, name="attention_scores",
        trials=trials, seed=seed, forbidden=ATTENTION_FORBIDDEN,
        mistakes=[
            Mistake("heads_not_moved", "your output is (B, T, H, S): the head axis must come right after the batch, "
                    "'bthd,bshd->bhts'.", scaled("bthd,bshd->bths")),
            Mistake("transposed", "your output is (B, H, S, T): write the query position before the key position, "
                    "'...->bhts'.", scaled("bthd,bshd->bhst")),
            Mistake("no_scale", "the scores are not scaled: divide by sqrt(D), the size of the contracted axis.",
                    lambda Q, K: torch.einsum("bthd,bshd->bhts", Q, K)),
            Mistake("scale_d", "you divided by D; the scale is 1 / sqrt(D).",
                    lambda Q, K: torch.einsum("bthd,bshd->bhts", Q, K) / Q.shape[-1]),
            Mistake("summed_heads", "your output has lost the head axis: keep h on the right of '->' so it is not summed.",
                    scaled("bthd,bshd->bts")),
            Mistake("scale_by_s", "you divided by sqrt of the number of keys; the scale is 1 / sqrt(D), D = Q.shape[-1].",
                    lambda Q, K: torch.einsum("bthd,bshd->bhts", Q, K) / math.sqrt(K.shape[1])),
        ], quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 5: numerical Jacobian
def _reference_numerical_jacobian(f, x, eps):
    x = x.copy()
    out = np.empty((np.asarray(f(x)).size, x.size))
    for i in range(x.size):
        original = x[i]
        x[i] = original + eps
        plus = np.asarray(f(x), dtype=np.float64)
        x[i] = original - eps
        minus = np.asarray(f(x), dtype=np.float64)
        x[i] = original
        out[:, i] = (plus - minus) / (2 * eps)
    return out


def _jacobian_variant(f, x, eps, *, forward=False, denominator=2.0, restore=True):
    x = x.copy()
    out = np.empty((np.asarray(f(x)).size, x.size))
    for i in range(x.size):
        original = x[i]
        if forward:
            base = np.asarray(f(x), dtype=np.float64)
            x[i] = original + eps
            out[:, i] = (np.asarray(f(x)) - base) / eps
        else:
            x[i] = original + eps
            plus = np.asarray(f(x), dtype=np.float64)
            x[i] = original - eps
            out[:, i] = (plus - np.asarray(f(x))) / (denominator * eps)
        if restore:
            x[i] = original
    return out


# autograd and the course's own finite differences
JACOBIAN_FORBIDDEN = ("torch.autograd.functional.jacobian", "course_utils.foundations.numerical_gradient",
                      "course_utils.grading.foundations._reference_numerical_jacobian")


def check_numerical_jacobian(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: the ``(m, n)`` central-difference Jacobian of ``f: R^n -> R^m`` at ``x``, step ``eps``."""

    def make_inputs(rng):
        n, m = int(rng.integers(1, 6)), int(rng.integers(6, 9))
        return SmoothMap(rng, n, m), rng.standard_normal(n), 1e-3

    # Reference and learner evaluate the same central differences, so they agree to rounding
    # (~1e-16 / eps); a forward difference or a lost restore is off by ~eps * f'' ~ 1e-3.
    # call_restoring hands the learner a copy of x and fails when it does not come back unchanged.
    check_function(
        functools.partial(call_restoring, fn), _reference_numerical_jacobian, make_inputs, name="numerical_jacobian",
        trials=trials, seed=seed, rtol=1e-7, atol=1e-9, forbidden=JACOBIAN_FORBIDDEN,
        mistakes=[
            Mistake("forward", "this is the forward difference (f(x+eps) - f(x)) / eps, accurate only to O(eps); "
                    "use the central difference (f(x+eps) - f(x-eps)) / (2 eps).",
                    lambda f, x, eps: _jacobian_variant(f, x, eps, forward=True)),
            Mistake("over_eps", "twice too large: the two evaluations are 2*eps apart, so divide by 2*eps.",
                    lambda f, x, eps: _jacobian_variant(f, x, eps, denominator=1.0)),
            Mistake("not_restored", "after perturbing x[i] you left it at x[i] - eps, so later columns are taken at the "
                    "wrong point: restore x[i] = original after the two evaluations.",
                    lambda f, x, eps: _jacobian_variant(f, x, eps, restore=False)),
            Mistake("transposed", "your Jacobian is (n, m); rows are outputs and columns inputs: J[j, i] = d f_j / d x_i.",
                    lambda f, x, eps: _reference_numerical_jacobian(f, x, eps).T),
        ], quiet=quiet,
    )


# ---------------------------------------------------------------- exercise 6: the view-vs-copy bug
def _reference_normalize_columns(X):
    return (X - X.mean(dim=0)) / X.std(dim=0, correction=0)  # (n, d)


def check_normalize_columns(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: standardize each column of ``X`` (n, d) to mean 0, std 1, *without* changing ``X``."""

    def make_inputs(rng):
        n, d = int(rng.integers(2, 10)), int(rng.integers(2, 5))  # d = 1 would make row statistics undefined
        X = rng.standard_normal((n, d)) * rng.uniform(0.5, 3.0, size=d) + rng.uniform(-2, 2, size=d)
        return (torch.from_numpy(X.astype(np.float32)),)

    def mutation_guard(X):
        X_seen = X.clone()
        got = call_learner("normalize_columns", fn, (X_seen,))
        if not torch.equal(X_seen, X):
            raise CheckFailed("normalize_columns: your function changed X: X[:], X.view(...) and X.T share X's storage, "
                              "so -= and /= on them write into X; use out-of-place ops or start from X.clone().")
        return got

    check_function(
        mutation_guard, _reference_normalize_columns, make_inputs, name="normalize_columns",
        trials=trials, seed=seed,
        mistakes=[
            Mistake("rows", "you normalized the rows; reduce over dim=0 (down each column) instead.",
                    lambda X: (X - X.mean(dim=1, keepdim=True)) / X.std(dim=1, keepdim=True, correction=0)),
            Mistake("unbiased", "you used the unbiased std (divides by n - 1); pass correction=0 (divide by n).",
                    lambda X: (X - X.mean(dim=0)) / X.std(dim=0)),
            Mistake("no_center", "the columns were scaled but not centred: subtract the column mean first.",
                    lambda X: X / X.std(dim=0, correction=0)),
        ], quiet=quiet,
    )
