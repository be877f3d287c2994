"""Tests of course_utils.upsampling, the lesson library of topic 04: sample images, interpolation, sizes, the
transposed convolution by matmul + F.fold, and pixel shuffle."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import upsampling as up


@pytest.mark.parametrize("size", [(11, 16), (10, 14), (3, 4), (5, 7), (1, 2)])
def test_upsample_nearest_and_bilinear_match_interpolate(size):
    x = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    assert torch.equal(up.upsample_nearest(x, size), F.interpolate(x, size=size, mode="nearest"))
    for ac in (False, True):
        want = F.interpolate(x, size=size, mode="bilinear", align_corners=ac)
        torch.testing.assert_close(up.upsample_bilinear(x, size, ac), want)


def test_source_positions_both_conventions():
    np.testing.assert_allclose(up.source_positions(7, 4, True), np.arange(7) * 0.5)
    # align_corners=False, 2x: (i + 0.5)/2 - 0.5, the first clamped to 0
    np.testing.assert_allclose(up.source_positions(8, 4, False), [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25])
    assert up.source_positions(1, 5, True).tolist() == [0.0]


CASES = [(1, 0, 0, 1, 3), (2, 1, 1, 1, 3), (2, 1, 0, 2, 3), (3, 2, 2, 1, 4), (3, 0, 1, 2, 2)]


@pytest.mark.parametrize("stride,padding,output_padding,dilation,k", CASES)
def test_conv_transpose2d_fold_matches_torch(stride, padding, output_padding, dilation, k):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=g)
    w = torch.randn(3, 4, k, k, dtype=torch.float64, generator=g)
    args = (stride, padding, output_padding, dilation)
    want = F.conv_transpose2d(x, w, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    assert want.shape[2:] == (up.conv_transpose_output_size(5, k, *args), up.conv_transpose_output_size(6, k, *args))
    torch.testing.assert_close(up.conv_transpose2d_fold(x, w, *args), want)


def test_output_sizes():
    from course_utils.convolution import conv_output_size

    assert up.conv_transpose_output_size(4, 3, 2, 1, 1) == 8
    assert up.conv_transpose_output_size(5, 3, 2, 0, 0, 2) == 13
    # the transposed size inverts the forward size when output_padding picks the lost remainder
    for n in range(6, 12):
        m = conv_output_size(n, 3, 2, 1)
        assert up.conv_transpose_output_size(m, 3, 2, 1, (n + 2 - 3) % 2) == n


@pytest.mark.parametrize("r", [2, 3])
def test_pixel_shuffle_and_its_weight(r):
    g = torch.Generator().manual_seed(r)
    y = torch.randn(2, 3 * r * r, 4, 5, generator=g)
    assert torch.equal(up.pixel_shuffle(y, r), F.pixel_shuffle(y, r))
    assert torch.equal(F.conv_transpose2d(y, up.pixel_shuffle_weight(3, r), stride=r), F.pixel_shuffle(y, r))


def test_sample_images():
    img = up.load_sample_image(48, 72)
    assert img.shape == (1, 3, 48, 72) and img.dtype == torch.float32
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0 and float(img.std()) > 0.05
    assert up.load_sample_image(20, 30, gray=True).shape == (1, 1, 20, 30)
    digits = up.load_digit_images(3)
    assert digits.shape == (3, 1, 8, 8) and float(digits.max()) <= 1.0
