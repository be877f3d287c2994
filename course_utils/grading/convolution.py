"""Grading for topic 03 (``solutions/03_convolution.ipynb``): one ``check_*`` per exercise, its named mistakes
and its reference (private, so that no answer can be imported under its exercise's name).

Every check draws fresh inputs on each run (``seed=None``; a failure names the seed that reproduces it),
includes edge sizes (an output of size 1 or 2, strides that divide the padded input exactly and not),
and forbids the shortcuts that would skip the exercise: the production op (``F.conv2d`` and friends),
autograd for the backward exercises, and the course's own functions for the piece being written. Exercises 4, 5 and 10
live in :mod:`course_utils.grading.convolution_backward`, exercises 8 and 9 in ``convolution_kernels`` (all re-exported
here); shared pieces in ``convolution_common``. Exercises 9 and 10 ask for what lesson 03 did not write (a model of
what a register tile reaches, and an implicit-GEMM weight gradient of a dilated, grouped convolution).
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, call_learner, check_function
from ..classroom.forbidden import ByHand
from ..errors import CheckFailed
from ..convolution import conv_output_size, im2col
from .convolution_backward import check_conv2d_grad_input, check_conv2d_grad_weight, check_conv2d_grad_weight_implicit
from .convolution_common import CONV_OPS, COURSE_CONVS, UNFOLD_OPS, _edge_size, _flip, _size_for, _torch_conv
from .convolution_kernels import check_micro_kernel_efficiency, check_micro_kernel_update

__all__ = [
    "check_conv_output_shape",
    "check_im2col_nhwc",
    "check_conv2d_grouped",
    "check_conv2d_grad_weight",
    "check_conv2d_grad_input",
    "check_conv1x1",
    "check_column_matrix_mib",
    "check_micro_kernel_update",
    "check_micro_kernel_efficiency",
    "check_conv2d_grad_weight_implicit",
]

_HERE = "course_utils.grading.convolution."
# Exercise 3: the prompt lets the learner build the column matrix with the lesson's im2col; the grouping is the exercise.
ALLOW_IM2COL = ByHand(allow=("course_utils.convolution.im2col", "course_utils.convolution.im2col_view",
                             "course_utils.convolution.conv_output_size"))
# Structural demands of the prompts, measured (issue 23): Python-level loop iterations in the learner's own code.
# Exercise 2: no loop over pixels (a loop over the <= 9 taps times the channels stays under the cap; trial 2 has
# hundreds of output pixels). Exercise 3: one batched product (trial 1 has 4 groups). Exercise 6: no loop at all.
NO_PIXEL_LOOP_IM2COL = ByHand(max_loop_iterations=100, loops="Python loop over pixels (take every window at once "
                              "with one strided view)")
ONE_BATCHED_PRODUCT = ByHand(allow=ALLOW_IM2COL.allow, max_loop_iterations=3, loops="Python loop over groups (one "
                             "batched np.matmul on (groups, ...) arrays computes them all)")
ONE_MATMUL = ByHand(max_loop_iterations=0, loops="Python loop (one matrix product does the whole 1x1 convolution)")


# ---------------------------------------------------------------- exercise 1: output shape
def _reference_output_shape(hw, kernel, stride, padding, dilation):
    return tuple(conv_output_size(hw[a], kernel[a], stride[a], padding[a], dilation[a]) for a in range(2))


def check_conv_output_shape(fn: Callable, *, trials: int = 6, seed: int | None = None,
                            quiet: bool = False) -> None:
    """Exercise 1: ``(hw, kernel, stride, padding, dilation)``, each an ``(H-axis, W-axis)`` pair -> ``(H_out, W_out)``."""
    counter = itertools.count()
    forbidden = CONV_OPS + ("course_utils.convolution.conv_output_size", _HERE + "_reference_output_shape")

    def make_inputs(rng):
        pair = lambda lo, hi: (int(rng.integers(lo, hi)), int(rng.integers(lo, hi)))  # noqa: E731
        if next(counter) % 3 == 2:  # every third trial: outputs of size 1 or 2, exact division or not
            k, s, p, d = pair(1, 6), pair(1, 4), pair(0, 3), pair(1, 4)
            hw = tuple(_edge_size(rng, int(rng.integers(1, 3)), k[a], s[a], p[a], d[a]) for a in range(2))
            return hw, k, s, p, d
        while True:  # draw until the reference and every mistake disagree, so each mistake is named exactly
            stride = pair(2, 4)
            if stride[0] == stride[1]:
                stride = (stride[0], stride[0] + 1)  # different per axis, so swapped axes show
            args = (pair(20, 40), pair(2, 6), stride, pair(1, 3), pair(2, 4))
            answers = [_reference_output_shape(*args)] + [m.fn(*args) for m in mistakes]
            if len(set(answers)) == len(answers):
                return args

    def size_with(formula, swap=False):
        def size(hw, k, s, p, d):
            b = (1, 0) if swap else (0, 1)
            return tuple(formula(hw[a], k[a], s[b[a]], p[a], d[a]) for a in range(2))
        return size

    right = lambda n, k, s, p, d: (n + 2 * p - d * (k - 1) - 1) // s + 1  # noqa: E731
    mistakes = [
        Mistake("no_dilation", "you forgot the dilation: a dilated kernel spans d*(K-1)+1 pixels, so subtract "
                "d*(K-1)+1, not K.", size_with(lambda n, k, s, p, d: (n + 2 * p - k) // s + 1)),
        Mistake("one_side", "you padded one side only: padding adds p pixels at both ends, so use n + 2*p.",
                size_with(lambda n, k, s, p, d: (n + p - d * (k - 1) - 1) // s + 1)),
        Mistake("no_plus_one", "off by one: count the first window too, (n + 2p - d(K-1) - 1) // s + 1.",
                size_with(lambda n, k, s, p, d: (n + 2 * p - d * (k - 1) - 1) // s)),
        Mistake("ceil", "you rounded up: a window that would run past the padded input is dropped, so use floor "
                "division //.", size_with(lambda n, k, s, p, d: -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1)),
        Mistake("swapped", "you mixed up the axes: use stride[0], padding[0], ... for H and index 1 for W.",
                size_with(right, swap=True)),
    ]

    def as_tuple(*args):
        got = call_learner("conv_output_shape", fn, args, forbidden=forbidden)
        if isinstance(got, (list, np.ndarray, torch.Size)):
            got = tuple(got)
        if isinstance(got, tuple):
            if any(isinstance(v, (float, np.floating)) for v in got):
                raise CheckFailed("conv_output_shape: sizes must be ints; use floor division // instead of / "
                                  "(np.floor returns a float too), or convert with int().")
            got = tuple(int(v) if isinstance(v, (int, np.integer)) else v for v in got)
        return got

    check_function(as_tuple, _reference_output_shape, make_inputs, name="conv_output_shape", trials=trials,
                   seed=seed, mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 2: channels-last im2col
def _reference_im2col_nhwc(x, kh, kw, stride, padding):
    """``(N, H, W, C) -> (N*OH*OW, KH*KW*C)``, rows (n, oh, ow), columns (kh, kw, c)."""
    cols = im2col(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), kh, kw, stride, padding)  # (C*KH*KW, N*OH*OW)
    c = x.shape[3]
    return np.ascontiguousarray(cols.reshape(c, kh, kw, -1).transpose(3, 1, 2, 0).reshape(-1, kh * kw * c))


def check_im2col_nhwc(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: channels-last im2col, the layout of implicit-GEMM kernels on NHWC tensors."""
    counter = itertools.count()

    def make_inputs(rng):
        t = next(counter)
        n, c = int(rng.integers(1, 3)), int(rng.integers(2, 5))
        kh, kw = int(rng.integers(2, 4)), int(rng.integers(1, 4))
        if t == 0:  # stride 2 and padding >= 1, so that every named mistake differs from the answer
            stride, padding = 2, int(rng.integers(1, 3))
            h, w = int(rng.integers(6, 10)), int(rng.integers(6, 10))
        elif t == 2:  # hundreds of output pixels: a loop over them exceeds the loop cap
            stride, padding = 1, int(rng.integers(0, 2))
            h, w = int(rng.integers(24, 32)), int(rng.integers(24, 32))
        else:
            stride, padding = int(rng.integers(1, 4)), int(rng.integers(0, 3))
            kind = "edge" if t % 2 else "plain"
            h, w = _size_for(rng, kind, kh, stride, padding), _size_for(rng, kind, kw, stride, padding)
        return rng.standard_normal((n, h, w, c)).astype(np.float32), kh, kw, stride, padding

    def channel_major(x, kh, kw, s, p):  # columns ordered (c, kh, kw): the NCHW order of the lesson
        return im2col(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), kh, kw, s, p).T.copy()

    def one_side(x, kh, kw, s, p):
        xp = np.pad(x, ((0, 0), (p, 0), (p, 0), (0, 0)))
        return _reference_im2col_nhwc(xp, kh, kw, s, 0)

    def one_side_end(x, kh, kw, s, p):
        xp = np.pad(x, ((0, 0), (0, p), (0, p), (0, 0)))
        return _reference_im2col_nhwc(xp, kh, kw, s, 0)

    mistakes = [
        Mistake("channel_order", "wrong channel order in the column matrix: channels-last columns run (kh, kw, c) "
                "with c fastest, not (c, kh, kw).", channel_major),
        Mistake("transposed", "your matrix is transposed: rows are output pixels (n, oh, ow), columns are "
                "(kh, kw, c).", lambda *a: _reference_im2col_nhwc(*a).T.copy()),
        Mistake("no_stride", "you ignored the stride: consecutive output pixels start `stride` input pixels apart.",
                lambda x, kh, kw, s, p: _reference_im2col_nhwc(x, kh, kw, 1, p)),
        Mistake("one_side", "off-by-one padding: you padded only the top/left; pad p pixels on both sides of H and W.",
                one_side),
        Mistake("one_side_end", "off-by-one padding: you padded only the bottom/right; pad p pixels on both sides.",
                one_side_end),
        Mistake("no_padding", "you forgot the zero padding: pad H and W by p on both sides before taking windows.",
                lambda x, kh, kw, s, p: _reference_im2col_nhwc(x, kh, kw, s, 0)),
    ]
    forbidden = UNFOLD_OPS + ("course_utils.convolution.im2col", "course_utils.convolution.im2col_view",
                              _HERE + "_reference_im2col_nhwc")
    check_function(fn, _reference_im2col_nhwc, make_inputs, name="im2col_nhwc", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=forbidden, by_hand=NO_PIXEL_LOOP_IM2COL, quiet=quiet)


