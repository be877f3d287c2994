"""Shared by the topic-03 graders (:mod:`course_utils.grading.convolution` and ``convolution_backward``): the shortcuts
they forbid and the edge sizes they draw."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# The production convolutions and torch's im2col/col2im: every exercise here builds one of them by hand.
CONV_OPS = (
    "torch.nn.functional.conv2d", "torch.conv2d", "torch.nn.functional.conv_transpose2d", "torch.conv_transpose2d",
)
UNFOLD_OPS = ("torch.nn.functional.unfold", "torch.nn.functional.fold", "torch.Tensor.unfold")
AUTOGRAD = ("torch.autograd.grad", "torch.autograd.backward", "torch.Tensor.backward",
            "torch.nn.grad.conv2d_weight", "torch.nn.grad.conv2d_input")
# The course's own convolutions (lessons 03 and 04): none may stand in for an exercise's answer.
COURSE_CONVS = (
    "course_utils.convolution.conv2d_naive", "course_utils.convolution.conv2d_vectorized",
    "course_utils.convolution.conv2d_im2col", "course_utils.convolution.conv2d_triton",
    "course_utils.convolution_blocking.conv2d_blocked", "course_utils.upsampling.conv_transpose2d_fold",
)


def _torch_conv(x, w, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d on NumPy arrays, returning a NumPy array of x's dtype."""
    out = F.conv2d(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(w)),
                   stride=stride, padding=padding, dilation=dilation, groups=groups)
    return out.numpy()


def _flip(w):
    return np.ascontiguousarray(w[..., ::-1, ::-1])


def _edge_size(rng, out: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """An input size whose output is ``out``, with the stride dividing ``size + 2p - span`` exactly or not."""
    span = dilation * (kernel - 1) + 1
    remainder = int(rng.integers(0, stride)) if rng.random() < 0.5 else 0
    return max((out - 1) * stride + span - 2 * padding + remainder, max(1, span - 2 * padding))


def _size_for(rng, kind: str, kernel: int, stride: int, padding: int, dilation: int = 1, lo: int = 6, hi: int = 11):
    """A spatial size: ``kind`` "edge" gives an output of 1 or 2, otherwise a size in [lo, hi)."""
    if kind == "edge":
        return _edge_size(rng, int(rng.integers(1, 3)), kernel, stride, padding, dilation)
    return max(int(rng.integers(lo, hi)), dilation * (kernel - 1) + 1 - 2 * padding)
