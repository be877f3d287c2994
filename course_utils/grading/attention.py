"""Checks of the topic 06 problem set (``solutions/06_flash_attention.ipynb``), with their named mistakes.

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``: new ones every run; a
failure names the seed that reproduces it), cycles through edge sizes (lengths 1 and 2, a length one past
a block edge, exact multiples of the block), and names the likely mistake. Exercises that say "by hand"
forbid the production op (``scaled_dot_product_attention``, ``torch.softmax``...) and the course's own
functions for the same thing (``course_utils.attention``). The references are the lesson library's rungs.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..attention import attention_backward_naive, attention_naive, merge_states
from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand
from .attention_inputs import (FORBIDDEN_ATTENTION, FP32_EXP_OVERFLOW, FP64_EXP_OVERFLOW,
                               HOT_FP32_TOL, _cycle, _hot_row, _lse, _masked_attention,
                               _nonfinite_mistakes, _qkv, _rand)

__all__ = [
    "check_merge_softmax_states",
    "check_causal_attention",
    "check_flash_forward_lse",
    "check_flash_backward_tiles",
]

def _half_score_matrix(args, kwargs) -> int:
    """Bytes a tiled answer may hold at once (tracemalloc's peak, NumPy's buffers included): half of a float64
    (L, L) matrix; the long trials make the full matrix alone twice this, and the tiles far below it."""
    return max(4 * args[0].shape[0] * args[1].shape[0], 2**18)


# ---------------------------------------------------------------- exercise 1: merging two softmax states
def check_merge_softmax_states(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: ``merge(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)`` for two disjoint key sets."""
    kind = _cycle("general", "one_row", "tied", "far_apart")

    def make_inputs(rng):
        which = kind()
        rows = 1 if which == "one_row" else int(rng.integers(2, 7))
        d = int(rng.integers(1, 6))
        shifts = {"tied": (0.0, 0.0), "far_apart": (0.0, float(rng.uniform(30, 60)))}.get(
            which, (0.0, float(rng.uniform(1.0, 3.0))))
        states = []
        for shift in shifts:  # the two halves have different maxima (or equal ones, "tied")
            n_keys = int(rng.integers(1, 6))
            s = _rand(rng, (rows, n_keys)) + shift  # (rows, n_keys) scores of this half
            if which == "tied":
                s[:, 0] = 5.0  # both halves hold the same maximum
            m = s.max(-1)
            e = np.exp(s - m[:, None])
            states += [m, e.sum(-1), e @ _rand(rng, (n_keys, d))]  # acc: (rows, d), unnormalised
        return tuple(states)

    def no_acc_rescale(m1, l1, a1, m2, l2, a2):
        m, l, _ = merge_states(m1, l1, a1, m2, l2, a2)
        return m, l, a1 + a2

    def normalised(m1, l1, a1, m2, l2, a2):
        m, l, acc = merge_states(m1, l1, a1, m2, l2, a2)
        return m, l, acc / l[:, None]

    def factors(m1, m2, inverted=False):
        m = np.maximum(m1, m2)
        return (m, np.exp(m - m1), np.exp(m - m2)) if inverted else (m, np.exp(m1 - m), np.exp(m2 - m))

    def wrong_sign(m1, l1, a1, m2, l2, a2):
        m, b1, b2 = factors(m1, m2, inverted=True)
        return m, b1 * l1 + b2 * l2, b1[:, None] * a1 + b2[:, None] * a2

    def swapped(m1, l1, a1, m2, l2, a2):
        m, b1, b2 = factors(m1, m2)
        return m, b1 * l1 + b2 * l2, b2[:, None] * a1 + b1[:, None] * a2

    mistakes = [
        Mistake("no_acc_rescale", "you forgot to rescale the accumulator: multiply acc1 by exp(m1 - m) and acc2 by "
                "exp(m2 - m), as you did for l.", no_acc_rescale),
        Mistake("no_rescale", "you added the sums and accumulators without rescaling: each was computed under its own "
                "max, so multiply by exp(m_i - m) first.", lambda m1, l1, a1, m2, l2, a2: (np.maximum(m1, m2), l1 + l2, a1 + a2)),
        Mistake("normalised", "you divided acc by l: the state keeps the unnormalised accumulator; divide only at the "
                "very end.", normalised),
        Mistake("normalised_no_acc_rescale", "two slips: the accumulators were neither rescaled by exp(m_i - m) nor "
                "kept unnormalised (do not divide by l).",
                lambda m1, l1, a1, m2, l2, a2: (lambda m, l, a: (m, l, a / l[:, None]))(*no_acc_rescale(m1, l1, a1, m2, l2, a2))),
        Mistake("wrong_sign", "the rescale factors are inverted: use exp(m_i - m) (<= 1), not exp(m - m_i).", wrong_sign),
        Mistake("swapped", "each accumulator takes its own state's factor: acc1 * exp(m1 - m) + acc2 * exp(m2 - m).",
                swapped),
        Mistake("min", "the merged max is the larger of m1 and m2 (np.maximum), not the smaller.",
                lambda m1, l1, a1, m2, l2, a2: (np.minimum(m1, m2),) + merge_states(m1, l1, a1, m2, l2, a2)[1:]),
    ]
    check_function(fn, merge_states, make_inputs, name="merge_softmax_states", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=FORBIDDEN_ATTENTION, quiet=quiet)


