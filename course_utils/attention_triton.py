r"""Topic 06 (FlashAttention), the Triton rung: the forward kernel, its launcher, and the
``torch.autograd.Function`` that pairs it with the Triton backward of ``course_utils.attention_triton_backward``.

Used by:

* ``notebooks/06_flash_attention.ipynb`` -- writes the kernels, their launchers and the autograd wiring by hand
  (``*_by_hand``) and asserts they agree with the ones here on fresh inputs; compiles these for sm_80/sm_90
  (:func:`compile_attention_kernels`);
* ``benchmarks/attention_gpu.py`` -- :func:`flash_attention_triton` and :func:`flash_attention` (forward and
  forward + backward) against ``scaled_dot_product_attention``.

The kernel is the tiled forward of ``course_utils.attention.flash_attention_forward_numpy`` (eq. 7 of lesson
06) with one program per block of query rows, exponentials in base 2 and a causal mask applied only to
the key blocks that straddle the diagonal. Grouped-query attention: ``k``, ``v`` may have ``H_kv`` heads
dividing ``q``'s ``H_q``; query head ``h`` reads key/value head ``h // (H_q / H_kv)`` (eq. 13). On a CPU,
Triton runs in its interpreter: compute in fp32 (its bf16 is wrong) with GPU-legal block sizes (powers of
two >= 16). Importing this module switches to the interpreter on the CPU tier first, as ``setup()`` does.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import torch

from .attention import _scale, flash_attention_backward_tiles, flash_attention_forward_numpy
from .attention_triton_backward import flash_attention_backward_triton
from .env import TRITON_MISSING, TritonUnavailable, import_triton
from .paths import ROOT

__all__ = [
    "attention_tile_step",
    "flash_attention_fwd_kernel",
    "flash_attention_triton",
    "FlashAttentionFunction",
    "flash_attention",
    "compile_attention_forward",
    "compile_attention_kernels",
    "ATTENTION_GPU_CONFIGS",
    "attention_configs",
]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e)), the GPU's native exponential

# What benchmarks/attention_gpu.py tries per GPU generation, as (block_m, block_n, num_warps, num_stages); the
# backward ones are both backward kernels'. tests/test_compile_kernels.py compiles each for d = 64 and 128,
# GROUP 1 and 4, causal and not (course_utils.devtools.compile_matrix) and fails on a spill, on shared
# memory over the GPU's limit, or on a Hopper kernel without wgmma. Left out, because they fail that:
# sm_90 forward (128, 64, 4, 3) spills at d=128, and (128, 128, 8, 2) at d=128 causal (20 B); backward BLOCK_M=32
# compiles the dQ kernel to mma.sync (a warpgroup MMA needs 64 rows); backward 64x128 and 128x64 spill at d=128.
# sm_80: the d=128 forward spills at 128x64 and 128x128 with 8 warps; the backward spills at 64x64 with 8 warps
# (dQ 8 B at d=64, dK/dV 4-40 B at d=64 GROUP 4 and 12 B at d=128 GROUP 4 causal) and with 4 warps (dK/dV d=128
# 1.2 KB), and at 32x64 with 4 warps (dK/dV d=128 64 B); 64x32 with 4 warps does not. sm_75 (a T4): fp16 (no bf16
# there), 64 KiB of shared memory per block, and Triton emits FMAs, not tensor-core MMAs, so registers run out
# early: the forward spills at 64x64 (d=64, 11 KB) and 32x32 (d=128, 1.6 KB), the backward at 32x32 (d=64) and,
# at d=128, at 16x16 with 4 warps (dK/dV 4.8 KB, dQ 0.5 KB) and 16x32 with 8 warps; 16x16 tiles with 8 warps
# (half the registers per thread for the same tile) do not spill at either head dim.
ATTENTION_GPU_CONFIGS: dict[int, dict[str, list[tuple[int, int, int, int]]]] = {
    90: {"fwd": [(128, 64, 8, 3), (64, 64, 4, 3)], "bwd": [(64, 64, 8, 2)]},
    80: {"fwd": [(64, 64, 4, 3)], "bwd": [(64, 32, 4, 2)]},
    75: {"fwd": [(16, 16, 4, 2)], "bwd": [(16, 16, 8, 1)]},
}


def attention_configs(arch: int, kind: str) -> list[tuple[int, int, int, int]]:
    """The benchmark's ``kind`` (``"fwd"`` or ``"bwd"``) configurations for ``sm_<arch>`` (the generation below it)."""
    return list(ATTENTION_GPU_CONFIGS[90 if arch >= 90 else 80 if arch >= 80 else 75][kind])

# Triton picks interpreter or compiler when imported: env.import_triton() switches to the
# interpreter on the CPU tier first, as setup() does.
triton, tl = import_triton()

