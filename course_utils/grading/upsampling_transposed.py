"""Grading for topic 04, exercises 3, 5 and 6 (the transposed convolution by zero insertion, its overlap counts,
the sub-pixel convolution as a transposed convolution).

Part of :mod:`course_utils.grading.upsampling`, which re-exports the checks; the references are private.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..classroom.checking import Mistake, call_learner, check_function
from ..upsampling import conv_transpose_output_size

__all__ = ["check_conv_transpose_by_zero_insertion", "check_overlap_counts", "check_subpixel_weight"]

_HERE = "course_utils.grading.upsampling_transposed."
CONV_OPS = ("torch.nn.functional.conv2d", "torch.conv2d", "torch.nn.functional.conv_transpose2d",
            "torch.conv_transpose2d")
TRANSPOSED_CONV_OPS = ("torch.nn.functional.conv_transpose2d", "torch.conv_transpose2d", "torch.nn.functional.fold",
                       "torch.nn.grad.conv2d_input", "torch.autograd.grad", "torch.autograd.backward",
                       "torch.Tensor.backward", "course_utils.upsampling.conv_transpose2d_fold",
                       "course_utils.convolution.col2im")


# ---------------------------------------------------------------- exercise 3: zero insertion
def _zero_insert(x: torch.Tensor, s: int) -> torch.Tensor:
    n, c, h, w = x.shape
    z = x.new_zeros(n, c, (h - 1) * s + 1, (w - 1) * s + 1)
    z[:, :, ::s, ::s] = x
    return z


def _zi_conv(x, w, s, p, op, *, flip=True, swap=True, pad=None, use_op=True):
    k = w.shape[-1]
    q = k - 1 - p if pad is None else pad
    z = _zero_insert(x, s)
    extra = op if use_op else 0
    z = F.pad(z, (q, q + extra, q, q + extra))
    kern = w.transpose(0, 1) if swap else w
    if flip:
        kern = kern.flip(-1, -2)
    return F.conv2d(z, kern)


def _zeros_after(x, w, s, p, op):
    n, c, h, wd = x.shape
    z = x.new_zeros(n, c, h * s, wd * s)
    z[:, :, ::s, ::s] = x
    q = w.shape[-1] - 1 - p
    z = F.pad(z, (q, q + op, q, q + op))  # s - 1 rows too many at the end
    return F.conv2d(z, w.transpose(0, 1).flip(-1, -2))


def _reference_conv_transpose(x, w, s, p, op):
    return F.conv_transpose2d(x, w, stride=s, padding=p, output_padding=op)


def check_conv_transpose_by_zero_insertion(fn: Callable, *, trials: int = 5,
                                           seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``conv_transpose2d(x, w, stride, padding, output_padding)`` as zero insertion + ``F.conv2d``."""
    counter = itertools.count()
    forbidden = TRANSPOSED_CONV_OPS + (_HERE + "_reference_conv_transpose",)

    def make_inputs(rng):
        t = next(counter)
        c_in = int(rng.integers(1, 4))
        c_out = c_in if (t == 0 or rng.integers(0, 2)) else int(rng.integers(1, 5))
        k = int(rng.integers(2, 5)) if t < 2 else int(rng.integers(1, 5))
        s = int(rng.integers(2, 4)) if t < 2 else int(rng.integers(1, 4))
        p = int(rng.integers(0, k))  # padding <= k - 1 so that k - 1 - p >= 0
        op = s - 1 if t == 0 else int(rng.integers(0, s))  # the first trial names the axis and p_out mistakes
        h, w = (int(rng.integers(3, 7)), int(rng.integers(3, 7))) if t % 2 == 0 else (1, int(rng.integers(1, 4)))
        if (min(h, w) - 1) * s + k - 2 * p + op < 1:  # an empty output: take no padding instead
            p = 0
        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        x = torch.randn(int(rng.integers(1, 3)), c_in, h, w, generator=g, dtype=torch.float64)
        wt = torch.randn(c_in, c_out, k, k, generator=g, dtype=torch.float64)
        return x, wt, s, p, op

    mistakes = [
        Mistake("not_flipped", "the kernel is not flipped: a transposed convolution done as a convolution needs "
                "w.flip(-1, -2) (the adjoint reverses the taps).",
                lambda x, w, s, p, op: _zi_conv(x, w, s, p, op, flip=False)),
        Mistake("axes_swapped", "the weight's channel axes are not swapped: conv_transpose2d weights are "
                "(C_in, C_out, k, k), F.conv2d wants (C_out, C_in, k, k), so use w.transpose(0, 1).",
                lambda x, w, s, p, op: _zi_conv(x, w, s, p, op, swap=False)),
        Mistake("no_output_padding", "output_padding is ignored: pad p_out extra zeros on the bottom and right "
                "(only) of the zero-inserted input.", lambda x, w, s, p, op: _zi_conv(x, w, s, p, op, use_op=False)),
        Mistake("pad_p", "the zero-inserted input must be padded by k - 1 - p, not by p.",
                lambda x, w, s, p, op: _zi_conv(x, w, s, p, op, pad=p)),
        Mistake("pad_k1", "padding k - 1 gives the full output; the transposed conv's padding p removes p pixels, "
                "so pad by k - 1 - p.", lambda x, w, s, p, op: _zi_conv(x, w, s, p, op, pad=w.shape[-1] - 1)),
        Mistake("zeros_after", "insert s - 1 zeros BETWEEN input pixels only ((n-1)s + 1 pixels), not after the "
                "last one too.", _zeros_after),
    ]
    check_function(fn, _reference_conv_transpose, make_inputs,
                   name="conv_transpose_by_zero_insertion", trials=trials, seed=seed, mistakes=mistakes,
                   forbidden=forbidden, quiet=quiet)


