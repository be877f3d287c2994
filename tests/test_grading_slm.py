"""Problem set 07's checks: right answers pass, each named mistake fails with its hint, shortcuts are refused."""
from __future__ import annotations

import math

import pytest
import torch

from course_utils import slm
from course_utils import slm_quant as sq
from course_utils.checks import CheckFailed, ForbiddenCall, NotAttempted
from course_utils.grading import slm as g


def fails_with(check, fn, text):
    with pytest.raises(CheckFailed) as info:
        check(fn, seed=7)
    assert text in str(info.value), str(info.value)


def stub(*args):
    raise NotImplementedError


# ---------------------------------------------------------------- exercise 1
def rms_written_differently(x, w, eps):
    return w * x / (x.pow(2).sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt()


def test_rms_norm():
    g.check_rms_norm(g._reference_rms_norm, seed=1)
    g.check_rms_norm(rms_written_differently)
    for hint, wrong in [("eps is missing", lambda x, w, e: x / x.pow(2).mean(-1, keepdim=True).sqrt() * w),
                        ("LayerNorm", lambda x, w, e: torch.nn.functional.layer_norm(x, x.shape[-1:], w, None, e)),
                        ("gain per channel", lambda x, w, e: x / (x.pow(2).mean(-1, keepdim=True) + e).sqrt())]:
        fails_with(g.check_rms_norm, wrong, hint)
    fails_with(g.check_rms_norm, lambda x, w, e: torch.nn.functional.rms_norm(x, x.shape[-1:], w, e), "replace by hand")
    fails_with(g.check_rms_norm, lambda x, w, e: torch.zeros_like(x), "differ")
    with pytest.raises(NotAttempted):
        g.check_rms_norm(stub)


# ---------------------------------------------------------------- exercise 2
def rope_via_complex(x, positions, base):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones((), dtype=torch.float64), positions.double()[:, None] * theta)
    return torch.cat([z.real, z.imag], dim=-1)


def test_apply_rope():
    g.check_apply_rope(g._reference_apply_rope, seed=1)
    g.check_apply_rope(rope_via_complex)
    fails_with(g.check_apply_rope, g._rope_adjacent, "adjacent pairs")
    fails_with(g.check_apply_rope, lambda x, p, b: g._reference_apply_rope(x, torch.arange(x.shape[-2]), b), "positions 0..T-1")
    fails_with(g.check_apply_rope, lambda x, p, b: g._reference_apply_rope(x, -p, b), "other way")

    def library(x, p, b):
        cos, sin = slm.rope_angles(p, x.shape[-1], b)
        return slm.rotate_pairs(x, cos.double(), sin.double())
    with pytest.raises(ForbiddenCall):
        g.check_apply_rope(library)
    fails_with(g.check_apply_rope, lambda x, p, b: x.clone(), "differ")


