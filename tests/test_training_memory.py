"""Tests of course_utils.training_memory (lesson 08): the formulas against published numbers and
against measurement, and the saved-tensor hooks."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

import course_utils.training_memory as tm


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

    class Square(nn.Module):  # x * x saves x twice: one storage
        def forward(self, x):
            return x * x

    assert tm.saved_bytes(Square(), x) == 4 * 4 * 8


def test_llama_activation_formula_matches_saved_tensors():
    import torch

    import course_utils.training_memory_llama as tml

    for s, b, h, a, f, kv in ((64, 2, 128, 4, 344, None), (48, 3, 96, 6, 256, 2)):
        torch.manual_seed(0)
        block = tml.LlamaBlock(h, a, f, kv).to(torch.bfloat16)
        x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
        assert tm.saved_bytes(block, x) == tml.activation_bytes_llama(s, b, h, f, a, kv_heads=kv)
    # FP32 and the unfused math attention: the probabilities and W_o's input copy are stored
    from torch.nn.attention import SDPBackend, sdpa_kernel
    block = tml.LlamaBlock(128, 4, 344).float()
    x = torch.randn(2, 64, 128, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        got = tm.saved_bytes(block, x)
    assert got == tml.activation_bytes_llama(64, 2, 128, 344, 4, flash=False, act_bytes=4)


def test_fused_rms_norm_gradients():
    import torch

    import course_utils.training_memory_llama as tml

    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: tml._RMSNormFn.apply(x, w, 1e-6), (x, w))
    ref = torch.nn.RMSNorm(16, eps=1e-6).double()
    with torch.no_grad():
        ref.weight.copy_(w)
    torch.testing.assert_close(tml._RMSNormFn.apply(x, w, 1e-6), ref(x))


def test_activation_bytes_picks_the_llama_formula():
    from dataclasses import replace

    import course_utils.training_memory_llama as tml

    s, b, sh = 4096, 1, tm.LLAMA2_7B
    per_layer = tml.activation_bytes_llama(s, b, sh.hidden, sh.ffn, sh.heads)
    out = tm.output_layer_activation_bytes(s, b, sh.hidden, sh.vocab_size)
    assert tm.activation_bytes(sh, s, b) == sh.layers * per_layer + out
    assert tm.activation_bytes(sh, s, b, recompute="selective") == tm.activation_bytes(sh, s, b)
    assert tm.activation_bytes(sh, s, b, recompute="full") == sh.layers * 2 * s * b * sh.hidden + out
    gpt = replace(sh, gated_mlp=False)
    assert tm.activation_bytes(gpt, s, b) == sh.layers * tm.activation_bytes_per_layer(s, b, sh.hidden, sh.heads) + out
    assert tml.activation_bytes_llama(s, b, sh.hidden, sh.ffn, sh.heads, t=4, sequence_parallel=True) == per_layer / 4
