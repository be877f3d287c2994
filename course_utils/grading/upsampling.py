"""Grading for topic 04 (``solutions/04_upsampling.ipynb``): one ``check_*`` per exercise, its named mistakes
and its reference (private, so that no answer can be imported under its exercise's name).

Every check draws fresh inputs on each run (``seed=None``; a failure names the seed that reproduces it),
includes edge sizes (an output of size 1, a single row, strides that divide exactly and not), and forbids
the production op the exercise rebuilds (``F.interpolate``, ``F.conv_transpose2d``, ``F.pixel_unshuffle``,
``F.unfold``/``F.fold``...) and the course's own function for the same job. Exercises 3, 5 and 6 live in
:mod:`course_utils.grading.upsampling_transposed`, exercises 7 and 8 (the antialiased resize, nearest upsampling
fused with a convolution) in :mod:`course_utils.grading.upsampling_filters` (re-exported here).
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..classroom.checking import Mistake, call_learner, check_function
from ..upsampling import source_positions
from .upsampling_filters import check_antialias_matrix, check_upsample_conv_fused
from .upsampling_transposed import (CONV_OPS, check_conv_transpose_by_zero_insertion, check_overlap_counts,
                                    check_subpixel_weight)

__all__ = [
    "check_interpolation_matrix",
    "check_output_padding_for",
    "check_conv_transpose_by_zero_insertion",
    "check_pixel_unshuffle",
    "check_overlap_counts",
    "check_subpixel_weight",
    "check_antialias_matrix",
    "check_upsample_conv_fused",
]

_HERE = "course_utils.grading.upsampling."


# ---------------------------------------------------------------- exercise 1: the interpolation matrix
def _reference_interpolation_matrix(in_size: int, out_size: int, align_corners: bool) -> np.ndarray:
    """The ``(out_size, in_size)`` float64 matrix of 1-D linear interpolation (lesson 04, eq. 3)."""
    return _interp_from_positions(source_positions(out_size, in_size, align_corners), in_size, out_size)


def _interp_from_positions(u, in_size, out_size):
    lo = np.clip(np.floor(u).astype(np.int64), 0, in_size - 1)
    hi = np.minimum(lo + 1, in_size - 1)
    t = u - lo
    a = np.zeros((out_size, in_size))
    np.add.at(a, (np.arange(out_size), lo), 1 - t)
    np.add.at(a, (np.arange(out_size), hi), t)
    return a


def _swapped_weights(u, n, m):
    lo = np.minimum(np.floor(u).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    t = u - lo
    a = np.zeros((m, n))
    np.add.at(a, (np.arange(m), lo), t)
    np.add.at(a, (np.arange(m), hi), 1 - t)
    return a


def check_interpolation_matrix(fn: Callable, *, trials: int = 6, seed: int | None = None,
                               quiet: bool = False) -> None:
    """Exercise 1: the ``(out, in)`` matrix of 1-D linear interpolation for both ``align_corners`` settings."""
    counter = itertools.count()
    forbidden = ("torch.nn.functional.interpolate", "torch.nn.functional.upsample", "torch.nn.functional.grid_sample",
                 "course_utils.upsampling.source_positions", "course_utils.upsampling.upsample_bilinear",
                 _HERE + "_reference_interpolation_matrix")

    def sizes(rng, t):
        if t < 2:  # upsampling by 2-3x, the lesson's case; every named mistake differs here
            in_size = int(rng.integers(3, 9))
            return in_size, int(in_size * rng.integers(2, 4) + rng.integers(0, 3))
        kind = (0, 2, 1, 3)[(t - 2) // 2 % 4]  # each kind twice in a row: once per align_corners setting
        in_size = int(rng.integers(1, 9)) if kind == 0 else int(rng.integers(2, 12))
        out = {0: 1 if t % 2 else int(rng.integers(1, 3)),      # an output of 1 pixel (align_corners: no m - 1)
               1: in_size,                                      # same size: the identity
               2: int(rng.integers(1, in_size + 1)),            # downsampling
               3: int(rng.integers(in_size, 4 * in_size + 1))}[kind]
        return in_size, out

    def inputs_for(rng):  # alternate align_corners so both settings are always tested
        t = next(counter)
        in_size, out_size = sizes(rng, t)
        return in_size, out_size, bool(t % 2)

    mistakes = [
        Mistake("offset", "your sample positions use the other align_corners rule: True maps i -> i (n-1)/(m-1); "
                "False maps i -> (i + 0.5) n/m - 0.5 (the half-pixel offset).",
                lambda n, m, ac: _interp_from_positions(source_positions(m, n, not ac), n, m)),
        Mistake("no_half", "with align_corners=False you scaled by n/m but forgot the half-pixel offset: "
                "use u = (i + 0.5) n/m - 0.5.",
                lambda n, m, ac: _interp_from_positions(
                    source_positions(m, n, True) if ac else np.arange(m) * n / m, n, m)),
        Mistake("no_clamp", "positions below 0 must be clamped to 0 (PyTorch does this for align_corners=False), "
                "otherwise the first rows get a negative weight.",
                lambda n, m, ac: _no_clamp(n, m, ac)),
        Mistake("nearest", "each row has a single 1: that is nearest-neighbour; split the weight as 1 - t and t "
                "between floor(u) and floor(u) + 1.",
                lambda n, m, ac: np.eye(n)[np.minimum(np.floor(np.arange(m) * n / m).astype(int), n - 1)]),
        Mistake("swapped_weights", "the weights are swapped: the LOWER neighbour floor(u) gets 1 - t, the upper one t "
                "(t = u - floor(u)).",
                lambda n, m, ac: _swapped_weights(source_positions(m, n, ac), n, m)),
    ]

    def learner(n, m, ac):
        return call_learner("interpolation_matrix", fn, (n, m, ac), forbidden=forbidden)

    check_function(learner, _reference_interpolation_matrix, inputs_for, name="interpolation_matrix",
                   trials=trials, seed=seed, mistakes=mistakes, quiet=True)

    # It must reproduce F.interpolate on an image, not only the reference matrix.
    resize_counter = itertools.count()

    def image_inputs(rng):
        h, w = int(rng.integers(1, 9)), int(rng.integers(2, 9))
        size = (int(rng.integers(1, 3 * h + 2)), int(rng.integers(1, 3 * w + 2)))
        return torch.from_numpy(rng.random((1, 1, h, w))), size, bool(next(resize_counter) % 2)

    def resize_with_matrices(x, size, ac):
        ah = torch.as_tensor(np.asarray(learner(x.shape[2], size[0], ac), dtype=np.float64))
        aw = torch.as_tensor(np.asarray(learner(x.shape[3], size[1], ac), dtype=np.float64))
        return (ah @ x[0, 0] @ aw.T)[None, None]  # (1, 1, *size)

    check_function(resize_with_matrices, lambda x, size, ac: F.interpolate(x, size=size, mode="bilinear",
                                                                           align_corners=ac),
                   image_inputs, name="interpolation_matrix (A_h @ X @ A_w.T against F.interpolate)",
                   trials=trials, seed=seed, quiet=True)
    if not quiet:
        print(f"✅ interpolation_matrix: matches the reference on {trials} random sizes, and A_h X A_w^T equals "
              f"F.interpolate on {trials} random images.")


def _no_clamp(n, m, ac):
    u = source_positions(m, n, True) if ac else (np.arange(m) + 0.5) * n / m - 0.5
    lo = np.minimum(np.floor(u).astype(np.int64), n - 1)  # -1 for the first rows: wraps to the last column
    hi = np.minimum(lo + 1, n - 1)
    t = u - lo
    a = np.zeros((m, n))
    np.add.at(a, (np.arange(m), lo), 1 - t)
    np.add.at(a, (np.arange(m), hi), t)
    return a


# ---------------------------------------------------------------- exercise 2: output_padding
def _reference_output_padding_for(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """``(n + 2p - d(k-1) - 1) mod s``: the rows a stride-``s`` convolution drops at the end."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) % stride


