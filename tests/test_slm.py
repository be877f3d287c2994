"""course_utils.slm, slm_train, slm_quant: the decoder, its cache, its data and its quantized layers."""
from __future__ import annotations

import copy

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
