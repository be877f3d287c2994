"""Check of the topic 06 problem set's exercise 6 (``solutions/06_flash_attention.ipynb``): one tile of the
Triton dK/dV kernel, from dP to dS with the delta pre-pass, with its named mistakes.

The learner writes ``dkdv_tile(k_j, v_j, q_i, o_i, do_i, lse_i) -> (dk_j, dv_j)``: what one block of query
rows adds to the gradients of one block of keys (lesson 06, eqs. 8-12). ``o_i`` and ``lse_i`` are the
forward's output and log-sum-exp over **all** keys, of which ``k_j`` is one block, so the tile's rows of
:math:`P` do not sum to 1 and :math:`\\delta` must come from ``o_i`` and ``do_i`` (the pre-pass), not from the
tile. Inputs are fresh every run; tiles are square in most trials (so that a transposed product has the
right shape and can be named), taller than wide, or a single query row.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..attention import attention_naive
from ..classroom.checking import Mistake, check_function
from .attention_inputs import FORBIDDEN_ATTENTION, _cycle, _lse, _qkv, _rand

__all__ = ["check_dkdv_tile"]

# Besides the attention shortcuts: autograd, and the course's own backward kernels.
FORBIDDEN_BACKWARD = FORBIDDEN_ATTENTION + (
    "torch.autograd.grad", "torch.autograd.backward", "torch.Tensor.backward",
    "course_utils.attention_triton.flash_attention",
    "course_utils.attention_triton_backward.flash_attention_backward_triton",
)


def _tile_grads(k, v, q, o, do, lse, *, delta="prepass", scale=1.0, dk_t=True, dv_t=True, lse_axis=0):
    """One tile of eqs. (8)-(12) in the dK/dV kernel's orientation, with one thing changed (the mistakes).

    ``delta``: "prepass" (rowsum(dO * O), right), "none", or "tile" (rowsum(P * dP) over this key block only);
    ``scale`` multiplies the right 1/sqrt(d) of dK; ``dk_t``/``dv_t``: False uses P or dS untransposed.
    """
    tau = 1 / math.sqrt(q.shape[1])
    p = np.exp(tau * q @ k.T - (lse[:, None] if lse_axis == 0 else lse[None, :]))  # (bm, bn), eq. (8)
    dp = do @ v.T  # (bm, bn), eq. (10)
    if delta == "prepass":
        ds = p * (dp - (do * o).sum(-1)[:, None])  # eq. (11)
    elif delta == "tile":
        ds = p * (dp - (p * dp).sum(-1)[:, None])
    else:
        ds = p * dp
    dv = (p.T if dv_t else p) @ do  # eq. (9)
    dk = scale * tau * ((ds.T if dk_t else ds) @ q)  # eq. (12)
    return dk, dv


def _reference_dkdv_tile(k, v, q, o, do, lse):
    return _tile_grads(k, v, q, o, do, lse)


def check_dkdv_tile(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: ``dkdv_tile(k_j, v_j, q_i, o_i, do_i, lse_i) -> (dk_j, dv_j)`` for one (query, key) tile.

    Shapes: ``k_j``, ``v_j`` ``(bn, D)``; ``q_i``, ``o_i``, ``do_i`` ``(bm, D)``; ``lse_i`` ``(bm,)``. Tiles cycle
    through square, square, taller than wide, and one query row.
    """
    kind = _cycle("square", "square", "tall", "one_row")

    def make_inputs(rng):
        shape = kind()
        bn = int(rng.choice([3, 4, 6]))
        bm = {"square": bn, "tall": bn + int(rng.integers(1, 4)), "one_row": 1}[shape]
        d, blocks = int(rng.integers(2, 7)), int(rng.integers(2, 4))
        q, _, _ = _qkv(rng, bm, d)  # (bm, D): one block of query rows
        k, v, _ = _qkv(rng, blocks * bn, d)  # all keys, of which the tile holds one block
        v = _rand(rng, v.shape)
        o, lse = attention_naive(q, k, v), _lse(q, k, 1 / math.sqrt(d))  # the forward over every key
        j = int(rng.integers(0, blocks)) * bn
        return k[j:j + bn].copy(), v[j:j + bn].copy(), q, o, _rand(rng, o.shape), lse

    def mistake(name, hint, **change):
        return Mistake(name, hint, lambda k, v, q, o, do, lse: _tile_grads(k, v, q, o, do, lse, **change))

    mistakes = [
        mistake("no_delta", "dS = P * (dP - delta): you dropped delta. It is rowsum(dO * O), the pre-pass's "
                "one number per query row (eq. 11).", delta="none"),
        mistake("delta_from_tile", "delta is rowsum(P * dP) over ALL keys of the row, which equals rowsum(dO * O); "
                "summing P * dP over this key block alone gives a different number. Compute it from o_i and do_i.",
                delta="tile"),
        Mistake("no_scale", "dK is missing the 1/sqrt(d) factor: S = tau Q K^T, so dK = tau dS^T Q (eq. 12).",
                lambda k, v, q, o, do, lse: _tile_grads(k, v, q, o, do, lse, scale=math.sqrt(q.shape[1]))),
        Mistake("scale_twice", "dK carries 1/sqrt(d) once (dK = tau dS^T Q); yours has it twice.",
                lambda k, v, q, o, do, lse: _tile_grads(k, v, q, o, do, lse, scale=1 / math.sqrt(q.shape[1]))),
        mistake("dk_transposed", "dK = tau dS^T Q: each key collects dS down its column (dS^T), not dS Q.",
                dk_t=False),
        mistake("dv_transposed", "dV = P^T dO: each key collects from the queries that attended to it, not P dO.",
                dv_t=False),
        mistake("lse_by_key", "P = exp(tau q_i k_j^T - lse_i[:, None]): lse belongs to the query rows.", lse_axis=1),
        Mistake("no_delta_no_scale", "two slips: delta = rowsum(dO * O) is missing from dS, and dK lacks 1/sqrt(d).",
                lambda k, v, q, o, do, lse: _tile_grads(k, v, q, o, do, lse, delta="none",
                                                        scale=math.sqrt(q.shape[1]))),
    ]
    check_function(fn, _reference_dkdv_tile, make_inputs, name="dkdv_tile", trials=trials, seed=seed,
                   n=16, mistakes=mistakes, forbidden=FORBIDDEN_BACKWARD, quiet=quiet)