def check_output_padding_for(fn: Callable, *, trials: int = 10, seed: int | None = None,
                             quiet: bool = False) -> None:
    """Exercise 2: ``(n, k, s, p, d) -> output_padding`` with ``conv_transpose(conv(x))`` back at size ``n``."""
    counter = itertools.count()
    forbidden = CONV_OPS + (_HERE + "_reference_output_padding_for",)

    def make_inputs(rng):
        t = next(counter)
        if t < 2:
            # trials 1 and 2: s=5, p=2 and n chosen so the answer is 1; then 0, s-1=4, the no-padding answer (2)
            # and, in trial 2 (d=2, k=3), the no-dilation answer (3) all differ, so each mistake is named
            s, p, d = 5, 2, 1 + t
            k = 3 if t else int(rng.integers(2, 6))
            n = int(rng.integers(d * (k - 1) + 2, 30))
            while _reference_output_padding_for(n, k, s, p, d) != 1:
                n += 1
            return n, k, s, p, d
        s, p, d = int(rng.integers(1, 5)), int(rng.integers(0, 3)), int(rng.integers(1, 4))
        k = int(rng.integers(1, 6))
        span = d * (k - 1) + 1
        if t % 3 == 0:  # edge: the convolution's output has 1 or 2 pixels; the stride divides exactly half the time
            out = int(rng.integers(1, 3))
            n = max((out - 1) * s + span - 2 * p + int(rng.integers(0, s) if rng.random() < 0.5 else 0), 1)
            return max(n, span - 2 * p), k, s, p, d
        return int(rng.integers(max(span - 2 * p, 1), 40)), k, s, p, d

    mistakes = [
        Mistake("zero", "output_padding = 0 ignores the rows the strided convolution dropped: it is the remainder "
                "(n + 2p - d(k-1) - 1) mod s.", lambda n, k, s, p, d: 0),
        Mistake("s_minus_1", "s - 1 is only the largest allowed value; the right one is the remainder "
                "(n + 2p - d(k-1) - 1) mod s.", lambda n, k, s, p, d: s - 1),
        Mistake("no_dilation", "you ignored dilation: a dilated kernel spans d(k-1)+1 pixels, not k.",
                lambda n, k, s, p, d: _reference_output_padding_for(n, k, s, p, 1)),
        Mistake("no_padding", "padding is added on both sides before the strided convolution: use n + 2p.",
                lambda n, k, s, p, d: _reference_output_padding_for(n, k, s, 0, d)),
        Mistake("size", "return the output_padding (a remainder smaller than s), not the output size.",
                lambda n, k, s, p, d: n),
    ]
    check_function(fn, _reference_output_padding_for, make_inputs, name="output_padding_for",
                   trials=trials, seed=seed, mistakes=mistakes, forbidden=forbidden, quiet=quiet)


