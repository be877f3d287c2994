"""Tests of course_utils.grading.upsampling: each check of solutions/04_upsampling.ipynb passes the solution and a
right answer written differently, says "not attempted" for a stub, names each plausible mistake, fails a forbidden
shortcut as forbidden, and fails a hard-coded answer on fresh inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _grading_helpers import stub  # noqa: E402
from _grading_helpers import (each_mistake_is_named, fails, forbidden, passes, rejects_recorded_answers,  # noqa: E402
                              right_answers_pass)
from _grading_helpers import SWEEP_SEEDS, forbidden_call, pasted, replayed_answer_fails, sweep_named, sweep_passes  # noqa: E402,E501
from course_utils import upsampling as up
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.grading import upsampling as grading
from course_utils.grading import upsampling_filters as filters
from course_utils.grading import upsampling_transposed as transposed

gp, tp, fp = pasted(grading), pasted(transposed), pasted(filters)  # the references' helpers, pasted as a learner would

SEEDS = SWEEP_SEEDS


# ---------------------------------------------------------------- exercise 1: interpolation matrix
def _positions(m, n, ac):  # eq. (1), written here: the course's up.source_positions is forbidden in the exercise
    i = np.arange(m, dtype=np.float64)
    if ac:
        return i * (n - 1) / (m - 1) if m > 1 else np.zeros(1)
    return np.maximum((i + 0.5) * n / m - 0.5, 0.0)


def _no_clamp(n, m, ac):
    u = _positions(m, n, True) if ac else (np.arange(m) + 0.5) * n / m - 0.5
    lo = np.minimum(np.floor(u).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    a = np.zeros((m, n))
    np.add.at(a, (np.arange(m), lo), 1 - (u - lo))
    np.add.at(a, (np.arange(m), hi), u - lo)
    return a


def _interpolation_matrix(n, m, ac):
    i = np.arange(m, dtype=np.float64)
    u = (i * (n - 1) / (m - 1) if m > 1 else np.zeros(1)) if ac else np.maximum((i + 0.5) * n / m - 0.5, 0.0)
    lo = np.minimum(np.floor(u).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    a = np.zeros((m, n))
    np.add.at(a, (np.arange(m), lo), 1 - (u - lo))
    np.add.at(a, (np.arange(m), hi), u - lo)
    return a


def _interpolation_matrix_loops(n, m, ac):  # right, written as loops with a hat function
    a = np.zeros((m, n))
    for i in range(m):
        u = (i * (n - 1) / (m - 1) if m > 1 else 0.0) if ac else max((i + 0.5) * n / m - 0.5, 0.0)
        u = min(u, n - 1)
        for j in range(n):
            a[i, j] = max(0.0, 1.0 - abs(u - j))
    return a


def test_check_interpolation_matrix():
    check = grading.check_interpolation_matrix
    sweep_passes(check, _interpolation_matrix, trials=10)
    sweep_passes(check, _interpolation_matrix_loops)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda n, m, ac: _interpolation_matrix(n, m, not ac), "other align_corners rule")
    sweep_named(check, lambda n, m, ac: gp._interp_from_positions(
        _positions(m, n, True) if ac else np.arange(m) * n / m, n, m), "half-pixel offset")
    sweep_named(check, _no_clamp, "clamped to 0")
    sweep_named(check, lambda n, m, ac: gp._swapped_weights(_positions(m, n, ac), n, m), "weights are swapped")
    sweep_named(check, lambda n, m, ac: _interpolation_matrix(n, m, ac).T, "shape")
    sweep_named(check, lambda n, m, ac: np.eye(n)[np.minimum(np.arange(m) * n // m, n - 1)], "nearest-neighbour")

    def no_single_pixel_case(n, m, ac):  # divides by m - 1 even when the output has one pixel
        if ac and m == 1:
            raise ZeroDivisionError("division by zero")
        return _interpolation_matrix(n, m, ac)

    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check(no_single_pixel_case, seed=0, trials=10, quiet=True)

    def by_interpolate(n, m, ac):
        return F.interpolate(torch.eye(n, dtype=torch.float64)[None], size=m, mode="linear",
                             align_corners=ac)[0].T.numpy()

    forbidden_call(check, by_interpolate, "interpolate")
    forbidden_call(check, lambda n, m, ac: grading._interp_from_positions(up.source_positions(m, n, ac), n, m),
              "course_utils.upsampling.source_positions")
    replayed_answer_fails(check, _interpolation_matrix)


# ---------------------------------------------------------------- exercise 2: output padding
def _output_padding(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) % s


def test_output_padding_for_restores_the_size_through_torch():
    for n in range(9, 20):
        for k, s, p, d in [(3, 2, 1, 1), (4, 3, 1, 2), (5, 2, 2, 1)]:
            x, w = torch.randn(1, 1, n, n), torch.randn(1, 1, k, k)
            y = F.conv2d(x, w, stride=s, padding=p, dilation=d)
            back = F.conv_transpose2d(y, w, stride=s, padding=p, output_padding=_output_padding(n, k, s, p, d), dilation=d)
            assert back.shape[-1] == n


def test_check_output_padding_for():
    check = grading.check_output_padding_for
    sweep_passes(check, _output_padding, trials=16)
    sweep_passes(check, lambda n, k, s, p, d: n - up.conv_transpose_output_size((n + 2 * p - d * (k - 1) - 1) // s + 1,
                                                                          k, s, p, 0, d))  # via eq. (6)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda n, k, s, p, d: 0, "ignores the rows")
    sweep_named(check, lambda n, k, s, p, d: s - 1, "largest allowed")
    sweep_named(check, lambda n, k, s, p, d: (n + 2 * p - (k - 1) - 1) % s, "dilation")
    sweep_named(check, lambda n, k, s, p, d: (n - d * (k - 1) - 1) % s, "n + 2p")
    sweep_named(check, lambda n, k, s, p, d: -1, "expected")

    def measured(n, k, s, p, d):
        y = F.conv2d(torch.zeros(1, 1, n, n), torch.zeros(1, 1, k, k), stride=s, padding=p, dilation=d)
        return n - F.conv_transpose2d(y, torch.zeros(1, 1, k, k), stride=s, padding=p, dilation=d).shape[-1]

    forbidden_call(check, measured, "conv")
    replayed_answer_fails(check, _output_padding)


# ---------------------------------------------------------------- exercise 3: zero insertion
def _zero_insertion(x, w, stride, padding, output_padding):
    k = w.shape[-1]
    n, c, h, wd = x.shape
    z = x.new_zeros(n, c, (h - 1) * stride + 1, (wd - 1) * stride + 1)
    z[:, :, ::stride, ::stride] = x
    q = k - 1 - padding
    z = F.pad(z, (q, q + output_padding, q, q + output_padding))
    return F.conv2d(z, w.transpose(0, 1).flip(-1, -2))


def _zero_insertion_dilated(x, w, stride, padding, output_padding):  # right: conv2d's own padding, then crop
    k = w.shape[-1]
    n, c, h, wd = x.shape
    z = torch.zeros(n, c, (h - 1) * stride + 1 + output_padding, (wd - 1) * stride + 1 + output_padding, dtype=x.dtype)
    z[:, :, :(h - 1) * stride + 1:stride, :(wd - 1) * stride + 1:stride] = x
    full = F.conv2d(z, torch.flip(w, (2, 3)).permute(1, 0, 2, 3), padding=k - 1)
    return full[:, :, padding:full.shape[2] - padding, padding:full.shape[3] - padding]


def test_check_conv_transpose_by_zero_insertion():
    check = grading.check_conv_transpose_by_zero_insertion
    sweep_passes(check, _zero_insertion, trials=8)
    sweep_passes(check, _zero_insertion_dilated)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda x, w, s, p, op: tp._zi_conv(x, w, s, p, op, flip=False), "not flipped")
    sweep_named(check, lambda x, w, s, p, op: tp._zi_conv(x, w, s, p, op, swap=False), "channel axes are not swapped")
    sweep_named(check, lambda x, w, s, p, op: tp._zi_conv(x, w, s, p, op, use_op=False), "output_padding is ignored")
    sweep_named(check, lambda x, w, s, p, op: tp._zi_conv(x, w, s, p, op, pad=p), "k - 1 - p")
    sweep_named(check, tp._zeros_after, "BETWEEN input pixels")
    sweep_named(check, lambda x, w, s, p, op: _zero_insertion(x, w, s, p, op).float(), "dtype")
    forbidden_call(check, lambda x, w, s, p, op: F.conv_transpose2d(x, w, stride=s, padding=p, output_padding=op),
              "conv_transpose2d")
    forbidden_call(check, lambda x, w, s, p, op: up.conv_transpose2d_fold(x, w, s, p, op),
              "course_utils.upsampling.conv_transpose2d_fold")
    replayed_answer_fails(check, _zero_insertion)


# ---------------------------------------------------------------- exercise 4: pixel unshuffle
def _unshuffle(x, r):
    n, c, hr, wr = x.shape
    return x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 1, 3, 5, 2, 4).reshape(n, c * r * r, hr // r, wr // r)


def _unshuffle_slices(x, r):  # right, written with strided slices and a stack
    n, c, hr, wr = x.shape
    phases = torch.stack([x[:, :, i::r, j::r] for i in range(r) for j in range(r)], dim=2)  # (N, C, r*r, H, W)
    return phases.reshape(n, c * r * r, hr // r, wr // r)


def test_check_pixel_unshuffle():
    check = grading.check_pixel_unshuffle
    sweep_passes(check, _unshuffle, trials=8)
    sweep_passes(check, _unshuffle_slices)
    with pytest.raises(NotAttempted):
        check(stub)

    def channel_last(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 3, 5, 1, 2, 4).reshape(n, c * r * r, hr // r, wr // r)

    def ij_swapped(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, hr // r, r, wr // r, r).permute(0, 1, 5, 3, 2, 4).reshape(n, c * r * r, hr // r, wr // r)

    def blocks(x, r):
        n, c, hr, wr = x.shape
        return x.reshape(n, c, r, hr // r, r, wr // r).permute(0, 1, 2, 4, 3, 5).reshape(n, c * r * r, hr // r, wr // r)

    sweep_named(check, channel_last, "channel order")
    sweep_named(check, ij_swapped, "swapped")
    sweep_named(check, lambda x, r: x.reshape(x.shape[0], -1, x.shape[2] // r, x.shape[3] // r), "reshape alone")
    sweep_named(check, blocks, "instead of (H, r)")
    forbidden_call(check, lambda x, r: F.pixel_unshuffle(x, r), "pixel_unshuffle")
    forbidden_call(check, lambda x, r: F.unfold(x, r, stride=r).reshape(x.shape[0], -1, x.shape[2] // r, x.shape[3] // r),
              "unfold")
    forbidden_call(check, lambda x, r: torch.nn.PixelUnshuffle(r)(x), "pixel_unshuffle")
    replayed_answer_fails(check, _unshuffle)


# ---------------------------------------------------------------- exercise 5: overlap counts
def _counts(h, w, k, s, p):
    def one(n):
        full = np.zeros((n - 1) * s + k, dtype=np.int64)
        for i in range(n):
            full[i * s:i * s + k] += 1
        return full[p:full.size - p]
    return np.outer(one(h), one(w))


def _counts_closed_form(h, w, k, s, p):  # right, written as a count of taps per position
    def one(n):
        pos = np.arange((n - 1) * s + k - 2 * p) + p  # uncropped positions kept
        i_hi = np.minimum(pos // s, n - 1)
        i_lo = np.maximum(-(-(pos - k + 1) // s), 0)
        return np.maximum(i_hi - i_lo + 1, 0).astype(np.int64)
    return np.outer(one(h), one(w))


def test_check_overlap_counts():
    check = grading.check_overlap_counts
    sweep_passes(check, _counts, trials=10)
    sweep_passes(check, _counts_closed_form)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda h, w, k, s, p: _counts(h, w, k, s, 0), "did not crop")

    def crop_end(h, w, k, s, p):
        full = _counts(h, w, k, s, 0)
        return full[: full.shape[0] - 2 * p, : full.shape[1] - 2 * p]

    sweep_named(check, crop_end, "from the end only")
    sweep_named(check, lambda h, w, k, s, p: _counts(h, 1, k, s, p)[:, :1] + _counts(1, w, k, s, p)[:1, :], "PRODUCT")
    sweep_named(check, lambda h, w, k, s, p: _counts(h, w, k, s, p).astype(np.float64), "dtype")

    def by_conv(h, w, k, s, p):
        ones = F.conv_transpose2d(torch.ones(1, 1, h, w), torch.ones(1, 1, k, k), stride=s, padding=p)
        return ones[0, 0].round().long().numpy()

    forbidden_call(check, by_conv, "conv_transpose2d")
    replayed_answer_fails(check, _counts)


def test_overlap_counts_reference_equals_conv_transpose_of_ones():
    for k, s, p in [(3, 2, 0), (3, 2, 1), (4, 2, 1), (5, 3, 2), (1, 3, 0), (2, 3, 0)]:
        ones = torch.ones(1, 1, 5, 6, dtype=torch.float64)
        want = F.conv_transpose2d(ones, torch.ones(1, 1, k, k, dtype=torch.float64), stride=s, padding=p)[0, 0]
        np.testing.assert_array_equal(transposed._reference_overlap_counts(5, 6, k, s, p), want.numpy())


# ---------------------------------------------------------------- exercise 6: sub-pixel weights
def _subpixel(kern, r):
    crr, c_in, k, _ = kern.shape
    w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 4, 1, 5, 2)
    return w.reshape(c_in, crr // (r * r), k * r, k * r)


def _subpixel_loops(kern, r):  # right, written as loops over taps and sub-pixels
    crr, c_in, k, _ = kern.shape
    c = crr // (r * r)
    w = torch.zeros(c_in, c, k * r, k * r, dtype=kern.dtype)
    for a in range(k):
        for b in range(k):
            for i in range(r):
                for j in range(r):
                    w[:, :, (k - 1 - a) * r + i, (k - 1 - b) * r + j] = kern[i * r + j::r * r, :, a, b].T
    return w


def test_check_subpixel_weight():
    check = grading.check_subpixel_weight
    sweep_passes(check, _subpixel, trials=6)
    sweep_passes(check, _subpixel_loops)
    with pytest.raises(NotAttempted):
        check(stub)
    sweep_named(check, lambda k, r: _subpixel(k.flip(-1, -2), r), "not flipped")
    sweep_named(check, lambda k, r: _subpixel(k, r).transpose(0, 1), "channel axes are swapped")

    def ij_swapped(kern, r):
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 4, 2, 5, 1)
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    sweep_named(check, ij_swapped, "sub-pixel offsets are swapped")

    def block_layout(kern, r):
        crr, c_in, k, _ = kern.shape
        w = kern.reshape(crr // (r * r), r, r, c_in, k, k).flip(-1, -2).permute(3, 0, 1, 4, 2, 5)
        return w.reshape(c_in, crr // (r * r), k * r, k * r)

    sweep_named(check, block_layout, "a'*r + i")

    def by_impulses(kern, r):  # the lesson's measurement: forbidden here
        k, c_in = kern.shape[-1], kern.shape[1]
        stamps = torch.zeros(c_in, kern.shape[0] // (r * r), k * r, k * r, dtype=kern.dtype)
        for ci in range(c_in):
            delta = torch.zeros(1, c_in, 2 * k - 1, 2 * k - 1, dtype=kern.dtype)
            delta[0, ci, k - 1, k - 1] = 1.0
            resp = F.pixel_shuffle(F.conv2d(delta, kern, padding=(k - 1) // 2), r)[0]
            lo = (k - 1) // 2 * r
            stamps[ci] = resp[:, lo:lo + k * r, lo:lo + k * r]
        return stamps

    forbidden_call(check, by_impulses, "conv2d")
    replayed_answer_fails(check, _subpixel)


# ---------------------------------------------------------------- exercise 7: the antialiased resize matrix


def _antialias(n, m):
    s = max(n / m, 1.0)
    centre = (np.arange(m) + 0.5) * n / m
    a = np.clip(1.0 - np.abs(np.arange(n)[None, :] + 0.5 - centre[:, None]) / s, 0.0, None)
    return a / a.sum(1, keepdims=True)


def _antialias_loops(n, m):  # right, written as loops over the input pixels under each tent (pixel-centre coordinates)
    s = max(n / m, 1.0)
    a = np.zeros((m, n))
    for i in range(m):
        u = (i + 0.5) * n / m - 0.5                       # the tent's centre, in pixel-centre coordinates
        for j in range(max(int(np.floor(u - s)), 0), min(int(np.ceil(u + s)) + 1, n)):
            a[i, j] = max(0.0, 1.0 - abs(j - u) / s)
        a[i] /= a[i].sum()
    return a


def test_antialias_reference_equals_torch_along_one_axis():
    for n in range(1, 30):
        for m in range(1, 30):
            eye = torch.eye(n, dtype=torch.float64)[None, None]        # resize the rows of the identity
            want = F.interpolate(eye, size=(m, n), mode="bilinear", antialias=True, align_corners=False)[0, 0]
            np.testing.assert_allclose(filters._reference_antialias_matrix(n, m), want.numpy(), atol=1e-12)


def test_check_antialias_matrix(capsys, monkeypatch):
    check = grading.check_antialias_matrix
    right_answers_pass(check, _antialias, _antialias_loops, capsys, trials=8)
    # the check compares twice (the matrix, then A_h X A_w^T on images): its mistakes are those of the first
    captured = []
    original = filters.check_function

    def spy(fn, ref, make_inputs, **kw):
        captured.append(list(kw.get("mistakes", ())))
        kw.pop("by_hand", None)  # the mistakes are built from the references, which the watch refuses
        return original(fn, ref, make_inputs, **kw)

    monkeypatch.setattr(filters, "check_function", spy)
    check(_antialias, trials=1, quiet=True)
    assert len(captured[0]) == 5
    for mistake in captured[0]:
        fails(check, mistake.fn, mistake.hint)
    monkeypatch.undo()
    fails(check, lambda n, m: _antialias(n, m).T, "shape")
    fails(check, lambda n, m: _antialias(n, m).astype(np.float32), "float")
    rejects_recorded_answers(check, _antialias)


def test_antialias_upsampling_is_exercise_1s_matrix():
    for n, m in [(3, 7), (4, 4), (5, 13)]:
        np.testing.assert_allclose(_antialias(n, m), _interpolation_matrix(n, m, False), atol=1e-12)


def _antialias_by_torch(n, m):
    eye = torch.eye(n, dtype=torch.float64)[None, None]
    return F.interpolate(eye, size=(m, n), mode="bilinear", antialias=True, align_corners=False)[0, 0].numpy()


def _antialias_by_aa_op(n, m):
    eye = torch.eye(n, dtype=torch.float64)[None, None]
    return torch.ops.aten._upsample_bilinear2d_aa(eye, [m, n], False, None, None)[0, 0].numpy()


ANTIALIAS_SHORTCUTS = [
    (_antialias_by_torch, "torch.nn.functional.interpolate"),
    (_antialias_by_aa_op, "_upsample_bilinear2d_aa"),
    (lambda n, m: torch.nn.Upsample(size=(m, n), mode="bilinear")(torch.eye(n)[None, None])[0, 0].double().numpy(),
     "torch.nn.functional.interpolate"),
    (lambda n, m: up.upsample_bilinear(torch.eye(n, dtype=torch.float64)[None, None], (m, n), False)[0, 0].numpy(),
     "course_utils.upsampling.upsample_bilinear"),
    (lambda n, m: filters._reference_antialias_matrix(n, m), "_reference_antialias_matrix"),
    (lambda n, m: filters._triangle_matrix(n, m, max(n / m, 1.0)), "course_utils.grading.upsampling_filters._triangle_matrix"),
]


@pytest.mark.parametrize("fn,name", ANTIALIAS_SHORTCUTS, ids=[s[1].split(".")[-1] + str(i) for i, s in enumerate(ANTIALIAS_SHORTCUTS)])
def test_antialias_shortcuts_are_refused(fn, name):
    forbidden(grading.check_antialias_matrix, fn, name)


def test_antialias_pasted_helpers_are_the_learners_own():
    passes(grading.check_antialias_matrix, lambda n, m: fp._triangle_matrix(n, m, max(n / m, 1.0)), quiet=True)


# ---------------------------------------------------------------- exercise 8: nearest x2 fused with a 3x3 conv
def _fused(x, weight):
    n, _, h, w = x.shape

    def collapse(k, axis):
        t0, t1, t2 = k.unbind(axis)
        return [torch.stack([t0, t1 + t2], axis), torch.stack([t0 + t1, t2], axis)]

    xp = F.pad(x, (1, 1, 1, 1))
    out = x.new_empty(n, weight.shape[0], 2 * h, 2 * w)
    for i, rows in enumerate(collapse(weight, 2)):
        for j, kernel in enumerate(collapse(rows, 3)):
            out[..., i::2, j::2] = F.conv2d(xp[..., i:i + h + 1, j:j + w + 1], kernel)
    return out


def _fused_one_conv(x, weight):  # right, written differently: one conv2d with the 4 C_out kernels, then pixel_shuffle
    n, c_in, h, w = x.shape
    c_out = weight.shape[0]
    # 2x2 kernel of phase i along one axis as a 2x3 matrix applied to the 3 taps
    m = torch.tensor([[[1.0, 0, 0], [0, 1, 1]], [[1, 1, 0], [0, 0, 1]]], dtype=x.dtype)      # (phase, tap2, tap3)
    kernels = torch.einsum("iab,jcd,oqbd->oijqac", m, m, weight).reshape(c_out * 4, c_in, 2, 2)  # (C_out*4, C_in, 2, 2)
    y = F.conv2d(F.pad(x, (1, 1, 1, 1)), kernels).reshape(n, c_out, 2, 2, h + 1, w + 1)          # (N, C_out, i, j, H+1, W+1)
    phases = torch.stack([torch.stack([y[:, :, i, j, i:i + h, j:j + w] for j in (0, 1)], 2) for i in (0, 1)], 2)
    return F.pixel_shuffle(phases.reshape(n, c_out * 4, h, w), 2)


def _materialised(x, weight):
    return F.conv2d(x.repeat_interleave(2, -2).repeat_interleave(2, -1), weight, padding=1)


def _by_index(x, weight):
    h, w = x.shape[-2:]
    rows, cols = torch.arange(2 * h) // 2, torch.arange(2 * w) // 2
    return F.conv2d(x[..., rows[:, None], cols[None, :]], weight, padding=1)


def _channel_by_channel(x, weight):  # upsamples one input channel at a time: each piece bigger than the output allows
    out = 0
    for c in range(x.shape[1]):
        piece = x[:, c:c + 1].repeat_interleave(2, -2).repeat_interleave(2, -1)
        out = out + F.conv2d(piece, weight[:, c:c + 1], padding=1)
    return out


def _by_conv_transpose(x, weight):  # nearest x2 then conv is a stride-2 transposed conv with a 4x4 kernel: refused
    return F.conv_transpose2d(x, torch.zeros(x.shape[1], weight.shape[0], 4, 4, dtype=x.dtype), stride=2, padding=1)


def test_check_upsample_conv_fused(capsys, monkeypatch):
    check = grading.check_upsample_conv_fused
    right_answers_pass(check, _fused, _fused_one_conv, capsys, trials=4)
    each_mistake_is_named(filters, check, _fused, monkeypatch, trials=3)
    fails(check, lambda x, w: _fused(x, w)[..., :-1, :-1], "shape")
    fails(check, lambda x, w: _fused(x.float(), w.float()), "float")
    rejects_recorded_answers(check, _fused)


@pytest.mark.parametrize("fn", [_materialised, _by_index])
def test_building_the_upsampled_image_is_refused(fn):
    message = fails(grading.check_upsample_conv_fused, fn, "nearest-upsampled image")
    assert "a tensor of shape (" in message and "elements stored" in message


def test_upsampling_one_channel_at_a_time_is_refused():
    # each one-channel piece fits in the size limit (it is no larger than the output); the loop over channels does not
    message = fails(grading.check_upsample_conv_fused, _channel_by_channel, "Python loop over channels")
    assert "this exercise allows 8" in message


def _pieces_larger_than_the_output(x, weight):  # two halves of the channels: each half bigger than the output
    half = x.shape[1] // 2
    parts = [(x[:, :half], weight[:, :half]), (x[:, half:], weight[:, half:])]
    return sum(F.conv2d(p.repeat_interleave(2, -2).repeat_interleave(2, -1), w, padding=1) for p, w in parts)


def test_upsampling_in_large_pieces_is_refused():
    fails(grading.check_upsample_conv_fused, _pieces_larger_than_the_output, "nearest-upsampled image")


UPSAMPLE_CONV_SHORTCUTS = [
    (lambda x, w: F.conv2d(F.interpolate(x, scale_factor=2.0, mode="nearest"), w, padding=1),
     "torch.nn.functional.interpolate"),
    (lambda x, w: F.conv2d(torch.ops.aten.upsample_nearest2d(x, [2 * x.shape[2], 2 * x.shape[3]]), w, padding=1),
     "upsample_nearest2d"),
    (_by_conv_transpose, "conv_transpose2d"),
    (lambda x, w: F.conv2d(up.upsample_nearest(x, (2 * x.shape[2], 2 * x.shape[3])), w, padding=1),
     "course_utils.upsampling.upsample_nearest"),
    (lambda x, w: filters._reference_upsample_conv_fused(x, w), "_reference_upsample_conv_fused"),
    (lambda x, w: filters._fused(x, w), "course_utils.grading.upsampling_filters._fused"),
]


@pytest.mark.parametrize("fn,name", UPSAMPLE_CONV_SHORTCUTS,
                         ids=[s[1].split(".")[-1] + str(i) for i, s in enumerate(UPSAMPLE_CONV_SHORTCUTS)])
def test_upsample_conv_shortcuts_are_refused(fn, name):
    forbidden(grading.check_upsample_conv_fused, fn, name)


def test_upsample_conv_pasted_helpers_are_the_learners_own():
    passes(grading.check_upsample_conv_fused, lambda x, w: fp._fused(x, w), quiet=True)
