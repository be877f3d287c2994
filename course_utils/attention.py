r"""Topic 06 (FlashAttention): from the full attention matrix to a tiled Triton kernel, forward and backward.

Used by:

* ``notebooks/06_flash_attention.ipynb`` -- derives every function here rung by rung (naive attention,
  safe and online softmax, the tiled forward with its log-sum-exp, the Triton kernel, the tiled
  backward and its ``torch.autograd.Function``, IO accounting), then imports them from this module;
* ``solutions/06_flash_attention.ipynb`` -- the ``check_*`` functions of its exercises;
* ``benchmarks/attention_gpu.py`` -- the Triton kernel against ``scaled_dot_product_attention``.

Conventions (those of ``torch.nn.functional.scaled_dot_product_attention``): ``q`` is ``(..., L_q, D)``,
``k`` and ``v`` are ``(..., L_k, D)``, the default scale is :math:`1/\sqrt{D}`, and a causal mask lets
query ``i`` see keys ``j <= i`` (``L_q == L_k``). Lesson 06's equations:

.. math::

   S = \tau\, Q K^\top \quad (1) \qquad P = \operatorname{softmax}_{\text{rows}}(S) \quad (2) \qquad O = P V \quad (3)

The tiled forward keeps, per query row, a running max :math:`m`, a running sum :math:`\ell` and an
unnormalised accumulator; a new block of scores :math:`S^{(j)}` updates them as (eq. 6)

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
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .checks import CheckFailed, Mistake, call_learner, check_function
from .env import import_triton

__all__ = [
    "attention_naive",
    "attention_reference",
    "softmax_unsafe",
    "softmax_safe",
    "online_softmax",
    "merge_softmax_states",
    "flash_attention_forward_numpy",
    "attention_backward_naive",
    "flash_attention_backward_tiles",
    "attention_tile_step",
    "flash_attention_fwd_kernel",
    "flash_attention_triton",
    "FlashAttentionFunction",
    "flash_attention",
    "attention_flops",
    "score_matrix_bytes",
    "sram_block_size",
    "naive_attention_io",
    "flash_attention_io",
    "causal_blocks_visited",
    "check_merge_softmax_states",
    "check_causal_attention",
    "check_causal_blocks_visited",
    "check_flash_forward_lse",
    "check_flash_backward_tiles",
    "check_sliding_window_attention",
]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e)), the GPU's native exponential


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


def merge_softmax_states(m1, l1, acc1, m2, l2, acc2):
    """Merge two partial attention states over disjoint key sets (eq. 7).

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
            m_new = xp.maximum(m, xp.amax(s, -1))  # eq. (6)
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


