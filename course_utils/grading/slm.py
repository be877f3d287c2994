"""Checks for problem set 07 (small language models): references, named mistakes, fresh inputs.

Every check draws new inputs on each run (``seed=None``); pass the seed a failure names to reproduce it.
The references are private (``_reference_*``) so that no answer can be imported under its exercise's name.
Exercises 2-6 ask for what lessons 07a-07c did not write: YaRN's frequency scaling, a batched KV cache with
ragged lengths and grouped heads, asymmetric int4 with its group-at-a-time matmul, and the exact per-layer
search at a size where enumeration cannot finish.
"""
from __future__ import annotations

import functools
import inspect
import math
import sys

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand
from ..classroom.released import choice_total_loss


class _Names:
    """Forbidden names, re-read at every call: transformers' names join once transformers is imported.

    Resolving a transformers name imports transformers (seconds); a learner who calls one has imported it, so
    the name is watched from the first trial after that import on. A grader's remote proxy gets every name
    (they are resolved in the learner's kernel).
    """

    def __init__(self, names, transformers_names=(), fn=None):
        self.names, self.optional, self.fn = tuple(names), tuple(transformers_names), fn

    def __iter__(self):
        remote = hasattr(self.fn, "__course_remote_call__")
        yield from self.names
        yield from _own_functions()
        yield from (n for n in self.optional if remote or "transformers" in sys.modules)


def _own_functions():
    """This module's private functions (references and the helpers behind them, mistakes included)."""
    return tuple(f"{__name__}.{n}" for n, v in globals().items()
                 if n.startswith("_") and inspect.isfunction(v) and v.__module__ == __name__ and n not in ("_own_functions", "_below_whole_weight"))


_LLAMA = "transformers.models.llama.modeling_llama"
_ROPE_FORBIDDEN = ("course_utils.slm.rotate_pairs", "course_utils.slm.rope_angles")
_ROPE_TRANSFORMERS = (f"{_LLAMA}.apply_rotary_pos_emb", f"{_LLAMA}.rotate_half")
_YARN_TRANSFORMERS = ("transformers.modeling_rope_utils._compute_yarn_parameters",)
_ATTN_FORBIDDEN = ("torch.nn.functional.scaled_dot_product_attention", "course_utils.slm.expand_kv_heads",
                   "course_utils.slm.Attention.forward")
_ATTN_TRANSFORMERS = (f"{_LLAMA}.repeat_kv", f"{_LLAMA}.eager_attention_forward")
_QUANT_FORBIDDEN = ("course_utils.slm_quant.int4_groupwise", "course_utils.slm_quant.dequantize_int4",
                    "course_utils.slm_quant.unpack_int4", "course_utils.slm_quant.QuantLinear.forward",
                    "torch._weight_int4pack_mm", "torch._weight_int8pack_mm")

# By hand (issue 23): per exercise, the torch operators that compute the whole result (whatever path reaches
# them) and the topic's lesson modules (course_utils.slm, slm_quant, ...); course_utils.grading, transformers and
# diffusers are always refused. Elementwise ops, indexing, reductions and (ex. 3, 5) the matmul stay the learner's.
_SLM = ("course_utils.slm",)
BY_HAND_APPLY_ROPE = ByHand(modules=_SLM)
BY_HAND_YARN_INV_FREQ = ByHand(modules=_SLM)
BY_HAND_DECODE_RAGGED = ByHand(ops=("@attention",), modules=_SLM)
BY_HAND_QUANTIZE_INT4_ASYM = ByHand(ops=("quantize_per_channel", "quantize_per_tensor", "fake_quantize_per_channel_affine",
                                         "_convert_weight_to_int4pack", "_convert_weight_to_int4pack_for_cpu"), modules=_SLM)


def _t(rng, *shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale)  # float64


# ------------------------------------------------------------------ 1. RoPE with given frequencies (warm-up)
def _rope_with(x, a):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)