if triton is not None:

    @triton.jit
    def attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n, offs_d, seqlen_k,
                            stride_kn, stride_vn, scale_log2e,
                            CAUSAL_TILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
        # One key block of eq. (7) for a (BLOCK_M, HEAD_DIM) query tile; returns the updated (m, l, acc).
        cols = start_n + offs_n  # (BLOCK_N,)
        n_ok = cols < seqlen_k  # ragged last key block
        kt = tl.load(k_base + cols[None, :] * stride_kn + offs_d[:, None],
                     mask=n_ok[None, :], other=0.0)  # (HEAD_DIM, BLOCK_N) = K^T tile
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale_log2e  # (BLOCK_M, BLOCK_N), eq. (1) in log2 units
        keep = n_ok[None, :]
        if CAUSAL_TILE:  # only tiles that straddle the diagonal pay for the causal mask
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # eq. (7); finite: key 0 is visible to every row
        alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :],
                    mask=n_ok[:, None], other=0.0)  # (BLOCK_N, HEAD_DIM)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def flash_attention_fwd_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
        stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
        seqlen_q, seqlen_k, scale_log2e,
        CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        DOT_PRECISION: tl.constexpr, GROUP: tl.constexpr = 1,
    ):
        # grid = (cdiv(L_q, BLOCK_M), B*H_q): one program per block of query rows of one head.
        start_m = tl.program_id(0)
        head = tl.program_id(1)
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows
        offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key columns within a block
        offs_d = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
        m_ok = offs_m < seqlen_q  # ragged last query block
        q = tl.load(q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=m_ok[:, None], other=0.0)  # (BLOCK_M, HEAD_DIM), read once, kept on chip
        kv_head = head // GROUP  # GQA: GROUP consecutive query heads read one key/value head
        k_base, v_base = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
        # fp32 accumulators; float64 inputs (gradcheck) keep float64 ones, or the loop would change their type
        ACC = tl.float64 if q_ptr.dtype.element_ty == tl.float64 else tl.float32
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=ACC)  # running max, base-2 units
        l_i = tl.zeros((BLOCK_M,), dtype=ACC)  # running sum
        acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=ACC)  # unnormalised output
        # Stage 1: key blocks every row of this query block sees in full (all of them without a causal mask).
        lo = seqlen_k
        if CAUSAL:
            lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # blocks wholly left of the diagonal
        for start_n in range(0, lo, BLOCK_N):
            m_i, l_i, acc = attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n, offs_d,
                                                seqlen_k, stride_kn, stride_vn, scale_log2e, False, DOT_PRECISION)
        # Stage 2 (causal): the blocks that straddle the diagonal (BLOCK_M / BLOCK_N of them when BLOCK_M >= BLOCK_N),
        # masked; blocks right of it are never loaded.
        if CAUSAL:
            hi = tl.minimum((start_m + 1) * BLOCK_M, seqlen_k)
            for start_n in range(lo, hi, BLOCK_N):
                m_i, l_i, acc = attention_tile_step(q, m_i, l_i, acc, k_base, v_base, start_n, offs_m, offs_n,
                                                    offs_d, seqlen_k, stride_kn, stride_vn, scale_log2e, True,
                                                    DOT_PRECISION)
        acc = acc / l_i[:, None]
        lse = (m_i + tl.log2(l_i)) / 1.4426950408889634  # eq. (8), back to natural log
        tl.store(lse_ptr + head * seqlen_q + offs_m, lse.to(lse_ptr.dtype.element_ty), mask=m_ok)
        tl.store(o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 acc.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])
else:  # pragma: no cover
    attention_tile_step = flash_attention_fwd_kernel = None


