r"""Topic 03 (convolution), the lesson library: sizes, the NumPy rungs, im2col/col2im and the Triton kernel.

Used by:

* ``notebooks/03_convolution.ipynb`` -- writes every rung by hand (``conv2d_loops``, ...), then asserts
  that it equals the function of the same role here;
* ``notebooks/04_upsampling.ipynb`` -- :func:`im2col`, :func:`col2im` (its adjoint) and :func:`conv_output_size`
  for the transposed convolution;
* ``benchmarks/conv_cpu.py`` -- the rungs side by side against ``torch.nn.functional.conv2d``;
* ``course_utils.grading.convolution`` -- the problem set's references.

Goto's blocked GEMM (rung 4) lives in :mod:`course_utils.convolution_blocking`; FLOP counts in
:func:`course_utils.bench.conv2d_flops`.

Conventions (the same as ``torch.nn.functional.conv2d``): input ``x`` is NCHW ``(N, C_in, H, W)``,
weight ``w`` is ``(C_out, C_in, KH, KW)``, and the operation is a *cross-correlation* (the kernel is
not flipped). Output size per spatial axis (lesson 03, eq. 2):

.. math:: H_{out} = \left\lfloor \frac{H + 2p - d\,(K - 1) - 1}{s} \right\rfloor + 1

As a GEMM (lesson 03, eq. 3): ``W`` viewed as ``(C_out, C_in*KH*KW)`` times the column matrix
``(C_in*KH*KW, N*H_out*W_out)`` whose rows are ordered ``(c_in, kh, kw)`` and columns ``(n, oh, ow)``:
the one im2col contract of the course (``F.unfold`` has the same rows, per sample).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .env import TritonUnavailable, import_triton

__all__ = [
    "conv_output_size",
    "conv2d_naive",
    "conv2d_vectorized",
    "im2col_view",
    "im2col",
    "col2im",
    "conv2d_im2col",
    "conv2d_implicit_gemm_kernel",
    "conv2d_triton",
]


# ---------------------------------------------------------------- sizes
def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Output length along one spatial axis (eq. 2): ``(size + 2p - d(k-1) - 1) // s + 1``."""
    span = dilation * (kernel - 1) + 1  # the receptive field of one output element
    if size + 2 * padding < span:
        raise ValueError(f"the dilated kernel (span {span}) is larger than the padded input ({size + 2 * padding})")
    return (size + 2 * padding - span) // stride + 1


def _pad(x: np.ndarray, padding: int) -> np.ndarray:
    """Zero-pad the two spatial axes of an NCHW array on both sides."""
    if padding == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))