def _reference_apply_rope(x, positions, inv_freq):
    return _rope_with(x, positions.double()[:, None] * inv_freq[None, :])          # angles (T, D/2)


def _rope_adjacent(x, positions, inv_freq):
    a = positions.double()[:, None] * inv_freq[None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1).flatten(-2)


def _rope_inputs(rng):
    t, d = int(rng.integers(2, 9)), int(rng.choice([8, 16, 32]))
    start = int(rng.integers(3, 200))
    positions = torch.arange(start, start + t) if rng.random() < 0.7 else torch.from_numpy(np.sort(rng.choice(500, t, replace=False)))
    inv_freq = torch.from_numpy(np.sort(rng.uniform(1e-4, 1.0, d // 2))[::-1].copy())   # any frequencies, not base^(-2i/D)
    return _t(rng, int(rng.integers(1, 3)), int(rng.integers(1, 4)), t, d), positions, inv_freq


def check_apply_rope(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 1: rotate pairs (i, i + D/2) of x (B, H, T, D) by positions[t] * inv_freq[i]."""
    check_function(fn, _reference_apply_rope, _rope_inputs, name="apply_rope", trials=trials, seed=seed,
                   by_hand=BY_HAND_APPLY_ROPE,
                   forbidden=_Names(_ROPE_FORBIDDEN, _ROPE_TRANSFORMERS, fn), mistakes=[
        Mistake("adjacent pairs", "you rotated adjacent pairs (x0, x1), (x2, x3)...; this exercise pairs x_i with x_{i+D/2} (rotate half).",
                _rope_adjacent),
        Mistake("positions ignored", "you used positions 0..T-1; rotate token t by the angle of positions[t] (decoding continues at an offset).",
                lambda x, p, f: _reference_apply_rope(x, torch.arange(x.shape[-2]), f)),
        Mistake("own frequencies", "use the frequencies you are given (inv_freq), not base^(-2i/D): exercise 2 changes them.",
                lambda x, p, f: _rope_with(x, p.double()[:, None] * 10000.0 ** (-2 * torch.arange(x.shape[-1] // 2).double() / x.shape[-1]))),
        Mistake("sign", "the rotation goes the other way: (x1 cos - x2 sin, x1 sin + x2 cos).",
                lambda x, p, f: _reference_apply_rope(x, -p, f)),
    ], quiet=quiet)


# ------------------------------------------------------------------ 2. YaRN: NTK-by-parts frequencies
def _theta(d, base):
    return base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)                 # (D/2,)


def _yarn(d, base, factor, context, alpha, beta, *, rotations=None, reverse=False, mscale=None):
    theta = _theta(d, base)
    r = context * theta / (2 * math.pi) if rotations is None else rotations(context, theta)   # turns over the context
    gamma = ((r - alpha) / (beta - alpha)).clamp(0, 1)                                  # 1: keep, 0: interpolate
    if reverse:
        gamma = 1 - gamma
    m = 0.1 * math.log(factor) + 1 if mscale is None else mscale(factor)
    return (1 - gamma) * theta / factor + gamma * theta, m


def _reference_yarn_inv_freq(head_dim, base, factor, original_context, alpha, beta):
    return _yarn(head_dim, base, factor, original_context, alpha, beta)


def _yarn_inputs(rng):
    return (int(rng.choice([32, 64, 128])), float(rng.choice([10000.0, 500000.0])), float(rng.choice([2, 4, 8, 16, 32])),
            int(rng.choice([512, 2048, 4096, 8192])), float(rng.choice([0.5, 1.0, 2.0])), float(rng.choice([16.0, 32.0, 64.0])))


def check_yarn_inv_freq(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 2: YaRN's per-pair blend of interpolated and original frequencies, and its attention scale."""
    def ntk(d, base, s, ctx, a, b):
        return _theta(d, base * s ** (d / (d - 2))), 0.1 * math.log(s) + 1

    check_function(fn, _reference_yarn_inv_freq, _yarn_inputs, name="yarn_inv_freq", trials=trials, seed=seed,
                   by_hand=BY_HAND_YARN_INV_FREQ,
                   forbidden=_Names((), _YARN_TRANSFORMERS, fn), mistakes=[
        Mistake("reversed ramp", "the ramp goes the other way: pairs that turn many times over the original context "
                "(r > beta, high frequencies) keep theta; the slow ones (r < alpha) are divided by the factor.",
                lambda d, b, s, c, a, be: _yarn(d, b, s, c, a, be, reverse=True)),
        Mistake("no 2 pi", "r counts full turns: r = L * theta / (2 pi), the context divided by the wavelength 2 pi / theta.",
                lambda d, b, s, c, a, be: _yarn(d, b, s, c, a, be, rotations=lambda ctx, th: ctx * th)),
        Mistake("position interpolation", "you divided every frequency by the factor (position interpolation); YaRN keeps the "
                "fast pairs (r > beta) unchanged and blends in between.",
                lambda d, b, s, c, a, be: (_theta(d, b) / s, 0.1 * math.log(s) + 1)),
        Mistake("NTK-aware", "you scaled the base (NTK-aware); YaRN blends theta and theta / factor per pair with the ramp on r.", ntk),
        Mistake("no mscale", "return the attention scale 0.1 ln(factor) + 1 as the second value (1 is what no scaling gives).",
                lambda d, b, s, c, a, be: _yarn(d, b, s, c, a, be, mscale=lambda f: 1.0)),
        Mistake("mscale without 1", "the attention scale is 0.1 ln(factor) + 1: you forgot the + 1.",
                lambda d, b, s, c, a, be: _yarn(d, b, s, c, a, be, mscale=lambda f: 0.1 * math.log(f))),
    ], quiet=quiet)


# ------------------------------------------------------------------ 3. a batch of sequences, ragged lengths, GQA
def _decode_ragged(q, k_new, v_new, k_cache, v_cache, lengths, *, slot=lambda n: n, keys=lambda n, lmax: n + 1,
                   heads="interleave", scale=None):
    b, h, _, d = q.shape
    rep = h // k_cache.shape[1]
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = torch.empty_like(q)
    for i in range(b):
        n = int(lengths[i])
        s = slot(n)
        k_cache[i, :, s], v_cache[i, :, s] = k_new[i, :, 0], v_new[i, :, 0]
        m = keys(n, k_cache.shape[2])
        kk, vv = k_cache[i, :, :m], v_cache[i, :, :m]                                  # (Hkv, m, D)
        if heads == "interleave":
            kk, vv = kk.repeat_interleave(rep, 0), vv.repeat_interleave(rep, 0)
        else:
            kk, vv = kk.repeat(rep, 1, 1), vv.repeat(rep, 1, 1)
        scores = q[i] @ kk.transpose(-1, -2) * (d ** -0.5 if scale is None else scale)  # (H, 1, m)
        out[i] = torch.softmax(scores, -1) @ vv
    return out, k_cache, v_cache


def _reference_decode_ragged(q, k_new, v_new, k_cache, v_cache, lengths):
    return _decode_ragged(q, k_new, v_new, k_cache, v_cache, lengths)


def _ragged_inputs(rng):
    b, hkv, rep = int(rng.integers(2, 5)), int(rng.choice([1, 2, 3])), int(rng.choice([2, 3, 4]))
    d, lmax = int(rng.choice([4, 8, 16])), int(rng.integers(8, 17))
    lengths = rng.integers(0, lmax, size=b)
    lengths[:2] = rng.choice(lmax, size=2, replace=False)                             # at least two different lengths
    cache = lambda: _t(rng, b, hkv, lmax, d)  # noqa: E731  (stale values of earlier sequences fill the free slots)
    return (_t(rng, b, hkv * rep, 1, d), _t(rng, b, hkv, 1, d), _t(rng, b, hkv, 1, d), cache(), cache(),
            torch.from_numpy(lengths).long())


def check_decode_ragged(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 3: one decode step for a batch of sequences of different lengths with grouped key/value heads."""
    def shared(n_of):
        def wrong(q, kn, vn, kc, vc, lengths):
            return _decode_ragged(q, kn, vn, kc, vc, torch.full_like(lengths, int(n_of(lengths))))
        return wrong

    check_function(fn, _reference_decode_ragged, _ragged_inputs, name="decode_ragged", trials=trials, seed=seed,
                   by_hand=BY_HAND_DECODE_RAGGED,
                   forbidden=_Names(_ATTN_FORBIDDEN, _ATTN_TRANSFORMERS, fn), mistakes=[
        Mistake("one length (max)", "each sequence has its own length: write sequence b's key at slot lengths[b] and let it "
                "see its positions 0..lengths[b] only, not the longest sequence's.", shared(lambda n: n.max())),
        Mistake("one length (first)", "each sequence has its own length: use lengths[b] for sequence b, not lengths[0] for all.",
                shared(lambda n: n[0])),
        Mistake("whole buffer", "the slots after lengths[b] hold stale keys of an earlier sequence: attend to positions "
                "0..lengths[b] only (mask the rest with -inf).",
                lambda *a: _decode_ragged(*a, keys=lambda n, lmax: lmax)),
        Mistake("old keys only", "the new token must also attend to itself: positions 0..lengths[b] inclusive.",
                lambda *a: _decode_ragged(*a, keys=lambda n, lmax: max(n, 1))),
        Mistake("slot length-1", "the new key goes to slot lengths[b] (0-based), the first free one, not lengths[b] - 1.",
                lambda *a: _decode_ragged(*a, slot=lambda n: max(n - 1, 0))),
        Mistake("tiled heads", "query head h uses key/value head h // n_rep (consecutive heads share one): "
                "repeat_interleave, not repeat.", lambda *a: _decode_ragged(*a, heads="tile")),
        Mistake("no scale", "scale the scores by 1/sqrt(D) before the softmax.", lambda *a: _decode_ragged(*a, scale=1.0)),
    ], quiet=quiet)


# ------------------------------------------------------------------ 4. asymmetric int4, group-wise
def _reference_quantize_int4_asym(w, group):
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // group, group)                                        # (out, G, group)
    lo, hi = wg.amin(2), wg.amax(2)                                                    # (out, G)
    scale = (hi - lo) / 15
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.reshape(out_f, in_f).to(torch.uint8), scale, zero.to(torch.uint8)


def _quant_inputs(rng):
    """w = (q - z + u) * s per group, |u| <= 0.4, with one code 0 and one code 15 exact: no rounding ties."""
    out_f, group = int(rng.integers(2, 9)), int(rng.choice([8, 16, 32]))
    n_groups = int(rng.integers(1, 5))
    s = np.exp(rng.uniform(-6, -2, size=(out_f, n_groups, 1)))
    z = rng.integers(2, 14, size=(out_f, n_groups, 1)).astype(np.float64)
    q = rng.integers(0, 16, size=(out_f, n_groups, group)).astype(np.float64) + rng.uniform(-0.4, 0.4, (out_f, n_groups, group))
    ends = np.stack([rng.permutation(group)[:2] for _ in range(out_f * n_groups)]).reshape(out_f, n_groups, 2)
    np.put_along_axis(q, ends[..., :1], 0.0, axis=2)
    np.put_along_axis(q, ends[..., 1:], 15.0, axis=2)
    q = np.clip(q, 0, 15)
    return torch.from_numpy(((q - z) * s).reshape(out_f, n_groups * group)).float(), group


def check_quantize_int4_asym(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 4: returns (q uint8 (out, in) in 0..15, scale float32 (out, G), zero uint8 (out, G))."""
    def variant(*, levels=15, per_row=False, rounding=torch.round, zero_sign=1):
        def wrong(w, group):
            g = w.shape[1] if per_row else group
            q, s, z = _reference_quantize_int4_asym(w, g)
            wg = w.reshape(w.shape[0], -1, g)
            lo, hi = wg.amin(2), wg.amax(2)
            s = (hi - lo) / levels
            z = torch.round(-zero_sign * lo / s).clamp(0, 15)
            q = (rounding(wg / s[..., None]) + z[..., None]).clamp(0, 15).reshape(w.shape).to(torch.uint8)
            if per_row:
                reps = w.shape[1] // group
                return q, s.repeat_interleave(reps, 1), z.to(torch.uint8).repeat_interleave(reps, 1)
            return q, s, z.to(torch.uint8)
        return wrong

    check_function(fn, _reference_quantize_int4_asym, _quant_inputs, name="quantize_int4_asym", trials=trials, seed=seed,
                   by_hand=BY_HAND_QUANTIZE_INT4_ASYM,
                   forbidden=_Names(_QUANT_FORBIDDEN), mistakes=[
        Mistake("16 levels", "4 bits give the codes 0..15: 15 steps between min and max, scale = (max - min) / 15.", variant(levels=16)),
        Mistake("per row", "one scale per group of `group` inputs, not per row: reshape to (out, in // group, group) first.",
                variant(per_row=True)),
        Mistake("truncated", "round w / scale to the nearest integer (torch.round), do not truncate toward zero.",
                variant(rounding=torch.trunc)),
        Mistake("zero sign", "the zero point is the code of 0.0: zero = round(-min / scale) (min is negative here).",
                variant(zero_sign=-1)),
    ], quiet=quiet)


# ------------------------------------------------------------------ 5. the int4 matmul, one group at a time
def _pack(q):
    return q[:, 0::2] | (q[:, 1::2] << 4)                                              # low nibble: the even element


def _reference_int4_matmul(x, packed, scale, zero, group):
    y = torch.zeros(x.shape[0], packed.shape[0], dtype=torch.float64)
    for g in range(scale.shape[1]):                                                    # one group of columns at a time
        p = packed[:, g * group // 2:(g + 1) * group // 2]
        q = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], group)          # (out, group) codes
        w = (q.double() - zero[:, g, None].double()) * scale[:, g, None].double()
        y += x[:, g * group:(g + 1) * group].double() @ w.T
    return y.float()


def _matmul_inputs(rng):
    out_f, group, n_groups, n = int(rng.choice([64, 96])), int(rng.choice([16, 32])), int(rng.integers(4, 9)), int(rng.integers(1, 5))
    q = torch.from_numpy(rng.integers(0, 16, size=(out_f, n_groups * group))).to(torch.uint8)
    scale = torch.from_numpy(np.exp(rng.uniform(-6, -2, size=(out_f, n_groups)))).float()
    zero = torch.from_numpy(rng.integers(1, 15, size=(out_f, n_groups))).to(torch.uint8)
    return torch.from_numpy(rng.standard_normal((n, n_groups * group))).float(), _pack(q), scale, zero, group


def _below_whole_weight(args, kwargs):
    """Elements a group-at-a-time answer may allocate at once: fewer than the whole (out, in) weight."""
    packed = args[1]
    return packed.shape[0] * packed.shape[1] * 2 - 1


BY_HAND_INT4_MATMUL = ByHand(ops=("_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu", "_weight_int4pack_mm_with_scales_and_zeros",
                                  "_weight_int8pack_mm"), modules=_SLM,
                             max_numel=_below_whole_weight, large="a copy of the whole (out, in) weight, unpacked or "
                             "dequantized (work on one group of columns at a time)")


def check_int4_matmul(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 5: y = x @ W^T with W = (q - zero) * scale, q unpacked from two codes per byte, one group at a time."""
    def swapped(x, p, s, z, g):
        return _reference_int4_matmul(x, (p >> 4) | ((p & 0xF) << 4), s, z, g)

    def variant(zero_of):
        return lambda x, p, s, z, g: _reference_int4_matmul(x, p, s, zero_of(z), g)

    check_function(fn, _reference_int4_matmul, _matmul_inputs, name="int4_matmul", by_hand=BY_HAND_INT4_MATMUL,
                   trials=trials, seed=seed, n=256, forbidden=_Names(_QUANT_FORBIDDEN, (), fn), mistakes=[
        Mistake("nibble order", "element 2j sits in the low nibble (packed & 15), element 2j+1 in the high one (packed >> 4).", swapped),
        Mistake("no zero", "subtract the zero point before scaling: W = (q - zero) * scale.", variant(torch.zeros_like)),
        Mistake("signed codes", "the codes are unsigned (0..15); the zero point, not a fixed 8, centres them: W = (q - zero) * scale.",
                variant(lambda z: torch.full_like(z, 8))),
    ], quiet=quiet)


# ------------------------------------------------------------------ 6. one variant per layer under a budget
def _reference_choose_variants(costs, losses, budget):
    """Exact dynamic program over (layer, budget used): the minimum total loss and one choice reaching it."""
    best = {0: 0.0}                                                                    # cost used -> best loss
    back = []                                                                          # per layer: cost -> (prev cost, j)
    for layer_costs, layer_losses in zip(costs, losses):
        nxt, ptr = {}, {}
        for used, loss in best.items():
            for j, (c, e) in enumerate(zip(layer_costs, layer_losses)):
                u = used + c
                if u <= budget and (u not in nxt or loss + e < nxt[u]):
                    nxt[u], ptr[u] = loss + e, (used, j)
        best = nxt
        back.append(ptr)
    used = min(best, key=best.get)
    total, choice = best[used], []
    for ptr in reversed(back):
        used, j = ptr[used]
        choice.append(j)
    return total, choice[::-1]


N_LAYERS = (40, 56)  # the check's problems: 40..55 layers of 5..7 variants: at least 5**40 ~ 1e28 combinations


def _choice_inputs(rng, n_layers=None):
    n_layers = int(rng.integers(*N_LAYERS)) if n_layers is None else n_layers
    n_var = int(rng.integers(5, 8))
    costs = [[int(c) for c in sorted(rng.integers(0, 12, size=n_var), reverse=True)] for _ in range(n_layers)]
    losses = [[round(float(v), 4) for v in sorted(rng.exponential(1.0, size=n_var) * (1 + i % 7))] for i in range(n_layers)]
    for c, l in zip(costs, losses):
        c[0], l[0] = c[0] + 4, 0.0                                                     # variant 0: the parent block
        c[-1] = 0                                                                      # the last variant: identity, free
    lo, hi = sum(min(c) for c in costs), sum(max(c) for c in costs)
    budget = int(rng.integers(lo + (hi - lo) // 4, hi - (hi - lo) // 4))
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


def _greedy_loss(costs, losses, budget):
    return float(sum(l_[j] for l_, j in zip(losses, _greedy(costs, losses, budget))))


def check_choose_variants(fn, trials: int = 4, seed: int | None = None, *, quiet: bool = False) -> None:
    """Ex. 6: a list with one variant index per layer, total cost <= budget, total loss minimal (40-55 layers).

    choice_total_loss checks the choice (valid indices, within the budget) and returns its total loss, which is
    compared with the optimum's: any optimal choice passes."""
    check_function(
        functools.partial(choice_total_loss, fn), lambda c, l_, b: float(_reference_choose_variants(c, l_, b)[0]),
        _choice_inputs, name="choose_variants", trials=trials, seed=seed, rtol=0.0, atol=1e-9,
        mistakes=[Mistake("greedy", "a greedy choice (best loss per unit of cost saved) is not optimal: keep, for every "
                          "total cost, the best loss so far (a dynamic program over layers and budget).", _greedy_loss)],
        forbidden=_Names((), (), fn), quiet=quiet)


def _brute_force(costs, losses, budget):
    """For tests: the optimum by enumeration (small problems only)."""
    import itertools
    best = math.inf
    for choice in itertools.product(*[range(len(c)) for c in costs]):
        if sum(c[j] for c, j in zip(costs, choice)) <= budget:
            best = min(best, sum(l_[j] for l_, j in zip(losses, choice)))
    return best