# Triton picks interpreter or compiler when imported: env.import_triton() switches to the
# interpreter on the CPU tier first, as setup() does.
triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n, offs_d, seqlen_k,
                            stride_kn, stride_vn, scale_log2e,
                            CAUSAL_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        # One key block of eq. (6) for a (BLOCK_M, HEAD_DIM) query tile; returns the updated (m, l, acc).
        cols = start_n + offs_n  # (BLOCK_N,)
        n_ok = cols < seqlen_k  # ragged last key block
        kt = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None],
                     mask=n_ok[None, :], other=0.0)  # (HEAD_DIM, BLOCK_N) = K^T tile
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale_log2e  # (BLOCK_M, BLOCK_N), eq. (1) in log2 units
        keep = n_ok[None, :]
        if CAUSAL_TILE:  # only tiles that straddle the diagonal pay for the causal mask
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # eq. (6); finite: key 0 is visible to every row
        alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)  # (BLOCK_N, HEAD_DIM)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    def flash_attention_fwd_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
        stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
        seqlen_q, seqlen_k, scale_log2e,
        CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        # grid = (cdiv(L_q, BLOCK_M), B*H): one program per block of query rows of one head.
        start_m = tl.program_id(0)
        head = tl.program_id(1)
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows
        offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key columns within a block
        offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
        m_ok = offs_m < seqlen_q  # ragged last query block
        q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM), read once, kept on chip
        k_base, v_base = k_ptr + head * stride_kh, v_ptr + head * stride_vh
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max, base-2 units
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running sum
        acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)  # unnormalised output
        # Stage 1: key blocks every row of this query block sees in full (all of them without a causal mask).
        lo = seqlen_k
        if CAUSAL:
            lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # blocks wholly left of the diagonal
        for start_n in range(0, lo, BLOCK_N):
            m_i, l_i, acc = attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                                seqlen_k, stride_kn, stride_vn, scale_log2e, False, DOT_PRECISION)
        # Stage 2 (causal): the blocks that straddle the diagonal, masked; blocks right of it are never loaded.
        if CAUSAL:
            hi = tl.minimum((start_m + 1) * BLOCK_M, seqlen_k)
            for start_n in range(lo, hi, BLOCK_N):
                m_i, l_i, acc = attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n,
                                                    offs_d, seqlen_k, stride_kn, stride_vn, scale_log2e, True,
                                                    DOT_PRECISION)
        acc = acc / l_i[:, None]
        lse = (m_i + tl.log2(l_i)) / 1.4426950408889634  # eq. (8), back to natural log
        tl.store(lse_ptr + head * seqlen_q + offs_m, lse, mask=m_ok)
        tl.store(o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])
else:  # pragma: no cover
    attention_tile_step = flash_attention_fwd_kernel = None

_JITTED: dict = {}


