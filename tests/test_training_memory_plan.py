"""Tests of course_utils.training_memory_plan (lesson 08): ZeRO per-GPU bytes, the calculator and
the two-process ZeRO-1 demo (course_utils.zero1_demo)."""
from __future__ import annotations

from dataclasses import replace

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import course_utils.training_memory as tm  # noqa: E402
import course_utils.training_memory_plan as plan  # noqa: E402


# ---------------------------------------------------------------- ZeRO and the calculator
def test_zero_paper_figure_1():
    got = [sum(plan.zero_bytes_per_gpu(7.5e9, "mixed_adam", 64, k).values()) / tm.GB for k in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError):
        plan.zero_bytes_per_gpu(1e9, "mixed_adam", 8, 4)


def test_plan_memory_and_fewest_gpus():
    base = plan.TrainingSetup()
    parts = plan.plan_memory(base)
    assert parts["weights"] + parts["gradients"] + parts["optimizer"] == 16 * tm.count_parameters(tm.LLAMA2_7B)
    assert parts["activations"] == tm.activation_bytes(tm.LLAMA2_7B, 4096, 1)
    assert plan.fewest_gpus(base, 80 * tm.GB) is None  # plain data parallelism never shrinks the states
    cfg = replace(base, zero_stage=3, recompute="selective")
    n = plan.fewest_gpus(cfg, 80 * tm.GB)
    assert n == 2
    assert sum(plan.plan_memory(replace(cfg, dp=n)).values()) <= 80 * tm.GB < sum(plan.plan_memory(replace(cfg, dp=n - 1)).values())
    tp = replace(cfg, tp=4)
    assert plan.fewest_gpus(tp, 80 * tm.GB) % 4 == 0
    assert "smallest fit on 80 GB GPUs" in plan.describe_plan(cfg, 80)


def test_memory_calculator_plain_fallback_and_widget(capsys):
    import matplotlib.pyplot as plt

    assert plan.memory_calculator(interactive=False) is None
    assert "per GPU (GB)" in capsys.readouterr().out
    widget = plan.memory_calculator(replace(plan.TrainingSetup(), zero_stage=3), interactive=True)
    import ipywidgets

    assert isinstance(widget, ipywidgets.interactive)
    plt.close("all")


@pytest.mark.parametrize("numel,world", [(10, 2), (11, 2), (6337, 2), (7, 4), (3, 4)])
def test_shard_bounds_partition_the_vector(numel, world):
    covered = []
    for rank in range(world):
        lo, hi, per = plan.shard_bounds(numel, world, rank)
        assert 0 <= hi - lo <= per and per * world >= numel
        covered.extend(range(lo, hi))
    assert covered == list(range(numel))


def test_zero1_matches_unsharded_adam_in_one_process(tmp_path):
    import torch.distributed as dist

    from course_utils import zero1_demo as z

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        params, opt_bytes, losses, (lo, hi) = z.zero1_train(0, 3, 0, 1)
    finally:
        dist.destroy_process_group()
    ref, ref_bytes = z.reference_train(0, 3, 1)
    assert torch.equal(params, ref) and opt_bytes == ref_bytes == 8 * params.numel() + 4
    assert (lo, hi) == (0, params.numel()) and len(losses) == 3


# The two-process torchrun run of ZeRO-1 (course_utils.zero1_demo) is lesson 08's own cell: it asserts that the run
# equals the unsharded one bit for bit and each rank's Adam bytes, and nbval compares its printout. Running it here too
# took 9 s of the suite for nothing the lesson does not check.