def _check_shapes(q, k, v, causal):
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q (B, H_q, L_q, D) and k, v (B, H_kv, L_k, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"H_q={q.shape[1]} query heads cannot share H_kv={k.shape[1]} key/value heads evenly")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError("causal attention here needs L_q == L_k")


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           scale: float | None = None, block_m: int = 16, block_n: int = 16,
                           num_warps: int | None = None, num_stages: int | None = None):
    """Rung 5: launch :func:`flash_attention_fwd_kernel` on ``(B, H, L, D)`` tensors; returns ``(o, lse)``.

    ``k``, ``v`` may have fewer heads than ``q`` (grouped-query attention: ``H_kv`` divides ``H_q``, and
    query head ``h`` reads key/value head ``h // (H_q / H_kv)``, as ``scaled_dot_product_attention(...,
    enable_gqa=True)``). ``lse`` is fp32 ``(B, H_q, L_q)``. fp32 inputs use an exact (``ieee``) ``tl.dot``; on a
    GPU pass bf16/fp16 (the interpreter's bf16 is wrong, so use fp32 on a CPU). ``D`` and the blocks are
    powers of two >= 16. ``num_warps`` / ``num_stages`` are passed to the compiled launch on a GPU.
    """
    if triton is None:  # pragma: no cover - macOS, Windows, Arm Linux; env.needs_triton turns this into a notice
        raise TritonUnavailable(TRITON_MISSING.format(what="the Triton FlashAttention kernel"))
    _check_shapes(q, k, v, causal)
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    for name, n in (("head dim", d), ("block_m", block_m), ("block_n", block_n)):
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name}={n}: use a power of two >= 16 (tl.arange and tl.dot need it)")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"unsupported dtype {q.dtype}: pass float32, bfloat16, float16 (or float64 for gradcheck)")
    if q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16):
        raise TypeError("under the interpreter compute in fp32: its bf16/fp16 results are wrong")
    if max(q.numel(), k.numel()) >= 2 ** 31:
        raise ValueError("tensors too large for the kernel's int32 offsets")
    q3 = q.contiguous().view(b * hq, lq, d)  # (B*H_q, L_q, D)
    k3, v3 = (t.contiguous().view(b * hkv, lk, d) for t in (k, v))  # (B*H_kv, L_k, D)
    o = torch.empty_like(q3)
    lse = torch.empty((b * hq, lq), device=q.device, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    grid = (triton.cdiv(lq, block_m), b * hq)
    launch = {key: val for key, val in (("num_warps", num_warps), ("num_stages", num_stages)) if val is not None}
    flash_attention_fwd_kernel[grid](
        q3, k3, v3, o, lse,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1), o.stride(0), o.stride(1),
        lq, lk, _scale(d, scale) * LOG2E,
        CAUSAL=causal, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",  # tf32: ignored for 16-bit
        GROUP=hq // hkv, **launch,
    )
    return o.view(b, hq, lq, d), lse.view(b, hq, lq)


# ---------------------------------------------------------------- rung 6: autograd wiring
def _kernel_ok(q) -> bool:
    d = q.shape[-1]
    return d >= 16 and not d & (d - 1) and triton is not None


class FlashAttentionFunction(torch.autograd.Function):
    """Forward: the Triton kernel (saves only Q, K, V, O and the lse). Backward: the Triton backward of
    :mod:`course_utils.attention_triton_backward` (delta pre-pass, dK/dV kernel, dQ kernel).

    float64 (``gradcheck``): the forward is the same algorithm in torch (rung 4), the backward the Triton
    kernels on float64 tiles with float64 accumulators (fp32 ones would not compile as loop-carried values). A head dim the kernels do not take falls
    back to the tiled torch backward. GQA: ``k``, ``v`` with ``H_kv`` dividing ``H_q`` heads.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, block_m=16, block_n=16, launch=None):
        _check_shapes(q, k, v, causal)
        launch = dict(launch or {})
        if _kernel_ok(q) and q.dtype != torch.float64:
            o, lse = flash_attention_triton(q, k, v, causal, scale, block_m, block_n, launch.get("num_warps"),
                                            launch.get("num_stages"))
        else:  # float64 (gradcheck) or a head dim the kernel does not take: the same algorithm in torch
            group = q.shape[1] // k.shape[1]
            o, lse = flash_attention_forward_numpy(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                                   causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = (causal, scale, launch.get("bwd_block_m", block_m), launch.get("bwd_block_n", block_n),
                      launch.get("bwd_num_warps"), launch.get("bwd_num_stages"))
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale, block_m, block_n, warps, stages = ctx.config
        if _kernel_ok(q):
            dq, dk, dv = flash_attention_backward_triton(q, k, v, o, lse, do, causal, scale, block_m, block_n,
                                                         warps, stages)
            return dq, dk, dv, None, None, None, None, None
        group = q.shape[1] // k.shape[1]  # pragma: no cover - head dims the kernels do not take
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        dq, dk, dv = flash_attention_backward_tiles(
            *(t.to(work) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), o)),
            lse.to(work), do.to(work), causal, scale, block_m, block_n)
        dk, dv = (g.unflatten(1, (k.shape[1], group)).sum(2) for g in (dk, dv))  # GQA: sum over the group
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, block_m: int = 16, block_n: int = 16,
                    launch: dict | None = None):
    """Differentiable FlashAttention on ``(B, H, L, D)`` tensors (see :class:`FlashAttentionFunction`).

    ``k``, ``v`` may have ``H_kv`` heads dividing ``q``'s ``H_q`` (GQA/MQA). ``launch`` (GPU tuning) may hold
    ``num_warps``, ``num_stages`` (forward) and ``bwd_block_m``, ``bwd_block_n``, ``bwd_num_warps``,
    ``bwd_num_stages`` (backward).
    """
    return FlashAttentionFunction.apply(q, k, v, causal, scale, block_m, block_n, launch)


# ---------------------------------------------------------------- the kernel compiled for a GPU, without one
_FWD_ARGS = ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "stride_qh", "stride_qm", "stride_kh", "stride_kn",
             "stride_vh", "stride_vn", "stride_oh", "stride_om", "seqlen_q", "seqlen_k", "scale_log2e"]
_BWD_STRIDES = ["stride_qh", "stride_qm", "stride_kh", "stride_kn", "stride_vh", "stride_vn", "stride_doh", "stride_dom"]
_DKDV_ARGS = (["q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dk_ptr", "dv_ptr"] + _BWD_STRIDES
              + ["stride_dkh", "stride_dkn", "stride_dvh", "stride_dvn", "seqlen_q", "seqlen_k", "scale"])
_DQ_ARGS = (["q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dq_ptr"] + _BWD_STRIDES
            + ["stride_dqh", "stride_dqm", "seqlen_q", "seqlen_k", "scale"])


def _signature(kernel: str, dtype: str) -> tuple[list[str], dict[str, str]]:
    """Argument names and Triton types of one of the course's attention kernels (``fwd``, ``dkdv``, ``dq``)."""
    stats = "*fp64" if dtype == "fp64" else "*fp32"  # lse and delta: fp32, float64 under gradcheck
    if kernel == "fwd":
        return _FWD_ARGS, dict(zip(_FWD_ARGS, [f"*{dtype}"] * 4 + [stats] + ["i32"] * 10 + ["fp32"]))
    names = _DKDV_ARGS if kernel == "dkdv" else _DQ_ARGS
    ptrs = [n for n in names if n.endswith("_ptr")]
    types = {n: stats if n in ("lse_ptr", "delta_ptr") else f"*{dtype}" for n in ptrs}
    types.update({n: "i32" for n in names if n.startswith(("stride", "seqlen"))}, scale="fp32")
    return names, types


