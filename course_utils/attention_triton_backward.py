r"""Topic 06 (FlashAttention), the Triton backward: the ``delta`` pre-pass and the two gradient kernels.

Used by:

* ``course_utils.attention_triton`` -- the backward of :class:`~course_utils.attention_triton.FlashAttentionFunction`;
* ``notebooks/06_flash_attention.ipynb`` -- writes the same three kernels by hand (``*_by_hand``) and asserts they
  agree with :func:`flash_attention_backward_triton` on fresh inputs;
* ``benchmarks/attention_gpu.py`` -- times forward + backward against ``scaled_dot_product_attention``.

Lesson 06's eqs. (9)-(12), with :math:`P` recomputed per tile from the saved log-sum-exp (eq. 8):

.. math::

   P = e^{\tau QK^\top - \mathrm{lse}},\quad dV = P^\top dO,\quad dP = dO\,V^\top,\quad
   dS = P\odot(dP - \delta),\quad \delta = \operatorname{rowsum}(dO\odot O),\quad
   dQ = \tau\, dS\,K,\quad dK = \tau\, dS^\top Q

Three launches, as in FlashAttention-2: a pre-pass writes :math:`\delta` (one number per query row);
:func:`flash_attention_bwd_dkdv_kernel` keeps one key block resident and loops over query blocks
(it owns its rows of dK and dV, no atomics); :func:`flash_attention_bwd_dq_kernel` keeps one query
block resident and loops over key blocks (it owns its rows of dQ). Under a causal mask both skip the
tiles wholly above the diagonal and mask only the ones that straddle it, like the forward.

Grouped-query attention: ``H_q`` query heads share ``H_kv`` key/value heads (``GROUP = H_q / H_kv``
consecutive query heads per key/value head; MQA is ``H_kv = 1``). The dK/dV program of a key/value
head loops over the ``GROUP`` query heads that read it, so the group's contributions are summed on chip.
"""
from __future__ import annotations

import torch

from .env import TRITON_MISSING, TritonUnavailable, import_triton

__all__ = [
    "attention_bwd_preprocess_kernel",
    "attention_dkdv_step",
    "flash_attention_bwd_dkdv_kernel",
    "attention_dq_step",
    "flash_attention_bwd_dq_kernel",
    "flash_attention_backward_triton",
]

triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def attention_bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr, stride_oh, stride_om, stride_doh, stride_dom,
                                        seqlen_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
        # grid = (cdiv(L_q, BLOCK_M), B*H_q): delta = rowsum(dO * O), eq. (11), one number per query row.
        start_m, head = tl.program_id(0), tl.program_id(1)
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        m_ok = offs_m < seqlen_q
        o = tl.load(o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM)
        do = tl.load(do_ptr + head * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                     mask=m_ok[:, None], other=0.0)
        ACC = tl.float64 if o_ptr.dtype.element_ty == tl.float64 else tl.float32  # float64 only for gradcheck
        delta = tl.sum(o.to(ACC) * do.to(ACC), 1)  # (BLOCK_M,)
        tl.store(delta_ptr + head * seqlen_q + offs_m, delta, mask=m_ok)

    @triton.jit
    def attention_dkdv_step(k, v, dk, dv, q_base, do_base, lse_base, delta_base, start_m, offs_m, offs_n, offs_d,
                            seqlen_q, stride_qm, stride_dom, scale_log2e,
                            CAUSAL_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        # One query block against the resident key block: transposed tiles, so no tile is transposed twice.
        rows = start_m + offs_m  # (BLOCK_M,) query rows
        m_ok = rows < seqlen_q  # ragged last query block
        qt = tl.load(q_base + rows[None, :] * stride_qm + offs_d[:, None], mask=m_ok[None, :], other=0.0)  # (D, BM)
        lse = tl.load(lse_base + rows, mask=m_ok, other=0.0) * 1.4426950408889634  # log2 units
        pt = tl.exp2(tl.dot(k, qt, input_precision=DOT_PRECISION) * scale_log2e - lse[None, :])  # P^T (BN, BM), eq. (8)
        keep = m_ok[None, :]
        if CAUSAL_TILE:  # only tiles on the diagonal pay for the mask
            keep = keep & (offs_n[:, None] <= rows[None, :])
        pt = tl.where(keep, pt, 0.0)
        do = tl.load(do_base + rows[:, None] * stride_dom + offs_d[None, :], mask=m_ok[:, None], other=0.0)  # (BM, D)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=DOT_PRECISION)  # eq. (9)
        delta = tl.load(delta_base + rows, mask=m_ok, other=0.0)  # (BLOCK_M,)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # dP^T (BN, BM), eq. (10)
        dst = pt * (dpt - delta[None, :])  # dS^T, eq. (11)
        dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=DOT_PRECISION)  # eq. (12), tau applied at the end
        return dk, dv

    @triton.jit
    def flash_attention_bwd_dkdv_kernel(
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
        stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_doh, stride_dom,
        stride_dkh, stride_dkn, stride_dvh, stride_dvn,
        seqlen_q, seqlen_k, scale,
        CAUSAL: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        # grid = (cdiv(L_k, BLOCK_N), B*H_kv): one program per key block of one key/value head.
        start_n, kv_head = tl.program_id(0) * BLOCK_N, tl.program_id(1)
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key rows
        offs_m, offs_d = tl.arange(0, BLOCK_M), tl.arange(0, HEAD_DIM)
        n_ok = offs_n < seqlen_k
        k = tl.load(k_ptr + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)  # (BLOCK_N, HEAD_DIM), read once
        v = tl.load(v_ptr + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)
        ACC = tl.float64 if k_ptr.dtype.element_ty == tl.float64 else tl.float32  # float64 only for gradcheck
        dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=ACC)  # a loop-carried variable keeps its type
        dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=ACC)
        scale_log2e = scale * 1.4426950408889634
        mid = 0  # first query block that sees the whole key block
        if CAUSAL:
            lo = start_n // BLOCK_M * BLOCK_M  # query blocks wholly above the diagonal: skipped
            mid = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, seqlen_q)
            if GROUP > 1:  # GQA: one loop per query head, every tile masked (the mask is a no-op below the
                mid = seqlen_q  # diagonal); two loops per head of the group spill registers at d=128
        for g in tl.static_range(GROUP):  # GQA: the query heads sharing this key/value head, summed on chip
            head = kv_head * GROUP + g
            q_base, do_base = q_ptr + head * stride_qh, do_ptr + head * stride_doh
            lse_base, delta_base = lse_ptr + head * seqlen_q, delta_ptr + head * seqlen_q
            if CAUSAL:  # stage 1: the query blocks that straddle the diagonal, masked
                for start_m in range(lo, mid, BLOCK_M):
                    dk, dv = attention_dkdv_step(k, v, dk, dv, q_base, do_base, lse_base, delta_base, start_m, offs_m,
                                                 offs_n, offs_d, seqlen_q, stride_qm, stride_dom, scale_log2e,
                                                 True, DOT_PRECISION)
            if not CAUSAL or GROUP == 1:
                for start_m in range(mid, seqlen_q, BLOCK_M):  # stage 2: no mask needed
                    dk, dv = attention_dkdv_step(k, v, dk, dv, q_base, do_base, lse_base, delta_base, start_m,
                                                 offs_m, offs_n, offs_d, seqlen_q, stride_qm, stride_dom, scale_log2e,
                                                 False, DOT_PRECISION)
        tl.store(dk_ptr + kv_head * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
                 (dk * scale).to(dk_ptr.dtype.element_ty), mask=n_ok[:, None])  # eq. (12): dK = tau dS^T Q
        tl.store(dv_ptr + kv_head * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
                 dv.to(dv_ptr.dtype.element_ty), mask=n_ok[:, None])

    @triton.jit
    def attention_dq_step(q, do, lse, delta, dq, k_base, v_base, start_n, offs_m, offs_n, offs_d, seqlen_k,
                          stride_kn, stride_vn, scale_log2e,
                          CAUSAL_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        # One key block against the resident query block.
        cols = start_n + offs_n  # (BLOCK_N,)
        n_ok = cols < seqlen_k
        kt = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None], mask=n_ok[None, :], other=0.0)  # (D, BN)
        vt = tl.load(v_base + cols[None, :] * stride_vn + offs_d[:, None], mask=n_ok[None, :], other=0.0)  # (D, BN)
        p = tl.exp2(tl.dot(q, kt, input_precision=DOT_PRECISION) * scale_log2e - lse[:, None])  # (BM, BN), eq. (8)
        keep = n_ok[None, :]
        if CAUSAL_TILE:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)  # eq. (10)
        ds = p * (dp - delta[:, None])  # eq. (11)
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PRECISION)  # eq. (12), tau at the end
        return dq

    @triton.jit
    def flash_attention_bwd_dq_kernel(
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
        stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_doh, stride_dom,
        stride_dqh, stride_dqm,
        seqlen_q, seqlen_k, scale,
        CAUSAL: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        # grid = (cdiv(L_q, BLOCK_M), B*H_q): one program per query block of one query head.
        start_m, head = tl.program_id(0), tl.program_id(1)
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM)
        m_ok = offs_m < seqlen_q
        q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM)
        do = tl.load(do_ptr + head * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                     mask=m_ok[:, None], other=0.0)
        lse = tl.load(lse_ptr + head * seqlen_q + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + head * seqlen_q + offs_m, mask=m_ok, other=0.0)
        k_base = k_ptr + (head // GROUP) * stride_kh  # GQA: the key/value head this query head reads
        v_base = v_ptr + (head // GROUP) * stride_vh
        ACC = tl.float64 if q_ptr.dtype.element_ty == tl.float64 else tl.float32  # float64 only for gradcheck
        dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=ACC)
        scale_log2e = scale * 1.4426950408889634
        lo = seqlen_k
        if CAUSAL:
            lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # key blocks wholly left of the diagonal
        for start_n in range(0, lo, BLOCK_N):  # stage 1: no mask needed
            dq = attention_dq_step(q, do, lse, delta, dq, k_base, v_base, start_n, offs_m, offs_n, offs_d, seqlen_k,
                                   stride_kn, stride_vn, scale_log2e, False, DOT_PRECISION)
        if CAUSAL:  # stage 2: the key blocks on the diagonal; those right of it are never loaded
            for start_n in range(lo, tl.minimum((start_m + 1) * BLOCK_M, seqlen_k), BLOCK_N):
                dq = attention_dq_step(q, do, lse, delta, dq, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                       seqlen_k, stride_kn, stride_vn, scale_log2e, True, DOT_PRECISION)
        tl.store(dq_ptr + head * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :],
                 (dq * scale).to(dq_ptr.dtype.element_ty), mask=m_ok[:, None])  # eq. (12): dQ = tau dS K
