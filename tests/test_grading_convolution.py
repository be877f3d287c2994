"""Tests of course_utils.grading.convolution: each check of solutions/03_convolution.ipynb passes the solution and a
right answer written differently, says "not attempted" for a stub, names each plausible mistake, fails a forbidden
shortcut as forbidden, and fails a hard-coded answer on fresh inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _grading_helpers import fails_with, stub  # noqa: E402
from _grading_helpers import SWEEP_SEEDS, forbidden_call, pasted, replayed_answer_fails, sweep_named, sweep_passes  # noqa: E402,E501
from course_utils import convolution as cv
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.grading import convolution as grading
from course_utils.grading import convolution_backward as backward

pcv = pasted(cv)  # the lesson's helpers as a learner who pasted their source would have them

SEEDS = SWEEP_SEEDS


def hard_coded(check, solution):
    replayed_answer_fails(check, solution, names_inputs=True)


# ---------------------------------------------------------------- exercise 1
def _output_shape(hw, k, s, p, d):
    return tuple((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2))


def test_output_shape_check():
    check = grading.check_conv_output_shape
    sweep_passes(check, _output_shape, trials=12)
    sweep_passes(check, lambda *a: list(_output_shape(*a)))  # a list is accepted too
    sweep_passes(check, lambda hw, k, s, p, d: tuple(int(np.floor((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) / s[a])) + 1
                                               for a in range(2)))  # written with / and floor
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda hw, k, s, p, d: tuple((hw[a] + 2 * p[a] - k[a]) // s[a] + 1 for a in range(2)), "dilation")
    sweep_named(check, lambda hw, k, s, p, d: tuple((hw[a] + p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(2)),
          "one side only")
    sweep_named(check, lambda hw, k, s, p, d: tuple((hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] for a in range(2)),
          "off by one")
    sweep_named(check, lambda hw, k, s, p, d: _output_shape(hw, k, s[::-1], p, d), "axes")
    sweep_named(check, lambda hw, k, s, p, d: tuple(-(-(hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a]) + 1
                                              for a in range(2)), "rounded up")
    sweep_named(check, lambda *a: tuple(float(v) for v in _output_shape(*a)), "must be ints")
    forbidden_call(check, lambda hw, k, s, p, d: tuple(cv.conv_output_size(hw[a], k[a], s[a], p[a], d[a]) for a in range(2)),
              "course_utils.convolution.conv_output_size")
    forbidden_call(check, lambda hw, k, s, p, d: tuple(F.conv2d(torch.zeros(1, 1, *hw), torch.zeros(1, 1, *k), stride=s,
                                                           padding=p, dilation=d).shape[2:]), "conv2d")
    hard_coded(check, _output_shape)


def test_output_shape_check_draws_edge_sizes():
    seen = set()

    def spy(*args):
        out = _output_shape(*args)
        seen.update(out)
        return out

    grading.check_conv_output_shape(spy, trials=12, seed=0, quiet=True)
    assert {1, 2} & seen


# ---------------------------------------------------------------- exercise 2
def _im2col_nhwc(x, kh, kw, s, p):
    xp = np.ascontiguousarray(np.pad(x, ((0, 0), (p, p), (p, p), (0, 0))))
    n, hp, wp, c = xp.shape
    oh, ow = (hp - kh) // s + 1, (wp - kw) // s + 1
    sn, sh, sw, sc = xp.strides
    v = np.lib.stride_tricks.as_strided(xp, (n, oh, ow, kh, kw, c), (sn, s * sh, s * sw, sh, sw, sc))
    return v.reshape(n * oh * ow, kh * kw * c)


def _im2col_nhwc_sliding(x, kh, kw, s, p):  # right, written with sliding_window_view
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::s, ::s]  # (N, OH, OW, C, KH, KW)
    return win.transpose(0, 1, 2, 4, 5, 3).reshape(-1, kh * kw * x.shape[3])


def test_im2col_nhwc_check():
    check = grading.check_im2col_nhwc
    sweep_passes(check, _im2col_nhwc, trials=8)
    sweep_passes(check, _im2col_nhwc_sliding)
    with pytest.raises(NotAttempted):
        check(stub)

    def channel_major(x, kh, kw, s, p):  # columns (c, kh, kw)
        cols = _im2col_nhwc(x, kh, kw, s, p)
        return cols.reshape(len(cols), kh, kw, x.shape[3]).transpose(0, 3, 1, 2).reshape(len(cols), -1)

    sweep_named(check, channel_major, "channel order")
    sweep_named(check, lambda x, kh, kw, s, p: _im2col_nhwc(np.pad(x, ((0, 0), (p, 0), (p, 0), (0, 0))), kh, kw, s, 0),
          "top/left")
    sweep_named(check, lambda x, kh, kw, s, p: _im2col_nhwc(x, kh, kw, 1, p), "stride")
    sweep_named(check, lambda x, kh, kw, s, p: _im2col_nhwc(x, kh, kw, s, p).T.copy(), "transposed")
    sweep_named(check, lambda x, kh, kw, s, p: _im2col_nhwc(x, kh, kw, s, 0), "zero padding")

    def via_course(x, kh, kw, s, p):
        cols = cv.im2col(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), kh, kw, s, p)
        return np.ascontiguousarray(cols.reshape(x.shape[3], kh, kw, -1).transpose(3, 1, 2, 0).reshape(-1, kh * kw * x.shape[3]))

    forbidden_call(check, via_course, "course_utils.convolution.im2col")

    def via_unfold(x, kh, kw, s, p):
        cols = F.unfold(torch.from_numpy(x).permute(0, 3, 1, 2), (kh, kw), padding=p, stride=s)  # (N, C*KH*KW, L)
        n, c = x.shape[0], x.shape[3]
        return cols.reshape(n, c, kh, kw, -1).permute(0, 4, 2, 3, 1).reshape(-1, kh * kw * c).numpy()

    forbidden_call(check, via_unfold, "unfold")
    hard_coded(check, _im2col_nhwc)


# ---------------------------------------------------------------- exercise 3
def _grouped(x, w, s, p, g):
    return _grouped_with(pcv, x, w, s, p, g)


def _grouped_with(cv, x, w, s, p, g):
    cols = cv.im2col(x, w.shape[2], w.shape[3], s, p)
    oh, ow = cv.conv_output_size(x.shape[2], w.shape[2], s, p), cv.conv_output_size(x.shape[3], w.shape[3], s, p)
    out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(g, -1, cols.shape[1]))
    return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))


def _grouped_einsum(x, w, s, p, g):  # right, written as per-group views and one einsum
    n, c_in, h, wd = x.shape
    kh, kw = w.shape[2:]
    view = pcv.im2col_view(x, kh, kw, s, p)  # (N, C_in, KH, KW, OH, OW)
    view = view.reshape(n, g, c_in // g, kh, kw, *view.shape[4:])
    wg = w.reshape(g, w.shape[0] // g, c_in // g, kh, kw)
    out = np.einsum("ngcpqij,gocpq->ngoij", view, wg)
    return np.ascontiguousarray(out.reshape(n, w.shape[0], *out.shape[3:]))


def test_conv2d_grouped_check():
    check = grading.check_conv2d_grouped
    sweep_passes(check, _grouped, trials=8)
    sweep_passes(check, _grouped_einsum)
    # the prompt allows the lesson's own im2col and conv_output_size (ByHand(allow=...)); its whole convolutions stay refused
    sweep_passes(check, lambda x, w, s, p, g: _grouped_with(cv, x, w, s, p, g))
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda x, w, s, p, g: _grouped(x, np.ascontiguousarray(w[..., ::-1, ::-1]), s, p, g), "flipped")

    def group0(x, w, s, p, g):
        cig = x.shape[1] // g
        return _grouped(np.tile(x[:, :cig], (1, g, 1, 1)), w, s, p, g)

    sweep_named(check, group0, "first group")

    def rows_interleaved(x, w, s, p, g):
        cols = pcv.im2col(x, w.shape[2], w.shape[3], s, p)
        oh, ow = pcv.conv_output_size(x.shape[2], w.shape[2], s, p), pcv.conv_output_size(x.shape[3], w.shape[3], s, p)
        out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(-1, g, cols.shape[1]).transpose(1, 0, 2))
        return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))

    sweep_named(check, rows_interleaved, "channel order")
    sweep_named(check, lambda x, w, s, p, g: _grouped(x, w, s, 0, g), "padding")
    forbidden_call(check, lambda x, w, s, p, g: F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s, padding=p,
                                                    groups=g).numpy(), "conv2d")

    def per_group_course(x, w, s, p, g):  # the lesson's whole convolution, once per group
        cig, cog = x.shape[1] // g, w.shape[0] // g
        return np.concatenate([cv.conv2d_im2col(x[:, i * cig:(i + 1) * cig], w[i * cog:(i + 1) * cog], s, p)
                               for i in range(g)], axis=1)

    forbidden_call(check, per_group_course, "course_utils.convolution.conv2d_im2col")
    hard_coded(check, _grouped)


# ---------------------------------------------------------------- exercises 4 and 5
def _grad_weight(x, g, k, s, p):
    cols = pcv.im2col(x, k, k, s, p)
    gm = g.transpose(1, 0, 2, 3).reshape(g.shape[1], -1)
    return (gm @ cols.T).reshape(g.shape[1], x.shape[1], k, k)


def _grad_weight_einsum(x, g, k, s, p):  # right, written on the strided view
    return np.einsum("ncpqij,noij->ocpq", pcv.im2col_view(x, k, k, s, p), g)


def test_conv2d_grad_weight_check():
    check = grading.check_conv2d_grad_weight
    sweep_passes(check, _grad_weight, trials=8)
    sweep_passes(check, _grad_weight_einsum)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda *a: np.ascontiguousarray(_grad_weight(*a)[..., ::-1, ::-1]), "flipped")
    sweep_named(check, lambda x, g, k, s, p: _grad_weight(x, g, k, s, p) / x.shape[0], "averaged")
    sweep_named(check, lambda x, g, k, s, p: _grad_weight(x[:1], g[:1], k, s, p), "first sample")
    sweep_named(check, lambda x, g, k, s, p: backward._grad_weight_unpadded(x, g, k, s, p), "unpadded")

    def by_autograd(x, g, k, s, p):
        w = torch.zeros(g.shape[1], x.shape[1], k, k, dtype=torch.float64, requires_grad=True)
        F.conv2d(torch.from_numpy(x), w, stride=s, padding=p).backward(torch.from_numpy(g))
        return w.grad.numpy()

    forbidden_call(check, by_autograd, "conv2d")

    hard_coded(check, _grad_weight)


def test_conv2d_grad_weight_check_forbids_torch_nn_grad():
    def by_nn_grad(x, g, k, s, p):
        return torch.nn.grad.conv2d_weight(torch.from_numpy(x), (g.shape[1], x.shape[1], k, k), torch.from_numpy(g),
                                           stride=s, padding=p).numpy()

    forbidden_call(grading.check_conv2d_grad_weight, by_nn_grad, "torch.nn.grad.conv2d_weight")


def _grad_input(g, w, hw, s, p):
    n, c_out, oh, ow = g.shape
    _, c_in, kh, kw = w.shape
    dcols = (w.reshape(c_out, -1).T @ g.transpose(1, 0, 2, 3).reshape(c_out, -1)).reshape(c_in, kh, kw, n, oh, ow)
    dxp = np.zeros((n, c_in, hw[0] + 2 * p, hw[1] + 2 * p))
    for u in range(kh):
        for v in range(kw):
            dxp[:, :, u:u + s * oh:s, v:v + s * ow:s] += dcols[:, u, v].transpose(1, 0, 2, 3)
    return dxp[:, :, p:p + hw[0], p:p + hw[1]].copy()


def _grad_input_loops(g, w, hw, s, p):  # right values, written as the loops over output pixels the prompt rules out
    n, c_out, oh, ow = g.shape
    _, c_in, kh, kw = w.shape
    dxp = np.zeros((n, c_in, hw[0] + 2 * p, hw[1] + 2 * p))
    for i in range(oh):
        for j in range(ow):
            dxp[:, :, i * s:i * s + kh, j * s:j * s + kw] += np.einsum("no,ocpq->ncpq", g[:, :, i, j], w)
    return dxp[:, :, p:p + hw[0], p:p + hw[1]].copy()


def _grad_input_torch(g, w, hw, s, p):
    extra = tuple(hw[a] - ((g.shape[2 + a] - 1) * s - 2 * p + w.shape[2 + a]) for a in range(2))  # output_padding
    return F.conv_transpose2d(torch.from_numpy(g), torch.from_numpy(w), stride=s, padding=p, output_padding=extra).numpy()


def test_conv2d_grad_input_check():
    check = grading.check_conv2d_grad_input
    sweep_passes(check, _grad_input, trials=8)
    # "loop over the kernel taps if you like, not over pixels": the loops over pixels are refused, whatever the values
    forbidden_call(check, _grad_input_loops, "loop over pixels")
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda g, w, hw, s, p: _grad_input(g, np.ascontiguousarray(w[..., ::-1, ::-1]), hw, s, p),
          "not flipped")

    def crop_late(g, w, hw, s, p):  # gradient of the padded input cropped at p - 1
        q = max(p - 1, 0)
        big = _grad_input(g, w, (hw[0] + 2 * p, hw[1] + 2 * p), s, 0)
        return np.ascontiguousarray(big[:, :, q:q + hw[0], q:q + hw[1]])

    sweep_named(check, crop_late, "off-by-one padding")

    def scatter_without_stride(g, w, hw, s, p):  # col2im that steps 1 pixel per output pixel
        n, c_out, oh, ow = g.shape
        _, c_in, kh, kw = w.shape
        dcols = (w.reshape(c_out, -1).T @ g.transpose(1, 0, 2, 3).reshape(c_out, -1)).reshape(c_in, kh, kw, n, oh, ow)
        dxp = np.zeros((n, c_in, hw[0] + 2 * p + oh, hw[1] + 2 * p + ow))
        for u in range(kh):
            for v in range(kw):
                dxp[:, :, u:u + oh, v:v + ow] += dcols[:, u, v].transpose(1, 0, 2, 3)
        return dxp[:, :, p:p + hw[0], p:p + hw[1]].copy()

    sweep_named(check, scatter_without_stride, "ignored the stride")
    forbidden_call(check, _grad_input_torch, "conv_transpose2d")

    def via_col2im(g, w, hw, s, p):
        dcols = w.reshape(w.shape[0], -1).T @ g.transpose(1, 0, 2, 3).reshape(g.shape[1], -1)
        return cv.col2im(dcols, (g.shape[0], w.shape[1]) + tuple(hw), w.shape[2], w.shape[3], s, p)

    forbidden_call(check, via_col2im, "course_utils.convolution.col2im")
    hard_coded(check, _grad_input)


# ---------------------------------------------------------------- exercise 6
def _conv1x1(x, w):
    return (w @ x.reshape(x.shape[0], x.shape[1], -1)).reshape(x.shape[0], -1, *x.shape[2:])


def test_conv1x1_check():
    check = grading.check_conv1x1
    sweep_passes(check, _conv1x1, trials=8)
    sweep_passes(check, lambda x, w: (x.permute(0, 2, 3, 1) @ w.T).permute(0, 3, 1, 2).contiguous())  # channels-last
    with pytest.raises(NotAttempted):
        check(stub)

    def bad_reshape(x, w):
        n, c, h, wd = x.shape
        return (x.reshape(n * h * wd, c) @ w.T).reshape(n, h, wd, -1).permute(0, 3, 1, 2).contiguous()

    sweep_named(check, bad_reshape, "mixes channels and pixels")

    def no_permute_back(x, w):
        n, c, h, wd = x.shape
        return (x.permute(0, 2, 3, 1).reshape(-1, c) @ w.T).reshape(n, -1, h, wd).contiguous()

    sweep_named(check, no_permute_back, "wrong order")
    sweep_named(check, lambda x, w: (x.permute(0, 2, 3, 1) @ w).permute(0, 3, 1, 2).contiguous(), "transposed")
    sweep_named(check, lambda x, w: (x.permute(0, 2, 3, 1) @ w.T).permute(0, 3, 1, 2), "not contiguous")
    forbidden_call(check, lambda x, w: F.conv2d(x, w[:, :, None, None]), "conv2d")
    forbidden_call(check, lambda x, w: torch.einsum("nchw,oc->nohw", x, w).contiguous(), "einsum")
    hard_coded(check, _conv1x1)


# ---------------------------------------------------------------- exercise 7
def _mib(x_shape, w_shape, s, p, itemsize):
    n, c, h, w = x_shape
    k = w_shape[2]
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    return c * k * k * n * oh * ow * itemsize / 2 ** 20


def test_column_matrix_mib_check():
    check = grading.check_column_matrix_mib
    sweep_passes(check, _mib, trials=10)
    sweep_passes(check, lambda x, w, s, p, i: np.prod([x[0], w[1], w[2], w[3], pcv.conv_output_size(x[2], w[2], s, p),
                                                  pcv.conv_output_size(x[3], w[3], s, p), i]) / 1024 / 1024)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda x, w, s, p, i: _mib(x, w, s, p, i) * 2 ** 20 / 1e6, "MB")
    sweep_named(check, lambda x, w, s, p, i: _mib(x, w, 1, p, i), "stride-1")
    sweep_named(check, lambda x, w, s, p, i: _mib(x, w, s, 0, i), "padding")
    sweep_named(check, lambda x, w, s, p, i: _mib((x[0], w[0]) + tuple(x[2:]), w, s, p, i), "output channels")
    sweep_named(check, lambda x, w, s, p, i: _mib((1,) + tuple(x[1:]), w, s, p, i), "one image")
    fails_with(lambda f: check(f, seed=0, trials=10, quiet=True), lambda x, w, s, p, i: _mib(x, w, s, p, 4), "itemsize")
    forbidden_call(check, lambda x, w, s, p, i: cv.im2col(np.zeros(x, dtype=np.float32), w[2], w[3], s, p).size * i / 2 ** 20,
              "course_utils.convolution.im2col")
    hard_coded(check, _mib)
    with pytest.raises(CheckFailed):  # the old exercise's single answer, 225.09765625 MiB, is no longer enough
        check(lambda *a: 3 * 49 * 32 * 112 * 112 * 4 / 2 ** 20, seed=0, quiet=True)


# ---------------------------------------------------------------- structural demands of the prompts (issue 23)
def _im2col_nhwc_pixel_loop(x, kh, kw, s, p):  # right values, one window per output pixel
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    oh, ow = (xp.shape[1] - kh) // s + 1, (xp.shape[2] - kw) // s + 1
    return np.stack([xp[n, i * s:i * s + kh, j * s:j * s + kw].reshape(-1)
                     for n in range(x.shape[0]) for i in range(oh) for j in range(ow)])


def _im2col_nhwc_tap_loop(x, kh, kw, s, p):  # right, a loop over the taps (allowed: not over pixels)
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    n, c = x.shape[0], x.shape[3]
    oh, ow = (xp.shape[1] - kh) // s + 1, (xp.shape[2] - kw) // s + 1
    out = np.empty((n, oh, ow, kh, kw, c), dtype=x.dtype)
    for u in range(kh):
        for v in range(kw):
            out[:, :, :, u, v] = xp[:, u:u + s * (oh - 1) + 1:s, v:v + s * (ow - 1) + 1:s]
    return out.reshape(n * oh * ow, -1)


def test_im2col_nhwc_refuses_a_loop_over_pixels():
    check = grading.check_im2col_nhwc
    for seed in SEEDS:
        quiet = dict(seed=seed, quiet=True)
        check(_im2col_nhwc_tap_loop, **quiet)
        forbidden_call(lambda f, **k: check(f, **quiet), _im2col_nhwc_pixel_loop, "loop over pixels")


def test_conv2d_grouped_refuses_a_loop_over_groups():
    def per_group(x, w, s, p, g):  # right values, one product per group
        cig, cog = x.shape[1] // g, w.shape[0] // g
        return np.concatenate([_grouped(x[:, i * cig:(i + 1) * cig], w[i * cog:(i + 1) * cog], s, p, 1)
                               for i in range(g)], axis=1)

    forbidden_call(grading.check_conv2d_grouped, per_group, "loop over groups")


def test_conv1x1_refuses_a_loop():
    def per_image(x, w):  # right values, one product per image
        return torch.stack([w @ x[i].reshape(x.shape[1], -1) for i in range(x.shape[0])]).reshape(
            x.shape[0], -1, *x.shape[2:]).contiguous()

    forbidden_call(grading.check_conv1x1, per_image, "Python loop")