# ---------------------------------------------------------------- exercise 5: overlap counts
def _counts_1d(n: int, k: int, s: int, p: int) -> np.ndarray:
    """1-D overlap counts: input pixel i stamps k ones starting at i*s, then p pixels are cropped per side."""
    n_out = conv_transpose_output_size(n, k, s, p)
    full = np.zeros(n_out + 2 * p, dtype=np.int64)
    for i in range(n):
        full[i * s:i * s + k] += 1
    return full[p:p + n_out]


def _reference_overlap_counts(h_in: int, w_in: int, kernel: int, stride: int, padding: int = 0) -> np.ndarray:
    """``(H_out, W_out)`` int64: the outer product of the 1-D counts (``conv_transpose2d`` of ones by ones)."""
    return np.outer(_counts_1d(h_in, kernel, stride, padding), _counts_1d(w_in, kernel, stride, padding))


def check_overlap_counts(fn: Callable, *, trials: int = 6, seed: int | None = None,
                         quiet: bool = False) -> None:
    """Exercise 5: the ``(H_out, W_out)`` integer map of overlaps of a transposed convolution."""
    counter = itertools.count()
    forbidden = CONV_OPS + TRANSPOSED_CONV_OPS + ("torch.nn.functional.unfold", _HERE + "_reference_overlap_counts",
                                                  _HERE + "_counts_1d")

    def make_inputs(rng):
        t = next(counter)
        s = int(rng.integers(2, 4))
        if t < 2:  # k > s, not a multiple: the checkerboard shows; the second has padding
            k = int(rng.integers(s + 1, 2 * s + 2))
            k += k % s == 0
            p = int(rng.integers(1, k)) if t else 0
            return int(rng.integers(3, 7)), int(rng.integers(3, 7)), k, s, p
        k = int(rng.integers(1, 2 * s + 2))  # k < s leaves gaps (zeros), k = s tiles exactly
        h, w = (int(rng.integers(2, 7)), int(rng.integers(2, 7))) if t % 2 == 0 else (1, int(rng.integers(1, 4)))
        p = int(rng.integers(0, k))
        while p and min((h - 1) * s + k, (w - 1) * s + k) - 2 * p < 1:  # keep the output non-empty
            p -= 1
        return h, w, k, s, p

    def uncropped(h, w, k, s, p):
        return _reference_overlap_counts(h, w, k, s, 0)

    def crop_end(h, w, k, s, p):
        full = _reference_overlap_counts(h, w, k, s, 0)
        return full[: full.shape[0] - 2 * p, : full.shape[1] - 2 * p]

    def summed(h, w, k, s, p):
        return (_counts_1d(h, k, s, p)[:, None] + _counts_1d(w, k, s, p)[None, :]).astype(np.int64)

    mistakes = [
        Mistake("uncropped", "you did not crop the padding: a transposed convolution with padding p removes p "
                "pixels from EACH side of the full (n-1)s + k output.", uncropped),
        Mistake("crop_end", "you cropped 2p pixels from the end only: padding removes p pixels from each side.",
                crop_end),
        Mistake("summed", "the 2-D count is the PRODUCT of the row and column counts (outer product), not their sum.",
                summed),
    ]
    check_function(fn, _reference_overlap_counts, make_inputs, name="overlap_counts", trials=trials,
                   seed=seed, mistakes=mistakes, forbidden=forbidden, quiet=quiet)