else:  # pragma: no cover
    attention_bwd_preprocess_kernel = attention_dkdv_step = flash_attention_bwd_dkdv_kernel = None
    attention_dq_step = flash_attention_bwd_dq_kernel = None


def flash_attention_backward_triton(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                                    block_m: int = 16, block_n: int = 16, num_warps: int | None = None,
                                    num_stages: int | None = None):
    """Gradients ``(dq, dk, dv)`` of attention from the forward's ``o`` and ``lse`` (three Triton launches).

    ``q``, ``o``, ``do`` are ``(B, H_q, L_q, D)``, ``k``, ``v`` ``(B, H_kv, L_k, D)`` with ``H_kv`` dividing
    ``H_q``; ``lse`` is ``(B, H_q, L_q)`` (natural log). ``block_m`` / ``block_n`` are the query / key block
    sizes of both kernels. fp32 and float64 use exact (``ieee``) products; on a GPU pass bf16/fp16.
    """
    if triton is None:  # pragma: no cover
        raise TritonUnavailable(TRITON_MISSING.format(what="the Triton FlashAttention backward"))
    from .attention import _scale

    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    q3, o3, do3 = (t.contiguous().view(b * hq, lq, d) for t in (q, o, do))  # (B*H_q, L_q, D)
    k3, v3 = (t.contiguous().view(b * hkv, lk, d) for t in (k, v))  # (B*H_kv, L_k, D)
    lse3 = lse.contiguous().view(b * hq, lq).float() if lse.dtype != torch.float64 else lse.contiguous().view(b * hq, lq)
    delta = torch.empty_like(lse3)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    launch = {key: val for key, val in (("num_warps", num_warps), ("num_stages", num_stages)) if val is not None}
    precision = "ieee" if q.dtype in (torch.float32, torch.float64) else "tf32"  # tf32 is ignored for 16-bit
    attention_bwd_preprocess_kernel[(triton.cdiv(lq, block_m), b * hq)](
        o3, do3, delta, o3.stride(0), o3.stride(1), do3.stride(0), do3.stride(1), lq, HEAD_DIM=d, BLOCK_M=block_m)
    common = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
              do3.stride(0), do3.stride(1))
    consts = dict(CAUSAL=causal, GROUP=hq // hkv, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
                  DOT_PRECISION=precision, **launch)
    flash_attention_bwd_dkdv_kernel[(triton.cdiv(lk, block_n), b * hkv)](
        q3, k3, v3, do3, lse3, delta, dk, dv, *common, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        lq, lk, _scale(d, scale), **consts)
    flash_attention_bwd_dq_kernel[(triton.cdiv(lq, block_m), b * hq)](
        q3, k3, v3, do3, lse3, delta, dq, *common, dq.stride(0), dq.stride(1), lq, lk, _scale(d, scale), **consts)
    return dq.view(b, hq, lq, d), dk.view(b, hkv, lk, d), dv.view(b, hkv, lk, d)
