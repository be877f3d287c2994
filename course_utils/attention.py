r"""Topic 06 (FlashAttention), the NumPy rungs: attention with S and P in memory, the safe and online
softmax, merging partial softmax states, the tiled forward with its log-sum-exp, and the backward.

Used by:

* ``notebooks/06_flash_attention.ipynb`` -- writes each rung by hand (``*_numpy``, ``*_by_hand``) and
  asserts it equals the function here;
* ``course_utils.attention_triton`` -- the Triton kernel's float64 fallback and the torch backward of
  its ``torch.autograd.Function``;
* ``course_utils.grading.attention`` -- references of the problem set's checks.

The Triton kernel and its autograd wiring are in ``course_utils.attention_triton``; FLOP, byte and IO
formulas in ``course_utils.attention_io``.

Conventions (those of ``torch.nn.functional.scaled_dot_product_attention``): ``q`` is ``(..., L_q, D)``,
``k`` and ``v`` are ``(..., L_k, D)``, the default scale is :math:`1/\sqrt{D}`, and a causal mask lets
query ``i`` see keys ``j <= i`` (``L_q == L_k``). Lesson 06's equations:

.. math::

   S = \tau\, Q K^\top \quad (1) \qquad P = \operatorname{softmax}_{\text{rows}}(S) \quad (2) \qquad O = P V \quad (3)

The tiled forward keeps, per query row, a running max :math:`m`, a running sum :math:`\ell` and an
unnormalised accumulator; a new block of scores :math:`S^{(j)}` updates them as (eq. 7)

.. math::

   m' = \max(m, \operatorname{rowmax} S^{(j)}),\quad
   \ell' = e^{m - m'}\ell + \operatorname{rowsum} e^{S^{(j)} - m'},\quad
   \mathrm{acc}' = e^{m - m'}\mathrm{acc} + e^{S^{(j)} - m'} V^{(j)}

and saves :math:`\mathrm{lse} = m + \log \ell` (natural log) for the backward, which recomputes
:math:`P = e^{S - \mathrm{lse}}` tile by tile (eqs. 9-12):
:math:`dV = P^\top dO`, :math:`dP = dO V^\top`, :math:`dS = P \odot (dP - \delta)` with
:math:`\delta = \operatorname{rowsum}(dO \odot O)`, :math:`dQ = \tau\, dS K`, :math:`dK = \tau\, dS^\top Q`.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "attention_naive",
    "attention_reference",
    "softmax_unsafe",
    "softmax_safe",
    "online_softmax",
    "merge_states",
    "flash_attention_forward_numpy",
    "attention_backward_naive",
    "flash_attention_backward_tiles",
]

def _xp(x):
    """The array namespace of ``x``: ``numpy`` or ``torch`` (the tiled functions accept both)."""
    return torch if isinstance(x, torch.Tensor) else np


def _scale(d: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _causal_mask(lq: int, lk: int, q0: int = 0, k0: int = 0) -> np.ndarray:
    """Boolean ``(lq, lk)``: query ``q0 + r`` may see key ``k0 + c`` when ``k0 + c <= q0 + r``."""
    rows = q0 + np.arange(lq)[:, None]
    cols = k0 + np.arange(lk)[None, :]
    return cols <= rows


# ---------------------------------------------------------------- rungs 1-2: materialised attention, softmax
def softmax_unsafe(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis straight from the definition (overflows for scores above ~88 in fp32)."""
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def softmax_safe(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis after subtracting the row max (eq. 4): every exponent is <= 0."""
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Rung 1: eqs. (1)-(3) with the full ``(..., L_q, L_k)`` score matrix S and probabilities P in memory."""
    tau = _scale(q.shape[-1], scale)
    s = tau * (q @ k.swapaxes(-1, -2))  # (..., L_q, L_k), eq. (1)
    if causal:
        s = np.where(_causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return softmax_safe(s) @ v  # (..., L_q, D), eqs. (2)-(3)


def attention_reference(q, k, v, causal: bool = False, scale: float | None = None):
    """``F.scaled_dot_product_attention`` on NumPy arrays or tensors, returning the same kind."""
    if isinstance(q, np.ndarray):
        out = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                             is_causal=causal, scale=scale)
        return out.numpy()
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


# ---------------------------------------------------------------- rung 3: online softmax and merging states
def online_softmax(s: np.ndarray, block: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pass over the last axis in blocks, keeping a running max ``m`` and sum ``l`` (eq. 5).

    Returns ``(p, m, l)``: the softmax (computed from the final ``m``, ``l``), and the statistics.
    """
    m = np.full(s.shape[:-1], -np.inf, dtype=s.dtype)
    l = np.zeros(s.shape[:-1], dtype=s.dtype)
    for j in range(0, s.shape[-1], block):
        blk = s[..., j:j + block]  # (..., block)
        m_new = np.maximum(m, blk.max(-1))
        l = l * np.exp(m - m_new) + np.exp(blk - m_new[..., None]).sum(-1)
        m = m_new
    return np.exp(s - m[..., None]) / l[..., None], m, l


def merge_states(m1, l1, acc1, m2, l2, acc2):
    """Merge two partial attention states over disjoint key sets (eq. 6).

    A state is ``(m, l, acc)``: row max of the scores, sum of ``exp(s - m)``, and the *unnormalised*
    output ``sum_j exp(s_j - m) v_j`` of shape ``(..., D)``. Works on NumPy arrays and tensors.
    """
    xp = _xp(m1)
    m = xp.maximum(m1, m2)
    a1, a2 = xp.exp(m1 - m), xp.exp(m2 - m)  # rescale factors, each <= 1
    return m, a1 * l1 + a2 * l2, a1[..., None] * acc1 + a2[..., None] * acc2


# ---------------------------------------------------------------- rung 4: tiled forward with log-sum-exp
def flash_attention_forward_numpy(q, k, v, causal: bool = False, scale: float | None = None,
                                  block_m: int = 16, block_n: int = 16):
    """Rung 4: FlashAttention's forward, tiled (outer loop over query blocks, inner over key blocks).

    Never holds more than a ``(..., block_m, block_n)`` tile of scores. Returns ``(o, lse)`` with
    ``lse = m + log(l)`` of shape ``(..., L_q)`` (eq. 8). Works on NumPy arrays and tensors.
    """
    xp = _xp(q)
    lq, d = q.shape[-2], q.shape[-1]
    lk = k.shape[-2]
    if causal and lq != lk:
        raise ValueError("causal attention here needs L_q == L_k")
    tau = _scale(d, scale)
    o = xp.zeros_like(q)
    lse = xp.zeros_like(q[..., 0])
    for i0 in range(0, lq, block_m):
        qi = q[..., i0:i0 + block_m, :]  # (..., bm, D)
        bm = qi.shape[-2]
        m = xp.full_like(qi[..., 0], -math.inf)  # (..., bm)
        l = xp.zeros_like(qi[..., 0])
        acc = xp.zeros_like(qi)  # (..., bm, D), unnormalised
        hi = min(i0 + bm, lk) if causal else lk  # key blocks past the diagonal are fully masked: skipped
        for j0 in range(0, hi, block_n):
            s = tau * (qi @ k[..., j0:j0 + block_n, :].swapaxes(-1, -2))  # (..., bm, bn), eq. (1)
            if causal:
                keep = _causal_mask(bm, s.shape[-1], i0, j0)
                s = xp.where(torch.from_numpy(keep).to(s.device) if xp is torch else keep, s, -math.inf)
            m_new = xp.maximum(m, xp.amax(s, -1))  # eq. (7)
            alpha = xp.exp(m - m_new)  # rescales what was accumulated under the old max
            p = xp.exp(s - m_new[..., None])  # (..., bm, bn)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ v[..., j0:j0 + block_n, :]
            m = m_new
        o[..., i0:i0 + bm, :] = acc / l[..., None]
        lse[..., i0:i0 + bm] = m + xp.log(l)  # eq. (8)
    return o, lse


# ---------------------------------------------------------------- rung 6: the backward
def attention_backward_naive(q, k, v, do, causal: bool = False, scale: float | None = None):
    """Gradients of eqs. (1)-(3) with the full P in memory (eqs. 9-12); NumPy arrays."""
    tau = _scale(q.shape[-1], scale)
    s = tau * (q @ k.swapaxes(-1, -2))  # (..., L_q, L_k)
    if causal:
        s = np.where(_causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    p = softmax_safe(s)
    dv = p.swapaxes(-1, -2) @ do  # (..., L_k, D), eq. (9)
    dp = do @ v.swapaxes(-1, -2)  # (..., L_q, L_k), eq. (10)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))  # eq. (11), softmax's Jacobian
    return tau * ds @ k, tau * ds.swapaxes(-1, -2) @ q, dv  # eq. (12)


def flash_attention_backward_tiles(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                                   block_m: int = 16, block_n: int = 16):
    """The tiled backward (eqs. 9-12): recompute ``P = exp(S - lse)`` per tile; never holds all of P.

    Outer loop over key blocks (each owns its dK, dV), inner over query blocks (which add into dQ).
    ``delta = rowsum(dO * O)`` replaces ``rowsum(dP * P)``. NumPy arrays or tensors; returns ``(dq, dk, dv)``.
    """
    xp = _xp(q)
    lq, d = q.shape[-2], q.shape[-1]
    lk = k.shape[-2]
    tau = _scale(d, scale)
    delta = (do * o).sum(-1)  # (..., L_q), eq. (11)
    dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
    for j0 in range(0, lk, block_n):
        kj, vj = k[..., j0:j0 + block_n, :], v[..., j0:j0 + block_n, :]  # (..., bn, D)
        start = (j0 // block_m) * block_m if causal else 0  # query blocks wholly above the diagonal: skipped
        for i0 in range(start, lq, block_m):
            qi, doi = q[..., i0:i0 + block_m, :], do[..., i0:i0 + block_m, :]  # (..., bm, D)
            s = tau * (qi @ kj.swapaxes(-1, -2))  # (..., bm, bn)
            p = xp.exp(s - lse[..., i0:i0 + block_m, None])  # recomputed, already normalised
            if causal:
                keep = _causal_mask(qi.shape[-2], kj.shape[-2], i0, j0)
                p = xp.where(torch.from_numpy(keep).to(p.device) if xp is torch else keep, p, 0.0)
            dv[..., j0:j0 + block_n, :] += p.swapaxes(-1, -2) @ doi  # eq. (9)
            dp = doi @ vj.swapaxes(-1, -2)  # eq. (10)
            ds = p * (dp - delta[..., i0:i0 + block_m, None])  # eq. (11)
            dq[..., i0:i0 + block_m, :] += tau * ds @ kj  # eq. (12)
            dk[..., j0:j0 + block_n, :] += tau * ds.swapaxes(-1, -2) @ qi
    return dq, dk, dv

