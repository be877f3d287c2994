"""Topic 01's exercise 6: stochastic rounding FP32 -> BF16, checked by its statistics.

The check draws values, calls the learner's ``sr(x, rng)`` on many copies of them, and compares the fraction
rounded up with the probability the rounding rule gives, (|x| - lo) / (hi - lo), where lo and hi are the two
bf16 neighbours that the lesson library computes. It holds no reference implementation (the expected
probabilities are the rule itself), so it is released to learners as it is, and runs in the release on fresh
inputs like every grader's check.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import call_learner, fresh_seed
from ..errors import CheckFailed
from ..floating_point import FORMATS, decode
from ..floating_point_rounding import round_bits, round_to_format

# Released to learners as it is (course_utils.classroom.release), because it holds no reference:
RELEASED_AS_SOURCE = ("the expected probability of rounding up is the rule, (|x| - lo) / (hi - lo), with lo and hi "
                      "from the lesson library; the learner's rounding function is nowhere in it")

__all__ = ["check_stochastic_rounding", "SR_FORBIDDEN"]

# the course's rounding functions and torch's (deterministic) casts
SR_FORBIDDEN = ("course_utils.floating_point_rounding.stochastic_round", "course_utils.floating_point_rounding.round_bits",
                "torch.Tensor.to", "torch.Tensor.bfloat16", "course_utils.floating_point.FloatFormat")


def _sr_probability(sr_fn: Callable, x: np.ndarray, repeats: int, seed: int, name: str) -> np.ndarray:
    """Fraction of draws rounded away from zero, per value; also checks every draw is a bf16 neighbour."""
    rng = np.random.default_rng(seed)
    tiled = np.tile(x, repeats)  # (repeats * n,)
    out = call_learner(name, sr_fn, (tiled, rng), forbidden=SR_FORBIDDEN)
    if out is None:
        raise CheckFailed(f"{name}: the function returned None; add a `return` statement.")
    out = np.asarray(out.detach().float().numpy() if isinstance(out, torch.Tensor) else out)
    if out.shape != tiled.shape:
        raise CheckFailed(f"{name}: expected shape {tiled.shape}, got {out.shape}; return one rounded value per input "
                          f"(seed={seed}).")
    out = out.astype(np.float64).reshape(repeats, -1)  # (repeats, n)
    bf16 = FORMATS["bf16"]
    toward = round_bits(x, bf16, stochastic_u=np.zeros(x.shape, np.int64))  # truncation: the neighbour toward zero
    lo = decode(toward, 8, 7)
    hi = decode(toward + 1, 8, 7)
    ok = (out == lo) | (out == hi)
    if not ok.all():
        raise CheckFailed(f"{name}: some outputs are not one of the two bf16 neighbours of the input; round the "
                          f"magnitude down or up to a bf16 value (keep the top 16 bits of the float32 pattern); reproduce with seed={seed}.")
    return (out == hi).mean(axis=0)


def check_stochastic_rounding(fn: Callable, *, repeats: int = 2000, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: stochastic rounding FP32 -> BF16, ``sr(x, rng)``; checks the neighbours and unbiasedness."""
    name = "stochastic_round_bf16"
    seed = fresh_seed(seed)
    again = f" (reproduce with seed={seed})"
    rng = np.random.default_rng([seed, 1])
    n = 48
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x[:4] = np.array([1.0 + 2.0**-9, 1.0 + 3 * 2.0**-10, -(1.0 + 2.0**-10), 3.0], dtype=np.float32)
    bf16 = FORMATS["bf16"]
    toward = round_bits(x, bf16, stochastic_u=np.zeros(x.shape, np.int64))
    lo, hi = decode(toward, 8, 7), decode(toward + 1, 8, 7)
    p_true = (np.abs(x.astype(np.float64)) - np.abs(lo)) / (np.abs(hi) - np.abs(lo))  # eq. 7
    p_got = _sr_probability(fn, x, repeats, seed, name)
    tol = 5 * np.sqrt(0.25 / repeats) + 1e-9  # 5 standard deviations of a fraction of `repeats` coin flips
    bad = np.abs(p_got - p_true) > tol
    if not bad.any():
        if not quiet:
            print(f"✅ {name}: every output is a bf16 neighbour and the mean of {repeats} draws matches x "
                  f"(within {tol:.2g} of a bf16 step) for all {n} values.")
        return
    p_rne = (np.abs(round_to_format(x, bf16)) == np.abs(hi)).astype(float)
    wrong = [
        (np.zeros(n), "you never round up (truncation): round the magnitude up with probability "
                      "(|x| - lo) / (hi - lo), e.g. add a uniform random 16-bit integer to the pattern before truncating."),
        (p_rne, "your rounding is deterministic (nearest): it is biased for updates smaller than half a step; "
                "round up at random with probability (|x| - lo) / (hi - lo)."),
        (1 - p_true, "you round up with the probability of rounding down: the closer x is to the upper neighbour, "
                     "the more often it must go up, p = (|x| - lo) / (hi - lo)."),
        (np.full(n, 0.5), "you pick the neighbour with a fair coin: that is biased; the probability of going up "
                          "must be (|x| - lo) / (hi - lo)."),
    ]
    inexact = p_true > 0  # values already in bf16 stay put under every variant
    for p_wrong, hint in wrong:
        if np.all(np.abs(p_got - p_wrong)[inexact] <= tol):
            raise CheckFailed(f"{name}: {hint}{again}")
    i = int(np.argmax(np.abs(p_got - p_true)))
    raise CheckFailed(f"{name}: x={x[i]:.6g} went up in {p_got[i]:.3f} of the draws, expected {p_true[i]:.3f}: "
                      f"the result is biased; E[round(x)] must equal x{again}.")
