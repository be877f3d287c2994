r"""Topic 04 (upsampling), the lesson library: sample images, interpolation, the transposed convolution, pixel shuffle.

Used by:

* ``notebooks/04_upsampling.ipynb`` -- writes each function by hand (``upsample_bilinear_by_hand``, ...)
  and asserts it equals the one here; im2col/col2im come from :mod:`course_utils.convolution` (lesson 03);
* ``course_utils.grading.upsampling`` -- the problem set's references;
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

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "load_sample_image",
    "load_digit_images",
    "source_positions",
    "upsample_nearest",
    "upsample_bilinear",
    "conv_transpose_output_size",
    "conv_transpose2d_fold",
    "pixel_shuffle",
    "pixel_shuffle_weight",
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


# ---------------------------------------------------------------- sizes
def conv_transpose_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0,
                               output_padding: int = 0, dilation: int = 1) -> int:
    """Output size of a transposed convolution along one axis (eq. 6): ``(n-1)s - 2p + d(k-1) + p_out + 1``."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


# ---------------------------------------------------------------- transposed convolution
def conv_transpose2d_fold(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0,
                          output_padding: int = 0, dilation: int = 1) -> torch.Tensor:
    """Transposed convolution as one matmul ``W^T x`` (every stamp as a column, eq. 5) and ``F.fold`` (torch's col2im).

    Lesson 04's rung 4; takes ``output_padding`` and ``dilation`` like ``F.conv_transpose2d``. Torch tensors.
    """
    n, c_in, h_in, w_in = x.shape
    _, c_out, kh, kw = w.shape
    cols = w.reshape(c_in, -1).T @ x.reshape(n, c_in, h_in * w_in)  # (N, C_out*kh*kw, H*W)
    h_out = conv_transpose_output_size(h_in, kh, stride, padding, output_padding, dilation)
    w_out = conv_transpose_output_size(w_in, kw, stride, padding, output_padding, dilation)
    return F.fold(cols, (h_out, w_out), (kh, kw), dilation=dilation, padding=padding, stride=stride)


# ---------------------------------------------------------------- sub-pixel convolution
def pixel_shuffle(x: torch.Tensor, r: int) -> torch.Tensor:
    """``(N, C*r*r, H, W) -> (N, C, H*r, W*r)`` by reshape and permute, as ``F.pixel_shuffle``."""
    n, crr, h, w = x.shape
    c = crr // (r * r)
    x = x.reshape(n, c, r, r, h, w)  # (N, C, i, j, H, W)
    x = x.permute(0, 1, 4, 2, 5, 3)  # (N, C, H, i, W, j)
    return x.reshape(n, c, h * r, w * r)  # row h*r + i, column w*r + j


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