def _jitted_kernel():
    """``triton.jit`` the kernel on first use (interpreted or compiled as decided at import)."""
    if "fwd" not in _JITTED:
        _JITTED["fwd"] = triton.jit(flash_attention_fwd_kernel)
    return _JITTED["fwd"]


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           scale: float | None = None, block_m: int = 16, block_n: int = 16,
                           num_warps: int | None = None, num_stages: int | None = None):
    """Rung 5: launch :func:`flash_attention_fwd_kernel` on ``(B, H, L, D)`` tensors; returns ``(o, lse)``.

    ``lse`` is fp32 ``(B, H, L_q)``. fp32 inputs use an exact (``ieee``) ``tl.dot``; on a GPU pass bf16/fp16
    (the interpreter's bf16 is wrong, so use fp32 on a CPU). ``D`` and the blocks are powers of two >= 16.
    ``num_warps`` / ``num_stages`` are passed to the compiled launch on a GPU (the benchmark tunes them).
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError("triton is not installed")
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q (B, H, Lq, D) and k, v (B, H, Lk, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if causal and lq != lk:
        raise ValueError("causal attention here needs L_q == L_k")
    for name, n in (("head dim", d), ("block_m", block_m), ("block_n", block_n)):
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name}={n}: use a power of two >= 16 (tl.arange and tl.dot need it)")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"unsupported dtype {q.dtype}")
    if q.device.type == "cpu" and q.dtype != torch.float32:
        raise TypeError("under the interpreter compute in fp32: its bf16/fp16 results are wrong")
    if max(q.numel(), k.numel()) >= 2 ** 31:
        raise ValueError("tensors too large for the kernel's int32 offsets")
    q, k, v = (t.contiguous().view(b * h, t.shape[2], d) for t in (q, k, v))  # (B*H, L, D)
    o = torch.empty_like(q)
    lse = torch.empty((b * h, lq), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(lq, block_m), b * h)
    launch = {key: val for key, val in (("num_warps", num_warps), ("num_stages", num_stages)) if val is not None}
    _jitted_kernel()[grid](
        q, k, v, o, lse,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        lq, lk, _scale(d, scale) * LOG2E,
        CAUSAL=causal, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 is ignored for 16-bit inputs
        **launch,
    )
    return o.view(b, h, lq, d), lse.view(b, h, lq)


# ---------------------------------------------------------------- rung 6: autograd wiring
class FlashAttentionFunction(torch.autograd.Function):
    """Forward: the Triton kernel (saves only Q, K, V, O and the lse). Backward: the tiled recomputation
    :func:`flash_attention_backward_tiles` in torch (fp32 accumulation), no Triton backward kernel."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        if q.shape[-1] >= 16 and not q.shape[-1] & (q.shape[-1] - 1) and q.dtype != torch.float64:
            o, lse = flash_attention_triton(q, k, v, causal, scale, block_m, block_n)
        else:  # float64 (gradcheck) or a head dim the kernel does not take: the same algorithm in torch
            o, lse = flash_attention_forward_numpy(q, k, v, causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = (causal, scale, block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, block_m, block_n = ctx.config
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq, dk, dv = flash_attention_backward_tiles(*(t.to(work) for t in (q, k, v, o)), lse.to(work), do.to(work),
                                                    causal, scale, block_m, block_n)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, block_m: int = 16, block_n: int = 16):
    """Differentiable FlashAttention on ``(B, H, L, D)`` tensors (see :class:`FlashAttentionFunction`)."""
    return FlashAttentionFunction.apply(q, k, v, causal, scale, block_m, block_n)


# ---------------------------------------------------------------- FLOPs, bytes and IO accounting
def attention_flops(b: int, h: int, lq: int, lk: int, d: int, causal: bool = False, backward: bool = False) -> float:
    """Matmul FLOPs of attention: ``QK^T`` and ``PV`` are ``2 L_q L_k D`` each; the backward has 5 such
    products (2.5x the forward, without recomputation); causal halves the count (the usual convention)."""
    flops = 4.0 * b * h * lq * lk * d
    if backward:
        flops *= 2.5
    return flops / 2 if causal else flops


def score_matrix_bytes(b: int, h: int, l: int, itemsize: int = 4) -> int:
    """Bytes of S and P together in rung 1: two ``(B, H, L, L)`` arrays (lesson 06, eq. 5a)."""
    return 2 * b * h * l * l * itemsize


def sram_block_size(sram_elements: int, d: int) -> int:
    """Largest power-of-two tile ``B`` (query rows = key rows) whose working set fits on chip:
    Q tile, K tile, V tile and the accumulator (``4 B d`` elements) plus the score tile (``B^2``)."""
    b = 1
    while 4 * (2 * b) * d + (2 * b) ** 2 <= sram_elements:
        b *= 2
    return b


def naive_attention_io(l: int, d: int) -> int:
    """Global-memory element reads + writes of materialised attention, per head (lesson 06, eq. 13; eqs. 1-3
    as three kernels):
    read Q, K, write S; read S, write P; read P, V, write O: ``4 L d + 4 L^2``."""
    return (2 * l * d + l * l) + (2 * l * l) + (l * l + l * d + l * d)


def flash_attention_io(l: int, d: int, sram_elements: int) -> int:
    """Global-memory element reads + writes of the tiled forward, per head (lesson 06, eq. 14): Q read once, O and lse written
    once, K and V read once per query block: ``2 L d + L + 2 L d * ceil(L / B)`` with ``B`` from
    :func:`sram_block_size` (capped at L)."""
    b = min(sram_block_size(sram_elements, d), l)
    return 2 * l * d + l + 2 * l * d * math.ceil(l / b)


def causal_blocks_visited(seqlen: int, block_m: int, block_n: int) -> int:
    """Number of (query block, key block) tiles a causal kernel computes when it skips fully masked tiles."""
    total = 0
    for i in range(math.ceil(seqlen / block_m)):
        hi = min((i + 1) * block_m, seqlen)  # one past the last query row of this block
        total += math.ceil(hi / block_n)
    return total


# ================================================================ problem-set checks
def _rand(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float64)


def check_merge_softmax_states(merge: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 1: ``merge(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)`` for two disjoint key sets."""

    def make_inputs(rng):
        rows, d = int(rng.integers(3, 7)), int(rng.integers(2, 6))
        states = []
        for shift in (0.0, float(rng.uniform(1.0, 3.0))):  # the two halves have different maxima
            n_keys = int(rng.integers(2, 6))
            s = _rand(rng, (rows, n_keys)) + shift  # (rows, n_keys) scores of this half
            m = s.max(-1)
            e = np.exp(s - m[:, None])
            states += [m, e.sum(-1), e @ _rand(rng, (n_keys, d))]  # acc: (rows, d), unnormalised
        return tuple(states)

    def no_acc_rescale(m1, l1, a1, m2, l2, a2):
        m, l, _ = merge_softmax_states(m1, l1, a1, m2, l2, a2)
        return m, l, a1 + a2

    def no_rescale(m1, l1, a1, m2, l2, a2):
        return np.maximum(m1, m2), l1 + l2, a1 + a2

    def normalised(m1, l1, a1, m2, l2, a2):
        m, l, acc = merge_softmax_states(m1, l1, a1, m2, l2, a2)
        return m, l, acc / l[:, None]

    def wrong_sign(m1, l1, a1, m2, l2, a2):
        m = np.maximum(m1, m2)
        b1, b2 = np.exp(m - m1), np.exp(m - m2)
        return m, b1 * l1 + b2 * l2, b1[:, None] * a1 + b2[:, None] * a2

    mistakes = [
        Mistake("no_acc_rescale", "you forgot to rescale the accumulator: multiply acc1 by exp(m1 - m) and acc2 by "
                "exp(m2 - m), as you did for l.", no_acc_rescale),
        Mistake("no_rescale", "you added the sums and accumulators without rescaling: each was computed under its own "
                "max, so multiply by exp(m_i - m) first.", no_rescale),
        Mistake("normalised", "you divided acc by l: the state keeps the unnormalised accumulator; divide only at the "
                "very end.", normalised),
        Mistake("wrong_sign", "the rescale factors are inverted: use exp(m_i - m) (<= 1), not exp(m - m_i).", wrong_sign),
    ]
    check_function(merge, merge_softmax_states, make_inputs, name="merge_softmax_states", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


def _qkv(rng, lq=None, d=None):
    l = int(rng.integers(5, 12)) if lq is None else lq
    d = int(rng.integers(3, 9)) if d is None else d
    return _rand(rng, (l, d), 1.5), _rand(rng, (l, d), 1.5), _rand(rng, (l, d))


def _masked_attention(q, k, v, keep, scale):
    s = scale * (q @ k.T)
    s = np.where(keep, s, -1e30)  # finite fill: a fully masked row averages every value
    return softmax_safe(s) @ v


def _wrap_fully_masked_row(fn: Callable, name: str, hint: str) -> Callable:
    """A learner using -inf and a mask without the diagonal gets NaN exactly in row 0: name that mistake."""

    def wrapped(*args):
        out = call_learner(name, fn, args)
        if isinstance(out, np.ndarray) and out.ndim == 2 and out.shape[0] > 1 and np.isnan(out[0]).all() \
                and not np.isnan(out[1:]).any():
            raise CheckFailed(f"{name}: {hint}")
        return out

    return wrapped


def check_causal_attention(causal_attention: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 2: ``causal_attention(q, k, v)`` for ``(L, D)`` float64 arrays, scale ``1/sqrt(D)``."""
    off_by_one = ("causal mask off by one: query i must see keys j <= i (the diagonal included); use "
                  "np.tril(..., k=0) or j <= i.")

    def ref(q, k, v):
        return attention_naive(q, k, v, causal=True)

    def idx(q):
        l = q.shape[0]
        return np.arange(l)[:, None], np.arange(l)[None, :]

    def strict(q, k, v):
        i, j = idx(q)
        return _masked_attention(q, k, v, j < i, 1 / math.sqrt(q.shape[1]))

    def leak(q, k, v):
        i, j = idx(q)
        return _masked_attention(q, k, v, j <= i + 1, 1 / math.sqrt(q.shape[1]))

    def wrong_axis(q, k, v):
        s = q @ k.T / math.sqrt(q.shape[1])
        s = np.where(np.tril(np.ones_like(s, dtype=bool)), s, -np.inf)
        e = np.exp(s - np.max(s, axis=0, keepdims=True))
        return (e / e.sum(0, keepdims=True)) @ v

    mistakes = [
        Mistake("no_scale", "missing 1/sqrt(d): scale the scores q @ k.T by 1/sqrt(D) before the softmax.",
                lambda q, k, v: attention_naive(q, k, v, causal=True, scale=1.0)),
        Mistake("scale_1_over_d", "you scaled by 1/D; the scale is 1/sqrt(D).",
                lambda q, k, v: attention_naive(q, k, v, causal=True, scale=1.0 / q.shape[1])),
        Mistake("no_mask", "no causal mask: set the scores of keys j > i to -inf before the softmax.",
                lambda q, k, v: attention_naive(q, k, v)),
        Mistake("strict_mask", off_by_one, strict),
        Mistake("leak", "causal mask off by one: your mask lets query i see key i + 1; keep only j <= i.", leak),
        Mistake("wrong_axis", "softmax over the wrong axis: normalise each row (over keys, axis=-1), not each column.",
                wrong_axis),
        Mistake("upper", "you kept the upper triangle (j >= i): query i sees keys j <= i, i.e. np.tril.",
                lambda q, k, v: _masked_attention(q, k, v, np.triu(np.ones((q.shape[0],) * 2, bool)),
                                                  1 / math.sqrt(q.shape[1]))),
    ]
    check_function(_wrap_fully_masked_row(causal_attention, "causal_attention", off_by_one), ref,
                   lambda rng: _qkv(rng), name="causal_attention", trials=trials, seed=seed, mistakes=mistakes,
                   quiet=quiet)


def check_causal_blocks_visited(blocks_visited: Callable, *, trials: int = 6, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 3: ``blocks_visited(seqlen, block_m, block_n) -> int``, tiles computed by a causal kernel."""

    def make_inputs(rng):
        block_m, block_n = (int(b) for b in rng.choice([16, 32, 64], size=2))
        seqlen = int(rng.integers(2, 12)) * max(block_m, block_n) + int(rng.integers(1, 16))  # ragged on purpose
        return seqlen, block_m, block_n

    def cd(a, b):
        return -(-a // b)

    mistakes = [
        Mistake("no_skip", "you counted every tile: a causal kernel skips key blocks that start past the query block's "
                "last row.", lambda L, bm, bn: cd(L, bm) * cd(L, bn)),
        Mistake("no_diagonal", "off by one: the diagonal block is partly visible; a query block [i*Bm, (i+1)*Bm) needs "
                "keys up to (i+1)*Bm - 1, so ceil((i+1)*Bm / Bn) key blocks (and ceil, not floor, for block counts).",
                lambda L, bm, bn: sum(cd(i * bm, bn) for i in range(cd(L, bm)))),
        Mistake("floor_last", "the ragged last query block needs ceil(min((i+1)*Bm, L) / Bn) key blocks: round up, "
                "not down.", lambda L, bm, bn: sum(min((i + 1) * bm, L) // bn for i in range(cd(L, bm)))),
        Mistake("no_clamp", "for the last (ragged) query block, clamp the key range at seqlen: min((i+1)*Bm, L).",
                lambda L, bm, bn: sum(cd((i + 1) * bm, bn) for i in range(cd(L, bm)))),
    ]
    check_function(blocks_visited, causal_blocks_visited, make_inputs, name="blocks_visited", trials=trials,
                   seed=seed, mistakes=mistakes, quiet=quiet)


def _lse(q, k, scale):
    s = scale * (q @ k.T)
    m = s.max(-1)
    return m + np.log(np.exp(s - m[:, None]).sum(-1))


def check_flash_forward_lse(flash_forward: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 4: ``flash_forward(q, k, v, block_n) -> (o, lse)``, one query block against key blocks."""

    def make_inputs(rng):
        block_n = int(rng.choice([4, 8]))
        l = int(rng.integers(3, 6)) * block_n + int(rng.integers(1, block_n))  # several blocks, one ragged
        q, k, v = _qkv(rng, l, int(rng.integers(3, 9)))
        k[: block_n] += 1.0  # the first block tends to hold the max, so stale maxima show
        return q, k, v, block_n

    def ref(q, k, v, block_n):
        return attention_naive(q, k, v), _lse(q, k, 1 / math.sqrt(q.shape[1]))

    def blocks(q, k, v, block_n, scale=None):
        tau = 1 / math.sqrt(q.shape[1]) if scale is None else scale
        for j in range(0, k.shape[0], block_n):
            yield tau * (q @ k[j:j + block_n].T), v[j:j + block_n]

    def last_block_lse(q, k, v, block_n):
        s, _ = list(blocks(q, k, v, block_n))[-1]
        m = s.max(-1)
        return attention_naive(q, k, v), m + np.log(np.exp(s - m[:, None]).sum(-1))

    def no_acc_rescale(q, k, v, block_n):
        m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros_like(q)
        for s, vj in blocks(q, k, v, block_n):
            m_new = np.maximum(m, s.max(-1))
            p = np.exp(s - m_new[:, None])
            l, acc, m = l * np.exp(m - m_new) + p.sum(-1), acc + p @ vj, m_new
        return acc / l[:, None], m + np.log(l)

    tau = lambda q: 1 / math.sqrt(q.shape[1])  # noqa: E731
    mistakes = [
        Mistake("no_acc_rescale", "you forgot to rescale the accumulator: multiply acc by exp(m_old - m_new) before "
                "adding the new block's p @ v.", no_acc_rescale),
        Mistake("lse_last_block", "log-sum-exp of the wrong block: you returned the last block's m + log(sum); return "
                "the running m + log(l) over all blocks.", last_block_lse),
        Mistake("lse_no_max", "the lse misses the max: it is m + log(l), since l was summed as exp(s - m).",
                lambda q, k, v, b: (attention_naive(q, k, v), _lse(q, k, tau(q)) - (tau(q) * q @ k.T).max(-1))),
        Mistake("lse_only_max", "the lse is m + log(l), not the running max m alone: add log(l).",
                lambda q, k, v, b: (attention_naive(q, k, v), (tau(q) * q @ k.T).max(-1))),
        Mistake("lse_log2", "your lse is in base 2: convert with lse = (m2 + log2(l)) * ln(2), or work with exp/log.",
                lambda q, k, v, b: (attention_naive(q, k, v), _lse(q, k, tau(q)) / math.log(2))),
        Mistake("no_scale", "missing 1/sqrt(d): scale the scores q @ k_j.T by 1/sqrt(D) in every block.",
                lambda q, k, v, b: (attention_naive(q, k, v, scale=1.0), _lse(q, k, 1.0))),
    ]
    check_function(flash_forward, ref, make_inputs, name="flash_forward", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


def check_flash_backward_tiles(flash_backward: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 5: ``flash_backward(q, k, v, o, lse, do, block) -> (dq, dk, dv)``, tiled, non-causal."""

    def make_inputs(rng):
        block = int(rng.choice([4, 8]))
        l = int(rng.integers(2, 4)) * block + int(rng.integers(1, block))
        q, k, v = _qkv(rng, l, int(rng.integers(3, 7)))
        o = attention_naive(q, k, v)
        lse = _lse(q, k, 1 / math.sqrt(q.shape[1]))
        return q, k, v, o, lse, _rand(rng, o.shape), block

    def ref(q, k, v, o, lse, do, block):
        return attention_backward_naive(q, k, v, do)

    def grads(q, k, v, o, lse, do, *, delta=True, tau_in_grad=True, pt=True, tau_in_p=True):
        """Eqs. (9)-(12) untiled, P recomputed from lse like a learner would, with one thing changed."""
        tau = 1 / math.sqrt(q.shape[1])
        p = np.exp((tau if tau_in_p else 1.0) * q @ k.T - lse[:, None])  # (L, L)
        dv = (p.T if pt else p) @ do
        dp = do @ v.T
        ds = p * (dp - (do * o).sum(-1)[:, None]) if delta else p * dp
        g = tau if tau_in_grad else 1.0
        return g * ds @ k, g * ds.T @ q, dv

    mistakes = [
        Mistake("no_delta", "dS is P * (dP - delta) with delta = rowsum(dO * O): you dropped the delta term.",
                lambda q, k, v, o, lse, do, b: grads(q, k, v, o, lse, do, delta=False)),
        Mistake("no_scale_grad", "missing 1/sqrt(d) in dQ and dK: S = tau Q K^T, so dQ = tau dS K and dK = tau dS^T Q.",
                lambda q, k, v, o, lse, do, b: grads(q, k, v, o, lse, do, tau_in_grad=False)),
        Mistake("no_scale_p", "missing 1/sqrt(d) when recomputing P: P = exp(tau * Q K^T - lse).",
                lambda q, k, v, o, lse, do, b: grads(q, k, v, o, lse, do, tau_in_p=False)),
        Mistake("p_not_transposed", "dV = P^T dO (each key collects from the queries that attended to it), not P dO.",
                lambda q, k, v, o, lse, do, b: grads(q, k, v, o, lse, do, pt=False)),
    ]
    check_function(flash_backward, ref, make_inputs, name="flash_backward", trials=trials, seed=seed,
                   rtol=1e-7, atol=1e-9, mistakes=mistakes, quiet=quiet)  # float64 sums in another tile order


def sliding_window_reference(q, k, v, window: int):
    """Causal attention where query i sees keys ``i - window < j <= i`` (the last ``window`` keys)."""
    i, j = np.arange(q.shape[0])[:, None], np.arange(k.shape[0])[None, :]
    return _masked_attention(q, k, v, (j <= i) & (j > i - window), 1 / math.sqrt(q.shape[1]))


def check_sliding_window_attention(sliding: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 6: ``sliding(q, k, v, window)``: each query sees itself and the ``window - 1`` keys before it."""

    def make_inputs(rng):
        q, k, v = _qkv(rng, int(rng.integers(8, 14)))
        return q, k, v, int(rng.integers(2, 5))

    def mask(q, cond):
        i, j = np.arange(q.shape[0])[:, None], np.arange(q.shape[0])[None, :]
        return cond(i, j)

    tau = lambda q: 1 / math.sqrt(q.shape[1])  # noqa: E731
    mistakes = [
        Mistake("window_plus_one", "off by one: your window holds window + 1 keys; keep j > i - window.",
                lambda q, k, v, w: _masked_attention(q, k, v, mask(q, lambda i, j: (j <= i) & (j >= i - w)), tau(q))),
        Mistake("window_minus_one", "off by one: your window holds window - 1 keys; keep i - window < j <= i.",
                lambda q, k, v, w: _masked_attention(q, k, v, mask(q, lambda i, j: (j <= i) & (j > i - w + 1)), tau(q))),
        Mistake("not_causal", "the window must also be causal: keys j > i stay masked.",
                lambda q, k, v, w: _masked_attention(q, k, v, mask(q, lambda i, j: np.abs(i - j) < w), tau(q))),
        Mistake("plain_causal", "that is plain causal attention: also mask keys older than the window (j <= i - window).",
                lambda q, k, v, w: attention_naive(q, k, v, causal=True)),
        Mistake("no_scale", "missing 1/sqrt(d): scale the scores by 1/sqrt(D).",
                lambda q, k, v, w: _masked_attention(q, k, v, mask(q, lambda i, j: (j <= i) & (j > i - w)), 1.0)),
    ]
    check_function(sliding, sliding_window_reference, make_inputs, name="sliding_window_attention", trials=trials,
                   seed=seed, mistakes=mistakes, quiet=quiet)
