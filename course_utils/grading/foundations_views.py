"""Grading for topic 00, exercises 7 and 8 (re-exported by :mod:`course_utils.grading.foundations`): 2-D image
patches as one ``as_strided`` view, with the memory the answer allocates measured, and a segment mean built from a
one-hot matrix by broadcasting, with no Python loop and none of the scatter functions. Reference answers are private.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand

__all__ = ["check_image_patches", "check_segment_mean"]


# ---------------------------------------------------------------- exercise 7: 2-D patches as one strided view
def _patch_count(n, k, stride):
    return (n - k) // stride + 1


def _reference_image_patches(x, kh, kw, stride):
    B, C, H, W = x.shape
    rows = stride * np.arange(_patch_count(H, kh, stride))[:, None] + np.arange(kh)[None, :]  # (Ho, kh)
    cols = stride * np.arange(_patch_count(W, kw, stride))[:, None] + np.arange(kw)[None, :]  # (Wo, kw)
    return x[:, :, rows[:, None, :, None], cols[None, :, None, :]]  # (B, C, Ho, Wo, kh, kw), a copy by gathering


def _patch_bytes(args, kwargs):
    """A copy of x, a quarter of the patches and 32 KiB for Python's and the watch's own objects: a view allocates
    next to nothing, while a copy of the patches (at least 3.6 times x at the check's sizes, x at least 23 KiB)
    does not fit."""
    x, kh, kw, stride = args
    B, C, H, W = x.shape
    patches = B * C * _patch_count(H, kh, stride) * _patch_count(W, kw, stride) * kh * kw * x.itemsize
    return x.nbytes + patches // 4 + 32768


# "a view built with as_strided": NumPy's and torch's window functions, the lesson's windows, and a copy of the patches
BY_HAND_IMAGE_PATCHES = ByHand(
    names=("numpy.lib.stride_tricks.sliding_window_view",),
    modules=("course_utils.foundations", "course_utils.convolution"),
    ops=("@unfold", "@conv"),
    max_traced_bytes=_patch_bytes,
    large="a copy of the patches (return a view of x built with as_strided, which allocates no data)",
)


def _image_inputs(rng, k):
    """(B, C, H, W) float32 in a layout that rotates: C order, channels-last (a transposed view), every other row."""
    B, C = 1, 3
    stride = int(rng.integers(1, 3))
    # at least 4 taps per patch at stride 1, 16 at stride 2: the patches are >= 3.6x the image, so a copy cannot hide
    kh, kw = (int(v) for v in rng.integers(2, 4, size=2) * stride)
    H, W = int(rng.integers(44, 57)), int(rng.integers(44, 57))
    if k % 3 == 0 and stride > 1:
        H += 1  # a leftover row the last patch does not reach
    layout = k % 3
    if layout == 1:  # channels-last memory, (B, C, H, W) logical: strides from x.strides, not from the shape
        x = np.ascontiguousarray(rng.standard_normal((B, H, W, C)).astype(np.float32)).transpose(0, 3, 1, 2)
    elif layout == 2:  # a strided view: every other row of a taller image
        x = rng.standard_normal((B, C, 2 * H, W)).astype(np.float32)[:, :, ::2, :]
    else:
        x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    return x, kh, kw, stride


def check_image_patches(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``(B, C, H, W) -> (B, C, Ho, Wo, kh, kw)`` patches as one ``as_strided`` view of ``x``."""
    counter = iter(range(1 << 30))

    def make_inputs(rng):
        return _image_inputs(rng, next(counter))

    def swapped(x, kh, kw, s):  # out[..., i, j, p, q] = x[..., i + s p, j + s q]: position and tap strides exchanged
        B, C, H, W = x.shape
        Ho, Wo = _patch_count(H, kh, s), _patch_count(W, kw, s)
        rows = np.arange(Ho)[:, None] + s * np.arange(kh)[None, :]
        cols = np.arange(Wo)[:, None] + s * np.arange(kw)[None, :]
        if rows.max() >= H or cols.max() >= W:
            return None
        return x[:, :, rows[:, None, :, None], cols[None, :, None, :]]

    def no_stride(x, kh, kw, s):  # every window, then the first Ho x Wo of them
        p = _reference_image_patches(x, kh, kw, 1)
        return p[:, :, :_patch_count(x.shape[2], kh, s), :_patch_count(x.shape[3], kw, s)]

    def from_shape(x, kh, kw, s):
        """Strides worked out from the shape on the channels-last trial: its (B, H, W, C) buffer read as (B, C, H, W).

        (Mistakes get a C-contiguous copy of x; the channels-last trial's buffer is rebuilt from its values.)"""
        buffer = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(x.shape)
        return _reference_image_patches(buffer, kh, kw, s)

    check_function(
        fn, _reference_image_patches, make_inputs, name="image_patches", trials=trials, seed=seed,
        by_hand=BY_HAND_IMAGE_PATCHES, quiet=quiet,
        mistakes=[
            Mistake("layout", "your patches are laid out (B, C, kh, kw, Ho, Wo); the check wants the positions first, "
                    "(B, C, Ho, Wo, kh, kw): list the position strides before the tap strides.",
                    lambda x, kh, kw, s: _reference_image_patches(x, kh, kw, s).transpose(0, 1, 4, 5, 2, 3)),
            Mistake("swapped", "the position and tap strides are swapped: patches start stride * x.strides[2] apart, "
                    "and within a patch the taps are x.strides[2] (rows) and x.strides[3] (columns) apart.", swapped),
            Mistake("from_shape", "right on a C-contiguous x but wrong on a channels-last or strided one: take the "
                    "strides from x.strides, not from the shape and x.itemsize.", from_shape),
            Mistake("no_stride", "your patches start one pixel apart: multiply the position strides by `stride`.",
                    no_stride),
        ],
    )


# ---------------------------------------------------------------- exercise 8: a segment mean by broadcasting
def _reference_segment_mean(values, segment_ids, num_segments):
    sums = torch.zeros(num_segments, values.shape[1], dtype=values.dtype).index_add_(0, segment_ids, values)
    counts = torch.bincount(segment_ids, minlength=num_segments).to(values.dtype)  # (S,)
    return sums / counts.clamp(min=1)[:, None]  # (S, D); an empty segment has sum 0 and mean 0


# The scatter/gather family, counting and one-hot helpers do the grouping for you; a loop would too.
BY_HAND_SEGMENT_MEAN = ByHand(
    names=("torch.Tensor.index_put_", "torch.Tensor.index_put", "torch.index_put", "torch.Tensor.put_",
           "torch.nn.functional.one_hot", "numpy.bincount", "numpy.add.at"),
    ops=("index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "scatter",
         "scatter_", "index_reduce", "index_reduce_", "bincount", "histc", "segment_reduce", "_segment_reduce",
         "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only", "one_hot", "put", "put_",
         "unique_consecutive", "_unique2", "unique_dim"),
    modules=("course_utils.foundations",),
    max_loop_iterations=0, loops="Python loop (the prompt asks for a one-hot matrix built by broadcasting)",
)


def _segment_inputs(rng):
    n, d = int(rng.integers(300, 600)), int(rng.integers(3, 9))
    s = int(rng.integers(24, 48))
    used = rng.choice(s, size=s - int(rng.integers(2, 6)), replace=False)  # a few segments stay empty
    ids = torch.from_numpy(rng.choice(used, size=n).astype(np.int64))  # unsorted, repeated
    values = torch.from_numpy(rng.standard_normal((n, d)) * 3 + 1)  # float64
    return values, ids, s


def check_segment_mean(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 8: ``(N, D), (N,), S -> (S, D)``: the mean of the rows of each segment, 0 for an empty one."""

    def sums(v, ids, s):
        return torch.zeros(s, v.shape[1], dtype=v.dtype).index_add_(0, ids, v)

    def counts(ids, s):
        return torch.bincount(ids, minlength=s).to(torch.float64)[:, None]

    check_function(
        fn, _reference_segment_mean, _segment_inputs, name="segment_mean", trials=trials, seed=seed,
        by_hand=BY_HAND_SEGMENT_MEAN, quiet=quiet,
        mistakes=[
            Mistake("sums", "these are the sums of each segment; divide by the number of rows in it.", sums),
            Mistake("empty_nan", "an empty segment gives 0 / 0 = NaN: divide by max(count, 1) so that its mean is 0.",
                    lambda v, ids, s: sums(v, ids, s) / counts(ids, s)),
            Mistake("over_n", "you divided every segment by N, the number of all rows; divide by each segment's own "
                    "count (the column sums of the one-hot matrix).", lambda v, ids, s: sums(v, ids, s) / v.shape[0]),
            Mistake("transposed", "your output is (D, S); return one row per segment, (S, D).",
                    lambda v, ids, s: _reference_segment_mean(v, ids, s).T),
            Mistake("last_only", "each segment holds one of its rows, not their mean: assigning with out[ids] = values "
                    "keeps one write per index; sum through the one-hot matrix instead.",
                    lambda v, ids, s: torch.zeros(s, v.shape[1], dtype=v.dtype).index_put_((ids,), v)),
        ],
    )
