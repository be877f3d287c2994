"""Grading for topic 02, exercises 6 and 7 (re-exported by :mod:`course_utils.grading.mixed_precision`): BF16 weights
without an FP32 master, kept accurate by a Kahan-compensated update, and FP8 (E4M3) casts with delayed scaling
from a history of amax values. Reference answers are private.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand

__all__ = ["check_kahan_bf16_sgd", "check_delayed_fp8_cast"]

_LESSON = ("course_utils.mixed_precision", "torch.optim", "torch.amp")


# ---------------------------------------------------------------- exercise 6: BF16 weights, Kahan-compensated SGD
def _kahan_steps(w, grads, lr, *, compensate=True, c_dtype=torch.bfloat16, sign=1.0, round_update=False):
    """SGD on BF16 weights with a compensation buffer (the reference, and its plausible variants)."""
    c = torch.zeros_like(w, dtype=c_dtype)
    for g in grads:  # (n,) float32 per step
        u = -lr * g  # float32
        if round_update:
            u = u.bfloat16().float()
        y = u - c.float() if compensate else u
        t = (w.float() + y).bfloat16()
        if compensate:
            c = (sign * ((t.float() - w.float()) - y)).to(c_dtype)
        w = t
    return w, c.bfloat16() if compensate else c


def _reference_kahan_bf16_sgd(w, grads, lr):
    return _kahan_steps(w, grads, lr)


def _kahan_inputs(rng):
    n, steps = int(rng.integers(400, 700)), int(rng.integers(20, 30))
    w = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).bfloat16()
    grads = torch.from_numpy(rng.standard_normal((steps, n)).astype(np.float32))
    lr = float(rng.choice([1e-3, 3e-3, 1e-4 * 2 ** int(rng.integers(0, 5))]))  # updates far below half a BF16 ulp of w
    return w, grads, lr


BY_HAND_KAHAN = ByHand(modules=_LESSON)


def check_kahan_bf16_sgd(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: ``(w bf16 (n,), grads float32 (steps, n), lr) -> (w, c)`` both bf16, after Kahan-compensated SGD."""
    check_function(
        fn, _reference_kahan_bf16_sgd, _kahan_inputs, name="kahan_bf16_sgd", trials=trials, seed=seed,
        rtol=0, atol=0, by_hand=BY_HAND_KAHAN, quiet=quiet,
        mistakes=[
            Mistake("plain", "your weights never move for most entries: without the compensation, an update below "
                    "half a BF16 ulp of w rounds away every step; carry what t = w + y lost in c and subtract it from "
                    "the next update.", lambda w, g, lr: (_kahan_steps(w, g, lr, compensate=False)[0],
                                                          torch.zeros_like(w))),
            Mistake("sign", "the compensation has the wrong sign: c = (t - w) - y is what the rounding added (the "
                    "negative of what it lost), and the next step uses y = u - c.",
                    lambda w, g, lr: _kahan_steps(w, g, lr, sign=-1.0)),
            Mistake("c_float32", "close, but your compensation is kept in float32: store c in BF16 (two BF16 buffers, "
                    "4 bytes per parameter, is the point of the recipe), rounding it after every step.",
                    lambda w, g, lr: _kahan_steps(w, g, lr, c_dtype=torch.float32)),
            Mistake("update_bf16", "you rounded the update -lr * g to BF16 before compensating: keep u and y in "
                    "float32; only t and c are rounded to BF16.",
                    lambda w, g, lr: _kahan_steps(w, g, lr, round_update=True)),
        ],
    )


# ---------------------------------------------------------------- exercise 7: delayed FP8 scaling
_E4M3_MAX = 448.0


