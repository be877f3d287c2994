"""course_utils.slm, slm_train, slm_quant: the decoder, its cache, its data and its quantized layers."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from course_utils import slm
from course_utils import slm_quant as sq
from course_utils import slm_train as st


def small(**kw):
    return slm.SLMConfig(**{"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 88, "max_seq_len": 64, **kw})


def test_rmsnorm_matches_torch():
    x = torch.randn(3, 5, 32)
    ours, ref = slm.RMSNorm(32, 1e-5), torch.nn.RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), ref(x))


def test_rope_relative_position_property():
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    def rot(v, p):
        cos, sin = slm.rope_angles(torch.tensor([p]), d)
        return slm.rotate_pairs(v[None], cos.double(), sin.double())[0]
    dots = [rot(q, m) @ rot(k, m - 3) for m in (3, 10, 50)]
    torch.testing.assert_close(torch.stack(dots), dots[0].expand(3), rtol=1e-5, atol=1e-5)


def test_expand_kv_heads_matches_repeat_interleave():
    x = torch.randn(2, 3, 5, 4)
    torch.testing.assert_close(slm.expand_kv_heads(x, 2), x.repeat_interleave(2, dim=1))


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_kv_cache_gives_the_uncached_logits(kv):
    torch.manual_seed(0)
    model = slm.TinyDecoder(small(n_kv_heads=kv)).eval()
    x = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = model(x)
        cache = slm.KVCache(model.config, 2, 20)
        parts = [model(x[:, :7], cache), model(x[:, 7:8], cache), model(x[:, 8:], cache)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.nbytes() == sq.kv_cache_bytes(2, kv, 8, 20, 2)


def test_generate_with_and_without_cache_agree():
    torch.manual_seed(0)
    model = slm.TinyDecoder(small()).eval()
    prompt = torch.randint(0, 256, (2, 5))
    assert torch.equal(slm.generate(model, prompt, 10), slm.generate(model, prompt, 10, use_cache=False))


def test_variants_and_identity_layers():
    cfg = slm.with_layers(small(), [(0, 0), (1, 44)])
    model = slm.TinyDecoder(cfg).eval()
    x = torch.randint(0, 256, (1, 6))
    logits, hidden = model(x, return_hidden=True)
    torch.testing.assert_close(hidden[1], hidden[0])        # identity layer
    assert logits.shape == (1, 6, 256)
    assert slm.swiglu_width(64) == 176


def test_matches_transformers_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = small()
    ours = slm.TinyDecoder(cfg).eval()
    theirs = transformers.LlamaForCausalLM(slm.hf_config(cfg)).eval()
    theirs.load_state_dict(slm.hf_state_dict(ours), strict=True)
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits, rtol=1e-5, atol=1e-5)


def test_stdlib_corpus_and_batches():
    data = st.stdlib_text(max_bytes=50_000)
    assert len(data) == 50_000 and b"def " in data
    train, held = st.split_tokens(data)
    x, y = st.get_batch(train, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert st.decode_bytes(torch.tensor([104, 105])) == "hi"


def test_training_lowers_the_loss():
    train, _ = st.split_tokens(st.stdlib_text(max_bytes=100_000))
    _, losses = st.train_lm(small(), train, st.TrainConfig(steps=30, batch=4, seq_len=32, warmup=5))
    assert losses[-5:].mean() < losses[:5].mean() - 1.0


def test_int8_and_int4_roundtrip_errors():
    w = torch.randn(16, 64)
    q, s = sq.int8_per_channel(w)
    assert q.dtype == torch.int8 and (q.float() * s[:, None] - w).abs().max() <= s.max() / 2 + 1e-6
    q4, s4 = sq.int4_groupwise(w, 32)
    assert q4.abs().max() <= 7
    assert torch.equal(sq.unpack_int4(sq.pack_int4(q4)), q4)
    err = (sq.dequantize_int4(q4, s4, 32) - w).abs()
    assert err.max() <= s4.max() / 2 + 1e-6


def test_quantized_model_runs_and_shrinks():
    torch.manual_seed(0)
    model = slm.TinyDecoder(small(dim=64, ffn_dim=176)).eval()
    x = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        ref = model(x)
        before = sq.weight_bytes(model)
        q8 = sq.quantize_model(copy.deepcopy(model), 8)
        q4 = sq.quantize_model(copy.deepcopy(model), 4)
        assert sq.weight_bytes(q8) < before and sq.weight_bytes(q4) < sq.weight_bytes(q8)
        assert (q8(x) - ref).abs().max() < 0.05 * ref.abs().max()
        assert (q4(x) - ref).abs().max() < 0.3 * ref.abs().max()
        dyn = sq.torch_dynamic_int8(copy.deepcopy(model))
        assert (dyn(x) - ref).abs().max() < 0.1 * ref.abs().max()


def test_ngram_baselines_on_a_periodic_text():
    tokens = torch.tensor(list(b"abc" * 400))
    train, held = tokens[:900], tokens[900:]
    bigram = st.ngram_loss(train, held, 2, alpha=1e-6, batch=2, seq_len=16, n_batches=2)
    unigram = st.ngram_loss(train, held, 1, alpha=1e-6, batch=2, seq_len=16, n_batches=2)
    assert bigram < 1e-3                                       # the previous byte determines the next one
    assert abs(unigram - math.log(3)) < 1e-3                   # three equally frequent bytes
    with pytest.raises(ValueError, match="order must be 1"):
        st.ngram_loss(train, held, 3)


def test_window_losses_and_paired_difference():
    torch.manual_seed(0)
    model = slm.TinyDecoder(small()).eval()
    tokens = torch.randint(0, 256, (3000,))
    kw = dict(batch=4, seq_len=16, n_batches=2)
    per_window = st.window_losses(model, tokens, **kw)
    assert per_window.shape == (8,)
    assert abs(per_window.mean().item() - st.eval_loss(model, tokens, **kw)) < 1e-5
    assert st.paired_difference(model, model, tokens, **kw) == (0.0, 0.0)
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(3.0)
    mean, se = st.paired_difference(other, model, tokens, **kw)
    assert mean != 0.0 and se > 0.0


def test_load_checkpoint_errors_and_quality(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_slm_checkpoint.py"):
        st.load_checkpoint(tmp_path / "missing.pt")
    model, record = st.load_checkpoint()
    assert model.config == slm.SLMConfig() and not model.training
    train, held = st.split_tokens(st.stdlib_text())
    loss = st.eval_loss(model, held)
    assert loss < st.ngram_loss(train, held, 2) - 0.4          # the committed model clearly beats a bigram table
    assert abs(loss - record["held_out_loss"]) < 0.05           # and the file's record says what it measures


@pytest.mark.parametrize("bits,group", [(8, None), (4, None), (4, 32), (3, 32), (2, None)])
def test_fake_quantize_is_what_quantlinear_computes_with(bits, group):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=False)
    layer = sq.QuantLinear(linear, bits, group)
    torch.testing.assert_close(layer.dequantized(), sq.fake_quantize(linear.weight.detach(), bits, group))


def test_awq_scaling_is_exact_before_rounding_and_never_worse_on_calibration():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(256, 64) * torch.linspace(0.1, 8.0, 64)             # uneven input channels, like real activations
    s = torch.rand(64) + 0.5
    layer = sq.QuantLinear(linear, 4, None, input_scale=s)
    with torch.no_grad():
        want = (x / s) @ sq.fake_quantize(linear.weight * s, 4, None).T
        torch.testing.assert_close(layer(x), want)
        model = torch.nn.Sequential(linear)
        scales = sq.awq_input_scales(model, {"0": x}, bits=3, group=None)
        plain = (x @ sq.fake_quantize(linear.weight, 3, None).T - x @ linear.weight.T).pow(2).mean()
        aware = ((x / scales["0"]) @ sq.fake_quantize(linear.weight * scales["0"], 3, None).T - x @ linear.weight.T).pow(2).mean()
    assert aware <= plain
    with pytest.raises(ValueError, match="2, 3 or 4 bits"):
        sq.int4_groupwise(linear.weight, 32, bits=5)


def test_linear_inputs_sees_every_linear_but_the_head():
    torch.manual_seed(0)
    model = slm.TinyDecoder(small()).eval()
    seen = sq.linear_inputs(model, [torch.randint(0, 256, (2, 8))])
    assert len(seen) == 2 * 7 and "lm_head" not in seen
    assert seen["layers.0.mlp.down_proj"].shape == (16, 88)