# ---------------------------------------------------------------- exercise 3: grouped convolution
def _reference_conv2d_grouped(x, w, stride, padding, groups):
    return _torch_conv(x, w, stride, padding, 1, groups)


def check_conv2d_grouped(fn: Callable, *, trials: int = 4, seed: int | None = None,
                         quiet: bool = False) -> None:
    """Exercise 3: ``groups``-way grouped convolution as one batched GEMM (depthwise when groups == C_in)."""
    counter = itertools.count()

    def make_inputs(rng):
        t = next(counter)
        groups = int(rng.choice([2, 3]))
        cig, cog = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        if t == 1:
            groups, cig, cog = 4, 1, 2  # depthwise with channel multiplier 2
        k = 3 if t < 2 else int(rng.choice([1, 3]))
        stride, padding = int(rng.integers(1, 4)), 1 if t < 2 else int(rng.integers(0, 2))
        kind = "edge" if t % 2 else "plain"
        h, wd = _size_for(rng, kind, k, stride, padding), _size_for(rng, kind, k, stride, padding)
        x = rng.standard_normal((int(rng.integers(1, 3)), groups * cig, h, wd)).astype(np.float32)
        w = rng.standard_normal((groups * cog, cig, k, k)).astype(np.float32)
        return x, w, stride, padding, groups

    def first_group_input(x, w, s, p, g):  # every group reads input group 0
        cig = x.shape[1] // g
        return _torch_conv(np.tile(x[:, :cig], (1, g, 1, 1)), w, s, p, 1, g)

    def interleaved(x, w, s, p, g):  # input channels dealt round-robin to groups
        cig = x.shape[1] // g
        order = np.arange(x.shape[1]).reshape(cig, g).T.reshape(-1)
        return _torch_conv(x[:, order], w, s, p, 1, g)

    def rows_interleaved(x, w, s, p, g):  # column-matrix rows dealt round-robin to groups
        kh, kw = w.shape[2:]
        cols = im2col(x, kh, kw, s, p)  # (C_in*KH*KW, N*OH*OW)
        out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(-1, g, cols.shape[1]).transpose(1, 0, 2))
        oh, ow = conv_output_size(x.shape[2], kh, s, p), conv_output_size(x.shape[3], kw, s, p)
        return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))

    def out_interleaved(x, w, s, p, g):  # output channels dealt round-robin from the groups
        ref = _reference_conv2d_grouped(x, w, s, p, g)
        cog = w.shape[0] // g
        order = np.arange(w.shape[0]).reshape(g, cog).T.reshape(-1)
        return np.ascontiguousarray(ref[:, order])

    mistakes = [
        Mistake("flipped", "you flipped the kernel (true convolution); conv2d is a cross-correlation: use w as is.",
                lambda x, w, s, p, g: _reference_conv2d_grouped(x, _flip(w), s, p, g)),
        Mistake("rows_interleaved", "wrong channel order in the column matrix: its rows run (c, kh, kw), so group k "
                "owns the contiguous rows k*R .. (k+1)*R - 1 with R = C_in/groups*KH*KW; reshape to (groups, R, -1).",
                rows_interleaved),
        Mistake("group0", "every group reads the first group's input channels: group g uses input channels "
                "g*C_in/groups to (g+1)*C_in/groups - 1.", first_group_input),
        Mistake("interleaved", "input channels are split round-robin; groups take contiguous blocks of "
                "C_in/groups channels (reshape (N, groups, C_in/groups, H, W)).", interleaved),
        Mistake("out_interleaved", "output channels come out in the wrong order: group g's filters are output "
                "channels g*C_out/groups .. (g+1)*C_out/groups - 1, in order; reshape (groups, C_out/groups, ...) "
                "back to C_out without a transpose.", out_interleaved),
        Mistake("no_padding", "you forgot the padding: pad H and W by `padding` on both sides.",
                lambda x, w, s, p, g: _reference_conv2d_grouped(x, w, s, 0, g)),
    ]
    forbidden = CONV_OPS + UNFOLD_OPS + COURSE_CONVS + (_HERE + "_reference_conv2d_grouped",)
    # atol: fp32 sums of up to 18 products of size ~1 in another order than torch's; outputs near 0
    # cannot meet a relative tolerance. Every mistake above changes outputs by O(1).
    check_function(fn, _reference_conv2d_grouped, make_inputs, name="conv2d_grouped", trials=trials,
                   seed=seed, atol=1e-4, mistakes=mistakes, forbidden=forbidden, by_hand=ONE_BATCHED_PRODUCT, quiet=quiet)