# ---------------------------------------------------------------- rung 1: loops
def conv2d_naive(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Rung 1: seven nested Python loops, one multiply-add per innermost iteration. Tiny inputs only."""
    n_batch, c_in, h, wd = x.shape
    c_out, _, kh, kw = w.shape
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    xp = _pad(x, padding)
    out = np.zeros((n_batch, c_out, oh, ow), dtype=x.dtype)
    for n in range(n_batch):
        for co in range(c_out):
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(c_in):
                        for p in range(kh):
                            for q in range(kw):
                                acc += xp[n, ci, i * stride + p * dilation, j * stride + q * dilation] * w[co, ci, p, q]
                    out[n, co, i, j] = acc
    return out


# ---------------------------------------------------------------- rung 2: vectorized inner loops
def conv2d_vectorized(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """Rung 2: loops over output pixels only; the (c_out, c_in, kh, kw) loops become one tensordot."""
    n_batch, c_in, h, wd = x.shape
    c_out, _, kh, kw = w.shape
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    xp = _pad(x, padding)
    out = np.empty((n_batch, c_out, oh, ow), dtype=x.dtype)
    span_h, span_w = dilation * (kh - 1) + 1, dilation * (kw - 1) + 1
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + span_h:dilation, j * stride:j * stride + span_w:dilation]  # (N, C_in, KH, KW)
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))  # (N, C_out)
    return out


# ---------------------------------------------------------------- rung 3: im2col + one GEMM
def im2col_view(x: np.ndarray, kh: int, kw: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """A read-only strided view ``(N, C_in, KH, KW, H_out, W_out)`` of the padded input; no copy of the windows.

    ``view[n, c, p, q, i, j] == x_padded[n, c, i*s + p*d, j*s + q*d]`` (eq. 4): the kernel axes step
    ``d`` rows/columns, the output axes step ``s`` rows/columns.
    """
    xp = np.ascontiguousarray(_pad(x, padding))
    n_batch, c_in, hp, wp = xp.shape
    oh, ow = conv_output_size(hp, kh, stride, 0, dilation), conv_output_size(wp, kw, stride, 0, dilation)
    sn, sc, sh, sw = xp.strides  # bytes
    shape = (n_batch, c_in, kh, kw, oh, ow)
    strides = (sn, sc, dilation * sh, dilation * sw, stride * sh, stride * sw)
    return np.lib.stride_tricks.as_strided(xp, shape=shape, strides=strides, writeable=False)


def im2col(x: np.ndarray, kh: int, kw: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> np.ndarray:
    """The column matrix ``(C_in*KH*KW, N*H_out*W_out)``, rows ordered ``(c_in, kh, kw)``, columns ``(n, oh, ow)``."""
    view = im2col_view(x, kh, kw, stride, padding, dilation)  # (N, C_in, KH, KW, OH, OW)
    n_batch, c_in, _, _, oh, ow = view.shape
    cols = view.transpose(1, 2, 3, 0, 4, 5)  # (C_in, KH, KW, N, OH, OW)
    return cols.reshape(c_in * kh * kw, n_batch * oh * ow)  # the copy: KH*KW times the input's size


def col2im(cols: np.ndarray, x_shape: tuple, kh: int, kw: int, stride: int = 1, padding: int = 0,
           dilation: int = 1) -> np.ndarray:
    """The adjoint of :func:`im2col`: scatter-ADD each column back onto its window, ``-> x_shape (N, C, H, W)``.

    ``cols`` is ``(C*KH*KW, N*OH*OW)`` in :func:`im2col`'s order. Where windows overlap, contributions
    add up; entries that land in the padding are dropped (like ``F.fold``, per sample). One strided slice
    addition per kernel tap ``(p, q)``: tap ``(p, q)`` of the output pixels ``(i, j)`` lands on padded rows
    ``i*s + p*d`` -- no two output pixels share a tap position, so each addition is collision-free.
    """
    n_batch, c_in, h, wd = x_shape
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    taps = cols.reshape(c_in, kh, kw, n_batch, oh, ow).transpose(3, 0, 1, 2, 4, 5)  # (N, C, KH, KW, OH, OW)
    xp = np.zeros((n_batch, c_in, h + 2 * padding, wd + 2 * padding), dtype=cols.dtype)
    for p in range(kh):
        for q in range(kw):
            r0, c0 = p * dilation, q * dilation
            xp[:, :, r0:r0 + (oh - 1) * stride + 1:stride, c0:c0 + (ow - 1) * stride + 1:stride] += taps[:, :, p, q]
    return xp[:, :, padding:padding + h, padding:padding + wd]


def conv2d_im2col(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
                  matmul: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul) -> np.ndarray:
    """Rung 3 (and, with ``matmul=`` Goto's blocked GEMM, rung 4): ``W (C_out, K) @ cols (K, N*OH*OW)`` (eq. 3)."""
    n_batch, _, h, wd = x.shape
    c_out, c_in, kh, kw = w.shape
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    cols = im2col(x, kh, kw, stride, padding, dilation)  # (C_in*KH*KW, N*OH*OW)
    out = matmul(w.reshape(c_out, c_in * kh * kw), cols)  # (C_out, N*OH*OW)
    return np.ascontiguousarray(out.reshape(c_out, n_batch, oh, ow).transpose(1, 0, 2, 3))  # (N, C_out, OH, OW)


# Triton picks interpreter or compiler when imported: env.import_triton() switches to the
# interpreter on the CPU tier first, as setup() does.
triton, tl = import_triton()

if triton is not None:

    def conv2d_implicit_gemm_kernel(
        x_ptr, w_ptr, out_ptr,
        N, C_IN, H, W, C_OUT, OH, OW,
        stride, padding, dilation,
        KH: tl.constexpr, KW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        # GEMM view (eq. 9): rows m = (n, oh, ow), columns = c_out, reduction k = (c_in, kh, kw).
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) output pixels
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) output channels
        m_ok = offs_m < N * OH * OW
        n_ok = offs_n < C_OUT
        n_idx = offs_m // (OH * OW)
        oh = (offs_m // OW) % OH
        ow = offs_m % OW
        K_TOTAL = C_IN * KH * KW
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K_TOTAL, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
            k_ok = offs_k < K_TOTAL
            ci = offs_k // (KH * KW)
            kh = (offs_k // KW) % KH
            kw = offs_k % KW
            ih = oh[:, None] * stride - padding + kh[None, :] * dilation  # (BLOCK_M, BLOCK_K)
            iw = ow[:, None] * stride - padding + kw[None, :] * dilation
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)  # zero padding = masked load
            a_mask = m_ok[:, None] & k_ok[None, :] & inside
            a_off = ((n_idx[:, None] * C_IN + ci[None, :]) * H + ih) * W + iw
            a = tl.load(x_ptr + a_off, mask=a_mask, other=0.0)  # (BLOCK_M, BLOCK_K), gathered, never stored
            b_off = offs_n[None, :] * K_TOTAL + offs_k[:, None]  # w viewed as (C_OUT, K_TOTAL)
            b = tl.load(w_ptr + b_off, mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_N)
            acc += tl.dot(a, b, input_precision="ieee")
        out_off = ((n_idx[:, None] * C_OUT + offs_n[None, :]) * OH + oh[:, None]) * OW + ow[:, None]
        tl.store(out_ptr + out_off, acc, mask=m_ok[:, None] & n_ok[None, :])

_JITTED = {}


def _jitted_kernel():
    """``triton.jit`` the kernel on first use (interpreted or compiled as decided at import, see above)."""
    if "kernel" not in _JITTED:
        _JITTED["kernel"] = triton.jit(conv2d_implicit_gemm_kernel)
    return _JITTED["kernel"]


def conv2d_triton(x: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0, dilation: int = 1,
                  block_m: int = 32, block_n: int = 16, block_k: int = 16) -> torch.Tensor:
    """Rung 6: :func:`conv2d_implicit_gemm_kernel` on contiguous fp32 NCHW tensors (interpreter on a CPU).

    Block sizes must be powers of two and at least 16 (``tl.dot``'s minimum on a GPU).
    """
    if triton is None:  # pragma: no cover
        raise TritonUnavailable("Triton is not installed on this machine: cv.conv2d_triton needs it")
    if x.dtype != torch.float32 or w.dtype != torch.float32:
        raise TypeError("conv2d_triton computes in fp32 (the interpreter's bf16 is wrong); pass float32 tensors")
    for name, b in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name}={b}: use a power of two >= 16 (tl.dot needs every dimension >= 16 on a GPU)")
    x, w = x.contiguous(), w.contiguous()
    n, c_in, h, wd = x.shape
    c_out, c_in_w, kh, kw = w.shape
    if c_in_w != c_in:
        raise ValueError(f"weight expects {c_in_w} input channels, x has {c_in}")
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    out = torch.empty((n, c_out, oh, ow), device=x.device, dtype=torch.float32)
    if n * c_out * oh * ow >= 2 ** 31 or x.numel() >= 2 ** 31:
        raise ValueError("tensor too large for the kernel's int32 offsets")
    grid = (triton.cdiv(n * oh * ow, block_m), triton.cdiv(c_out, block_n))
    _jitted_kernel()[grid](
        x, w, out, n, c_in, h, wd, c_out, oh, ow, stride, padding, dilation,
        KH=kh, KW=kw, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


