r"""Topic 04 (upsampling): interpolation, transposed convolution and sub-pixel convolution by hand.

Used by:

* ``notebooks/04_upsampling.ipynb`` -- derives every function here (sample positions, nearest and
  bilinear resizing, im2col/col2im, the transposed convolution ladder, the output-size formula,
  pixel shuffle, the sub-pixel-to-transposed-convolution weights), then imports them from here;
* ``solutions/04_upsampling.ipynb`` -- the ``check_*`` functions of its six exercises;
* later lessons that upsample (the VAE decoder of 10, the U-Net of 11 and 12) can reuse
  :func:`conv_transpose_output_size` and :func:`load_sample_image`.

Conventions (the lesson's equation numbers):

* Sample position of output pixel :math:`i` in input coordinates (eq. 1), input size :math:`n`, output
  size :math:`m`: ``align_corners=True``: :math:`u_i = i\,(n-1)/(m-1)`; ``False``:
  :math:`u_i = \max(0, (i + \tfrac12)\,n/m - \tfrac12)` (PyTorch clamps negatives to 0 for linear modes).
* Transposed convolution output size (eq. 6):
  :math:`H_\text{out} = (H_\text{in}-1)s - 2p + d(k-1) + p_\text{out} + 1`.
* Weights of a transposed convolution have shape ``(C_in, C_out, kH, kW)``, those of a convolution
  ``(C_out, C_in, kH, kW)``: the transposed convolution with weight ``w`` is the adjoint of the
  convolution with the same ``w``.
* Pixel shuffle channel order: input channel ``c * r * r + i * r + j`` goes to output channel ``c``,
  sub-pixel row ``i`` and column ``j``.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .bench import single_thread  # noqa: F401  (re-exported: the lesson times rungs with up.single_thread())
from .convolution import conv_output_size  # derived in lesson 03 (eq. 1); re-exported for lesson 04
from .checks import CheckFailed, Mistake, check_function

__all__ = [
    "single_thread",
    "load_sample_image",
    "load_digit_images",
    "source_positions",
    "upsample_nearest",
    "upsample_bilinear",
    "interpolation_matrix",
    "conv_output_size",
    "conv_transpose_output_size",
    "im2col",
    "col2im",
    "conv2d_im2col",
    "conv_transpose2d_loops",
    "conv_transpose2d_col2im",
    "conv_transpose2d_taps",
    "conv_transpose2d_fold",
    "overlap_counts",
    "pixel_shuffle",
    "pixel_unshuffle",
    "pixel_shuffle_weight",
    "subpixel_as_conv_transpose_weight",
    "check_interpolation_matrix",
    "output_padding_for",
    "check_output_padding_for",
    "check_conv_transpose_by_zero_insertion",
    "check_pixel_unshuffle",
    "check_overlap_counts",
    "check_subpixel_weight",
]


# ---------------------------------------------------------------- real images
def load_sample_image(height: int = 96, width: int = 144, *, gray: bool = False) -> torch.Tensor:
    """scikit-learn's bundled ``china.jpg`` (427 x 640), area-downscaled, as ``(1, C, height, width)`` float32 in [0, 1].

    ``C`` is 3, or 1 when ``gray``. Downscaling keeps the lesson fast; nothing is downloaded.
    """
    from sklearn.datasets import load_sample_image as _load

    img = torch.from_numpy(_load("china.jpg").astype(np.float32) / 255.0)  # (427, 640, 3)
    img = img.permute(2, 0, 1)[None]  # (1, 3, 427, 640)
    if gray:
        img = (img * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)  # (1, 1, 427, 640)
    return F.interpolate(img, size=(height, width), mode="area").contiguous()


def load_digit_images(count: int = 4) -> torch.Tensor:
    """The first ``count`` of scikit-learn's 8x8 digits as ``(count, 1, 8, 8)`` float32 in [0, 1]."""
    from sklearn.datasets import load_digits

    images = load_digits().images[:count].astype(np.float32) / 16.0  # (count, 8, 8)
    return torch.from_numpy(images)[:, None].contiguous()


