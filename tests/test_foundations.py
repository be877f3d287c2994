"""Tests of course_utils.foundations: the helpers lessons import (the checks are in test_grading_foundations.py)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from course_utils import foundations as fd


# ---------------------------------------------------------------- helpers
def test_sliding_windows_numpy_is_a_readonly_view():
    x = np.arange(2 * 10, dtype=np.float32).reshape(2, 10)
    w = fd.sliding_windows(x, 4)
    assert w.shape == (2, 7, 4)
    assert np.shares_memory(w, x) and not w.flags.writeable
    np.testing.assert_array_equal(w, np.lib.stride_tricks.sliding_window_view(x, 4, axis=-1))
    strided = x[:, ::2]  # non-contiguous input
    np.testing.assert_array_equal(fd.sliding_windows(strided, 3), np.lib.stride_tricks.sliding_window_view(strided, 3, axis=-1))


def test_sliding_windows_torch_matches_unfold_and_shares_storage():
    x = torch.randn(3, 12)[:, 1:]  # storage offset 1, non-contiguous rows
    w = fd.sliding_windows(x, 5)
    assert w.shape == (3, 7, 5)
    assert w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(w, x.unfold(-1, 5, 1))


def test_sliding_windows_rejects_bad_width():
    with pytest.raises(ValueError):
        fd.sliding_windows(np.zeros(4), 5)
    with pytest.raises(ValueError):
        fd.sliding_windows(np.zeros(4), 0)


def test_numerical_gradient_numpy_and_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2))
    before = x.copy()
    grad = fd.numerical_gradient(lambda v: np.sum(np.sin(v) * v), x)
    np.testing.assert_allclose(grad, np.cos(before) * before + np.sin(before), rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(x, before)  # every entry restored

    w = torch.tensor(rng.standard_normal(4), requires_grad=True)
    loss = lambda: (w.tanh() ** 2).sum()  # noqa: E731 - reads w through the closure
    loss().backward()
    numeric = fd.numerical_gradient(lambda _: loss(), w)
    torch.testing.assert_close(numeric, w.grad, rtol=1e-6, atol=1e-8)
