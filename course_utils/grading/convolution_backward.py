"""Grading for topic 03, exercises 4, 5 and 10: the backward pass of a convolution, checked against autograd (4, 5)
and against a tap-by-tap reference that tests hold to ``torch.nn.grad.conv2d_weight`` (10).

Exercise 10 asks for what the lesson did not write: the weight gradient of a strided, padded, dilated and grouped
convolution as an implicit GEMM whose reduction runs over the output pixels, each tap's input gathered on the fly.
The check measures the structure the prompt demands: no tensor larger than the padded input, ``grad_out`` and the
weight (the column matrix, or one group's share of it, is several times larger on the check's inputs).

Part of :mod:`course_utils.grading.convolution`, which re-exports the checks; the references are private.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand
from ..convolution import conv_output_size, im2col_view
from .convolution_common import AUTOGRAD, CONV_OPS, COURSE_CONVS, UNFOLD_OPS, _flip, _size_for
from .convolution_kernels import TO_NUMPY

__all__ = ["check_conv2d_grad_weight", "check_conv2d_grad_input", "check_conv2d_grad_weight_implicit"]

_HERE = "course_utils.grading.convolution_backward."


def _autograd_grads(x, w, grad_out, stride, padding):
    xt = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_(True)
    wt = torch.from_numpy(np.ascontiguousarray(w)).requires_grad_(True)
    out = F.conv2d(xt, wt, stride=stride, padding=padding)
    out.backward(torch.from_numpy(np.ascontiguousarray(grad_out)))
    return xt.grad.numpy(), wt.grad.numpy()


def _backward_inputs(rng, trial: int, *, first_stride: int, large: bool = False):
    """``x, w, grad_out, stride, padding``; trial 0 has ``first_stride`` and padding >= 1, odd trials edge sizes;
    ``large``: stride 1 and hundreds of output pixels (a loop over them exceeds exercise 5's loop cap)."""
    n, c_in, c_out = int(rng.integers(1, 3)), int(rng.integers(2, 4)), int(rng.integers(2, 4))
    k = int(rng.choice([3, 5])) if trial < 2 else int(rng.choice([1, 2, 3]))
    stride = first_stride if trial == 0 else int(rng.integers(1, 4))
    padding = int(rng.integers(1, 3)) if trial == 0 else int(rng.integers(0, 3))
    padding = min(padding, k - 1) if k > 1 else 0
    kind = "edge" if trial % 2 else "plain"
    if large:
        stride, kind = 1, "plain"
    lo, hi = (24, 30) if large else (8, 12)
    h, wd = _size_for(rng, kind, k, stride, padding, lo=lo, hi=hi), _size_for(rng, kind, k, stride, padding, lo=lo, hi=hi)
    oh, ow = conv_output_size(h, k, stride, padding), conv_output_size(wd, k, stride, padding)
    x = rng.standard_normal((n, c_in, h, wd))
    w = rng.standard_normal((c_out, c_in, k, k))
    grad_out = rng.standard_normal((n, c_out, oh, ow))
    return x, w, grad_out, stride, padding


def _reference_conv2d_grad_weight(x, grad_out, k, s, p):
    w = np.zeros((grad_out.shape[1], x.shape[1], k, k))
    return _autograd_grads(x, w, grad_out, s, p)[1]


def _grad_weight_unpadded(x, grad_out, k, s, p):
    """dout @ cols^T with the windows taken from the unpadded x, cropped/extended to dout's size."""
    view = im2col_view(x, k, k, s, 0)  # (N, C_in, K, K, oh', ow')
    oh2, ow2 = min(grad_out.shape[2], view.shape[4]), min(grad_out.shape[3], view.shape[5])
    return np.einsum("ncpqij,noij->ocpq", view[..., :oh2, :ow2], grad_out[:, :, :oh2, :ow2])


def check_conv2d_grad_weight(fn: Callable, *, trials: int = 4, seed: int | None = None,
                             quiet: bool = False) -> None:
    """Exercise 4: ``dL/dW`` from ``x`` and ``dL/dout`` (float64), checked against autograd."""
    counter = itertools.count()

    def make_inputs(rng):
        x, w, grad_out, s, p = _backward_inputs(rng, next(counter), first_stride=2)
        return x, grad_out, w.shape[2], s, p

    reference = _reference_conv2d_grad_weight
    mistakes = [
        Mistake("flipped", "your gradient is flipped in kh and kw: dW[co, ci, p, q] pairs dout[i, j] with "
                "x[i*s + p, j*s + q] (no flip for a cross-correlation).", lambda *a: _flip(reference(*a))),
        Mistake("first_sample", "you kept only the first sample: dW sums over the batch (and all output pixels).",
                lambda x, g, k, s, p: reference(x[:1], g[:1], k, s, p)),
        Mistake("mean_batch", "you averaged over the batch: dW is the sum over samples, not the mean.",
                lambda x, g, k, s, p: reference(x, g, k, s, p) / x.shape[0]),
        Mistake("channels_swapped", "the channel axes are swapped: dW has w's shape (C_out, C_in, k, k), "
                "so compute G (C_out, N*OH*OW) @ Cols.T, not Cols @ G.T.",
                lambda *a: np.ascontiguousarray(reference(*a).transpose(1, 0, 2, 3))),
        Mistake("no_padding", "you took windows of the unpadded x: pad x by `padding` on both sides before im2col.",
                _grad_weight_unpadded),
    ]
    forbidden = CONV_OPS + UNFOLD_OPS + AUTOGRAD + COURSE_CONVS + (_HERE + "_reference_conv2d_grad_weight",)
    # the prompt lets the learner build Cols with the lesson's im2col (the set's eq. (P1) is the exercise)
    allow = ByHand(allow=("course_utils.convolution.im2col", "course_utils.convolution.im2col_view",
                          "course_utils.convolution.conv_output_size"))
    check_function(fn, reference, make_inputs, name="conv2d_grad_weight", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=forbidden, by_hand=allow, quiet=quiet)


def _reference_conv2d_grad_input(grad_out, w, hw, s, p):
    x = np.zeros((grad_out.shape[0], w.shape[1]) + tuple(hw))
    return _autograd_grads(x, w, grad_out, s, p)[0]


def check_conv2d_grad_input(fn: Callable, *, trials: int = 4, seed: int | None = None,
                            quiet: bool = False) -> None:
    """Exercise 5: ``dL/dx`` from ``W`` and ``dL/dout`` (float64): a transposed convolution, checked against autograd."""
    counter = itertools.count()

    def make_inputs(rng):
        trial = next(counter)
        x, w, grad_out, s, p = _backward_inputs(rng, trial, first_stride=2, large=trial == 2)
        return grad_out, w, (x.shape[2], x.shape[3]), s, p

    reference = _reference_conv2d_grad_input

    def not_flipped(grad_out, w, hw, s, p):  # the adjoint with the kernel used as is: a correlation, not its transpose
        return reference(grad_out, _flip(w), hw, s, p)

    def ignore_stride(grad_out, w, hw, s, p):  # full correlation of dout with the flipped kernel, no zero insertion
        k = w.shape[2]
        full = F.conv2d(torch.from_numpy(grad_out), torch.from_numpy(_flip(w)).transpose(0, 1).contiguous(),
                        padding=k - 1).numpy()
        out = np.zeros((grad_out.shape[0], w.shape[1]) + tuple(hw))
        hh, ww = min(hw[0], full.shape[2] - p), min(hw[1], full.shape[3] - p)
        out[:, :, :hh, :ww] = full[:, :, p:p + hh, p:p + ww]
        return out

    def crop_off_by_one(grad_out, w, hw, s, p):  # crop the padded gradient starting at p - 1
        h, wd = hw
        big = reference(grad_out, w, (h + 2 * p, wd + 2 * p), s, 0)  # gradient wrt the padded input
        q = max(p - 1, 0)
        return np.ascontiguousarray(big[:, :, q:q + h, q:q + wd])

    mistakes = [
        Mistake("not_flipped", "kernel not flipped: dx is a *transposed* convolution, so each tap w[co, ci, p, q] "
                "scatters dout[i, j] to x[i*s + p, j*s + q] (or correlate with the flipped, transposed kernel).",
                not_flipped),
        Mistake("no_stride", "you ignored the stride: dout[i, j] belongs at padded-input row i*stride + u, so scatter "
                "with step `stride` (or insert stride - 1 zeros between dout entries before correlating).",
                ignore_stride),
        Mistake("crop", "off-by-one padding: the gradient wrt the padded input must be cropped as [p:p+H, p:p+W].",
                crop_off_by_one),
    ]
    forbidden = (CONV_OPS + UNFOLD_OPS + AUTOGRAD + COURSE_CONVS
                 + ("course_utils.convolution.col2im", _HERE + "_reference_conv2d_grad_input"))
    # "loop over the kernel taps if you like, not over pixels": taps x channels stay under the cap, pixels do not
    no_pixel_loop = ByHand(max_loop_iterations=200, loops="Python loop over pixels (loop over the kernel taps, if at "
                           "all, and scatter-add whole strided slices)")
    check_function(fn, reference, make_inputs, name="conv2d_grad_input", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=forbidden, by_hand=no_pixel_loop, quiet=quiet)


# ---------------------------------------------------------------- exercise 10: implicit-GEMM weight gradient
def _out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _dw_taps(x, g, kernel_size, s, p, d, groups, *, offset=True, in_group=None):
    """dW tap by tap from index arithmetic (NumPy, float64); the keywords make the named mistakes."""
    x, g = np.asarray(x), np.asarray(g)
    (_, c_in, h, w), (c_out, oh, ow), (kh, kw) = x.shape, g.shape[1:], kernel_size
    cig, cog = c_in // groups, c_out // groups
    channels = in_group or (lambda k: np.arange(k * cig, (k + 1) * cig))
    off = p if offset else 0
    dw = np.zeros((c_out, cig, kh, kw))
    for u in range(kh):
        ih = np.arange(oh) * s + u * d - off                                  # (OH,) rows of x read by tap u
        for v in range(kw):
            iw = np.arange(ow) * s + v * d - off
            inside = ((ih >= 0) & (ih < h))[:, None] & ((iw >= 0) & (iw < w))[None, :]
            tap = x[:, :, np.clip(ih, 0, h - 1)][:, :, :, np.clip(iw, 0, w - 1)] * inside   # (N, C_in, OH, OW)
            for k in range(groups):
                dw[k * cog:(k + 1) * cog, :, u, v] = np.einsum("noij,ncij->oc", g[:, k * cog:(k + 1) * cog],
                                                                tap[:, channels(k)])
    return torch.from_numpy(dw)


def _reference_conv2d_grad_weight_implicit(x, grad_out, kernel_size, stride, padding, dilation, groups):
    """dW tap by tap (torch.nn.grad.conv2d_weight gives the same in float64, tested, at 50x the time)."""
    return _dw_taps(x, grad_out, kernel_size, stride, padding, dilation, groups)


def _largest_allowed(args, kwargs):
    """Elements of the largest tensor the answer may hold: the padded input, grad_out or the weight."""
    x, g, (kh, kw), _, p, _, groups = args
    n, c_in, h, w = x.shape
    return max(n * c_in * (h + 2 * p) * (w + 2 * p), g.numel(), g.shape[1] * (c_in // groups) * kh * kw)


def _column_numel(x_shape, oh, ow, kernel_size):
    return x_shape[0] * x_shape[1] * kernel_size[0] * kernel_size[1] * oh * ow


def _implicit_inputs(rng, trial):
    """Even trials: stride 2, dilation 2, padding >= 1, groups >= 2; odd trials: a batch of 2, stride 1, and a column
    matrix (and each group's share of it) well above what the answer may hold, so that building it is seen."""
    while True:
        groups, cig = int(rng.choice([1, 2, 4])), int(rng.integers(2, 5))
        cog = int(rng.integers(1, cig + 1))
        kernel = (int(rng.choice([3, 5])), int(rng.choice([3, 5])))
        if trial % 2 == 0:
            n, s, d, groups = 1, 2, 2, max(groups, 2)
        else:
            n, s, d = 2, 1, int(rng.integers(1, 3))
        p = int(rng.integers(1 if trial % 2 == 0 else 0, d * (min(kernel) - 1) // 2 + 1))
        h, w = int(rng.integers(24, 40)), int(rng.integers(24, 40))
        oh, ow = _out_size(h, kernel[0], s, p, d), _out_size(w, kernel[1], s, p, d)
        x = torch.from_numpy(rng.standard_normal((n, groups * cig, h, w)))
        g = torch.from_numpy(rng.standard_normal((n, groups * cog, oh, ow)))
        args = (x, g, kernel, s, p, d, groups)
        limit, cols = _largest_allowed(args, {}), _column_numel(x.shape, oh, ow, kernel)
        if trial % 2 == 0 or cols >= 1.25 * groups * limit:
            return args


_IMPLICIT_MISTAKES = [
    Mistake("flipped", "your gradient is flipped in (u, v): tap (u, v) pairs grad_out[i, j] with "
            "x_pad[i*stride + u*dilation, j*stride + v*dilation] (no flip for a cross-correlation).",
            lambda *a: _reference_conv2d_grad_weight_implicit(*a).flip(-1, -2)),
    Mistake("no_dilation", "you ignored the dilation: tap (u, v) reads input pixels u*dilation, v*dilation away from "
            "the window's corner, not u, v.", lambda x, g, k, s, p, d, gr: _dw_taps(x, g, k, s, p, 1, gr)),
    Mistake("no_stride", "you ignored the stride: output pixel (i, j) reads its window at i*stride, j*stride of the "
            "padded input.", lambda x, g, k, s, p, d, gr: _dw_taps(x, g, k, 1, p, d, gr)),
    Mistake("no_padding_offset", "your index arithmetic forgets the padding: in the unpadded input, tap (u, v) of "
            "output pixel (i, j) is row i*stride - padding + u*dilation (and the same for columns), read as 0 "
            "outside the image.", lambda x, g, k, s, p, d, gr: _dw_taps(x, g, k, s, p, d, gr, offset=False)),
    Mistake("group0", "every group read the first group's input channels: group k pairs its C_out/groups filters with "
            "input channels k*C_in/groups .. (k+1)*C_in/groups - 1.", lambda x, g, k, s, p, d, gr: _dw_taps(
                x, g, k, s, p, d, gr, in_group=lambda i: np.arange(x.shape[1] // gr))),
    Mistake("interleaved", "input channels were dealt round-robin to the groups; groups take contiguous blocks of "
            "C_in/groups channels.", lambda x, g, k, s, p, d, gr: _dw_taps(
                x, g, k, s, p, d, gr, in_group=lambda i: np.arange(i, x.shape[1], gr))),
    Mistake("mean_batch", "you averaged over the batch: dW is the sum over samples and output pixels, not the mean.",
            lambda x, *a: _reference_conv2d_grad_weight_implicit(x, *a) / x.shape[0]),
]

BY_HAND_GRAD_WEIGHT_IMPLICIT = ByHand(
    names=CONV_OPS + UNFOLD_OPS + AUTOGRAD + COURSE_CONVS + TO_NUMPY, ops=("@conv", "@unfold"),
    modules=("course_utils.convolution", "course_utils.upsampling"), max_numel=_largest_allowed,
    large="the column matrix, or a slab of it larger than the padded input, grad_out and the weight (gather one tap, "
          "or one block of pixels, at a time)")


def check_conv2d_grad_weight_implicit(fn: Callable, *, trials: int = 2, seed: int | None = None,
                                      quiet: bool = False) -> None:
    """Exercise 10: ``dL/dW`` of a strided, padded, dilated, grouped convolution without the column matrix (torch float64)."""
    counter = itertools.count()
    check_function(fn, _reference_conv2d_grad_weight_implicit, lambda rng: _implicit_inputs(rng, next(counter)),
                   name="conv2d_grad_weight_implicit", trials=trials, seed=seed, mistakes=_IMPLICIT_MISTAKES,
                   by_hand=BY_HAND_GRAD_WEIGHT_IMPLICIT, quiet=quiet)
