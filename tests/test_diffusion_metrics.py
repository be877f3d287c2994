"""Tests of course_utils.diffusion_metrics: MMD and sliced Wasserstein separate same from different."""
from __future__ import annotations

import pytest
import torch

from course_utils import diffusion_metrics as metrics
from course_utils.diffusion_training import make_data


def test_metrics_separate_same_from_different():
    a, b = make_data(500, seed=1), make_data(500, seed=2)
    shifted = b + torch.tensor([0.5, 0.0])
    assert abs(metrics.mmd_rbf(a, b)) < 0.02 < metrics.mmd_rbf(a, shifted)
    assert metrics.sliced_wasserstein(a, b) < 0.1 < metrics.sliced_wasserstein(a, shifted)
    assert metrics.sliced_wasserstein(a, a) == 0.0
    with pytest.raises(ValueError):
        metrics.sliced_wasserstein(a, b[:10])


def test_distances_to_equals_both_metrics_bit_for_bit():
    reference = make_data(300, seed=1)
    distances = metrics.distances_to(reference)
    for x in (make_data(300, seed=3), make_data(300, seed=4) * 1.3 + 0.2, make_data(300, seed=5) * 40):  # last: kernels underflow
        assert distances(x) == (metrics.mmd_rbf(x, reference), metrics.sliced_wasserstein(x, reference))
    assert metrics.distances_to(reference, (0.3,), 17, 2)(x) == (metrics.mmd_rbf(x, reference, (0.3,)),
                                                               metrics.sliced_wasserstein(x, reference, 17, 2))
    with pytest.raises(ValueError, match="reference's shape"):
        distances(reference[:10])


def test_mmd_matches_the_kernel_sum_written_out():
    a, b = make_data(200, seed=1).double(), make_data(150, seed=2).double() * 1.2
    def k(x, y):
        d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
        return sum(torch.exp(-d2 / (2 * s**2)) for s in (0.05, 0.1, 0.2, 0.5, 1.0))
    kaa, kbb = k(a, a), k(b, b)
    want = (kaa.sum() - kaa.trace()) / (200 * 199) + (kbb.sum() - kbb.trace()) / (150 * 149) - 2 * k(a, b).mean()
    torch.testing.assert_close(torch.tensor(metrics.mmd_rbf(a, b), dtype=torch.float64), want, rtol=1e-12, atol=1e-15)
