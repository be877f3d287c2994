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
