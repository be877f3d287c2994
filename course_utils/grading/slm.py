"""Checks for problem set 07 (small language models): references, named mistakes, fresh inputs.

Every check draws new inputs on each run (``seed=None``); pass the seed a failure names to reproduce it.
The references are private (``_reference_*``) so that no answer can be imported under its exercise's name.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ..classroom.checking import Mistake, call_learner, check_function, fresh_seed
from ..errors import CheckFailed

_RMS_FORBIDDEN = ("torch.nn.functional.rms_norm", "torch.rms_norm", "course_utils.slm.RMSNorm.forward")
_ROPE_FORBIDDEN = ("course_utils.slm.rotate_pairs", "course_utils.slm.rope_angles")
_ATTN_FORBIDDEN = ("torch.nn.functional.scaled_dot_product_attention", "course_utils.slm.expand_kv_heads")
_QUANT_FORBIDDEN = ("course_utils.slm_quant.int8_per_channel", "torch.quantize_per_channel",
                    "torch._weight_int8pack_mm")


def _t(rng, *shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale)  # float64


# ------------------------------------------------------------------ 1. RMSNorm
def _reference_rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _rms_inputs(rng):
    c = int(rng.choice([8, 33, 64]))
    x = _t(rng, int(rng.integers(1, 4)), int(rng.integers(1, 7)), c, scale=float(rng.uniform(0.1, 0.5)))  # (B, T, C)
    return x, _t(rng, c) + 1.0, float(rng.choice([0.05, 0.1, 0.3]))


def check_rms_norm(fn, trials: int = 4, seed: int | None = None) -> None:
    """Ex. 1: y = x / sqrt(mean(x^2, last axis) + eps) * weight."""
    check_function(fn, _reference_rms_norm, _rms_inputs, name="rms_norm", trials=trials, seed=seed,
                   forbidden=_RMS_FORBIDDEN, mistakes=[
        Mistake("no eps", "eps is missing: add it to the mean of squares, inside the square root.",
                lambda x, w, eps: x / torch.sqrt((x * x).mean(-1, keepdim=True)) * w),
        Mistake("eps outside", "eps belongs inside the square root: sqrt(mean(x^2) + eps).",
                lambda x, w, eps: x / (torch.sqrt((x * x).mean(-1, keepdim=True)) + eps) * w),
        Mistake("layernorm", "you subtracted the mean (that is LayerNorm); RMSNorm only divides by the root mean square.",
                lambda x, w, eps: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * w),
        Mistake("sum", "use the mean of the squares over the last axis, not their sum.",
                lambda x, w, eps: x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps) * w),
        Mistake("no weight", "multiply by the learned weight (one gain per channel) at the end.",
                lambda x, w, eps: x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)),
        Mistake("wrong axis", "normalize over the last axis (the channels C), not over the tokens.",
                lambda x, w, eps: x / torch.sqrt((x * x).mean(-2, keepdim=True) + eps) * w),
    ])


# ------------------------------------------------------------------ 2. RoPE at arbitrary positions
def _angles(positions, d, base, exponent=2.0):
    inv = base ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)   # (D/2,)
    return positions.double()[:, None] * inv[None, :]                           # (T, D/2)


def _reference_apply_rope(x, positions, base):
    half = x.shape[-1] // 2
    a = _angles(positions, x.shape[-1], base)
    cos, sin = a.cos(), a.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _rope_adjacent(x, positions, base):
    a = _angles(positions, x.shape[-1], base)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)
    return out.flatten(-2)


def _rope_inputs(rng):
    t, d = int(rng.integers(2, 9)), int(rng.choice([8, 16, 32]))
    start = int(rng.integers(3, 200))
    positions = torch.arange(start, start + t) if rng.random() < 0.7 else torch.from_numpy(np.sort(rng.choice(500, t, replace=False)))
    return _t(rng, int(rng.integers(1, 3)), int(rng.integers(1, 4)), t, d), positions, float(rng.choice([100.0, 10000.0]))


def check_apply_rope(fn, trials: int = 4, seed: int | None = None) -> None:
    """Ex. 2: rotate pairs (i, i + D/2) of x (B, H, T, D) by positions[t] * base^(-2i/D)."""
    check_function(fn, _reference_apply_rope, _rope_inputs, name="apply_rope", trials=trials, seed=seed,
                   forbidden=_ROPE_FORBIDDEN, mistakes=[
        Mistake("adjacent pairs", "you rotated adjacent pairs (x0, x1), (x2, x3)...; this exercise pairs x_i with x_{i+D/2} (rotate half).",
                _rope_adjacent),
        Mistake("positions ignored", "you used positions 0..T-1; rotate token t by the angle of positions[t] (decoding continues at an offset).",
                lambda x, p, b: _reference_apply_rope(x, torch.arange(x.shape[-2]), b)),
        Mistake("exponent", "the frequency of pair i is base^(-2i/D), not base^(-i/D).",
                lambda x, p, b: _rope_with(x, _angles(p, x.shape[-1], b, exponent=1.0))),
        Mistake("sign", "the rotation goes the other way: (x1 cos - x2 sin, x1 sin + x2 cos).",
                lambda x, p, b: _reference_apply_rope(x, -p, b)),
    ])


def _rope_with(x, a):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)


# ------------------------------------------------------------------ 3. grouped-query attention
def _attend(q, k, v, scale, causal=True, offset=0):
    scores = q @ k.transpose(-1, -2) * scale                                 # (B, H, Tq, Tk)
    if causal:
        tq, tk = scores.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=offset)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _reference_gqa_attention(q, k, v):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, T, D)
    return _attend(q, k, v, 1 / math.sqrt(q.shape[-1]))


def _gqa_inputs(rng):
    hkv, rep = int(rng.choice([1, 2, 3])), int(rng.choice([2, 3, 4]))
    b, t, d = int(rng.integers(1, 3)), int(rng.integers(3, 9)), int(rng.choice([4, 8, 16]))
    return _t(rng, b, hkv * rep, t, d), _t(rng, b, hkv, t, d), _t(rng, b, hkv, t, d)


def _gqa_tiled(q, k, v):
    rep = q.shape[1] // k.shape[1]
    return _attend(q, k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1), 1 / math.sqrt(q.shape[-1]))


def check_gqa_attention(fn, trials: int = 4, seed: int | None = None) -> None:
    """Ex. 3: causal attention where query head h uses key/value head h // (H / Hkv)."""
    rep = lambda t, q: t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)  # noqa: E731
    check_function(fn, _reference_gqa_attention, _gqa_inputs, name="gqa_attention", trials=trials, seed=seed,
                   forbidden=_ATTN_FORBIDDEN, mistakes=[
        Mistake("tiled heads", "query head h shares key/value head h // n_rep (consecutive heads form a group); "
                "you tiled the heads (h % Hkv): use repeat_interleave, not repeat.", _gqa_tiled),
        Mistake("no scale", "scale the scores by 1/sqrt(D) before the softmax.",
                lambda q, k, v: _attend(q, rep(k, q), rep(v, q), 1.0)),
        Mistake("scale 1/D", "the scale is 1/sqrt(D), not 1/D.",
                lambda q, k, v: _attend(q, rep(k, q), rep(v, q), 1 / q.shape[-1])),
        Mistake("no mask", "this is a decoder: mask the future (query t sees keys 0..t only).",
                lambda q, k, v: _attend(q, rep(k, q), rep(v, q), 1 / math.sqrt(q.shape[-1]), causal=False)),
    ])