def _compile_here(arch: int, kernel: str = "fwd", causal: bool = True, head_dim: int = 128, block_m: int = 128,
                  block_n: int = 64, num_warps: int = 8, num_stages: int = 3, dtype: str = "bf16", group: int = 1):
    from .attention_triton_backward import flash_attention_bwd_dkdv_kernel, flash_attention_bwd_dq_kernel
    from .gpu_compile import compile_for

    fn = {"fwd": flash_attention_fwd_kernel, "dkdv": flash_attention_bwd_dkdv_kernel,
          "dq": flash_attention_bwd_dq_kernel}[kernel]
    names, signature = _signature(kernel, dtype)
    constexprs = {"CAUSAL": causal, "HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n,
                  "DOT_PRECISION": "ieee" if dtype in ("fp32", "fp64") else "tf32", "GROUP": group}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    divisible = [n for n in names if n.endswith("_ptr") or n.startswith("stride")]  # aligned, multiples of 16
    return compile_for(fn, arch=arch, signature=signature, constexprs=constexprs, divisible=divisible,
                       num_warps=num_warps, num_stages=num_stages, sass=False)


def compile_attention_kernels(configs: list[dict]) -> list:
    """Compile the course's attention kernels for GPUs this machine may not have (``course_utils.gpu_compile``).

    Each config holds ``arch`` (80, 90, ...), ``kernel`` (``"fwd"``, ``"dkdv"`` or ``"dq"``; default ``"fwd"``)
    and optionally ``causal``, ``head_dim``, ``block_m``, ``block_n``, ``num_warps``, ``num_stages``, ``group``
    and ``dtype`` (``"bf16"``); returns one ``gpu_compile.Compiled`` per config (registers, spills, shared
    memory, ``mma.sync``/``wgmma``...). Under Triton's interpreter (the CPU tier) all configs compile in one
    fresh process that selects the compiler, since ``compile_for`` cannot compile a kernel that calls a
    ``@triton.jit`` helper while the interpreter is on.
    """
    if triton is None:
        raise TritonUnavailable(TRITON_MISSING.format(what="compiling the Triton FlashAttention kernels"))
    from triton import knobs

    if not knobs.runtime.interpret:
        return [_compile_here(**config) for config in configs]
    root = str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    code = ("import pickle, sys\nfrom course_utils.attention_triton import _compile_here\n"
            "configs = pickle.loads(sys.stdin.buffer.read())\n"
            "sys.stdout.buffer.write(pickle.dumps([_compile_here(**c) for c in configs]))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(list(configs)), capture_output=True,
                         env=env, timeout=900)
    if out.returncode != 0:
        lines = out.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"compiling the attention kernels failed: {lines[-1] if lines else out.returncode}")
    return pickle.loads(out.stdout)


def compile_attention_forward(configs: list[dict]) -> list:
    """:func:`compile_attention_kernels` for the forward kernel (each config's ``kernel`` defaults to ``"fwd"``)."""
    return compile_attention_kernels([{"kernel": "fwd", **config} for config in configs])