def _delayed(xs, history_len, *, window=None, reduce=max, current=False, amax_of_q=False, inverse=False,
             dequantize=False):
    """E4M3 casts of each step's tensor with a scale from the previous steps' amax values (and wrong variants)."""
    window = history_len if window is None else window
    qs, scales, saturated, history = [], [], [], []
    for x in xs:  # (n,) float32 per step
        amax = float(x.abs().max())
        seen = (history + [amax])[-window:] if current else history[-window:] if window > 0 else []
        h = reduce(seen) if seen else 0.0
        scale = np.float32((h / _E4M3_MAX) if inverse else (_E4M3_MAX / h)) if h > 0 else np.float32(1.0)
        y = x * torch.tensor(scale)  # float32
        saturated.append(int((y.abs() > _E4M3_MAX).sum()))
        q = y.clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).float()
        qs.append(q / torch.tensor(scale) if dequantize else q)
        scales.append(float(scale))
        history.append(float(q.abs().max()) if amax_of_q else amax)
    return torch.stack(qs), torch.tensor(scales, dtype=torch.float32), torch.tensor(saturated, dtype=torch.int64)


def _reference_delayed_fp8_cast(xs, history_len):
    return _delayed(xs, history_len)


def _delayed_inputs(rng):
    """Activations whose scale drifts, with spikes (saturation) and sometimes an all-zero first step."""
    steps, n = int(rng.integers(16, 24)), int(rng.integers(128, 256))
    level = np.exp(np.cumsum(rng.normal(0.0, 0.25, size=steps)))  # a random walk of the activations' size
    spikes = rng.random(steps) < 0.15
    level = level * np.where(spikes, rng.uniform(4, 20, size=steps), 1.0)
    xs = rng.standard_normal((steps, n)) * level[:, None]
    xs = xs * np.exp(rng.normal(0, 2.0, size=(steps, n)))  # a wide spread of magnitudes: subnormals in E4M3 too
    if rng.random() < 0.4:
        xs[0] = 0.0  # no amax yet: the next step still uses scale 1
    return torch.from_numpy(xs.astype(np.float32)), int(rng.integers(3, 7))  # >= 3: one step shorter is not 'last only'


BY_HAND_DELAYED = ByHand(modules=_LESSON + ("torchao", "transformer_engine"))


def check_delayed_fp8_cast(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``(xs float32 (steps, n), history_len) -> (q float32 (steps, n), scales float32 (steps,),
    saturated int64 (steps,))``: E4M3 casts with delayed scaling."""
    check_function(
        fn, _reference_delayed_fp8_cast, _delayed_inputs, name="delayed_fp8_cast", trials=trials, seed=seed,
        rtol=0, atol=0, by_hand=BY_HAND_DELAYED, quiet=quiet,
        mistakes=[
            Mistake("current", "your scale already knows the current step's amax (just-in-time scaling): with delayed "
                    "scaling, step t uses only the amaxes of the steps before it, and records its own afterwards.",
                    lambda xs, h: _delayed(xs, h, current=True)),
            Mistake("window", "your history is one step too long: keep the amaxes of the last history_len steps.",
                    lambda xs, h: _delayed(xs, h, window=h + 1)),
            Mistake("window_short", "your history is one step too short: keep the amaxes of the last history_len "
                    "steps.", lambda xs, h: _delayed(xs, h, window=h - 1)),
            Mistake("last_only", "you use only the previous step's amax: take the max over the whole history window.",
                    lambda xs, h: _delayed(xs, h, window=1)),
            Mistake("mean", "you average the history: take its max, so that no recent value saturates.",
                    lambda xs, h: _delayed(xs, h, reduce=lambda v: float(np.float32(np.mean(v))))),
            Mistake("amax_of_q", "you recorded the amax of the cast tensor q (already scaled): record max |x| of the "
                    "unscaled input.", lambda xs, h: _delayed(xs, h, amax_of_q=True)),
            Mistake("inverse", "your scale is amax / 448, its inverse: scale = 448 / amax maps amax onto E4M3's "
                    "largest value.", lambda xs, h: _delayed(xs, h, inverse=True)),
            Mistake("dequantized", "you returned q / scale (the dequantized values); return the FP8 values q "
                    "themselves, with the scales next to them.", lambda xs, h: _delayed(xs, h, dequantize=True)),
        ],
    )
