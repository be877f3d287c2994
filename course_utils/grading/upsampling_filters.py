"""Grading for topic 04, exercises 7 and 8: what lesson 04 did not write.

* Exercise 7, the antialiased resize as a matrix: the bilinear triangle widened by the downsampling factor, the
  filter behind ``F.interpolate(..., antialias=True)``; the lesson only resized with the plain triangle.
* Exercise 8, nearest upsampling by 2 fused with the 3x3 convolution that follows it (the lesson's
  "resize, then convolve" remedy for checkerboards): four 2x2 sub-pixel convolutions on the small image, whose
  kernels are sums of the 3x3 taps. The upsampled image is never built; the check measures it (the largest tensor
  the learner's code allocates, seen at the operator level).

Part of :mod:`course_utils.grading.upsampling`, which re-exports the checks; the references are private.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..classroom.checking import Mistake, call_learner, check_function
from ..classroom.forbidden import ByHand

__all__ = ["check_antialias_matrix", "check_upsample_conv_fused"]

_LESSON = ("course_utils.upsampling", "course_utils.convolution")
_INTERPOLATE = ("torch.nn.functional.interpolate", "torch.nn.functional.upsample", "torch.nn.functional.upsample_nearest",
                "torch.nn.functional.upsample_bilinear", "torch.nn.functional.grid_sample")


# ---------------------------------------------------------------- exercise 7: the antialiased resize matrix
def _triangle_matrix(n: int, m: int, width: float, centre_offset: float = 0.5, normalise: bool = True) -> np.ndarray:
    """``(m, n)``: row ``i`` samples the tent ``max(0, 1 - |x| / width)`` at the input pixel centres ``j + 1/2``,
    centred at ``(i + centre_offset) n / m`` (input edge coordinates); rows normalised to sum 1, or divided by the
    width."""
    c = (np.arange(m) + centre_offset) * n / m                                     # (m,)
    j = np.arange(n) + 0.5                                                          # (n,)
    a = np.clip(1.0 - np.abs(j[None, :] - c[:, None]) / width, 0.0, None)         # (m, n)
    with np.errstate(invalid="ignore"):  # a tent narrower than the pixel spacing may miss every pixel: NaN, as a learner's
        return a / a.sum(1, keepdims=True) if normalise else a / width


def _reference_antialias_matrix(in_size: int, out_size: int) -> np.ndarray:
    """The ``(out_size, in_size)`` float64 matrix of ``F.interpolate(mode="bilinear", antialias=True,
    align_corners=False)`` along one axis: the tent widened to half-width ``s = max(n/m, 1)``."""
    return _triangle_matrix(in_size, out_size, max(in_size / out_size, 1.0))


def _area_matrix(n: int, m: int) -> np.ndarray:
    a = np.zeros((m, n))
    for i in range(m):
        lo, hi = (i * n) // m, -((-(i + 1) * n) // m)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


BY_HAND_ANTIALIAS = ByHand(names=_INTERPOLATE + ("torch.nn.functional.avg_pool1d", "torch.nn.functional.avg_pool2d",
                                                 "torch.nn.functional.adaptive_avg_pool1d"),
                           ops=("@interpolate",), modules=_LESSON)


def check_antialias_matrix(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: the ``(out, in)`` matrix of the antialiased bilinear resize, for downsampling and upsampling."""
    name = "antialias_matrix"
    counter = itertools.count()

    def sizes(rng):
        t = next(counter)
        kind = t % 4 if t >= 2 else 0
        m = int(rng.integers(3, 12))
        if kind == 0:    # downsampling by a factor between 2 and 4, not an integer: every named mistake differs
            return m * int(rng.integers(2, 4)) + int(rng.integers(1, m)), m
        if kind == 1:    # a mild downsampling (factor in (1, 2)) at a size no table holds
            m += 20
            return int(rng.integers(m + 1, 2 * m)), m
        if kind == 2:    # upsampling: the plain bilinear tent, not narrowed
            n = int(rng.integers(2, 9))
            return n, n * int(rng.integers(2, 4)) + int(rng.integers(0, 3))
        return int(rng.integers(2, 40)), 1        # one output pixel: the average of the whole row under the tent

    def learner(n, m):
        return call_learner(name, fn, (n, m), by_hand=BY_HAND_ANTIALIAS)

    mistakes = [
        Mistake("not_widened", "that is plain bilinear (exercise 1): when downsampling by s = n/m, widen the tent to "
                "half-width s, weight max(0, 1 - |x|/s) at distance x, so that every input pixel is averaged in.",
                lambda n, m: _triangle_matrix(n, m, 1.0)),
        Mistake("divided_by_width", "normalise each row by its own sum, not by s: the samples of a widened tent do "
                "not add up to s exactly when s is not an integer, and the border cuts the tent.",
                lambda n, m: _triangle_matrix(n, m, max(n / m, 1.0), normalise=False)),
        Mistake("narrowed", "when upsampling (n < m) keep the tent's half-width at 1 pixel, s = max(n/m, 1): a narrower "
                "tent than the input pixel spacing drops the neighbours.",
                lambda n, m: _triangle_matrix(n, m, n / m)),
        Mistake("no_half_pixel", "the centres are off by half a pixel: output pixel i sits at (i + 1/2) n/m in input "
                "edge coordinates, and input pixel j at j + 1/2.",
                lambda n, m: _triangle_matrix(n, m, max(n / m, 1.0), centre_offset=0.0)),
        Mistake("area", "that is area averaging (a box filter, mode='area'); the antialiasing filter is the bilinear "
                "tent, widened by s.", _area_matrix),
    ]
    check_function(fn, _reference_antialias_matrix, sizes, name=name, trials=trials, seed=seed,
                   mistakes=mistakes, by_hand=BY_HAND_ANTIALIAS, quiet=True)

    # and the matrices do the job: A_h X A_w^T equals PyTorch's antialiased resize of an image
    def image_inputs(rng):
        h, w = int(rng.integers(4, 30)), int(rng.integers(4, 30))
        size = (int(rng.integers(2, h + 4)), int(rng.integers(2, max(w // 3, 3))))  # both axes >= 2 (see below)
        return torch.from_numpy(rng.random((1, 1, h, w))), size

    def resize_with_matrices(x, size):
        ah = torch.as_tensor(np.asarray(learner(x.shape[2], size[0]), dtype=np.float64))
        aw = torch.as_tensor(np.asarray(learner(x.shape[3], size[1]), dtype=np.float64))
        return (ah @ x[0, 0] @ aw.T)[None, None]  # (1, 1, *size)

    # torch 2.x's antialiased kernel mixes rows wrongly when one output axis has a single pixel and the other is
    # resized, so that case is compared with the reference matrix above, not with F.interpolate.
    check_function(resize_with_matrices, lambda x, size: F.interpolate(x, size=size, mode="bilinear", antialias=True,
                                                                       align_corners=False),
                   image_inputs, name=f"{name} (A_h @ X @ A_w.T against F.interpolate(antialias=True))",
                   trials=trials, seed=seed, quiet=True)
    if not quiet:
        print(f"✅ {name}: matches the reference on {trials} random sizes (down, up, one pixel), and A_h X A_w^T "
              f"equals F.interpolate(antialias=True) on {trials} random images.")


# ---------------------------------------------------------------- exercise 8: nearest x2 fused with a 3x3 conv
def _nearest2(x: torch.Tensor) -> torch.Tensor:
    return x.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)  # (N, C, 2H, 2W)


def _reference_upsample_conv_fused(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``conv2d(nearest_x2(x), weight, padding=1)``, ``(N, C_out, 2H, 2W)``, computed the slow way."""
    return F.conv2d(_nearest2(x), weight, padding=1)


def _phase_kernels(weight: torch.Tensor, swap: bool = False) -> list[list[torch.Tensor]]:
    """The four ``(C_out, C_in, 2, 2)`` sub-pixel kernels: phase 0 taps ``(w0, w1 + w2)``, phase 1 ``(w0 + w1, w2)``."""
    def collapse(w, axis):  # the three taps along ``axis`` -> phase 0's two taps and phase 1's two taps
        a, b, c = w.unbind(axis)
        phases = [torch.stack([a, b + c], axis), torch.stack([a + b, c], axis)]
        return phases[::-1] if swap else phases

    return [collapse(rows, 3) for rows in collapse(weight, 2)]  # [i][j]: (C_out, C_in, 2, 2)


def _fused(x: torch.Tensor, weight: torch.Tensor, swap: bool = False, pad_mode: str = "constant",
           transpose_phases: bool = False) -> torch.Tensor:
    n, _, h, w = x.shape
    xp = F.pad(x, (1, 1, 1, 1), mode=pad_mode)                                      # (N, C_in, H+2, W+2)
    out = x.new_empty(n, weight.shape[0], 2 * h, 2 * w)
    for i, row in enumerate(_phase_kernels(weight, swap)):
        for j, kern in enumerate(row):
            y = F.conv2d(xp[..., i:i + h + 1, j:j + w + 1], kern)                  # (N, C_out, H, W)
            if transpose_phases:
                out[..., j::2, i::2] = y
            else:
                out[..., i::2, j::2] = y
    return out


def _no_more_than_the_small_image(args, kwargs) -> int:
    """Elements the fused computation needs at most: the padded small image, the four phases' outputs with a border,
    or the four 2x2 kernels (16 C_out C_in, room for building them with an einsum)."""
    x, weight = args[0], args[1]
    n, c_in, h, w = x.shape
    return max(n * max(c_in, 4 * weight.shape[0]) * (h + 2) * (w + 2), 16 * weight.shape[0] * c_in)


BY_HAND_UPSAMPLE_CONV = ByHand(
    names=_INTERPOLATE + ("torch.nn.functional.conv_transpose2d", "torch.conv_transpose2d", "torch.nn.grad.conv2d_input",
                          "torch.nn.functional.fold"),
    ops=("@interpolate", "slow_conv_transpose2d", "convolution_backward", "col2im"), allow_ops=("pixel_shuffle",),
    modules=_LESSON, max_numel=_no_more_than_the_small_image,
    large="the nearest-upsampled image (N, C_in, 2H, 2W) or a piece of it larger than the output: convolve the small "
          "image with the four 2x2 sub-pixel kernels instead",
    max_loop_iterations=8, loops="Python loop over channels or pixels (loop over the four phases at most)")


def check_upsample_conv_fused(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 8: ``conv2d(nearest_x2(x), weight, padding=1)`` as four 2x2 convolutions of the small image."""
    counter = itertools.count()

    def make_inputs(rng):
        t = next(counter)
        c_out = 1 + t % 3
        # the upsampled image is >= 4x the output, and a loop over input channels takes more than 8 iterations
        c_in = max(4 * c_out, 9) + int(rng.integers(0, 5))
        n = 1 + t % 2
        h, w = int(rng.integers(3, 11)), int(rng.integers(5, 13))   # H W >= 15: the kernels' room stays below 4 N H W C_in
        if t == 0:
            h, w = int(rng.integers(5, 9)), int(rng.integers(5, 9))
        x = torch.from_numpy(rng.standard_normal((n, c_in, h, w)))
        weight = torch.from_numpy(rng.standard_normal((c_out, c_in, 3, 3)))
        return x, weight

    mistakes = [
        Mistake("phases_swapped", "the phases are swapped: even output rows 2h read x rows h-1 and h with taps "
                "(w0, w1 + w2), odd rows 2h+1 read rows h and h+1 with (w0 + w1, w2); the same for columns.",
                lambda x, wt: _fused(x, wt, swap=True)),
        Mistake("flipped", "F.conv2d correlates, it does not flip: tap a of the 3x3 kernel reads upsampled row "
                "y + a - 1, so sum the taps in order, without flipping the kernel.",
                lambda x, wt: _fused(x, wt.flip(-1, -2))),
        Mistake("phases_transposed", "the output of phase (row offset i, column offset j) goes to out[..., i::2, j::2], "
                "not out[..., j::2, i::2].", lambda x, wt: _fused(x, wt, transpose_phases=True)),
        Mistake("replicate_padding", "the 3x3 convolution pads the upsampled image with zeros, so pad the small image "
                "with zeros (F.pad's default), not by replication.",
                lambda x, wt: _fused(x, wt, pad_mode="replicate")),
        Mistake("bilinear", "that is bilinear upsampling followed by the convolution; nearest neighbour copies each "
                "pixel into a 2x2 block.",
                lambda x, wt: F.conv2d(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False), wt,
                                       padding=1)),
    ]
    check_function(fn, _reference_upsample_conv_fused, make_inputs, name="upsample_conv_fused", trials=trials,
                   seed=seed, n=64 * 9, mistakes=mistakes, by_hand=BY_HAND_UPSAMPLE_CONV, quiet=True)
    if not quiet:
        print(f"✅ upsample_conv_fused: equals conv2d(nearest x2, padding=1) on {trials} random images, and never held "
              f"a tensor as large as the upsampled image.")