# ---------------------------------------------------------------- exercise 3
def gqa_by_loop(q, k, v):
    rep = q.shape[1] // k.shape[1]
    outs = []
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h // rep].transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
        outs.append(s.softmax(-1) @ v[:, h // rep])
    return torch.stack(outs, 1)


def test_gqa_attention():
    g.check_gqa_attention(g._reference_gqa_attention, seed=1)
    g.check_gqa_attention(gqa_by_loop)
    fails_with(g.check_gqa_attention, g._gqa_tiled, "repeat_interleave")
    fails_with(g.check_gqa_attention, lambda q, k, v: g._attend(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                                                                 v.repeat_interleave(q.shape[1] // k.shape[1], 1), 1.0), "1/sqrt(D)")
    fails_with(g.check_gqa_attention, lambda q, k, v: g._attend(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                                                                 v.repeat_interleave(q.shape[1] // k.shape[1], 1),
                                                                 q.shape[-1] ** -0.5, causal=False), "mask the future")
    with pytest.raises(ForbiddenCall):
        g.check_gqa_attention(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    fails_with(g.check_gqa_attention, lambda q, k, v: torch.zeros_like(q), "differ")


# ---------------------------------------------------------------- exercise 4
def decode_with_cat(q, k_new, v_new, k_cache, v_cache, length):
    keys = torch.cat([k_cache[:, :, :length], k_new], 2)
    values = torch.cat([v_cache[:, :, :length], v_new], 2)
    out = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ values
    k2, v2 = k_cache.clone(), v_cache.clone()
    k2[:, :, : length + 1], v2[:, :, : length + 1] = keys, values
    return out, k2, v2


def test_decode_step():
    g.check_decode_step(g._reference_decode_step, seed=1)
    g.check_decode_step(decode_with_cat)
    fails_with(g.check_decode_step, g._decode_wrong_slot(lambda n: n - 1), "slot `length`")
    fails_with(g.check_decode_step, g._decode_wrong_slot(lambda n: 0), "at the start of the cache")
    fails_with(g.check_decode_step, g._decode_variant(lambda n, m: m, lambda d: d ** -0.5), "whole preallocated cache")
    fails_with(g.check_decode_step, g._decode_variant(lambda n, m: n, lambda d: d ** -0.5), "attend to itself")
    fails_with(g.check_decode_step, g._decode_variant(lambda n, m: n + 1, lambda d: 1.0), "1/sqrt(D)")

    def in_place(q, k_new, v_new, k_cache, v_cache, length):
        k_cache[:, :, length:length + 1] = k_new
        return g._reference_decode_step(q, k_new, v_new, k_cache, v_cache, length)
    fails_with(g.check_decode_step, in_place, "in place")


# ---------------------------------------------------------------- exercise 5
def test_quantize_int8():
    g.check_quantize_int8(g._reference_quantize_int8, seed=1)
    g.check_quantize_int8(lambda w: ((w * (127 / w.abs().amax(1, keepdim=True))).round().to(torch.int8), w.abs().amax(1) / 127))
    fails_with(g.check_quantize_int8, lambda w: (torch.round(w / (w.abs().max() / 127)).to(torch.int8),
                                                 (w.abs().max() / 127).expand(w.shape[0]).clone()), "per-tensor")
    fails_with(g.check_quantize_int8, lambda w: (torch.trunc(w / (w.abs().amax(1, keepdim=True) / 127)).to(torch.int8),
                                                 w.abs().amax(1) / 127), "round to the nearest")
    fails_with(g.check_quantize_int8, lambda w: (torch.round(w / (w.abs().amax(1, keepdim=True) / 128)).to(torch.int8),
                                                 w.abs().amax(1) / 128), "127 levels")
    with pytest.raises(ForbiddenCall):
        g.check_quantize_int8(sq.int8_per_channel)
    fails_with(g.check_quantize_int8, lambda w: g._reference_quantize_int8(w)[0].float(), "")  # wrong dtype / structure


# ---------------------------------------------------------------- exercise 6
def test_choose_variants_reference_is_optimal():
    import numpy as np
    for s in range(20):
        costs, losses, budget = g._choice_inputs(np.random.default_rng(s))
        best, choice = g._reference_choose_variants(costs, losses, budget)
        assert abs(best - g._brute_force(costs, losses, budget)) < 1e-9
        assert sum(c[j] for c, j in zip(costs, choice)) <= budget


def test_choose_variants():
    g.check_choose_variants(lambda c, l_, b: g._reference_choose_variants(c, l_, b)[1], seed=1)

    def brute(costs, losses, budget):
        import itertools
        ok = [ch for ch in itertools.product(*[range(len(c)) for c in costs]) if sum(c[j] for c, j in zip(costs, ch)) <= budget]
        return list(min(ok, key=lambda ch: sum(l_[j] for l_, j in zip(losses, ch))))
    g.check_choose_variants(brute)
    fails_with(g.check_choose_variants, g._greedy, "greedy")
    fails_with(g.check_choose_variants, lambda c, l_, b: [0] * len(c), "over the budget")
    fails_with(g.check_choose_variants, lambda c, l_, b: [len(x) - 1 for x in c], "above the best possible")
    fails_with(g.check_choose_variants, lambda c, l_, b: [0, 0], "one valid variant index")
    with pytest.raises(NotAttempted):
        g.check_choose_variants(stub)