# ------------------------------------------------------------------ 4. one decode step with a KV cache
def _reference_decode_step(q, k_new, v_new, k_cache, v_cache, length):
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    k_cache[:, :, length:length + 1], v_cache[:, :, length:length + 1] = k_new, v_new
    out = _attend(q, k_cache[:, :, :length + 1], v_cache[:, :, :length + 1], 1 / math.sqrt(q.shape[-1]), causal=False)
    return out, k_cache, v_cache


def _decode_inputs(rng):
    b, h, d, lmax = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.choice([4, 8])), int(rng.integers(6, 12))
    length = int(rng.integers(1, lmax - 1))
    k_cache, v_cache = torch.zeros(b, h, lmax, d, dtype=torch.float64), torch.zeros(b, h, lmax, d, dtype=torch.float64)
    k_cache[:, :, :length], v_cache[:, :, :length] = _t(rng, b, h, length, d), _t(rng, b, h, length, d)
    return _t(rng, b, h, 1, d), _t(rng, b, h, 1, d), _t(rng, b, h, 1, d), k_cache, v_cache, length


def _decode_wrong_slot(slot):
    def fn(q, k_new, v_new, k_cache, v_cache, length):
        s = slot(length)
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        k_cache[:, :, s:s + 1], v_cache[:, :, s:s + 1] = k_new, v_new
        out = _attend(q, k_cache[:, :, :length + 1], v_cache[:, :, :length + 1], 1 / math.sqrt(q.shape[-1]), causal=False)
        return out, k_cache, v_cache
    return fn