# ---------------------------------------------------------------- exercise 2: causal attention from scratch
def _causal_by(q, k, v, keep=lambda i, j: j <= i, scale=None, fill=-np.inf, axis=-1, max_sub="row"):
    """Causal attention with one thing changed: the mask, the scale, the fill, the softmax axis or its max."""
    n, d = q.shape
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    s = q @ k.T * np.asarray(1 / math.sqrt(d) if scale is None else scale, dtype=q.dtype)
    s = np.where(keep(i, j), s, np.asarray(fill, dtype=q.dtype))
    with np.errstate(all="ignore"):  # the overflow and 0/0 of the mistakes are their point
        e = np.exp(s - {"row": s.max(axis, keepdims=True), "global": s.max(), "none": 0}[max_sub])
        return (e / e.sum(axis, keepdims=True)) @ v


def check_causal_attention(fn: Callable, *, trials: int = 3, seed: int | None = None,
                           quiet: bool = False) -> None:
    """Exercise 2: ``causal_attention(q, k, v)`` for ``(L, D)`` float32 arrays, scale ``1/sqrt(D)``.

    Every trial has one query row whose visible scores exceed fp32's ``exp`` overflow (88.7), so an answer
    without the max subtraction fails; lengths cycle through a general one, 1 and 2.
    """
    kind = _cycle("general", "one", "two")
    off_by_one = ("causal mask off by one: query i must see keys j <= i (the diagonal included); use "
                  "np.tril(..., k=0) or j <= i.")

    def make_inputs(rng):
        n = {"one": 1, "two": 2}.get(kind(), int(rng.integers(4, 13)))
        q, k, v = _qkv(rng, n, int(rng.integers(2, 9)), np.float32)
        return _hot_row(rng, q, k, FP32_EXP_OVERFLOW), k, v

    def ref(q, k, v):
        return attention_naive(q, k, v, causal=True)

    mistakes = [
        Mistake("no_max", f"exp overflowed: a score here exceeds {FP32_EXP_OVERFLOW:.1f}, where fp32's exp is inf. "
                "Subtract each row's max before np.exp (eq. 4).", lambda q, k, v: _causal_by(q, k, v, max_sub="none")),
        Mistake("global_max", "you subtracted one max for the whole matrix: rows far below it underflow to 0/0. "
                "Subtract each row's own max (axis=-1, keepdims=True).",
                lambda q, k, v: _causal_by(q, k, v, max_sub="global")),
        Mistake("no_scale", "missing 1/sqrt(d): scale the scores q @ k.T by 1/sqrt(D) before the softmax.",
                lambda q, k, v: _causal_by(q, k, v, scale=1.0)),
        Mistake("scale_1_over_d", "you scaled by 1/D; the scale is 1/sqrt(D).",
                lambda q, k, v: _causal_by(q, k, v, scale=1.0 / q.shape[1])),
        Mistake("no_mask", "no causal mask: set the scores of keys j > i to -inf before the softmax.",
                lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j >= 0)),
        Mistake("strict_mask", off_by_one, lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j < i)),
        Mistake("strict_mask_finite", off_by_one,
                lambda q, k, v: _masked_attention(q, k, v, np.tri(q.shape[0], k=-1, dtype=bool), 1 / math.sqrt(q.shape[1]))),
        Mistake("leak", "causal mask off by one: your mask lets query i see key i + 1; keep only j <= i.",
                lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j <= i + 1)),
        Mistake("wrong_axis", "softmax over the wrong axis: normalise each row (over keys, axis=-1), not each column.",
                lambda q, k, v: _causal_by(q, k, v, axis=0)),
        Mistake("upper", "you kept the upper triangle (j >= i): query i sees keys j <= i, i.e. np.tril.",
                lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j >= i)),
        Mistake("no_mask_no_scale", "two things are missing: the causal mask (keys j > i to -inf) and the 1/sqrt(D) "
                "scale.", lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j >= 0, scale=1.0)),
        Mistake("upper_no_scale", "two slips: keep the lower triangle (j <= i, np.tril) and scale by 1/sqrt(D).",
                lambda q, k, v: _causal_by(q, k, v, keep=lambda i, j: j >= i, scale=1.0)),
    ]
    learner = _nonfinite_mistakes(fn, "causal_attention", mistakes, FORBIDDEN_ATTENTION,
                                  overflow=(FP32_EXP_OVERFLOW, mistakes[0].hint))
    check_function(learner, ref, make_inputs, name="causal_attention", trials=trials, seed=seed,
                   rtol=HOT_FP32_TOL, atol=HOT_FP32_TOL, mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 4: tiled forward with lse
def _online(q, k, v, block_n, *, rescale=True, track_max="running", lse="running", scale=True):
    """The one-query-block tiled forward, with one thing changed (a learner's plausible variants)."""
    with np.errstate(all="ignore"):  # the overflow of the mistakes is their point
        return _online_steps(q, k, v, block_n, rescale, track_max, lse, scale)


def _online_steps(q, k, v, block_n, rescale, track_max, lse, scale):
    tau = 1 / math.sqrt(q.shape[1]) if scale else 1.0
    m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros_like(q)
    last = None
    for j in range(0, k.shape[0], block_n):
        s = tau * (q @ k[j:j + block_n].T)  # (L, bn)
        m_new = {"running": np.maximum(m, s.max(-1)), "none": np.zeros_like(m),
                 "first": s.max(-1) if j == 0 else m}[track_max]
        alpha = np.exp(m - m_new) if track_max == "running" else np.ones_like(m)
        p = np.exp(s - m_new[:, None])
        l, acc = alpha * l + p.sum(-1), (alpha[:, None] if rescale else 1.0) * acc + p @ v[j:j + block_n]
        m = m_new
        last = s.max(-1) + np.log(np.exp(s - s.max(-1)[:, None]).sum(-1))
    out = {"running": m + np.log(l), "last": last, "nomax": np.log(l), "max": m, "log2": (m + np.log(l)) / math.log(2)}
    return acc / l[:, None], out[lse]


def check_flash_forward_lse(fn: Callable, *, trials: int = 5, seed: int | None = None,
                            quiet: bool = False) -> None:
    """Exercise 4: ``flash_forward(q, k, v, block_n) -> (o, lse)``, one query block against key blocks.

    One query row per trial has a score above float64's ``exp`` overflow (709.8), so a softmax without a
    running max fails; lengths cycle through ragged, an exact multiple of the block, one past it, 1 and 2.
    """
    kind = _cycle("long", "ragged", "exact", "one_past", "one", "two")

    def make_inputs(rng):
        block_n = int(rng.choice([4, 8]))
        which = kind()
        if which == "long":  # the full score matrix alone (8 L^2 bytes) is twice the limit; the tiles are far below it
            block_n, n = int(rng.choice([16, 32])), int(rng.integers(448, 513))
        n = n if which == "long" else {"exact": int(rng.integers(2, 5)) * block_n, "one_past": int(rng.integers(1, 4)) * block_n + 1, "one": 1,
             "two": 2}.get(which, int(rng.integers(2, 5)) * block_n + int(rng.integers(2, block_n)))
        q, k, v = _qkv(rng, n, int(rng.integers(2, 9)))
        k[:block_n] += 1.0  # the first block tends to hold the max, so stale maxima show
        return _hot_row(rng, q, k, FP64_EXP_OVERFLOW), k, v, block_n

    def ref(q, k, v, block_n):
        return attention_naive(q, k, v), _lse(q, k, 1 / math.sqrt(q.shape[1]))

    mistakes = [
        Mistake("no_max", f"exp overflowed: a score here exceeds {FP64_EXP_OVERFLOW:.0f}, where float64's exp is inf. "
                "Keep the running max m and exponentiate s - m_new (eq. 7).",
                lambda q, k, v, b: _online(q, k, v, b, track_max="none", lse="nomax")),
        Mistake("first_block_max", "you kept the first block's max: update m = max(m, rowmax(s)) for every block and "
                "rescale l and acc by exp(m_old - m_new).", lambda q, k, v, b: _online(q, k, v, b, track_max="first")),
        Mistake("no_acc_rescale", "you forgot to rescale the accumulator: multiply acc by exp(m_old - m_new) before "
                "adding the new block's p @ v.", lambda q, k, v, b: _online(q, k, v, b, rescale=False)),
        Mistake("lse_last_block", "log-sum-exp of the wrong block: you returned the last block's m + log(sum); return "
                "the running m + log(l) over all blocks.", lambda q, k, v, b: _online(q, k, v, b, lse="last")),
        Mistake("lse_no_max", "the lse misses the max: it is m + log(l), since l was summed as exp(s - m).",
                lambda q, k, v, b: _online(q, k, v, b, lse="nomax")),
        Mistake("lse_only_max", "the lse is m + log(l), not the running max m alone: add log(l).",
                lambda q, k, v, b: _online(q, k, v, b, lse="max")),
        Mistake("lse_log2", "your lse is in base 2: convert with lse = (m2 + log2(l)) * ln(2), or work with exp/log.",
                lambda q, k, v, b: _online(q, k, v, b, lse="log2")),
        Mistake("no_scale", "missing 1/sqrt(d): scale the scores q @ k_j.T by 1/sqrt(D) in every block.",
                lambda q, k, v, b: _online(q, k, v, b, scale=False)),
        Mistake("no_acc_rescale_lse_last", "two slips: rescale acc by exp(m_old - m_new) in every block, and return "
                "the running m + log(l), not the last block's.",
                lambda q, k, v, b: _online(q, k, v, b, rescale=False, lse="last")),
    ]
    tiled = ByHand(max_traced_bytes=_half_score_matrix, large="the full (L, L) score matrix (tile the keys: hold only "
                   "one (L, block_n) block at a time)")
    learner = _nonfinite_mistakes(fn, "flash_forward", mistakes, FORBIDDEN_ATTENTION,
                                  overflow=(FP64_EXP_OVERFLOW, mistakes[0].hint), by_hand=tiled)
    check_function(learner, ref, make_inputs, name="flash_forward", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 5: tiled backward
def check_flash_backward_tiles(fn: Callable, *, trials: int = 4, seed: int | None = None,
                               quiet: bool = False) -> None:
    """Exercise 5: ``flash_backward(q, k, v, o, lse, do, block) -> (dq, dk, dv)``, tiled, non-causal.

    Lengths cycle through ragged, one past a block edge, an exact multiple, and 1.
    """
    kind = _cycle("long", "ragged", "one_past", "exact", "one")

    def make_inputs(rng):
        block = int(rng.choice([4, 8]))
        which = kind()
        if which == "long":  # the full P alone (8 L^2 bytes) is twice the limit; the tiles are far below it
            block, n = int(rng.choice([16, 32])), int(rng.integers(320, 385))
        n = n if which == "long" else {"one_past": int(rng.integers(1, 4)) * block + 1, "exact": int(rng.integers(1, 4)) * block,
             "one": 1}.get(which, int(rng.integers(2, 4)) * block + int(rng.integers(2, block)))
        q, k, v = _qkv(rng, n, int(rng.integers(2, 7)))
        o = attention_naive(q, k, v)
        return q, k, v, o, _lse(q, k, 1 / math.sqrt(q.shape[1])), _rand(rng, o.shape), block

    def ref(q, k, v, o, lse, do, block):
        return attention_backward_naive(q, k, v, do)

    def grads(q, k, v, o, lse, do, *, delta=True, tau_in_grad=True, pt=True, tau_in_p=True, lse_col=False):
        """Eqs. (9)-(12) untiled, P recomputed from lse like a learner would, with one thing changed."""
        tau = 1 / math.sqrt(q.shape[1])
        p = np.exp((tau if tau_in_p else 1.0) * q @ k.T - (lse[None, :] if lse_col else lse[:, None]))  # (L, L)
        dv = (p.T if pt else p) @ do
        dp = do @ v.T
        ds = p * (dp - (do * o).sum(-1)[:, None]) if delta else p * dp
        g = tau if tau_in_grad else 1.0
        return g * ds @ k, g * ds.T @ q, dv

    def mistake(hint_name, hint, **change):
        return Mistake(hint_name, hint, lambda q, k, v, o, lse, do, b: grads(q, k, v, o, lse, do, **change))

    mistakes = [
        mistake("no_delta", "dS is P * (dP - delta) with delta = rowsum(dO * O): you dropped the delta term.",
                delta=False),
        mistake("no_scale_grad", "missing 1/sqrt(d) in dQ and dK: S = tau Q K^T, so dQ = tau dS K and dK = tau dS^T Q.",
                tau_in_grad=False),
        mistake("no_scale_p", "missing 1/sqrt(d) when recomputing P: P = exp(tau * Q K^T - lse).", tau_in_p=False),
        mistake("p_not_transposed", "dV = P^T dO (each key collects from the queries that attended to it), not P dO.",
                pt=False),
        mistake("lse_by_key", "subtract each query row's lse (lse[i:i+B, None]), not the key block's.", lse_col=True),
        mistake("no_delta_no_scale", "two slips: dS = P * (dP - delta) with delta = rowsum(dO * O), and dQ, dK carry "
                "the 1/sqrt(d) factor.", delta=False, tau_in_grad=False),
    ]
    tiled = ByHand(max_traced_bytes=_half_score_matrix, large="the full (L, L) P, dP or dS (recompute P one "
                   "(block, block) tile at a time)")
    check_function(fn, ref, make_inputs, name="flash_backward", trials=trials, seed=seed, by_hand=tiled,
                   n=64, mistakes=mistakes, forbidden=FORBIDDEN_ATTENTION, quiet=quiet)  # float64 sums in another order