# ---------------------------------------------------------------- exercise 6: 1x1 convolution
def _reference_conv1x1(x, w):
    return torch.einsum("nchw,oc->nohw", x, w).contiguous()


def check_conv1x1(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: a 1x1 convolution of NCHW ``x`` with ``w (C_out, C_in)`` as one matmul, contiguous result (torch)."""
    counter = itertools.count()
    forbidden = CONV_OPS + ("torch.einsum", "torch.tensordot", _HERE + "_reference_conv1x1")

    def make_inputs(rng):
        t = next(counter)
        n, c = int(rng.integers(1, 3)), int(rng.integers(3, 6))
        h, wd = (int(rng.integers(3, 6)), int(rng.integers(3, 6))) if t % 2 == 0 else (1, int(rng.integers(1, 4)))
        if t == 3:
            c = 1
        c_out = c if (t == 0 or rng.random() < 0.5) else int(rng.integers(2, 6))  # square first: names w.T
        x = torch.from_numpy(rng.standard_normal((n, c, h, wd)).astype(np.float32))
        w = torch.from_numpy(rng.standard_normal((c_out, c)).astype(np.float32))
        return x, w

    def contiguous_result(x, w):
        got = call_learner("conv1x1", fn, (x, w), forbidden=forbidden, by_hand=ONE_MATMUL)
        if isinstance(got, torch.Tensor) and got.ndim == 4 and not got.is_contiguous():
            raise CheckFailed("conv1x1: the values may be right but the result is a permuted view, not contiguous, "
                              "as the exercise asks; end with .contiguous() (or reshape a contiguous product).")
        return got

    def bad_reshape(x, w):  # (N, C, H, W) reshaped straight to (N*H*W, C), without moving C last
        n, c, h, wd = x.shape
        rows = x.reshape(n * h * wd, c) @ w.T  # (N*H*W, C_out)
        return rows.reshape(n, h, wd, -1).permute(0, 3, 1, 2).contiguous()

    def no_permute_back(x, w):  # right product, wrong memory order on the way back
        n, c, h, wd = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, c) @ w.T  # (N*H*W, C_out)
        return rows.reshape(n, -1, h, wd).contiguous()

    mistakes = [
        Mistake("transposed_w", "you used w transposed: out[n, o] = sum_c w[o, c] x[n, c], i.e. W @ x_(C, HW), not "
                "W.T.", lambda x, w: _reference_conv1x1(x, w.T.contiguous())),
        Mistake("bad_reshape", "your reshape mixes channels and pixels: x.reshape(N*H*W, C) is not channels-last; "
                "permute to (N, H, W, C) first, or compute W @ x.reshape(N, C, H*W).", bad_reshape),
        Mistake("no_permute_back", "the result has the right numbers in the wrong order: reshape to (N, H, W, C_out) "
                "and permute to (N, C_out, H, W).", no_permute_back),
    ]
    check_function(contiguous_result, _reference_conv1x1, make_inputs, name="conv1x1", trials=trials, seed=seed,
                   atol=1e-5, mistakes=mistakes, quiet=quiet)  # atol: fp32 sums of <= 5 terms, another order


# ---------------------------------------------------------------- exercise 7: the column matrix's size
def _column_bytes(x_shape, w_shape, stride, padding, itemsize):
    """Bytes of the im2col matrix ``(C_in*KH*KW, N*OH*OW)`` (lesson eq. 5)."""
    n, c_in, h, w = x_shape
    _, _, kh, kw = w_shape
    return c_in * kh * kw * n * conv_output_size(h, kh, stride, padding) * conv_output_size(w, kw, stride, padding) * itemsize


def _reference_column_matrix_mib(x_shape, w_shape, stride, padding, itemsize):
    return _column_bytes(x_shape, w_shape, stride, padding, itemsize) / 2 ** 20


def check_column_matrix_mib(fn: Callable, *, trials: int = 5, seed: int | None = None,
                            quiet: bool = False) -> None:
    """Exercise 7: MiB of the im2col column matrix of a layer, ``(x_shape, w_shape, stride, padding, itemsize)``."""
    counter = itertools.count()

    def make_inputs(rng):
        t = next(counter)
        if t == 0:  # a ResNet-50-like stem: every mistake below gives another number
            x_shape, w_shape, stride, padding = (int(rng.integers(2, 65)), 3, 224, 224), (64, 3, 7, 7), 2, 3
            return x_shape, w_shape, stride, padding, 4
        k, stride, padding = int(rng.choice([1, 3, 5, 7])), int(rng.integers(1, 4)), int(rng.integers(0, 4))
        c_in, c_out = int(rng.integers(1, 257)), int(rng.integers(1, 257))
        kind = "edge" if t % 2 else "plain"
        h, w = _size_for(rng, kind, k, stride, padding, lo=7, hi=300), _size_for(rng, kind, k, stride, padding, lo=7, hi=300)
        itemsize = int(rng.choice([1, 2, 4, 8]))
        return (int(rng.integers(1, 129)), c_in, h, w), (c_out, c_in, k, k), stride, padding, itemsize

    def bytes_with(**change):
        def mib(x_shape, w_shape, stride, padding, itemsize, scale=2 ** 20):
            args = dict(x_shape=x_shape, w_shape=w_shape, stride=stride, padding=padding, itemsize=itemsize)
            args.update({k: (v(args) if callable(v) else v) for k, v in change.items() if k != "scale"})
            return _column_bytes(**args) / change.get("scale", scale)
        return mib

    mistakes = [
        Mistake("mb", "that is in MB (1e6 bytes); the question asks for MiB (2**20 bytes).", bytes_with(scale=1e6)),
        Mistake("bytes", "that is in bytes; divide by 2**20 for MiB.", bytes_with(scale=1)),
        Mistake("no_stride", "that is the stride-1 size: with stride s there are about s^2 times fewer output "
                "pixels, hence fewer columns.", bytes_with(stride=1)),
        Mistake("no_padding", "you forgot the padding in the output size (eq. 2).", bytes_with(padding=0)),
        Mistake("itemsize", "use the itemsize you are given (bytes per element), not a fixed 4.",
                bytes_with(itemsize=4)),
        Mistake("c_out", "rows count *input* channels times KH*KW (the reduction), not output channels.",
                bytes_with(x_shape=lambda a: (a["x_shape"][0], a["w_shape"][0]) + tuple(a["x_shape"][2:]))),
        Mistake("one_image", "that is one image; count all N images of the batch.",
                bytes_with(x_shape=lambda a: (1,) + tuple(a["x_shape"][1:]))),
        Mistake("input_size", "you used the input's H*W instead of the output's H_out*W_out for the columns.",
                lambda x, w, s, p, i: x[0] * x[1] * w[2] * w[3] * x[2] * x[3] * i / 2 ** 20),
    ]
    forbidden = UNFOLD_OPS + ("course_utils.convolution.im2col", _HERE + "_reference_column_matrix_mib",
                              _HERE + "_column_bytes")
    check_function(fn, _reference_column_matrix_mib, make_inputs, name="column_matrix_mib",
                   trials=trials, seed=seed, rtol=1e-9, atol=0.0, mistakes=mistakes, forbidden=forbidden,
                   by_hand=ByHand(allow=("course_utils.convolution.conv_output_size",)), quiet=quiet)