# ---------------------------------------------------------------- interpolation
def source_positions(out_size: int, in_size: int, align_corners: bool) -> np.ndarray:
    """Where each output pixel samples the input, in input pixel coordinates (eq. 1); float64 ``(out_size,)``.

    Pixel ``k`` of the input has its centre at coordinate ``k``. ``align_corners=True`` puts the
    centres of the first and last pixels of input and output on each other; ``False`` treats pixels
    as squares and aligns the outer *edges* (the half-pixel offset), clamping negative positions to 0
    as PyTorch does for linear modes.
    """
    i = np.arange(out_size, dtype=np.float64)
    if align_corners:
        if out_size == 1:
            return np.zeros(1)
        return i * (in_size - 1) / (out_size - 1)
    return np.maximum((i + 0.5) * in_size / out_size - 0.5, 0.0)


def upsample_nearest(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``F.interpolate(x, size, mode="nearest")`` by hand: ``src = floor(dst * in / out)``, a gather. ``(N, C, H, W)``."""
    (h_in, w_in), (h_out, w_out) = x.shape[-2:], size
    rows = torch.clamp((torch.arange(h_out, dtype=torch.float64) * (h_in / h_out)).floor().long(), max=h_in - 1)
    cols = torch.clamp((torch.arange(w_out, dtype=torch.float64) * (w_in / w_out)).floor().long(), max=w_in - 1)
    return x[..., rows[:, None], cols[None, :]]  # (N, C, h_out, w_out)


def _lerp_axis(x: torch.Tensor, out_size: int, align_corners: bool, axis: int) -> torch.Tensor:
    """Linear interpolation along one axis (eq. 2): ``(1 - t) * x[lo] + t * x[lo + 1]``."""
    in_size = x.shape[axis]
    u = torch.from_numpy(source_positions(out_size, in_size, align_corners))  # (out,)
    lo = torch.clamp(u.floor().long(), max=in_size - 1)
    hi = torch.clamp(lo + 1, max=in_size - 1)
    t = (u - lo).to(x.dtype)  # fractional part, weight of the upper neighbour
    shape = [1] * x.ndim
    shape[axis] = out_size
    t = t.view(shape)
    return (1 - t) * x.index_select(axis, lo) + t * x.index_select(axis, hi)


def upsample_bilinear(x: torch.Tensor, size: tuple[int, int], align_corners: bool) -> torch.Tensor:
    """``F.interpolate(x, size, mode="bilinear", align_corners=...)`` by hand: lerp rows, then columns. ``(N, C, H, W)``."""
    y = _lerp_axis(x, size[0], align_corners, axis=-2)  # (N, C, h_out, W)
    return _lerp_axis(y, size[1], align_corners, axis=-1)  # (N, C, h_out, w_out)


def interpolation_matrix(in_size: int, out_size: int, align_corners: bool) -> np.ndarray:
    """The ``(out_size, in_size)`` float64 matrix ``A`` of 1-D linear interpolation: ``y = A @ x`` (eq. 3).

    Row ``i`` has weight ``1 - t`` at ``floor(u_i)`` and ``t`` at the next pixel (clamped at the edge).
    A bilinear resize of an image ``X`` is ``A_h @ X @ A_w.T``.
    """
    u = source_positions(out_size, in_size, align_corners)
    lo = np.minimum(np.floor(u).astype(np.int64), in_size - 1)
    hi = np.minimum(lo + 1, in_size - 1)
    t = u - lo
    a = np.zeros((out_size, in_size))
    rows = np.arange(out_size)
    np.add.at(a, (rows, lo), 1 - t)
    np.add.at(a, (rows, hi), t)
    return a


# ---------------------------------------------------------------- sizes
def conv_transpose_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0,
                               output_padding: int = 0, dilation: int = 1) -> int:
    """Output size of a transposed convolution along one axis (eq. 6): ``(n-1)s - 2p + d(k-1) + p_out + 1``."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


# ---------------------------------------------------------------- im2col / col2im
def _patch_indices(h_in: int, w_in: int, kernel: tuple[int, int], stride: int, dilation: int):
    """Row and column indices ``(kH*kW, L)`` into a padded image of the patch elements of each output position."""
    kh, kw = kernel
    h_out = (h_in - dilation * (kh - 1) - 1) // stride + 1
    w_out = (w_in - dilation * (kw - 1) - 1) // stride + 1
    a, b = np.meshgrid(np.arange(kh) * dilation, np.arange(kw) * dilation, indexing="ij")  # (kh, kw)
    oh, ow = np.meshgrid(np.arange(h_out) * stride, np.arange(w_out) * stride, indexing="ij")  # (h_out, w_out)
    rows = a.reshape(-1, 1) + oh.reshape(1, -1)  # (kh*kw, L)
    cols = b.reshape(-1, 1) + ow.reshape(1, -1)  # (kh*kw, L)
    return rows, cols, h_out, w_out


def im2col(x: np.ndarray, kernel: tuple[int, int], stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """``(N, C, H, W) -> (N, C*kH*kW, L)``: every receptive field as a column (like ``F.unfold``)."""
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    rows, cols, _, _ = _patch_indices(xp.shape[2], xp.shape[3], kernel, stride, dilation)
    patches = xp[:, :, rows, cols]  # (N, C, kh*kw, L)
    return patches.reshape(x.shape[0], -1, rows.shape[1])  # (N, C*kh*kw, L)


def col2im(cols: np.ndarray, out_hw: tuple[int, int], kernel: tuple[int, int], stride: int = 1,
           padding: int = 0, dilation: int = 1) -> np.ndarray:
    """The adjoint of :func:`im2col` (like ``F.fold``): scatter-ADD every column back to its receptive field.

    ``(N, C*kH*kW, L) -> (N, C, H, W)``. Where receptive fields overlap, contributions add up
    (``np.add.at``; plain fancy-index assignment would keep only one of them).
    """
    n = cols.shape[0]
    kh, kw = kernel
    h_pad, w_pad = out_hw[0] + 2 * padding, out_hw[1] + 2 * padding
    rows, cidx, _, _ = _patch_indices(h_pad, w_pad, kernel, stride, dilation)
    c = cols.shape[1] // (kh * kw)
    out = np.zeros((n, c, h_pad, w_pad), dtype=cols.dtype)
    np.add.at(out, (slice(None), slice(None), rows, cidx), cols.reshape(n, c, kh * kw, -1))
    return out[:, :, padding:padding + out_hw[0], padding:padding + out_hw[1]]  # (N, C, H, W)


def conv2d_im2col(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Convolution (cross-correlation, as ``F.conv2d``) as im2col + one matmul. ``w``: ``(C_out, C_in, kH, kW)``."""
    c_out, _, kh, kw = w.shape
    cols = im2col(x, (kh, kw), stride, padding, dilation)  # (N, C_in*kh*kw, L)
    out = w.reshape(c_out, -1) @ cols  # (N, C_out, L)
    h_out = conv_output_size(x.shape[2], kh, stride, padding, dilation)
    w_out = conv_output_size(x.shape[3], kw, stride, padding, dilation)
    return out.reshape(x.shape[0], c_out, h_out, w_out)


# ---------------------------------------------------------------- transposed convolution: the ladder
def conv_transpose2d_loops(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0,
                           output_padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Rung 1: every input pixel stamps ``x[n, :, h, w] @ w[:, :, a, b]`` onto the output (scatter form).

    ``x``: ``(N, C_in, H, W)``, ``w``: ``(C_in, C_out, kH, kW)``. Output pixel ``h*s + a*d - p``
    receives the tap ``(a, b)`` of input pixel ``h``.
    """
    n, _, h_in, w_in = x.shape
    _, c_out, kh, kw = w.shape
    h_out = conv_transpose_output_size(h_in, kh, stride, padding, output_padding, dilation)
    w_out = conv_transpose_output_size(w_in, kw, stride, padding, output_padding, dilation)
    out = np.zeros((n, c_out, h_out + 2 * padding, w_out + 2 * padding), dtype=np.result_type(x, w))
    for h in range(h_in):
        for ww in range(w_in):
            for a in range(kh):
                for b in range(kw):
                    out[:, :, h * stride + a * dilation, ww * stride + b * dilation] += x[:, :, h, ww] @ w[:, :, a, b]
    return out[:, :, padding:padding + h_out, padding:padding + w_out]


def conv_transpose2d_col2im(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0,
                            output_padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Rung 2: one matmul ``W^T x`` gives every stamp as a column, then :func:`col2im` scatter-adds them (eq. 5)."""
    n, c_in, h_in, w_in = x.shape
    _, c_out, kh, kw = w.shape
    cols = w.reshape(c_in, -1).T @ x.reshape(n, c_in, h_in * w_in)  # (N, C_out*kh*kw, H*W)
    h_out = conv_transpose_output_size(h_in, kh, stride, padding, output_padding, dilation)
    w_out = conv_transpose_output_size(w_in, kw, stride, padding, output_padding, dilation)
    return col2im(cols, (h_out, w_out), (kh, kw), stride, padding, dilation)


def conv_transpose2d_taps(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0,
                          output_padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Rung 3: the same matmul, then col2im as ``k*k`` strided slice additions (tap ``(a, b)`` of every pixel
    lands on rows ``a*d + h*s``; two pixels never share a tap position, so each addition is collision-free)."""
    n, c_in, h_in, w_in = x.shape
    _, c_out, kh, kw = w.shape
    stamps = (w.reshape(c_in, -1).T @ x.reshape(n, c_in, h_in * w_in)).reshape(n, c_out, kh, kw, h_in, w_in)
    h_out = conv_transpose_output_size(h_in, kh, stride, padding, output_padding, dilation)
    w_out = conv_transpose_output_size(w_in, kw, stride, padding, output_padding, dilation)
    out = np.zeros((n, c_out, h_out + 2 * padding, w_out + 2 * padding), dtype=stamps.dtype)
    span_h, span_w = (h_in - 1) * stride + 1, (w_in - 1) * stride + 1
    for a in range(kh):
        for b in range(kw):
            r0, c0 = a * dilation, b * dilation
            out[:, :, r0:r0 + span_h:stride, c0:c0 + span_w:stride] += stamps[:, :, a, b]
    return out[:, :, padding:padding + h_out, padding:padding + w_out]


def conv_transpose2d_fold(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0,
                          output_padding: int = 0, dilation: int = 1) -> torch.Tensor:
    """Rung 4: the same matmul in torch, and ``F.fold`` (torch's col2im) for the scatter-add."""
    n, c_in, h_in, w_in = x.shape
    _, c_out, kh, kw = w.shape
    cols = w.reshape(c_in, -1).T @ x.reshape(n, c_in, h_in * w_in)  # (N, C_out*kh*kw, H*W)
    h_out = conv_transpose_output_size(h_in, kh, stride, padding, output_padding, dilation)
    w_out = conv_transpose_output_size(w_in, kw, stride, padding, output_padding, dilation)
    return F.fold(cols, (h_out, w_out), (kh, kw), dilation=dilation, padding=padding, stride=stride)


def _counts_1d(n: int, k: int, s: int, p: int) -> np.ndarray:
    """1-D overlap counts: input pixel i stamps k ones starting at i*s, then p pixels are cropped per side."""
    n_out = conv_transpose_output_size(n, k, s, p)
    full = np.zeros(n_out + 2 * p, dtype=np.int64)
    for i in range(n):
        full[i * s:i * s + k] += 1
    return full[p:p + n_out]


def overlap_counts(h_in: int, w_in: int, kernel: int, stride: int, padding: int = 0) -> np.ndarray:
    """How many (input pixel, kernel tap) pairs land on each output pixel of a transposed convolution.

    ``(H_out, W_out)`` int64. It is the output of ``conv_transpose2d`` on an all-ones input with an
    all-ones kernel, and the outer product of the two 1-D counts. Uneven counts are the checkerboard.
    """
    return np.outer(_counts_1d(h_in, kernel, stride, padding), _counts_1d(w_in, kernel, stride, padding))


# ---------------------------------------------------------------- sub-pixel convolution
def pixel_shuffle(x: torch.Tensor, r: int) -> torch.Tensor:
    """``(N, C*r*r, H, W) -> (N, C, H*r, W*r)`` by reshape and permute, as ``F.pixel_shuffle``."""
    n, crr, h, w = x.shape
    c = crr // (r * r)
    x = x.reshape(n, c, r, r, h, w)  # (N, C, i, j, H, W)
    x = x.permute(0, 1, 4, 2, 5, 3)  # (N, C, H, i, W, j)
    return x.reshape(n, c, h * r, w * r)  # row h*r + i, column w*r + j


def pixel_unshuffle(x: torch.Tensor, r: int) -> torch.Tensor:
    """``(N, C, H*r, W*r) -> (N, C*r*r, H, W)``, the inverse of :func:`pixel_shuffle`, as ``F.pixel_unshuffle``."""
    n, c, hr, wr = x.shape
    h, w = hr // r, wr // r
    x = x.reshape(n, c, h, r, w, r)  # (N, C, H, i, W, j)
    x = x.permute(0, 1, 3, 5, 2, 4)  # (N, C, i, j, H, W)
    return x.reshape(n, c * r * r, h, w)


def pixel_shuffle_weight(channels: int, r: int, dtype=torch.float32) -> torch.Tensor:
    """The 0/1 weight ``(C*r*r, C, r, r)`` with ``conv_transpose2d(x, W, stride=r) == pixel_shuffle(x, r)``.

    ``W[c*r*r + i*r + j, c, i, j] = 1``: input channel ``c*r*r + i*r + j`` stamps a single 1 at
    sub-pixel ``(i, j)`` of output channel ``c``; the stamps of neighbouring pixels never overlap.
    """
    w = torch.zeros(channels * r * r, channels, r, r, dtype=dtype)
    for c in range(channels):
        for i in range(r):
            for j in range(r):
                w[c * r * r + i * r + j, c, i, j] = 1.0
    return w


def subpixel_as_conv_transpose_weight(kernel: torch.Tensor, r: int) -> torch.Tensor:
    r"""Weights of the transposed convolution equal to ``pixel_shuffle(conv2d(x, kernel, padding=p), r)`` (lesson 04 section 9, exercise 6).

    ``kernel``: ``(C*r*r, C_in, k, k)`` -> ``(C_in, C, k*r, k*r)``, used with ``stride=r`` and
    ``padding=(k-1-p)*r``. Tap ``(a, b)`` of output channel ``c*r*r + i*r + j`` moves to position
    ``(i + (k-1-a) r, j + (k-1-b) r)``: the kernel is flipped, each tap spread onto an r x r grid.
    """
    crr, c_in, k, _ = kernel.shape
    c = crr // (r * r)
    kern = kernel.reshape(c, r, r, c_in, k, k)  # (C, i, j, C_in, a, b)
    kern = kern.flip(-1, -2)  # index k-1-a, k-1-b
    kern = kern.permute(3, 0, 4, 1, 5, 2)  # (C_in, C, a', i, b', j)
    return kern.reshape(c_in, c, k * r, k * r)  # position a'*r + i, b'*r + j


# ================================================================ exercise checks
def _pos_wrong_offset(out_size, in_size, align_corners):
    return source_positions(out_size, in_size, not align_corners)


def _interp_from_positions(u, in_size, out_size):
    lo = np.minimum(np.floor(u).astype(np.int64), in_size - 1)
    lo = np.maximum(lo, 0)
    hi = np.minimum(lo + 1, in_size - 1)
    t = u - lo
    a = np.zeros((out_size, in_size))
    np.add.at(a, (np.arange(out_size), lo), 1 - t)
    np.add.at(a, (np.arange(out_size), hi), t)
    return a


def check_interpolation_matrix(interpolation_matrix_fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 1: the ``(out, in)`` matrix of 1-D linear interpolation for both ``align_corners`` settings."""

    counter = itertools.count()

    def inputs_for(rng):  # alternate align_corners so both settings are always tested
        in_size = int(rng.integers(3, 9))
        out_size = int(in_size * rng.integers(2, 4) + rng.integers(0, 3))
        return in_size, out_size, bool(next(counter) % 2)

    mistakes = [
        Mistake("offset", "your sample positions use the other align_corners rule: True maps i -> i (n-1)/(m-1); "
                "False maps i -> (i + 0.5) n/m - 0.5 (the half-pixel offset).",
                lambda n, m, ac: _interp_from_positions(_pos_wrong_offset(m, n, ac), n, m)),
        Mistake("no_half", "with align_corners=False you scaled by n/m but forgot the half-pixel offset: "
                "use u = (i + 0.5) n/m - 0.5.",
                lambda n, m, ac: _interp_from_positions(
                    source_positions(m, n, True) if ac else np.arange(m) * n / m, n, m)),
        Mistake("no_clamp", "positions below 0 must be clamped to 0 (PyTorch does this for align_corners=False), "
                "otherwise the first rows get a negative weight.",
                lambda n, m, ac: _interp_from_positions(
                    source_positions(m, n, True) if ac else (np.arange(m) + 0.5) * n / m - 0.5, n, m)),
        Mistake("nearest", "each row has a single 1: that is nearest-neighbour; split the weight as 1 - t and t "
                "between floor(u) and floor(u) + 1.",
                lambda n, m, ac: np.eye(n)[np.minimum(np.floor(np.arange(m) * n / m).astype(int), n - 1)]),
        Mistake("swapped_weights", "the weights are swapped: the LOWER neighbour floor(u) gets 1 - t, the upper one t "
                "(t = u - floor(u)).",
                lambda n, m, ac: _swapped_weights(source_positions(m, n, ac), n, m)),
    ]

    def reference(n, m, ac):
        return interpolation_matrix(n, m, ac)

    check_function(interpolation_matrix_fn, reference, inputs_for, name="interpolation_matrix",
                   trials=trials, seed=seed, mistakes=mistakes)
    # It must reproduce F.interpolate on an image, not only the reference matrix.
    x = torch.rand(1, 1, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    for ac in (False, True):
        ah = torch.as_tensor(np.asarray(interpolation_matrix_fn(5, 11, ac), dtype=np.float64))
        aw = torch.as_tensor(np.asarray(interpolation_matrix_fn(7, 16, ac), dtype=np.float64))
        got = ah @ x[0, 0] @ aw.T
        want = F.interpolate(x, size=(11, 16), mode="bilinear", align_corners=ac)[0, 0]
        if not torch.allclose(got, want, rtol=1e-10, atol=1e-12):
            raise CheckFailed(f"interpolation_matrix: A_h @ X @ A_w.T differs from F.interpolate(bilinear, "
                              f"align_corners={ac}); check the positions of eq. 1 for this setting.")


def _swapped_weights(u, n, m):
    lo = np.minimum(np.floor(u).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    t = u - lo
    a = np.zeros((m, n))
    np.add.at(a, (np.arange(m), lo), t)
    np.add.at(a, (np.arange(m), hi), 1 - t)
    return a


def output_padding_for(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """The ``output_padding`` that makes a transposed convolution map the conv's output size back to ``size``.

    A stride-``s`` convolution drops ``(n + 2p - d(k-1) - 1) mod s`` rows at the end; the transposed
    convolution cannot know how many, so ``output_padding`` tells it (the shape of ``conv2d``'s input gradient).
    """
    return (size + 2 * padding - dilation * (kernel - 1) - 1) % stride


def check_output_padding_for(fn: Callable, *, trials: int = 8, seed: int = 0) -> None:
    """Exercise 2: ``(n, k, s, p, d) -> output_padding`` with ``conv_transpose(conv(x))`` back at size ``n``."""
    counter = itertools.count()

    def make_inputs(rng):
        t = next(counter)
        if t < 2:
            # trials 1 and 2: s=5, p=2 and n chosen so the answer is 1; then 0, s-1=4, the no-padding answer (2)
            # and, in trial 2 (d=2, k=3), the no-dilation answer (3) all differ, so each mistake is named
            s, p, d = 5, 2, 1 + t
            k = 3 if t else int(rng.integers(2, 6))
            n = int(rng.integers(d * (k - 1) + 2, 30))
            while output_padding_for(n, k, s, p, d) != 1:
                n += 1
            return n, k, s, p, d
        s, p, d = int(rng.integers(2, 5)), int(rng.integers(0, 3)), int(rng.integers(1, 4))
        k = int(rng.integers(1, 6))
        n = int(rng.integers(d * (k - 1) + 2, 40))
        return n, k, s, p, d

    mistakes = [
        Mistake("zero", "output_padding = 0 ignores the rows the strided convolution dropped: it is the remainder "
                "(n + 2p - d(k-1) - 1) mod s.", lambda n, k, s, p, d: 0),
        Mistake("s_minus_1", "s - 1 is only the largest allowed value; the right one is the remainder "
                "(n + 2p - d(k-1) - 1) mod s.", lambda n, k, s, p, d: s - 1),
        Mistake("no_dilation", "you ignored dilation: a dilated kernel spans d(k-1)+1 pixels, not k.",
                lambda n, k, s, p, d: output_padding_for(n, k, s, p, 1)),
        Mistake("no_padding", "padding is added on both sides before the strided convolution: use n + 2p.",
                lambda n, k, s, p, d: output_padding_for(n, k, s, 0, d)),
        Mistake("size", "return the output_padding (a remainder smaller than s), not the output size.",
                lambda n, k, s, p, d: n),
    ]
    check_function(fn, output_padding_for, make_inputs, name="output_padding_for",
                   trials=trials, seed=seed, mistakes=mistakes)


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


def check_conv_transpose_by_zero_insertion(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 3: ``conv_transpose2d(x, w, stride, padding, output_padding)`` as zero insertion + ``F.conv2d``."""

    def make_inputs(rng):
        c_in = int(rng.integers(2, 4))
        c_out = c_in if rng.integers(0, 2) else int(rng.integers(2, 5))
        k = int(rng.integers(2, 5))
        s = int(rng.integers(2, 4))
        p = int(rng.integers(0, k))  # padding <= k - 1 so that k - 1 - p >= 0
        op = int(rng.integers(0, s))
        h, w = int(rng.integers(3, 7)), int(rng.integers(3, 7))
        g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        x = torch.randn(2, c_in, h, w, generator=g, dtype=torch.float64)
        wt = torch.randn(c_in, c_out, k, k, generator=g, dtype=torch.float64)
        return x, wt, s, p, op

    counter = itertools.count()

    def inputs_square_first(rng):
        # the first trial has C_in == C_out and output_padding > 0, so the axis and p_out mistakes can be named
        x, w, s, p, op = make_inputs(rng)
        if next(counter) == 0:
            g = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
            w = torch.randn(x.shape[1], x.shape[1], *w.shape[2:], generator=g, dtype=torch.float64)
            op = s - 1
        return x, w, s, p, op

    def reference(x, w, s, p, op):
        return F.conv_transpose2d(x, w, stride=s, padding=p, output_padding=op)

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
                "last one too.", lambda x, w, s, p, op: _zeros_after(x, w, s, p, op)),
    ]
    check_function(fn, reference, inputs_square_first, name="conv_transpose_by_zero_insertion",
                   trials=trials, seed=seed, mistakes=mistakes)


def _zeros_after(x, w, s, p, op):
    n, c, h, wd = x.shape
    z = x.new_zeros(n, c, h * s, wd * s)
    z[:, :, ::s, ::s] = x
    q = w.shape[-1] - 1 - p
    z = F.pad(z, (q, q + op, q, q + op))  # s - 1 rows too many at the end
    return F.conv2d(z, w.transpose(0, 1).flip(-1, -2))


def check_pixel_unshuffle(fn: Callable, *, trials: int = 3, seed: int = 0) -> None:
    """Exercise 4: ``(N, C, H*r, W*r) -> (N, C*r*r, H, W)`` by reshape and permute."""

    def make_inputs(rng):
        r = int(rng.integers(2, 4))
        c = int(rng.integers(2, 4))
        h, w = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        x = torch.from_numpy(rng.standard_normal((2, c, h * r, w * r)).astype(np.float32))
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
    check_function(fn, lambda x, r: F.pixel_unshuffle(x, r), make_inputs, name="pixel_unshuffle",
                   trials=trials, seed=seed, mistakes=mistakes)


def check_overlap_counts(fn: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 5: the ``(H_out, W_out)`` integer map of overlaps of a transposed convolution."""

    counter = itertools.count()

    def make_inputs(rng):
        odd = next(counter) % 2 == 0
        s = int(rng.integers(2, 4))
        k = int(rng.integers(s + 1, 2 * s + 2))
        if k % s == 0:
            k += 1  # keep the checkerboard visible
        p = int(rng.integers(1, k)) if odd else 0
        return int(rng.integers(3, 7)), int(rng.integers(3, 7)), k, s, p

    def uncropped(h, w, k, s, p):
        return overlap_counts(h, w, k, s, 0)

    def crop_end(h, w, k, s, p):
        full = overlap_counts(h, w, k, s, 0)
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

    check_function(fn, overlap_counts, make_inputs, name="overlap_counts", trials=trials, seed=seed,
                   mistakes=mistakes)


def check_subpixel_weight(fn: Callable, *, trials: int = 3, seed: int = 0) -> None:
    """Exercise 6: the transposed-convolution weight equal to conv2d (padding p) followed by pixel_shuffle."""

    def make_inputs(rng):
        r = int(rng.integers(2, 4))
        k = 3
        c, c_in = int(rng.integers(1, 3)), int(rng.integers(2, 4))
        kern = torch.from_numpy(rng.standard_normal((c * r * r, c_in, k, k)))  # float64
        return kern, r

    def not_flipped(kern, r):
        return subpixel_as_conv_transpose_weight(kern.flip(-1, -2), r)

    def axes_swapped(kern, r):
        return subpixel_as_conv_transpose_weight(kern, r).transpose(0, 1)

    def block_layout(kern, r):  # position i*k + a' instead of a'*r + i
        crr, c_in, k, _ = kern.shape
        c = crr // (r * r)
        w = kern.reshape(c, r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 1, 4, 2, 5)  # (C_in, C, i, a', j, b')
        return w.reshape(c_in, c, k * r, k * r)

    def ij_swapped(kern, r):
        crr, c_in, k, _ = kern.shape
        c = crr // (r * r)
        w = kern.reshape(c, r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 4, 2, 5, 1)  # (C_in, C, a', j, b', i)
        return w.reshape(c_in, c, k * r, k * r)

    mistakes = [
        Mistake("not_flipped", "the taps are not flipped: tap (a, b) goes to block (k-1-a, k-1-b), because a "
                "transposed convolution stamps where a convolution gathers.", not_flipped),
        Mistake("axes_swapped", "the channel axes are swapped: conv_transpose2d weights are (C_in, C_out, kr, kr).",
                axes_swapped),
        Mistake("block_layout", "the position inside the kr x kr kernel is a'*r + i (tap block a', sub-pixel i), "
                "not i*k + a'.", block_layout),
        Mistake("ij_swapped", "the sub-pixel offsets are swapped: channel c*r*r + i*r + j is row offset i, "
                "column offset j.", ij_swapped),
    ]
    check_function(fn, subpixel_as_conv_transpose_weight, make_inputs, name="subpixel_as_conv_transpose_weight",
                   trials=trials, seed=seed, mistakes=mistakes)
    # and the weight must actually do the job
    rng = np.random.default_rng([seed, 7])
    kern, r = make_inputs(rng)
    x = torch.from_numpy(rng.standard_normal((1, kern.shape[1], 5, 4)))
    want = F.pixel_shuffle(F.conv2d(x, kern, padding=1), r)
    got = F.conv_transpose2d(x, fn(kern, r), stride=r, padding=r)
    if not torch.allclose(got, want, rtol=1e-10, atol=1e-12):
        raise CheckFailed("subpixel_as_conv_transpose_weight: conv_transpose2d(x, W, stride=r, padding=r) does not "
                          "equal pixel_shuffle(conv2d(x, K, padding=1), r); re-derive the formula of exercise 6.")
