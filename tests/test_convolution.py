"""Tests of course_utils.convolution, the lesson library of topic 03: sizes, the rungs lesson 03 asserts its
hand-written versions against, im2col and its adjoint col2im (used by lesson 04), and the Triton kernel."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import convolution as cv

SETTINGS = [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)]  # (stride, padding, dilation)


def torch_conv(x, w, s=1, p=0, d=1):
    return F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s, padding=p, dilation=d).numpy()


@pytest.fixture
def xw():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3, 9, 8)).astype(np.float32), rng.standard_normal((4, 3, 3, 2)).astype(np.float32)


@pytest.mark.parametrize("size,kernel,s,p,d", [(7, 3, 1, 1, 1), (8, 3, 2, 1, 1), (13, 5, 2, 2, 2), (9, 2, 3, 0, 3)])
def test_conv_output_size_matches_torch(size, kernel, s, p, d):
    y = F.conv2d(torch.zeros(1, 1, size, size), torch.zeros(1, 1, kernel, kernel), stride=s, padding=p, dilation=d)
    assert cv.conv_output_size(size, kernel, s, p, d) == y.shape[-1]


def test_conv_output_size_rejects_a_kernel_larger_than_the_input():
    with pytest.raises(ValueError):
        cv.conv_output_size(4, 3, dilation=3)


@pytest.mark.parametrize("s,p,d", SETTINGS)
def test_every_numpy_rung_matches_conv2d(xw, s, p, d):
    x, w = xw
    want = torch_conv(x, w, s, p, d)
    for fn in (cv.conv2d_naive, cv.conv2d_vectorized, cv.conv2d_im2col):
        np.testing.assert_allclose(fn(x, w, s, p, d), want, rtol=1e-5, atol=1e-4)


def test_im2col_view_is_a_view_and_im2col_orders_rows_c_kh_kw(xw):
    x, _ = xw
    view = cv.im2col_view(x, 3, 2, stride=2, padding=1, dilation=1)
    assert view.shape == (2, 3, 3, 2, 5, 5) and not view.flags.writeable
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert view[1, 2, 2, 1, 3, 4] == xp[1, 2, 3 * 2 + 2, 4 * 2 + 1]
    cols = cv.im2col(x, 3, 2, stride=2, padding=1)
    assert cols.shape == (3 * 3 * 2, 2 * 5 * 5)
    # row (c=2, kh=2, kw=1), column (n=1, i=3, j=4)
    assert cols[2 * 6 + 2 * 2 + 1, 1 * 25 + 3 * 5 + 4] == xp[1, 2, 8, 9]
    # torch's unfold uses the same (c, kh, kw) row order, per sample
    unfolded = F.unfold(torch.from_numpy(x), (3, 2), padding=1, stride=2).numpy()  # (N, C*KH*KW, L)
    np.testing.assert_array_equal(cols.reshape(18, 2, 25).transpose(1, 0, 2), unfolded)


@pytest.mark.parametrize("s,p,d", SETTINGS + [(2, 0, 1), (3, 2, 1)])
def test_col2im_is_the_adjoint_of_im2col_and_equals_fold(s, p, d):
    rng = np.random.default_rng(s * 10 + p + d)
    x = rng.standard_normal((2, 3, 9, 8))
    cols = cv.im2col(x, 3, 2, s, p, d)
    c = rng.standard_normal(cols.shape)
    back = cv.col2im(c, x.shape, 3, 2, s, p, d)
    assert back.shape == x.shape
    lhs, rhs = np.sum(cols * c), np.sum(x * back)
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))
    folded = F.fold(torch.from_numpy(c.reshape(18, 2, -1).transpose(1, 0, 2).copy()), (9, 8), (3, 2),
                    dilation=d, padding=p, stride=s).numpy()
    np.testing.assert_allclose(back, folded, rtol=1e-12, atol=1e-12)


def test_col2im_of_ones_counts_window_overlaps():
    x = np.zeros((1, 1, 7, 7))
    counts = cv.col2im(np.ones_like(cv.im2col(x, 3, 3, 2, 0)), x.shape, 3, 3, 2, 0)
    assert counts[0, 0, 2, 2] == 4 and counts[0, 0, 1, 1] == 1 and counts[0, 0, 0, 2] == 2


@pytest.mark.parametrize("s,p,d", SETTINGS)
def test_triton_kernel_matches_conv2d(s, p, d):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter takes CPU tensors
    torch.backends.cudnn.allow_tf32 = False  # the kernel computes true fp32 (input_precision="ieee")
    x, w = torch.randn(2, 5, 7, 9, device=device), torch.randn(20, 5, 3, 2, device=device)
    torch.testing.assert_close(cv.conv2d_triton(x, w, s, p, d), F.conv2d(x, w, stride=s, padding=p, dilation=d),
                               rtol=1e-5, atol=1e-4)


def test_triton_launcher_rejects_illegal_blocks_and_dtypes():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(ValueError):
        cv.conv2d_triton(x, w, block_k=8)
    with pytest.raises(ValueError):
        cv.conv2d_triton(x, w, block_m=48)
    with pytest.raises(TypeError):
        cv.conv2d_triton(x.double(), w.double())
