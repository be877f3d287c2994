"""Tests of exercise 10 of solutions/03_convolution.ipynb (course_utils.grading.convolution_backward): the weight gradient
of a strided, padded, dilated, grouped convolution as an implicit GEMM. The check passes the solution and right answers
written differently, names each plausible mistake, refuses autograd, the convolution ops, unfold, the course's functions
and the way out to NumPy, measures the structure (no column matrix, not even one group's share of it), and rejects a
table of recorded answers. Its reference is held to torch.nn.grad.conv2d_weight."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _grading_helpers import SEED, each_mistake_is_named, fails, forbidden, passes, rejects_recorded_answers, stub  # noqa: E402
from course_utils import convolution as cv
from course_utils.checks import NotAttempted
from course_utils.grading import convolution as grading
from course_utils.grading import convolution_backward as backward

check = grading.check_conv2d_grad_weight_implicit


def _solution(x, grad_out, kernel_size, stride, padding, dilation, groups):
    n, c_in, h, w = x.shape
    c_out, oh, ow = grad_out.shape[1:]
    (kh, kw), cig, cog = kernel_size, c_in // groups, c_out // groups
    xp = F.pad(x, (padding,) * 4)                                          # (N, C_in, H+2p, W+2p)
    g = grad_out.reshape(n, groups, cog, oh * ow)
    dw = torch.empty(c_out, cig, kh, kw, dtype=x.dtype)
    for u in range(kh):
        for v in range(kw):
            r0, c0 = u * dilation, v * dilation
            tap = xp[:, :, r0:r0 + stride * (oh - 1) + 1:stride, c0:c0 + stride * (ow - 1) + 1:stride]
            dw[:, :, u, v] = (g @ tap.reshape(n, groups, cig, oh * ow).transpose(-1, -2)).sum(0).reshape(c_out, cig)
    return dw


def _pixel_blocks(x, grad_out, kernel_size, stride, padding, dilation, groups):
    """Right, written the other way round: blocks of output pixels, every tap gathered by index arithmetic with a mask
    (no padded copy), one (block, K) slab of Cols per group at a time, accumulated with einsum."""
    n, c_in, h, w = x.shape
    c_out, oh, ow = grad_out.shape[1:]
    (kh, kw), cig, cog = kernel_size, c_in // groups, c_out // groups
    block = (h + 2 * padding) * (w + 2 * padding) // (kh * kw)           # a slab no larger than the padded input
    u = torch.arange(kh).repeat_interleave(kw) * dilation                 # (KH*KW,) row offsets of the taps
    v = torch.arange(kw).repeat(kh) * dilation
    dw = torch.zeros(groups, cog, cig, kh * kw, dtype=x.dtype)
    go = grad_out.reshape(n, groups, cog, oh * ow)
    for m0 in range(0, oh * ow, block):
        m = torch.arange(m0, min(m0 + block, oh * ow))
        ih = (m // ow * stride - padding)[:, None] + u[None, :]           # (block, KH*KW)
        iw = (m % ow * stride - padding)[:, None] + v[None, :]
        inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)
        slab = x[:, :, ih.clamp(0, h - 1), iw.clamp(0, w - 1)] * inside    # (N, C_in, block, KH*KW)
        slab = slab.reshape(n, groups, cig, len(m), kh * kw)
        dw += torch.einsum("ngom,ngcmk->gock", go[..., m], slab)
    return dw.reshape(c_out, cig, kh, kw)


def test_the_reference_is_autograds_weight_gradient():
    for trial in range(2):  # one input of each kind
        x, g, k, s, p, d, groups = backward._implicit_inputs(np.random.default_rng([SEED, trial]), trial)
        w_shape = (g.shape[1], x.shape[1] // groups) + tuple(k)
        want = torch.nn.grad.conv2d_weight(x, w_shape, g, s, p, d, groups)
        torch.testing.assert_close(backward._reference_conv2d_grad_weight_implicit(x, g, k, s, p, d, groups), want)


def test_right_answers_pass(capsys):
    passes(check, _solution)
    passes(check, _pixel_blocks)
    assert capsys.readouterr().out.count("✅") == 4
    with pytest.raises(NotAttempted):
        check(stub)


def test_each_mistake_is_named(monkeypatch):
    each_mistake_is_named(backward, check, _solution, monkeypatch, trials=2)


def _taps(x, g, k, s, p, d, groups, change):  # the solution with one slip, as a learner would write it
    args = dict(s=s, p=p, d=d)
    args.update(change)
    xp = F.pad(x, (args["p"],) * 4) if "shift" not in change else F.pad(x, (0, 2 * p, 0, 2 * p))
    n, c_in = x.shape[:2]
    c_out, oh, ow = g.shape[1:]
    cig, cog = c_in // groups, c_out // groups
    out = torch.empty(c_out, cig, *k, dtype=x.dtype)
    for u in range(k[0]):
        for v in range(k[1]):
            r0, c0 = u * args["d"], v * args["d"]
            tap = xp[:, :, r0:r0 + args["s"] * (oh - 1) + 1:args["s"], c0:c0 + args["s"] * (ow - 1) + 1:args["s"]]
            tap = tap[:, change["channels"](c_in, groups)] if "channels" in change else tap
            for j in range(groups):
                out[j * cog:(j + 1) * cog, :, u, v] = torch.einsum("noij,ncij->oc", g[:, j * cog:(j + 1) * cog],
                                                                   tap[:, j * cig:(j + 1) * cig])
    return out


@pytest.mark.parametrize("slip, fragment", [
    (dict(d=1), "ignored the dilation"),
    (dict(s=1), "ignored the stride"),
    (dict(shift=True), "forgets the padding"),
    (dict(channels=lambda c, g: torch.arange(c).reshape(c // g, g).T.reshape(-1)), "round-robin"),
    (dict(channels=lambda c, g: torch.arange(c // g).repeat(g)), "first group"),
])
def test_written_mistakes_are_named(slip, fragment):
    fails(check, lambda *a: _taps(*a, slip), fragment, trials=2)


def test_flipped_and_averaged_are_named():
    fails(check, lambda x, *a: _solution(x, *a).flip(-1, -2), "flipped", trials=2)
    fails(check, lambda x, *a: _solution(x, *a) / x.shape[0], "averaged", trials=2)


def _im2col_torch(x, k, s, p, d, oh, ow):
    """The whole column matrix, (C_in*KH*KW, N*OH*OW), from an as_strided view and one copy."""
    xp = F.pad(x, (p,) * 4)
    sn, sc, sh, sw = xp.stride()
    view = xp.as_strided((x.shape[0], x.shape[1], k[0], k[1], oh, ow), (sn, sc, d * sh, d * sw, s * sh, s * sw))
    return view.permute(1, 2, 3, 0, 4, 5).reshape(x.shape[1] * k[0] * k[1], -1)


def _explicit(x, g, k, s, p, d, groups, per_group=False):
    n, c_in = x.shape[:2]
    c_out, oh, ow = g.shape[1:]
    gm = g.transpose(0, 1).reshape(groups, c_out // groups, -1)            # (g, C_out/g, M)
    if per_group:                                                           # one group's share of Cols at a time
        cig = c_in // groups
        return torch.cat([gm[j] @ _im2col_torch(x[:, j * cig:(j + 1) * cig], k, s, p, d, oh, ow).T
                          for j in range(groups)]).reshape(c_out, cig, *k)
    cols = _im2col_torch(x, k, s, p, d, oh, ow).reshape(groups, -1, n * oh * ow)
    return (gm @ cols.transpose(1, 2)).reshape(c_out, c_in // groups, *k)


def test_the_column_matrix_is_refused():
    for per_group in (False, True):
        message = forbidden(check, lambda *a: _explicit(*a, per_group=per_group), "column matrix", trials=2)
        assert "elements stored" in message, message


def _autograd(x, g, k, s, p, d, groups):  # a forward written tap by tap (no conv op), differentiated by autograd
    n, c_in = x.shape[:2]
    c_out, oh, ow = g.shape[1:]
    cig, cog = c_in // groups, c_out // groups
    w = torch.zeros(c_out, cig, *k, dtype=x.dtype, requires_grad=True)
    xp = F.pad(x, (p,) * 4)
    out = 0
    for u in range(k[0]):
        for v in range(k[1]):
            tap = xp[:, :, u * d:u * d + s * (oh - 1) + 1:s, v * d:v * d + s * (ow - 1) + 1:s].reshape(n, groups, cig, -1)
            out = out + w[:, :, u, v].reshape(groups, cog, cig) @ tap        # (N, g, C_out/g, OH*OW)
    out.backward(g.reshape(n, groups, cog, -1))
    return w.grad


@pytest.mark.parametrize("shortcut, name", [
    (_autograd, "backward"),
    (lambda x, g, k, s, p, d, gr: _autograd_of_conv(x, g, k, s, p, d, gr), "conv2d"),
    (lambda x, g, k, s, p, d, gr: torch.nn.grad.conv2d_weight(x, (g.shape[1], x.shape[1] // gr, *k), g, s, p, d, gr),
     "conv2d_weight"),
    (lambda x, g, k, s, p, d, gr: backward._reference_conv2d_grad_weight_implicit(x, g, k, s, p, d, gr),
     "_reference_conv2d_grad_weight_implicit"),
    (lambda x, g, k, s, p, d, gr: backward._dw_taps(x, g, k, s, p, d, gr), "course_utils.grading"),
    (lambda x, g, k, s, p, d, gr: torch.from_numpy(backward._dw_taps(x.numpy(), g.numpy(), k, s, p, d, gr).numpy()),
     "torch.Tensor.numpy"),
    (lambda x, *a: _solution(x, *a) + 0 * float(cv.im2col(np.zeros((1, 1, 3, 3)), 1, 1).sum()),
     "course_utils.convolution.im2col"),
    (lambda x, g, k, s, p, d, gr: _explicit_unfold(x, g, k, s, p, d, gr), "unfold"),
])
def test_shortcuts_are_refused(shortcut, name):
    forbidden(check, shortcut, name, trials=2)


def _autograd_of_conv(x, g, k, s, p, d, groups):
    w = torch.zeros(g.shape[1], x.shape[1] // groups, *k, dtype=x.dtype, requires_grad=True)
    F.conv2d(x, w, stride=s, padding=p, dilation=d, groups=groups).backward(g)
    return w.grad


def _explicit_unfold(x, g, k, s, p, d, groups):
    cols = F.unfold(x, k, dilation=d, padding=p, stride=s)                  # (N, C_in*KH*KW, M)
    gm = g.reshape(g.shape[0], groups, g.shape[1] // groups, -1)
    cols = cols.reshape(x.shape[0], groups, -1, cols.shape[-1])
    return (gm @ cols.transpose(-1, -2)).sum(0).reshape(g.shape[1], x.shape[1] // groups, *k)


def test_a_convolution_used_as_the_gemm_is_refused():
    def via_conv(x, g, k, s, p, d, groups):                                 # dW as a conv of x with grad_out: aten's convolution
        c_in = x.shape[1]
        xs = F.pad(x, (p,) * 4).transpose(0, 1)                             # (C_in, N, Hp, Wp): batch as channels
        gs = g.transpose(0, 1)                                              # (C_out, N, OH, OW)
        out = F.conv2d(xs, gs, stride=d, dilation=s)                        # (C_in, C_out, KH', KW')
        return out[:, :, :k[0], :k[1]].transpose(0, 1)[:, :c_in // groups]

    forbidden(check, via_conv, "conv2d", trials=2)


def test_rejects_recorded_answers():
    rejects_recorded_answers(lambda fn, seed: check(fn, seed=seed, trials=2), _solution)
