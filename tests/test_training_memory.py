"""Tests of course_utils.training_memory (lesson 08): the formulas against published numbers and
against measurement, the calculator, the ZeRO-1 demo, and every exercise check.

For each check: it passes the reference, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import replace

import matplotlib
import pytest
import torch
from torch import nn

matplotlib.use("Agg")

import course_utils.training_memory as tm  # noqa: E402
from course_utils.checks import NotAttempted  # noqa: E402
from conftest import stub, fails_with  # noqa: E402


# ---------------------------------------------------------------- parameter counts
def test_llama2_7b_count_formula_equals_meta_model():
    assert tm.count_parameters(tm.LLAMA2_7B) == 6_738_415_616  # published "6.74B"
    model = tm.build_model(tm.LLAMA2_7B, device="meta")
    assert sum(p.numel() for p in model.parameters()) == 6_738_415_616
    assert sum(tm.parameter_breakdown(tm.LLAMA2_7B).values()) == 6_738_415_616


@pytest.mark.parametrize("kw", [dict(), dict(kv_heads=2), dict(tied_embeddings=True), dict(qkv_bias=True, kv_heads=1),
                                dict(gated_mlp=False, tied_embeddings=True)])
def test_formula_matches_a_real_model_for_variants(kw):
    shape = replace(tm.TINY, **kw)
    model = tm.build_model(shape)
    assert sum(p.numel() for p in model.parameters()) == tm.count_parameters(shape)
    logits = model(torch.randint(0, shape.vocab_size, (2, 5)))
    assert logits.shape == (2, 5, shape.vocab_size)


def test_llama2_70b_gqa_count():
    assert tm.count_parameters(tm.LLAMA2_70B) == 68_976_648_192


# ---------------------------------------------------------------- recipes
def test_recipe_bytes_per_param_and_the_articles_112_gb():
    assert {k: r.total for k, r in tm.RECIPES.items()} == {
        "fp32_adam": 16, "mixed_adam": 16, "mixed_adam_fp32_accum": 20, "fp32_sgd_momentum": 12}
    parts = tm.model_state_bytes(7e9, "mixed_adam")
    assert parts["weights"] == 14 * tm.GB and parts["gradients"] == 14 * tm.GB
    assert parts["FP32 master copy"] + parts["optimizer moments"] == 84 * tm.GB
    assert sum(parts.values()) == 112 * tm.GB
    assert tm.RECIPES["mixed_adam"].K == 12


@pytest.mark.parametrize("recipe", list(tm.RECIPES))
def test_measured_state_matches_formula(recipe):
    measured = tm.measure_recipe_state(recipe)
    formula = tm.model_state_bytes(tm.count_parameters(tm.TINY), recipe)
    n_tensors = len(list(tm.build_model(tm.TINY, device="meta").parameters()))
    for part, nbytes in formula.items():
        step_counters = 4 * n_tensors if (part == "optimizer moments" and "adam" in recipe) else 0
        assert measured[part] == nbytes + step_counters, (recipe, part)


# ---------------------------------------------------------------- activations
def test_activation_formula_variants():
    s, b, h, a = 2048, 2, 1024, 16
    sbh = s * b * h
    assert tm.activation_bytes_per_layer(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert tm.activation_bytes_per_layer(s, b, h, a, recompute="selective") == 34 * sbh
    assert tm.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * sbh
    assert tm.activation_bytes_per_layer(s, b, h, a, t=4) == sbh * (10 + 24 / 4 + 5 * a * s / (h * 4))
    assert tm.activation_bytes_per_layer(s, b, h, a, t=4, sequence_parallel=True) == sbh * (34 + 5 * a * s / h) / 4
    assert tm.activation_bytes_per_layer(s, b, h, a, t=1, sequence_parallel=True) == tm.activation_bytes_per_layer(s, b, h, a)
    with pytest.raises(ValueError):
        tm.activation_bytes_per_layer(s, b, h, a, recompute="some")


def test_saved_tensor_hooks_count_unique_storages_without_parameters():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU())
    x = torch.randn(4, 8, requires_grad=True)
    # Linear saves x (4*8 floats), GELU saves its input (4*16 floats); weights are excluded
    assert tm.saved_bytes(mlp, x) == 4 * (4 * 8 + 4 * 16)
    assert tm.saved_bytes_beyond_input(mlp, x) == 4 * 4 * 16

    class Square(nn.Module):  # x * x saves x twice: one storage
        def forward(self, x):
            return x * x

    assert tm.saved_bytes(Square(), x) == 4 * 4 * 8


# ---------------------------------------------------------------- ZeRO and the calculator
def test_zero_paper_figure_1():
    got = [sum(tm.zero_bytes_per_gpu(7.5e9, "mixed_adam", 64, k).values()) / tm.GB for k in range(4)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError):
        tm.zero_bytes_per_gpu(1e9, "mixed_adam", 8, 4)


def test_plan_memory_and_min_gpus():
    base = tm.TrainingSetup()
    plan = tm.plan_memory(base)
    assert plan["weights"] + plan["gradients"] + plan["optimizer"] == 16 * tm.count_parameters(tm.LLAMA2_7B)
    assert plan["activations"] == tm.activation_bytes(tm.LLAMA2_7B, 4096, 1)
    assert tm.min_gpus(base, 80 * tm.GB) is None  # plain data parallelism never shrinks the states
    cfg = replace(base, zero_stage=3, recompute="selective")
    n = tm.min_gpus(cfg, 80 * tm.GB)
    assert n == 2
    assert sum(tm.plan_memory(replace(cfg, dp=n)).values()) <= 80 * tm.GB < sum(tm.plan_memory(replace(cfg, dp=n - 1)).values())
    tp = replace(cfg, tp=4)
    assert tm.min_gpus(tp, 80 * tm.GB) % 4 == 0
    assert "smallest fit on 80 GB GPUs" in tm.describe_plan(cfg, 80)


def test_memory_calculator_plain_fallback_and_widget(capsys):
    import matplotlib.pyplot as plt

    assert tm.memory_calculator(interactive=False) is None
    assert "per GPU (GB)" in capsys.readouterr().out
    widget = tm.memory_calculator(replace(tm.TrainingSetup(), zero_stage=3), interactive=True)
    import ipywidgets

    assert isinstance(widget, ipywidgets.interactive)
    plt.close("all")


@pytest.mark.parametrize("numel,world", [(10, 2), (11, 2), (6337, 2), (7, 4), (3, 4)])
def test_shard_bounds_partition_the_vector(numel, world):
    covered = []
    for rank in range(world):
        lo, hi, per = tm.shard_bounds(numel, world, rank)
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


@pytest.mark.slow
def test_zero1_with_torchrun_two_processes(tmp_path):
    out = tmp_path / "zero1.json"
    proc = subprocess.run(tm.zero1_command(out, steps=3), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world"] == 2 and result["allclose"] and result["max_abs_diff"] == 0.0
    per_rank = sorted(result["ranks"], key=lambda r: r["rank"])
    assert [r["optimizer_bytes"] for r in per_rank] == [8 * (r["shard"][1] - r["shard"][0]) + 4 for r in per_rank]
    assert sum(r["optimizer_bytes"] for r in per_rank) == result["reference_optimizer_bytes"] + 4


# ---------------------------------------------------------------- exercise checks
CHECKS = {
    "gqa": (tm.check_gqa_parameter_count, tm._ref_gqa),
    "adam": (tm.check_adam_state_gib, tm._ref_adam_gib),
    "act": (tm.check_activation_bytes_tp, tm._ref_act_tp),
    "zero2": (tm.check_zero2_bytes, tm._ref_zero2),
    "min_gpus": (tm.check_min_gpus, tm._ref_min_gpus),
    "saved": (tm.check_saved_bytes, tm.saved_bytes_beyond_input),
}


@pytest.mark.parametrize("key", list(CHECKS))
def test_check_passes_reference_and_flags_stub(key, capsys):
    check, reference = CHECKS[key]
    check(reference)
    assert capsys.readouterr().out.startswith("✅")
    with pytest.raises(NotAttempted):
        check(stub)


def test_check_gqa_names_tied_twice_and_ignored_gqa():
    def tied_twice(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        kv = kv_heads * hidden // heads
        per_layer = 2 * hidden**2 + 2 * hidden * kv + (hidden + 2 * kv if qkv_bias else 0) + 3 * hidden * ffn + 2 * hidden
        return 2 * vocab * hidden + layers * per_layer + hidden  # head counted even when tied

    def no_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return tm._ref_gqa(vocab, hidden, layers, heads, heads, ffn, tied, qkv_bias)

    fails_with(tm.check_gqa_parameter_count, tied_twice, "count V·h once")
    fails_with(tm.check_gqa_parameter_count, no_gqa, "use kv_heads, not heads")


def test_check_adam_names_master_copy_and_units():
    fails_with(tm.check_adam_state_gib, lambda n, w, g: n * (w + g + 8) / 2**30, "FP32 master copy")
    fails_with(tm.check_adam_state_gib, lambda n, w, g: n * (w + g + (4 if w < 4 else 0) + 8) / 1e9, "GiB (2**30 bytes)")


def test_check_activation_names_the_heads_factor():
    def no_heads(s, b, h, a, t, selective):
        return 10 * s * b * h + 24 * s * b * h / t + (0 if selective else 5 * s * s * b / t)

    fails_with(tm.check_activation_bytes_tp, no_heads, "number of heads a")
    fails_with(tm.check_activation_bytes_tp, lambda s, b, h, a, t, sel: s * b * h * (34 + (0 if sel else 5 * a * s / h)) / t,
               "replicated on every rank")


def test_check_zero2_names_stage_mixups():
    fails_with(tm.check_zero2_bytes, lambda n, nd, acc: (4 + (4 if acc else 0)) * n + 12 * n / nd, "shards the gradients")
    fails_with(tm.check_zero2_bytes, lambda n, nd, acc: (16 + (4 if acc else 0)) * n / nd, "only stage 3")


def test_check_min_gpus_names_gib_and_activations():
    fails_with(tm.check_min_gpus, lambda n, act, gpu: math.ceil(16 * n / (gpu * 2**30 - act * 1e9)), "do not use 2**30")
    fails_with(tm.check_min_gpus, lambda n, act, gpu: math.ceil(16 * n / (gpu * 1e9)), "subtract activation_gb")
    fails_with(tm.check_min_gpus, lambda n, act, gpu: math.ceil(12 * n / ((gpu - act) * 1e9)), "FP32 master")


def test_check_saved_bytes_names_params_input_and_dedup():
    fails_with(tm.check_saved_bytes, tm.saved_bytes, "input x exists anyway")

    def no_dedup(module, x):
        skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), x]}
        total = 0

        def pack(t):
            nonlocal total
            if t.untyped_storage().data_ptr() not in skip:
                total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(x)
        return total

    fails_with(tm.check_saved_bytes, no_dedup, "count unique storages")


def test_every_listed_mistake_is_named(monkeypatch):
    """Each check's own Mistake list: submitting the mistake gets that mistake's hint, not another's."""
    captured = {}
    original = tm.check_function

    def spy(fn, ref, make_inputs, **kw):
        captured["mistakes"] = list(kw.get("mistakes", ()))
        return original(fn, ref, make_inputs, **kw)

    monkeypatch.setattr(tm, "check_function", spy)
    for key, (check, reference) in CHECKS.items():
        check(reference, trials=1)
        for mistake in captured["mistakes"]:
            fails_with(check, mistake.fn, mistake.hint)
