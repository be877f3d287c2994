"""Tests of course_utils.diffusion_training: the toy data, a short training run, and the sampler on it."""
from __future__ import annotations

import pytest
import torch

from course_utils import diffusion as dm
from course_utils import diffusion_training as dtr


def test_swiss_roll_data_and_unknown_kind():
    x = dtr.make_data(300, kind="swiss_roll")
    assert x.shape == (300, 2) and x.dtype == torch.float32 and 0.3 < float(x.std()) < 2
    with pytest.raises(ValueError):
        dtr.make_data(10, kind="circles")


def test_short_training_lowers_the_loss_and_sampler_runs():
    data = dtr.make_data(2000)
    config = dtr.DenoiserConfig(T=100, hidden=32, depth=2, steps=300, batch_size=128, lr=3e-3)
    threads = torch.get_num_threads()
    model, sched, losses = dtr.train_denoiser(data, config, show_progress=False)
    assert torch.get_num_threads() == threads  # single_thread() restores the setting
    assert losses[-50:].mean() < 0.8 * losses[:50].mean()
    x, kept = dm.sample(model, sched, 200, 10, method="ddim", keep=(0, 5, 10))
    assert x.shape == (200, 2) and sorted(kept) == [0, 5, 10]
    torch.testing.assert_close(kept[10], x)
    again = dm.sample(model, sched, 200, 10, method="ddim")
    torch.testing.assert_close(again, x)  # seeded: the same samples
    with pytest.raises(ValueError):
        dm.sample(model, sched, 10, 5, method="euler")