# ---------------------------------------------------------------- exercise 6: sub-pixel as transposed conv
def _reference_subpixel_weight(kernel: torch.Tensor, r: int) -> torch.Tensor:
    """``(C*r*r, C_in, k, k) -> (C_in, C, k*r, k*r)``: tap ``(a, b)`` of channel ``c*r*r + i*r + j`` at
    ``((k-1-a) r + i, (k-1-b) r + j)``; use with ``stride=r, padding=(k-1-p) r``."""
    crr, c_in, k, _ = kernel.shape
    c = crr // (r * r)
    kern = kernel.reshape(c, r, r, c_in, k, k).flip(-1, -2)  # (C, i, j, C_in, a', b')
    return kern.permute(3, 0, 4, 1, 5, 2).reshape(c_in, c, k * r, k * r)  # position a'*r + i, b'*r + j


def check_subpixel_weight(fn: Callable, *, trials: int = 4, seed: int | None = None,
                          quiet: bool = False) -> None:
    """Exercise 6: the transposed-convolution weight equal to conv2d (padding (k-1)/2) followed by pixel_shuffle."""
    name = "subpixel_as_conv_transpose_weight"
    counter = itertools.count()
    forbidden = CONV_OPS + ("torch.nn.functional.pixel_shuffle", "torch.pixel_shuffle",
                            "torch.nn.functional.pixel_unshuffle", "torch.pixel_unshuffle",
                            "course_utils.upsampling.pixel_shuffle", "course_utils.upsampling.pixel_shuffle_weight",
                            _HERE + "_reference_subpixel_weight")

    def make_inputs(rng):
        t = next(counter)
        r = int(rng.integers(2, 4))
        k = 3 if t < 2 else int(rng.choice([1, 3, 5]))
        c, c_in = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        return torch.from_numpy(rng.standard_normal((c * r * r, c_in, k, k))), r  # float64

    def learner(kern, r):
        return call_learner(name, fn, (kern, r), forbidden=forbidden)

    def block_layout(kern, r):  # position i*k + a' instead of a'*r + i
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 1, 4, 2, 5)  # (C_in, C, i, a', j, b')
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    def ij_swapped(kern, r):
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 4, 2, 5, 1)  # (C_in, C, a', j, b', i)
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    mistakes = [
        Mistake("not_flipped", "the taps are not flipped: tap (a, b) goes to block (k-1-a, k-1-b), because a "
                "transposed convolution stamps where a convolution gathers.",
                lambda kern, r: _reference_subpixel_weight(kern.flip(-1, -2), r)),
        Mistake("axes_swapped", "the channel axes are swapped: conv_transpose2d weights are (C_in, C_out, kr, kr).",
                lambda kern, r: _reference_subpixel_weight(kern, r).transpose(0, 1)),
        Mistake("block_layout", "the position inside the kr x kr kernel is a'*r + i (tap block a', sub-pixel i), "
                "not i*k + a'.", block_layout),
        Mistake("ij_swapped", "the sub-pixel offsets are swapped: channel c*r*r + i*r + j is row offset i, "
                "column offset j.", ij_swapped),
    ]
    check_function(learner, _reference_subpixel_weight, make_inputs, name=name, trials=trials, seed=seed,
                   mistakes=mistakes, quiet=True)

    # and the weight must do the job: conv_transpose2d with it equals the sub-pixel layer on an image
    def layer_inputs(rng):
        kern, r = make_inputs(rng)
        x = torch.from_numpy(rng.standard_normal((1, kern.shape[1], int(rng.integers(1, 6)), int(rng.integers(1, 6)))))
        return x, kern, r

    def as_transposed(x, kern, r):
        k = kern.shape[-1]
        return F.conv_transpose2d(x, learner(kern, r), stride=r, padding=(k - 1 - (k - 1) // 2) * r)

    check_function(as_transposed, lambda x, kern, r: F.pixel_shuffle(F.conv2d(x, kern, padding=(kern.shape[-1] - 1) // 2), r),
                   layer_inputs, name=f"{name}: conv_transpose2d(x, W, stride=r, padding=(k-1-p)r) vs "
                   "pixel_shuffle(conv2d(x, K, padding=p), r)", trials=trials, seed=seed, quiet=True)
    if not quiet:
        print(f"✅ {name}: matches the reference on {trials} random kernels, and the transposed convolution with it "
              f"equals the sub-pixel layer on {trials} random images.")