def _decode_variant(keys_upto, scale_of):
    def fn(q, k_new, v_new, k_cache, v_cache, length):
        out, k2, v2 = _reference_decode_step(q, k_new, v_new, k_cache, v_cache, length)
        n = keys_upto(length, k2.shape[2])
        return _attend(q, k2[:, :, :n], v2[:, :, :n], scale_of(q.shape[-1]), causal=False), k2, v2
    return fn


def check_decode_step(fn, trials: int = 4, seed: int | None = None) -> None:
    """Ex. 4: write the new key/value at position ``length``, attend over positions 0..length."""
    sq = lambda d: 1 / math.sqrt(d)  # noqa: E731
    check_function(fn, _reference_decode_step, _decode_inputs, name="decode_step", trials=trials, seed=seed,
                   forbidden=_ATTN_FORBIDDEN, mistakes=[
        Mistake("slot length-1", "you overwrote the last cached position; the new token goes to slot `length` (0-based), the first free one.",
                _decode_wrong_slot(lambda n: n - 1)),
        Mistake("slot 0", "you wrote the new key/value at the start of the cache; it goes to slot `length`.",
                _decode_wrong_slot(lambda n: 0)),
        Mistake("whole buffer", "you attended to the whole preallocated cache; the empty slots after `length` are not keys: "
                "attend to positions 0..length only.", _decode_variant(lambda n, lmax: lmax, sq)),
        Mistake("old keys only", "the new token must also attend to itself: use positions 0..length inclusive.",
                _decode_variant(lambda n, lmax: n, sq)),
        Mistake("no scale", "scale the scores by 1/sqrt(D) before the softmax.", _decode_variant(lambda n, lmax: n + 1, lambda d: 1.0)),
    ])


# ------------------------------------------------------------------ 5. int8 per-channel quantization
def _reference_quantize_int8(w):
    scale = w.abs().amax(dim=1) / 127                                         # (out,)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def _quant_inputs(rng):
    """Weights whose codes sit far from rounding ties: w = (q + u) * s with |u| <= 0.4, one |q| = 127 per row."""
    out_f, in_f = int(rng.integers(2, 9)), int(rng.integers(4, 33))
    s = np.exp(rng.uniform(-6, -2, size=(out_f, 1)))
    q = rng.integers(-126, 127, size=(out_f, in_f)).astype(np.float64) + rng.uniform(-0.4, 0.4, size=(out_f, in_f))
    q[np.arange(out_f), rng.integers(0, in_f, size=out_f)] = 127 * rng.choice([-1, 1], size=out_f)
    return (torch.from_numpy(q * s).float(),)


def check_quantize_int8(fn, trials: int = 4, seed: int | None = None) -> None:
    """Ex. 5: symmetric int8 per output channel: returns (q int8 (out, in), scale float32 (out,))."""
    def per_tensor(w):
        s = w.abs().amax() / 127
        return torch.round(w / s).clamp(-127, 127).to(torch.int8), s.expand(w.shape[0]).clone()

    def per_column(w):
        s = w.abs().amax(dim=0) / 127
        return torch.round(w / s).clamp(-127, 127).to(torch.int8), s

    def truncated(w):
        q, s = _reference_quantize_int8(w)
        return torch.trunc(w / s[:, None]).to(torch.int8), s

    def by_128(w):
        s = w.abs().amax(dim=1) / 128
        return torch.round(w / s[:, None]).clamp(-128, 127).to(torch.int8), s

    def by_128_wrapped(w):  # 128 does not fit in int8 and wraps to -128
        s = w.abs().amax(dim=1) / 128
        return torch.round(w / s[:, None]).to(torch.int8), s

    check_function(fn, _reference_quantize_int8, _quant_inputs, name="quantize_int8", trials=trials, seed=seed,
                   forbidden=_QUANT_FORBIDDEN, mistakes=[
        Mistake("per tensor", "one scale for the whole matrix is per-tensor; compute one scale per output row (max over axis 1).", per_tensor),
        Mistake("per column", "you took the max over the output axis; the scale is per output channel, the max of each row.", per_column),
        Mistake("truncated", "round to the nearest integer (torch.round), do not truncate toward zero.", truncated),
        Mistake("128", "symmetric int8 uses 127 levels on each side: scale = max|w| / 127.", by_128),
        Mistake("128 wrapped", "symmetric int8 uses 127 levels on each side: scale = max|w| / 127 (with /128 the "
                "largest weight becomes 128, which wraps to -128 in int8).", by_128_wrapped),
    ])