# ---------------------------------------------------------------- exercise 4: pixel unshuffle
def _reference_pixel_unshuffle(x, r):
    return F.pixel_unshuffle(x, r)


def check_pixel_unshuffle(fn: Callable, *, trials: int = 4, seed: int | None = None,
                          quiet: bool = False) -> None:
    """Exercise 4: ``(N, C, H*r, W*r) -> (N, C*r*r, H, W)`` by reshape and permute."""
    counter = itertools.count()
    forbidden = ("torch.nn.functional.pixel_unshuffle", "torch.pixel_unshuffle", "torch.nn.functional.pixel_shuffle",
                 "torch.pixel_shuffle", "torch.nn.functional.unfold", "torch.Tensor.unfold",
                 "torch.nn.PixelUnshuffle.forward", "course_utils.upsampling.pixel_shuffle",
                 _HERE + "_reference_pixel_unshuffle")

    def make_inputs(rng):
        t = next(counter)
        r = int(rng.integers(2, 4))
        c = int(rng.integers(2, 4)) if t < 2 else int(rng.integers(1, 4))
        h, w = (int(rng.integers(2, 5)), int(rng.integers(2, 5))) if t % 2 == 0 else (1, int(rng.integers(1, 4)))
        x = torch.from_numpy(rng.standard_normal((int(rng.integers(1, 3)), c, h * r, w * r)).astype(np.float32))
        return x, r

    def channel_last(x, r):  # channel index (i*r + j)*C + c
        n, c, hr, wr = x.shape
        y = x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 3, 5, 1, 2, 4)  # (N, i, j, C, H, W)
        return y.reshape(n, c * r * r, hr // r, wr // r)

    def ij_swapped(x, r):
        n, c, hr, wr = x.shape
        y = x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 1, 5, 3, 2, 4)  # (N, C, j, i, H, W)
        return y.reshape(n, c * r * r, hr // r, wr // r)

    def blocks(x, r):  # splits the image into r x r big blocks instead of interleaved sub-pixels
        n, c, hr, wr = x.shape
        y = x.reshape(n, c, r, hr // r, r, wr // r).permute(0, 1, 2, 4, 3, 5)  # (N, C, i, j, H, W)
        return y.reshape(n, c * r * r, hr // r, wr // r)

    def no_permute(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c * r * r, hr // r, wr // r)

    mistakes = [
        Mistake("channel_last", "channel order: PyTorch puts the original channel first, so output channel is "
                "c*r*r + i*r + j; permute to (N, C, i, j, H, W), not (N, i, j, C, H, W).", channel_last),
        Mistake("ij_swapped", "the sub-pixel row i and column j are swapped: output channel c*r*r + i*r + j holds "
                "row offset i, column offset j.", ij_swapped),
        Mistake("blocks", "you split H*r as (r, H) instead of (H, r): sub-pixels are interleaved (row h*r + i), "
                "so reshape to (N, C, H, r, W, r).", blocks),
        Mistake("no_permute", "a reshape alone does not move the sub-pixels to channels: reshape to "
                "(N, C, H, r, W, r), permute to (N, C, r, r, H, W), then reshape.", no_permute),
    ]
    check_function(fn, _reference_pixel_unshuffle, make_inputs, name="pixel_unshuffle",
                   trials=trials, seed=seed, mistakes=mistakes, forbidden=forbidden, quiet=quiet)
