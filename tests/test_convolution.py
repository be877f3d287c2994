"""Tests of course_utils.convolution: the rungs the lesson imports, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_utils import convolution as cv
from course_utils.checks import NotAttempted
from conftest import stub, fails_with  # noqa: E402

SETTINGS = [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)]  # (stride, padding, dilation)


def torch_conv(x, w, s=1, p=0, d=1, groups=1):
    return F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s, padding=p, dilation=d, groups=groups).numpy()


@pytest.fixture
def xw():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 3, 9, 8)).astype(np.float32), rng.standard_normal((4, 3, 3, 2)).astype(np.float32)


# ---------------------------------------------------------------- helpers the lesson imports
@pytest.mark.parametrize("size,kernel,s,p,d", [(7, 3, 1, 1, 1), (8, 3, 2, 1, 1), (13, 5, 2, 2, 2), (9, 2, 3, 0, 3)])
def test_conv_output_size_matches_torch(size, kernel, s, p, d):
    y = F.conv2d(torch.zeros(1, 1, size, size), torch.zeros(1, 1, kernel, kernel), stride=s, padding=p, dilation=d)
    assert cv.conv_output_size(size, kernel, s, p, d) == y.shape[-1]


def test_conv_output_size_rejects_a_kernel_larger_than_the_input():
    with pytest.raises(ValueError):
        cv.conv_output_size(4, 3, dilation=3)


def test_conv2d_flops_counts_two_per_multiply_add():
    assert cv.conv2d_flops((2, 3, 8, 8), (5, 3, 3, 3), 1, 1) == 2 * 2 * 5 * 8 * 8 * 3 * 3 * 3


@pytest.mark.parametrize("s,p,d", SETTINGS)
def test_every_numpy_rung_matches_conv2d(xw, s, p, d):
    x, w = xw
    want = torch_conv(x, w, s, p, d)
    for fn in (cv.conv2d_naive, cv.conv2d_vectorized, cv.conv2d_im2col):
        np.testing.assert_allclose(fn(x, w, s, p, d), want, rtol=1e-5, atol=1e-4)
    got = cv.conv2d_blocked(x, w, s, p, d, mc=8, kc=16, nc=16, mr=4, nr=4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


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


def test_cache_sizes_reads_sysfs_layout_and_falls_back(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    got = cv.cache_sizes(tmp_path)
    assert got["L1d"] == 48 * 1024 and got["L2"] == 2 * 1024 ** 2
    assert got["L3"] == cv.FALLBACK_CACHES["L3"] and got["source"] == "sysfs, fallback for L3"
    missing = cv.cache_sizes(tmp_path / "nowhere")
    assert missing["source"] == "fallback" and missing["L1d"] == cv.FALLBACK_CACHES["L1d"]


def test_goto_block_sizes_fit_their_caches():
    caches = {"L1d": 32 * 1024, "L2": 1024 ** 2, "L3": 8 * 1024 ** 2}
    b = cv.goto_block_sizes(caches, itemsize=4, mr=8, nr=8)
    assert b["kc"] % 16 == 0 and (b["mr"] + b["nr"]) * b["kc"] * 4 <= caches["L1d"] // 2
    assert b["mc"] % 8 == 0 and b["mc"] * b["kc"] * 4 <= caches["L2"] // 2
    assert b["nc"] % 8 == 0 and b["nc"] * b["kc"] * 4 <= caches["L3"] // 2
    assert b == {"mc": 512, "kc": 256, "nc": 4096, "mr": 8, "nr": 8}


def test_packing_layout():
    a = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    pa = cv.pack_a(a, 2)  # (3 panels, kc=3, mr=2), zero-padded
    assert pa.shape == (3, 3, 2) and pa.flags.c_contiguous
    np.testing.assert_array_equal(pa[1], a[2:4].T)
    np.testing.assert_array_equal(pa[2], np.stack([a[4], np.zeros(3)], axis=1))
    pb = cv.pack_b(a.T, 2)  # (3, 5) -> (3 panels, 3, 2)
    np.testing.assert_array_equal(pb[0], a.T[:, :2])


@pytest.mark.parametrize("cfg", [dict(mc=16, kc=16, nc=16, mr=4, nr=4), dict(mc=8, kc=32, nc=24, mr=8, nr=8)])
def test_blocked_matmul_handles_ragged_edges(cfg):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((37, 53)), rng.standard_normal((53, 45))
    np.testing.assert_allclose(cv.blocked_matmul(a, b, **cfg), a @ b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError):
        cv.blocked_matmul(a, b.T)


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


# ---------------------------------------------------------------- exercise 1
def test_output_shape_check():
    def right(hw, k, s, p, d):
        return tuple((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2))

    cv.check_conv_output_shape(right)
    cv.check_conv_output_shape(lambda *a: list(right(*a)))  # a list is accepted too
    with pytest.raises(NotAttempted):
        cv.check_conv_output_shape(stub)
    fails_with(cv.check_conv_output_shape,
               lambda hw, k, s, p, d: tuple((hw[a] + 2 * p[a] - k[a]) // s[a] + 1 for a in range(2)), "dilation")
    fails_with(cv.check_conv_output_shape,
               lambda hw, k, s, p, d: tuple((hw[a] + p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2)),
               "one side only")
    fails_with(cv.check_conv_output_shape,
               lambda hw, k, s, p, d: tuple((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] for a in range(2)),
               "off by one")
    fails_with(cv.check_conv_output_shape, lambda hw, k, s, p, d: right(hw, k, s[::-1], p, d), "axes")
    fails_with(cv.check_conv_output_shape,
               lambda hw, k, s, p, d: tuple(-(-(hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a]) + 1 for a in range(2)),
               "rounded up")
    fails_with(cv.check_conv_output_shape, lambda *a: tuple(float(v) for v in right(*a)), "must be ints")


# ---------------------------------------------------------------- exercise 2
def _im2col_nhwc(x, kh, kw, s, p):
    xp = np.ascontiguousarray(np.pad(x, ((0, 0), (p, p), (p, p), (0, 0))))
    n, hp, wp, c = xp.shape
    oh, ow = (hp - kh) // s + 1, (wp - kw) // s + 1
    sn, sh, sw, sc = xp.strides
    v = np.lib.stride_tricks.as_strided(xp, (n, oh, ow, kh, kw, c), (sn, s * sh, s * sw, sh, sw, sc))
    return v.reshape(n * oh * ow, kh * kw * c)


def test_im2col_nhwc_check():
    cv.check_im2col_nhwc(_im2col_nhwc)
    with pytest.raises(NotAttempted):
        cv.check_im2col_nhwc(stub)

    def channel_major(x, kh, kw, s, p):  # columns (c, kh, kw)
        cols = _im2col_nhwc(x, kh, kw, s, p)
        return cols.reshape(len(cols), kh, kw, x.shape[3]).transpose(0, 3, 1, 2).reshape(len(cols), -1)

    fails_with(cv.check_im2col_nhwc, channel_major, "channel order")
    fails_with(cv.check_im2col_nhwc,
               lambda x, kh, kw, s, p: _im2col_nhwc(np.pad(x, ((0, 0), (p, 0), (p, 0), (0, 0))), kh, kw, s, 0),
               "top/left")
    fails_with(cv.check_im2col_nhwc, lambda x, kh, kw, s, p: _im2col_nhwc(x, kh, kw, 1, p), "stride")
    fails_with(cv.check_im2col_nhwc, lambda x, kh, kw, s, p: _im2col_nhwc(x, kh, kw, s, p).T.copy(), "transposed")


# ---------------------------------------------------------------- exercise 3
def _grouped(x, w, s, p, g):
    cols = cv.im2col(x, w.shape[2], w.shape[3], s, p)
    oh, ow = cv.conv_output_size(x.shape[2], w.shape[2], s, p), cv.conv_output_size(x.shape[3], w.shape[3], s, p)
    out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(g, -1, cols.shape[1]))
    return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))


def test_conv2d_grouped_check():
    cv.check_conv2d_grouped(_grouped, trials=6)
    with pytest.raises(NotAttempted):
        cv.check_conv2d_grouped(stub)
    fails_with(cv.check_conv2d_grouped,
               lambda x, w, s, p, g: _grouped(x, np.ascontiguousarray(w[..., ::-1, ::-1]), s, p, g), "flipped")

    def group0(x, w, s, p, g):
        cig = x.shape[1] // g
        return _grouped(np.tile(x[:, :cig], (1, g, 1, 1)), w, s, p, g)

    fails_with(cv.check_conv2d_grouped, group0, "first group")

    def rows_interleaved(x, w, s, p, g):
        cols = cv.im2col(x, w.shape[2], w.shape[3], s, p)
        oh, ow = cv.conv_output_size(x.shape[2], 3, s, p), cv.conv_output_size(x.shape[3], 3, s, p)
        out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(-1, g, cols.shape[1]).transpose(1, 0, 2))
        return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))

    fails_with(cv.check_conv2d_grouped, rows_interleaved, "channel order")
    fails_with(cv.check_conv2d_grouped, lambda x, w, s, p, g: _grouped(x, w, s, 0, g), "padding")


# ---------------------------------------------------------------- exercises 4 and 5
def _grad_weight(x, g, k, s, p):
    cols = cv.im2col(x, k, k, s, p)
    gm = g.transpose(1, 0, 2, 3).reshape(g.shape[1], -1)
    return (gm @ cols.T).reshape(g.shape[1], x.shape[1], k, k)


def test_conv2d_grad_weight_check():
    cv.check_conv2d_grad_weight(_grad_weight)
    with pytest.raises(NotAttempted):
        cv.check_conv2d_grad_weight(stub)
    fails_with(cv.check_conv2d_grad_weight, lambda *a: np.ascontiguousarray(_grad_weight(*a)[..., ::-1, ::-1]),
               "flipped")
    fails_with(cv.check_conv2d_grad_weight, lambda x, g, k, s, p: _grad_weight(x, g, k, s, p) / x.shape[0],
               "averaged")
    fails_with(cv.check_conv2d_grad_weight, lambda x, g, k, s, p: _grad_weight(x[:1], g[:1], k, s, p), "first sample")


def _grad_input(g, w, hw, s, p):
    extra = tuple(hw[a] - ((g.shape[2 + a] - 1) * s - 2 * p + w.shape[2 + a]) for a in range(2))  # output_padding
    return F.conv_transpose2d(torch.from_numpy(g), torch.from_numpy(w), stride=s, padding=p, output_padding=extra).numpy()


def test_conv2d_grad_input_check():
    cv.check_conv2d_grad_input(_grad_input)
    with pytest.raises(NotAttempted):
        cv.check_conv2d_grad_input(stub)
    fails_with(cv.check_conv2d_grad_input,
               lambda g, w, hw, s, p: _grad_input(g, np.ascontiguousarray(w[..., ::-1, ::-1]), hw, s, p), "not flipped")

    def crop_late(g, w, hw, s, p):  # gradient of the padded input cropped at p - 1
        h, wd = hw
        extra = tuple((h, wd)[a] + 2 * p - ((g.shape[2 + a] - 1) * s + w.shape[2 + a]) for a in range(2))
        big = F.conv_transpose2d(torch.from_numpy(g), torch.from_numpy(w), stride=s, output_padding=extra).numpy()
        return np.ascontiguousarray(big[:, :, p - 1:p - 1 + h, p - 1:p - 1 + wd])

    fails_with(cv.check_conv2d_grad_input, crop_late, "off-by-one padding")

    def scatter_without_stride(g, w, hw, s, p):  # col2im that steps 1 pixel per output pixel
        n, c_out, oh, ow = g.shape
        _, c_in, kh, kw = w.shape
        dcols = (w.reshape(c_out, -1).T @ g.transpose(1, 0, 2, 3).reshape(c_out, -1)).reshape(c_in, kh, kw, n, oh, ow)
        dxp = np.zeros((n, c_in, hw[0] + 2 * p + oh, hw[1] + 2 * p + ow))
        for u in range(kh):
            for v in range(kw):
                dxp[:, :, u:u + oh, v:v + ow] += dcols[:, u, v].transpose(1, 0, 2, 3)
        return dxp[:, :, p:p + hw[0], p:p + hw[1]].copy()

    fails_with(cv.check_conv2d_grad_input, scatter_without_stride, "ignored the stride")


# ---------------------------------------------------------------- exercise 6
def test_conv1x1_check():
    cv.check_conv1x1(lambda x, w: (w @ x.reshape(x.shape[0], x.shape[1], -1)).reshape(x.shape[0], -1, *x.shape[2:]))
    with pytest.raises(NotAttempted):
        cv.check_conv1x1(stub)

    def bad_reshape(x, w):
        n, c, h, wd = x.shape
        return (x.reshape(n * h * wd, c) @ w.T).reshape(n, h, wd, -1).permute(0, 3, 1, 2).contiguous()

    fails_with(cv.check_conv1x1, bad_reshape, "mixes channels and pixels")

    def no_permute_back(x, w):
        n, c, h, wd = x.shape
        return (x.permute(0, 2, 3, 1).reshape(-1, c) @ w.T).reshape(n, -1, h, wd).contiguous()

    fails_with(cv.check_conv1x1, no_permute_back, "wrong order")


# ---------------------------------------------------------------- exercise 7
def test_column_bytes_check():
    right = 3 * 49 * 32 * 112 * 112 * 4 / 2 ** 20
    cv.check_column_bytes(right)
    with pytest.raises(NotAttempted):
        cv.check_column_bytes(...)
    fails_with(cv.check_column_bytes, 3 * 49 * 32 * 224 * 224 * 4 / 2 ** 20, "stride")
    fails_with(cv.check_column_bytes, 3 * 49 * 32 * 112 * 112 * 4 / 1e6, "MiB")
    fails_with(cv.check_column_bytes, 123.0, "not right yet")
