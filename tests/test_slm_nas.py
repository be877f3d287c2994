"""course_utils.slm_nas: variants initialized from the parent, block distillation, assembly, global distillation."""
from __future__ import annotations

import torch

from course_utils import slm
from course_utils import slm_nas as nas
from course_utils import slm_train as st


def tiny_parent():
    torch.manual_seed(0)
    config = slm.SLMConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=88, max_seq_len=64)
    model = slm.TinyDecoder(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_parent_variant_reproduces_the_parent_block():
    parent = tiny_parent()
    x = torch.randn(2, 10, 32)
    cos, sin = slm.rope_angles(torch.arange(10), parent.config.head_dim)
    block = nas.init_from_parent(parent.layers[0], parent.config, nas.variant_specs(parent.config)["parent"])
    torch.testing.assert_close(block(x, cos, sin), parent.layers[0](x, cos, sin))


def test_one_kv_head_init_is_the_mean_of_the_group():
    parent = tiny_parent()
    block = nas.init_from_parent(parent.layers[0], parent.config, (1, 88))
    k = parent.layers[0].self_attn.k_proj.weight.view(2, 8, 32)
    torch.testing.assert_close(block.self_attn.k_proj.weight, k.mean(0))


def test_block_distillation_lowers_the_error_and_assembly_works():
    parent = tiny_parent()
    tokens = torch.randint(0, 256, (5000,))
    io = nas.block_io(parent, tokens, n_batches=2, batch=4, seq_len=16, seed=0)
    assert len(io) == 3 and io[0].shape == (8, 16, 32)
    blocks, errors = nas.block_library(parent, io, io, steps=20)
    assert abs(errors[0, "parent"]) < 1e-6 and abs(errors[0, "identity"] - 1) < 1e-6
    x, y = io[1], io[2]
    cos, sin = slm.rope_angles(torch.arange(16), parent.config.head_dim)
    start = nas.init_from_parent(parent.layers[1], parent.config, (2, 22))
    with torch.no_grad():
        assert errors[1, "FFN 1/4"] <= nas.relative_error(start(x, cos, sin), x, y) + 1e-6
    child = nas.assemble(parent, blocks, ["parent", "parent"])
    with torch.no_grad():
        torch.testing.assert_close(child(tokens[None, :20]), parent(tokens[None, :20]))
    small = nas.assemble(parent, blocks, ["no attention", "identity"])
    assert slm.count_module_parameters(small) < slm.count_module_parameters(parent)
    tuned = nas.global_distill(small, parent, tokens, steps=5, batch=2, seq_len=16)
    assert st.eval_loss(tuned, tokens, batch=2, seq_len=16, n_batches=1) < 10


def test_decode_bytes_per_token_counts_weights_once_per_step_and_kv_per_sequence():
    config = tiny_parent().config
    c, d = config.dim, config.head_dim
    parent = nas.decode_bytes_per_token(config, (2, 88), batch=4, context=10)
    assert parent == 4 * ((2 * c * c + 2 * c * 2 * d + 3 * c * 88) / 4 + 2 * 2 * d * 10)
    one_kv = nas.decode_bytes_per_token(config, (1, 88), batch=4, context=10)
    assert parent - one_kv == 4 * (2 * c * d / 4 + 2 * d * 10)         # GQA: fewer weights and half the cache reads
    assert nas.decode_bytes_per_token(config, (0, 0)) == 0


def test_replace_one_block_kl_is_zero_for_the_parent_block_and_restores_the_parent():
    parent = tiny_parent()
    tokens = torch.randint(0, 256, (3000,))
    specs = nas.variant_specs(parent.config)
    blocks = {(i, n): nas.init_from_parent(parent.layers[i], parent.config, specs[n])
              for i in range(2) for n in ("parent", "identity")}
    before = [id(layer) for layer in parent.layers]
    scores = nas.replace_one_block_kl(parent, blocks, tokens, batch=2, seq_len=16, n_batches=1)
    assert [id(layer) for layer in parent.layers] == before
    assert abs(scores[0, "parent"]) < 1e-6 and abs(scores[1, "parent"]) < 1e-6
    assert scores[0, "identity"] > 0 and scores[1, "identity"] > 0
