"""Tests of course_utils.upsampling: the helpers lesson 04 imports, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import upsampling as up
from course_utils.checks import NotAttempted
from conftest import stub, fails_with  # noqa: E402


# ---------------------------------------------------------------- helpers: interpolation
@pytest.mark.parametrize("size", [(11, 16), (10, 14), (3, 4), (5, 7)])
def test_upsample_nearest_and_bilinear_match_interpolate(size):
    x = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(up.upsample_nearest(x, size), F.interpolate(x, size=size, mode="nearest"))
    for ac in (False, True):
        want = F.interpolate(x, size=size, mode="bilinear", align_corners=ac)
        torch.testing.assert_close(up.upsample_bilinear(x, size, ac), want)
        a_h = torch.from_numpy(up.interpolation_matrix(5, size[0], ac))
        a_w = torch.from_numpy(up.interpolation_matrix(7, size[1], ac))
        torch.testing.assert_close((a_h @ x.double() @ a_w.T).float(), want)


def test_source_positions_both_conventions():
    np.testing.assert_allclose(up.source_positions(7, 4, True), np.arange(7) * 0.5)
    # align_corners=False, 2x: (i + 0.5)/2 - 0.5, the first clamped to 0
    np.testing.assert_allclose(up.source_positions(8, 4, False), [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25])
    assert up.source_positions(1, 5, True).tolist() == [0.0]


def test_interpolation_matrix_rows_sum_to_one():
    for ac in (False, True):
        a = up.interpolation_matrix(6, 13, ac)
        assert a.shape == (13, 6)
        np.testing.assert_allclose(a.sum(1), 1.0)
        assert (a >= 0).all()


# ---------------------------------------------------------------- helpers: transposed convolution
CASES = [(1, 0, 0, 1, 3), (2, 1, 1, 1, 3), (2, 1, 0, 2, 3), (3, 2, 2, 1, 4), (3, 0, 1, 2, 2)]


@pytest.mark.parametrize("stride,padding,output_padding,dilation,k", CASES)
def test_conv_transpose_rungs_match_torch(stride, padding, output_padding, dilation, k):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 6))
    w = rng.standard_normal((3, 4, k, k))
    args = (stride, padding, output_padding, dilation)
    want = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=padding,
                              output_padding=output_padding, dilation=dilation).numpy()
    assert want.shape[2:] == (up.conv_transpose_output_size(5, k, *args), up.conv_transpose_output_size(6, k, *args))
    np.testing.assert_allclose(up.conv_transpose2d_loops(x, w, *args), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(up.conv_transpose2d_col2im(x, w, *args), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(up.conv_transpose2d_taps(x, w, *args), want, rtol=1e-10, atol=1e-12)
    got = up.conv_transpose2d_fold(torch.from_numpy(x), torch.from_numpy(w), *args).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stride,padding,dilation,k", [(1, 0, 1, 3), (2, 1, 1, 3), (2, 2, 2, 3), (3, 1, 1, 4)])
def test_im2col_conv2d_match_torch_and_col2im_is_adjoint(stride, padding, dilation, k):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((4, 3, k, k))
    tx = torch.from_numpy(x)
    np.testing.assert_allclose(up.im2col(x, (k, k), stride, padding, dilation),
                               F.unfold(tx, k, dilation=dilation, padding=padding, stride=stride).numpy())
    np.testing.assert_allclose(up.conv2d_im2col(x, w, stride, padding, dilation),
                               F.conv2d(tx, torch.from_numpy(w), stride=stride, padding=padding, dilation=dilation).numpy(),
                               rtol=1e-10, atol=1e-12)
    cols = up.im2col(x, (k, k), stride, padding, dilation)
    c = rng.standard_normal(cols.shape)
    lhs = np.sum(cols * c)
    rhs = np.sum(x * up.col2im(c, (9, 8), (k, k), stride, padding, dilation))
    assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs))


def test_output_sizes():
    assert up.conv_transpose_output_size(4, 3, 2, 1, 1) == 8
    assert up.conv_transpose_output_size(5, 3, 2, 0, 0, 2) == 13
    assert up.conv_output_size(8, 3, 2, 1) == 4
    # the transposed size inverts the forward size when output_padding picks the lost remainder
    for n in range(6, 12):
        m = up.conv_output_size(n, 3, 2, 1)
        assert up.conv_transpose_output_size(m, 3, 2, 1, (n + 2 - 3) % 2) == n


def test_overlap_counts_equal_conv_transpose_of_ones():
    for k, s, p in [(3, 2, 0), (3, 2, 1), (4, 2, 1), (5, 3, 2)]:
        ones = torch.ones(1, 1, 5, 6, dtype=torch.float64)
        want = F.conv_transpose2d(ones, torch.ones(1, 1, k, k, dtype=torch.float64), stride=s, padding=p)[0, 0]
        got = up.overlap_counts(5, 6, k, s, p)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want.numpy())
    interior = up.overlap_counts(6, 6, 4, 2, 1)[1:-1, 1:-1]
    assert (interior == 4).all()  # k divisible by s: even overlap away from the border


# ---------------------------------------------------------------- helpers: sub-pixel convolution
@pytest.mark.parametrize("r", [2, 3])
def test_pixel_shuffle_unshuffle_and_their_weights(r):
    g = torch.Generator().manual_seed(r)
    y = torch.randn(2, 3 * r * r, 4, 5, generator=g)
    torch.testing.assert_close(up.pixel_shuffle(y, r), F.pixel_shuffle(y, r))
    torch.testing.assert_close(up.pixel_unshuffle(up.pixel_shuffle(y, r), r), y)
    z = torch.randn(2, 3, 4 * r, 5 * r, generator=g)
    torch.testing.assert_close(up.pixel_unshuffle(z, r), F.pixel_unshuffle(z, r))
    torch.testing.assert_close(F.conv_transpose2d(y, up.pixel_shuffle_weight(3, r), stride=r), F.pixel_shuffle(y, r))
    kern = torch.randn(2 * r * r, 3, 3, 3, dtype=torch.float64, generator=g)
    x = torch.randn(1, 3, 5, 6, dtype=torch.float64, generator=g)
    torch.testing.assert_close(F.conv_transpose2d(x, up.subpixel_as_conv_transpose_weight(kern, r), stride=r, padding=r),
                               F.pixel_shuffle(F.conv2d(x, kern, padding=1), r))


def test_single_thread_restores_thread_counts():
    from threadpoolctl import threadpool_info

    before = torch.get_num_threads()
    with up.single_thread():
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    assert torch.get_num_threads() == before


def test_sample_images():
    img = up.load_sample_image(48, 72)
    assert img.shape == (1, 3, 48, 72) and img.dtype == torch.float32
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0 and float(img.std()) > 0.05
    assert up.load_sample_image(20, 30, gray=True).shape == (1, 1, 20, 30)
    digits = up.load_digit_images(3)
    assert digits.shape == (3, 1, 8, 8) and float(digits.max()) <= 1.0


# ---------------------------------------------------------------- exercise 1: interpolation matrix
def test_check_interpolation_matrix():
    up.check_interpolation_matrix(up.interpolation_matrix)
    with pytest.raises(NotAttempted):
        up.check_interpolation_matrix(stub)
    fails_with(up.check_interpolation_matrix, lambda n, m, ac: up.interpolation_matrix(n, m, not ac),
               "other align_corners rule")

    def no_half(n, m, ac):
        u = up.source_positions(m, n, True) if ac else np.arange(m) * n / m
        return up._interp_from_positions(u, n, m)

    fails_with(up.check_interpolation_matrix, no_half, "half-pixel offset")

    def no_clamp(n, m, ac):
        u = up.source_positions(m, n, True) if ac else (np.arange(m) + 0.5) * n / m - 0.5
        return up._interp_from_positions(u, n, m)

    fails_with(up.check_interpolation_matrix, no_clamp, "clamped to 0")
    fails_with(up.check_interpolation_matrix,
               lambda n, m, ac: up._swapped_weights(up.source_positions(m, n, ac), n, m), "weights are swapped")
    fails_with(up.check_interpolation_matrix, lambda n, m, ac: up.interpolation_matrix(n, m, ac).T,
               "expected shape")
    fails_with(up.check_interpolation_matrix,
               lambda n, m, ac: np.eye(n)[np.minimum(np.arange(m) * n // m, n - 1)], "nearest-neighbour")


# ---------------------------------------------------------------- exercise 2: output padding
def test_output_padding_for_restores_the_size_through_torch():
    for n in range(9, 20):
        for k, s, p, d in [(3, 2, 1, 1), (4, 3, 1, 2), (5, 2, 2, 1)]:
            x = torch.randn(1, 1, n, n)
            w = torch.randn(1, 1, k, k)
            y = F.conv2d(x, w, stride=s, padding=p, dilation=d)
            op = up.output_padding_for(n, k, s, p, d)
            back = F.conv_transpose2d(y, w, stride=s, padding=p, output_padding=op, dilation=d)
            assert back.shape[-1] == n


def test_check_output_padding_for():
    check = up.check_output_padding_for
    check(up.output_padding_for)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda n, k, s, p, d: 0, "ignores the rows")
    fails_with(check, lambda n, k, s, p, d: s - 1, "largest allowed")
    fails_with(check, lambda n, k, s, p, d: (n + 2 * p - (k - 1) - 1) % s, "dilation")
    fails_with(check, lambda n, k, s, p, d: (n - d * (k - 1) - 1) % s, "n + 2p")
    fails_with(check, lambda n, k, s, p, d: -1, "expected int")


# ---------------------------------------------------------------- exercise 3: zero insertion
def _zero_insertion_solution(x, w, stride, padding, output_padding):
    k = w.shape[-1]
    n, c, h, wd = x.shape
    z = x.new_zeros(n, c, (h - 1) * stride + 1, (wd - 1) * stride + 1)
    z[:, :, ::stride, ::stride] = x
    q = k - 1 - padding
    z = F.pad(z, (q, q + output_padding, q, q + output_padding))
    return F.conv2d(z, w.transpose(0, 1).flip(-1, -2))


def test_check_conv_transpose_by_zero_insertion():
    check = up.check_conv_transpose_by_zero_insertion
    check(_zero_insertion_solution)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda x, w, s, p, op: up._zi_conv(x, w, s, p, op, flip=False), "not flipped")
    fails_with(check, lambda x, w, s, p, op: up._zi_conv(x, w, s, p, op, swap=False), "channel axes are not swapped")
    fails_with(check, lambda x, w, s, p, op: up._zi_conv(x, w, s, p, op, use_op=False), "output_padding is ignored")
    fails_with(check, lambda x, w, s, p, op: up._zi_conv(x, w, s, p, op, pad=p), "k - 1 - p")
    fails_with(check, up._zeros_after, "BETWEEN input pixels")
    fails_with(check, lambda x, w, s, p, op: _zero_insertion_solution(x, w, s, p, op).float(), "dtype")


# ---------------------------------------------------------------- exercise 4: pixel unshuffle
def test_check_pixel_unshuffle():
    up.check_pixel_unshuffle(up.pixel_unshuffle)
    with pytest.raises(NotAttempted):
        up.check_pixel_unshuffle(stub)

    def channel_last(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 3, 5, 1, 2, 4).reshape(n, c * r * r, hr // r, wr // r)

    def ij_swapped(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 1, 5, 3, 2, 4).reshape(n, c * r * r, hr // r, wr // r)

    fails_with(up.check_pixel_unshuffle, channel_last, "channel order")
    fails_with(up.check_pixel_unshuffle, ij_swapped, "swapped")
    fails_with(up.check_pixel_unshuffle,
               lambda x, r: x.reshape(x.shape[0], -1, x.shape[2] // r, x.shape[3] // r), "reshape alone")

    def blocks(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, r, hr // r, r, wr // r).permute(0, 1, 2, 4, 3, 5).reshape(n, c * r * r, hr // r, wr // r)

    fails_with(up.check_pixel_unshuffle, blocks, "instead of (H, r)")


# ---------------------------------------------------------------- exercise 5: overlap counts
def test_check_overlap_counts():
    up.check_overlap_counts(up.overlap_counts)
    with pytest.raises(NotAttempted):
        up.check_overlap_counts(stub)
    fails_with(up.check_overlap_counts, lambda h, w, k, s, p: up.overlap_counts(h, w, k, s, 0), "did not crop")

    def crop_end(h, w, k, s, p):
        full = up.overlap_counts(h, w, k, s, 0)
        return full[: full.shape[0] - 2 * p, : full.shape[1] - 2 * p]

    fails_with(up.check_overlap_counts, crop_end, "from the end only")
    fails_with(up.check_overlap_counts,
               lambda h, w, k, s, p: up._counts_1d(h, k, s, p)[:, None] + up._counts_1d(w, k, s, p)[None, :], "PRODUCT")

    def float_counts(h, w, k, s, p):
        return up.overlap_counts(h, w, k, s, p).astype(np.float64)

    fails_with(up.check_overlap_counts, float_counts, "dtype")


# ---------------------------------------------------------------- exercise 6: sub-pixel weights
def test_check_subpixel_weight():
    up.check_subpixel_weight(up.subpixel_as_conv_transpose_weight)
    with pytest.raises(NotAttempted):
        up.check_subpixel_weight(stub)
    fails_with(up.check_subpixel_weight, lambda k, r: up.subpixel_as_conv_transpose_weight(k.flip(-1, -2), r),
               "not flipped")
    fails_with(up.check_subpixel_weight, lambda k, r: up.subpixel_as_conv_transpose_weight(k, r).transpose(0, 1),
               "channel axes are swapped")

    def ij_swapped(kern, r):
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 4, 2, 5, 1)
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    fails_with(up.check_subpixel_weight, ij_swapped, "sub-pixel offsets are swapped")

    def block_layout(kern, r):
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 1, 4, 2, 5)
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    fails_with(up.check_subpixel_weight, block_layout, "a'*r + i")
