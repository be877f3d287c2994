"""Inputs and NaN-aware mistake matching for the topic 06 checks (``course_utils.grading.attention``).

The forbidden shortcuts, the sizes at which ``exp`` overflows, edge-size cycles, a "hot" query row whose
scores overflow ``exp`` without the max subtraction, and a wrapper that names mistakes whose symptom is
NaN or inf (which a value comparison cannot match).
"""
from __future__ import annotations

import importlib.util
import itertools
import math
from typing import Callable

import numpy as np

from ..attention import softmax_safe
from ..classroom.checking import Mistake, call_learner
from ..classroom.forbidden import ByHand
from ..errors import CheckFailed
from ..tolerances import tolerance_for


# The production ops a "by hand" attention or softmax must not call.
_PRODUCTION = ("torch.nn.functional.scaled_dot_product_attention", "torch.softmax", "torch.nn.functional.softmax",
               "torch.Tensor.softmax", "torch.logsumexp")
if importlib.util.find_spec("scipy") is not None:
    _PRODUCTION += ("scipy.special.softmax", "scipy.special.logsumexp")
# The course's own attention functions (the lesson library, whose rungs are these exercises' references).
_COURSE = tuple(f"course_utils.attention.{name}" for name in (
    "attention_naive", "attention_reference", "softmax_safe", "softmax_unsafe", "online_softmax", "merge_states",
    "flash_attention_forward_numpy", "attention_backward_naive", "flash_attention_backward_tiles"))
FORBIDDEN_ATTENTION = _PRODUCTION + _COURSE
FORBIDDEN_BLOCKS = ("course_utils.attention_io.causal_blocks_visited",)

FP32_EXP_OVERFLOW = math.log(np.finfo(np.float32).max)  # 88.72: exp of a larger fp32 score is inf
FP64_EXP_OVERFLOW = math.log(np.finfo(np.float64).max)  # 709.78
# Exercise 2's hot scores reach 2 * 88.7 + 60 ~ 240 in fp32; each is rounded to ~240 * 2^-24 ~ 1.4e-5
# absolute, which exp turns into a relative error of the same size in every weight: allow 8 times that.
HOT_FP32_TOL = 8 * (2 * FP32_EXP_OVERFLOW + 60) * 2.0**-24


def _rand(rng, shape, scale=1.0, dtype=np.float64):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _cycle(*kinds):
    """A ``next()``-able cycle of edge-size kinds: trial t of a check gets ``kinds[t % len(kinds)]``."""
    return itertools.cycle(kinds).__next__


def _hot_row(rng, q, k, threshold):
    """Give one query row a score above ``threshold`` (where ``exp`` overflows) against a key it may see.

    Row ``r`` is pointed at key ``j <= r`` (visible under a causal mask): its scaled score is drawn in
    ``[threshold + 60, 2 threshold + 60]``, so an ``exp`` without the max subtraction is inf, and
    subtracting one global max underflows every other row to 0 (0/0).
    """
    n, d = q.shape
    r = int(rng.integers(min(1, n - 1), n))  # not row 0 when there are others: its mask differs most between mistakes
    j = int(rng.integers(0, r + 1))
    target = float(rng.uniform(threshold + 60, 2 * threshold + 60))  # tau * q_r . k_j
    q[r] = (target * math.sqrt(d) / float(k[j] @ k[j])) * k[j]
    return q


def _nonfinite_mistakes(fn: Callable, name: str, mistakes: list[Mistake], forbidden: tuple,
                        overflow: tuple[float, str] | None = None, by_hand: ByHand | None = None) -> Callable:
    """Call the learner's ``fn``; when its output holds NaN or inf, name the mistake that gives the same NaNs.

    ``check_function`` compares values; a NaN never equals a NaN there, so mistakes whose symptom is an
    overflow (no max subtraction) or a fully masked row (0/0) are matched here, NaN for NaN. With
    ``overflow=(threshold, hint)``, NaN/inf confined to the query rows whose scores exceed ``threshold``
    (however the learner's NaNs spread within them) gets ``hint``. ``by_hand`` (a structure the prompt demands)
    is watched around the learner's call, in the learner's kernel under the grader too.
    """

    def wrapped(*args):
        out = call_learner(name, fn, args, forbidden=forbidden, by_hand=by_hand)
        items = out if isinstance(out, tuple) else (out,)
        arrays = [np.asarray(x) for x in items if isinstance(x, np.ndarray)]
        if arrays and any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays):
            for mistake in mistakes:
                with np.errstate(all="ignore"):
                    try:
                        wrong = mistake.fn(*(a.copy() if isinstance(a, np.ndarray) else a for a in args))
                    except Exception:  # noqa: BLE001 - a variant that cannot run here does not match
                        continue
                wrong = wrong if isinstance(wrong, tuple) else (wrong,)
                if len(wrong) == len(items) and all(_same_with_nan(g, w) for g, w in zip(items, wrong)):
                    raise CheckFailed(f"{name}: {mistake.hint}")
            if overflow is not None and _only_in_hot_rows(args[0], args[1], items, overflow[0]):
                raise CheckFailed(f"{name}: {overflow[1]}")
        return out

    return wrapped


def _only_in_hot_rows(q, k, items, threshold) -> bool:
    """True when every NaN/inf of the outputs sits in a query row with a score above ``threshold``."""
    with np.errstate(all="ignore"):
        hot = (q @ k.T / math.sqrt(q.shape[1])).max(-1) > threshold  # (L,)
    bad = np.zeros(q.shape[0], dtype=bool)
    for x in items:
        if isinstance(x, np.ndarray) and x.shape[:1] == (q.shape[0],):
            bad |= ~np.isfinite(x.reshape(q.shape[0], -1)).all(-1)
    return bool(bad.any() and not (bad & ~hot).any())


def _same_with_nan(got, want) -> bool:
    if not isinstance(got, np.ndarray) or np.shape(got) != np.shape(want):
        return False
    rtol, atol = tolerance_for(got.dtype)
    return bool(np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))


def _qkv(rng, l, d, dtype=np.float64):
    return _rand(rng, (l, d), 1.5, dtype), _rand(rng, (l, d), 1.5, dtype), _rand(rng, (l, d), 1.0, dtype)


def _masked_attention(q, k, v, keep, scale):
    s = scale * (q @ k.T)
    s = np.where(keep, s, np.asarray(-1e30, dtype=s.dtype))  # finite fill: a fully masked row averages every value
    return softmax_safe(s) @ v

def _lse(q, k, scale):
    s = scale * (q @ k.T)
    m = s.max(-1)
    return m + np.log(np.exp(s - m[:, None]).sum(-1))