# ------------------------------------------------------------------ 6. one variant per layer under a budget
def _reference_choose_variants(costs, losses, budget):
    """Exact dynamic program over (layer, budget used): the minimum total loss and one choice reaching it."""
    best = {0: (0.0, [])}                                                     # cost used -> (loss, choice)
    for layer_costs, layer_losses in zip(costs, losses):
        nxt = {}
        for used, (loss, choice) in best.items():
            for j, (c, l) in enumerate(zip(layer_costs, layer_losses)):
                u = used + c
                if u <= budget and (u not in nxt or loss + l < nxt[u][0]):
                    nxt[u] = (loss + l, choice + [j])
        best = nxt
    return min(best.values(), key=lambda p: p[0])


def _choice_inputs(rng):
    n_layers, n_var = int(rng.integers(3, 7)), int(rng.integers(3, 6))
    costs = [[int(c) for c in sorted(rng.integers(0, 20, size=n_var), reverse=True)] for _ in range(n_layers)]
    losses = [[round(float(v), 4) for v in sorted(rng.exponential(1.0, size=n_var) * (1 + i))] for i in range(n_layers)]
    for c, l in zip(costs, losses):
        c[0], l[0] = c[0] + 5, 0.0                                            # variant 0: the parent block
        c[-1] = 0                                                             # the last variant: identity, free
    budget = int(rng.integers(sum(min(c) for c in costs), sum(max(c) for c in costs)))
    return costs, losses, budget


def _greedy(costs, losses, budget):
    choice = [0] * len(costs)
    used = sum(c[0] for c in costs)
    while used > budget:  # repeatedly take the cheapest loss increase per unit of cost saved
        options = [((losses[i][j] - losses[i][choice[i]]) / (costs[i][choice[i]] - costs[i][j]), i, j)
                   for i in range(len(costs)) for j in range(len(costs[i])) if costs[i][j] < costs[i][choice[i]]]
        _, i, j = min(options)
        used += costs[i][j] - costs[i][choice[i]]
        choice[i] = j
    return choice


def check_choose_variants(fn, trials: int = 6, seed: int | None = None) -> None:
    """Ex. 6: a list with one variant index per layer, total cost <= budget, total loss minimal."""
    seed = fresh_seed(seed)
    for trial in range(trials):
        costs, losses, budget = _choice_inputs(np.random.default_rng([seed, trial]))
        where = f" (trial {trial + 1}, {len(costs)} layers, budget {budget}; reproduce with seed={seed})"
        got = call_learner("choose_variants", fn, (costs, losses, budget))
        try:
            got = [int(j) for j in got]
        except Exception:
            raise CheckFailed(f"choose_variants: return a list of integers (one variant index per layer), got {type(got).__name__}{where}.") from None
        if len(got) != len(costs) or any(not 0 <= j < len(c) for j, c in zip(got, costs)):
            raise CheckFailed(f"choose_variants: return one valid variant index per layer ({len(costs)} of them){where}.")
        cost = sum(c[j] for c, j in zip(costs, got))
        loss = sum(l_[j] for l_, j in zip(losses, got))
        optimum, _ = _reference_choose_variants(costs, losses, budget)
        if cost > budget:
            raise CheckFailed(f"choose_variants: your choice costs {cost}, over the budget {budget}; "
                              f"a layer's cost counts once, for the variant you pick{where}.")
        if loss > optimum + 1e-9:
            g = _greedy(costs, losses, budget)
            if got == g:
                raise CheckFailed("choose_variants: a greedy choice (best loss per unit of cost saved) is not optimal: "
                                  "keep, for every total cost, the best loss so far (a dynamic program over layers and budget).")
            raise CheckFailed(f"choose_variants: your choice fits the budget but its total loss {loss:.4g} is above "
                              f"the best possible {optimum:.4g}{where}.")
    print(f"✅ choose_variants: optimal within the budget on {trials} random problems.")


def _brute_force(costs, losses, budget):
    """For tests: the optimum by enumeration."""
    best = math.inf
    for choice in itertools.product(*[range(len(c)) for c in costs]):
        if sum(c[j] for c, j in zip(costs, choice)) <= budget:
            best = min(best, sum(l_[j] for l_, j in zip(losses, choice)))
    return best
