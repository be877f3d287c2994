"""Grading for topic 03, exercises 4 and 5 (the backward pass of a convolution, checked against autograd).

Part of :mod:`course_utils.grading.convolution`, which re-exports both checks; the references are private.
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

__all__ = ["check_conv2d_grad_weight", "check_conv2d_grad_input"]

_HERE = "course_utils.grading.convolution_backward."


def _autograd_grads(x, w, grad_out, stride, padding):
    xt = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_(True)
    wt = torch.from_numpy(np.ascontiguousarray(w)).requires_grad_(True)
    out = F.conv2d(xt, wt, stride=stride, padding=padding)
    out.backward(torch.from_numpy(np.ascontiguousarray(grad_out)))
    return xt.grad.numpy(), wt.grad.numpy()


def _backward_inputs(rng, trial: int, *, first_stride: int):
    """``x, w, grad_out, stride, padding``; trial 0 has ``first_stride`` and padding >= 1, odd trials edge sizes."""
    n, c_in, c_out = int(rng.integers(1, 3)), int(rng.integers(2, 4)), int(rng.integers(2, 4))
    k = int(rng.choice([3, 5])) if trial < 2 else int(rng.choice([1, 2, 3]))
    stride = first_stride if trial == 0 else int(rng.integers(1, 4))
    padding = int(rng.integers(1, 3)) if trial == 0 else int(rng.integers(0, 3))
    padding = min(padding, k - 1) if k > 1 else 0
    kind = "edge" if trial % 2 else "plain"
    h, wd = _size_for(rng, kind, k, stride, padding, lo=8, hi=12), _size_for(rng, kind, k, stride, padding, lo=8, hi=12)
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
    # the prompt lets the learner build Cols with the lesson's im2col (eq. 8 is the exercise)
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
        x, w, grad_out, s, p = _backward_inputs(rng, next(counter), first_stride=2)
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
    check_function(fn, reference, make_inputs, name="conv2d_grad_input", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=forbidden, quiet=quiet)
