r"""Topic 03 (convolution): from six nested loops to a blocked GEMM and an implicit-GEMM Triton kernel.

Used by:

* ``notebooks/03_convolution.ipynb`` -- derives every function here rung by rung (naive loops,
  vectorized inner loops, im2col + one GEMM, Goto-style blocked GEMM, the Triton kernel), then
  imports them from this module;
* ``solutions/03_convolution.ipynb`` -- the ``check_*`` functions of its exercises;
* ``benchmarks/conv_cpu.py`` -- the rungs side by side against ``torch.nn.functional.conv2d``.

Helpers meant for later lessons: :func:`conv_output_size`, :func:`conv2d_flops`, :func:`im2col_view`,
:func:`im2col` (rows ``(c_in, kh, kw)``, columns ``(n, oh, ow)``) and :func:`blocked_matmul`.

Conventions (the same as ``torch.nn.functional.conv2d``): input ``x`` is NCHW ``(N, C_in, H, W)``,
weight ``w`` is ``(C_out, C_in, KH, KW)``, and the operation is a *cross-correlation* (the kernel is
not flipped). Output size per spatial axis (lesson 03, eq. 1):

.. math:: H_{out} = \left\lfloor \frac{H + 2p - d\,(K - 1) - 1}{s} \right\rfloor + 1

As a GEMM (lesson 03, eq. 3): ``W`` viewed as ``(C_out, C_in*KH*KW)`` times the column matrix
``(C_in*KH*KW, N*H_out*W_out)`` whose rows are ordered ``(c_in, kh, kw)``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from .checks import CheckFailed, Mistake, check_function, check_value
from .env import import_triton

__all__ = [
    "conv_output_size",
    "conv2d_flops",
    "conv2d_naive",
    "conv2d_vectorized",
    "im2col",
    "im2col_view",
    "conv2d_im2col",
    "cache_sizes",
    "goto_block_sizes",
    "pack_a",
    "pack_b",
    "blocked_matmul",
    "conv2d_blocked",
    "conv2d_implicit_gemm_kernel",
    "conv2d_triton",
    "check_conv_output_shape",
    "check_im2col_nhwc",
    "check_conv2d_grouped",
    "check_conv2d_grad_weight",
    "check_conv2d_grad_input",
    "check_conv1x1",
    "check_column_bytes",
]


# ---------------------------------------------------------------- sizes and FLOPs
def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """Output length along one spatial axis (eq. 1): ``(size + 2p - d(k-1) - 1) // s + 1``."""
    span = dilation * (kernel - 1) + 1  # the receptive field of one output element
    if size + 2 * padding < span:
        raise ValueError(f"the dilated kernel (span {span}) is larger than the padded input ({size + 2 * padding})")
    return (size + 2 * padding - span) // stride + 1


def conv2d_flops(x_shape, w_shape, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """FLOPs of a dense 2-D convolution (eq. 2): ``2 N C_out H_out W_out C_in KH KW``."""
    n, c_in, h, w = x_shape
    c_out, _, kh, kw = w_shape
    oh = conv_output_size(h, kh, stride, padding, dilation)
    ow = conv_output_size(w, kw, stride, padding, dilation)
    return 2 * n * c_out * oh * ow * c_in * kh * kw


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


def conv2d_im2col(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
                  matmul: Callable[[np.ndarray, np.ndarray], np.ndarray] = np.matmul) -> np.ndarray:
    """Rung 3 (and, with ``matmul=blocked_matmul``, rung 4): ``W (C_out, K) @ cols (K, N*OH*OW)`` (eq. 3)."""
    n_batch, _, h, wd = x.shape
    c_out, c_in, kh, kw = w.shape
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(wd, kw, stride, padding, dilation)
    cols = im2col(x, kh, kw, stride, padding, dilation)  # (C_in*KH*KW, N*OH*OW)
    out = matmul(w.reshape(c_out, c_in * kh * kw), cols)  # (C_out, N*OH*OW)
    return np.ascontiguousarray(out.reshape(c_out, n_batch, oh, ow).transpose(1, 0, 2, 3))  # (N, C_out, OH, OW)


# ---------------------------------------------------------------- rung 4: Goto's blocked GEMM
# Used when /sys does not say (a typical desktop core); the lesson prints which source it used.
FALLBACK_CACHES = {"L1d": 32 * 1024, "L2": 1024 * 1024, "L3": 8 * 1024 * 1024}


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_sizes(root: str | os.PathLike = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """Data-cache sizes in bytes, ``{"L1d", "L2", "L3", "source"}``, read from Linux's sysfs.

    Missing levels (another OS, a container hiding /sys) fall back to :data:`FALLBACK_CACHES`, and
    ``source`` says which values were read and which were assumed.
    """
    found: dict[str, int] = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        found["L1d" if level == 1 else f"L{level}"] = size
    out = {k: found.get(k, v) for k, v in FALLBACK_CACHES.items()}
    missing = [k for k in FALLBACK_CACHES if k not in found]
    out["source"] = "sysfs" if not missing else ("fallback" if len(missing) == 3 else f"sysfs, fallback for {', '.join(missing)}")
    return out


def goto_block_sizes(caches: dict, itemsize: int = 4, mr: int = 8, nr: int = 8) -> dict:
    r"""Block sizes from cache sizes (eq. 5): half of each cache holds the block that lives there.

    * ``kc``: an A micro-panel (mr x kc) and a B micro-panel (kc x nr) fit in half of L1;
    * ``mc``: the packed A block (mc x kc) fits in half of L2;
    * ``nc``: the packed B panel (kc x nc) fits in half of L3.

    Each is rounded down to a multiple of 16 (``kc``), ``mr`` (``mc``) or ``nr`` (``nc``).
    """
    kc = max(16, (caches["L1d"] // 2) // ((mr + nr) * itemsize) // 16 * 16)
    mc = max(mr, (caches["L2"] // 2) // (kc * itemsize) // mr * mr)
    nc = max(nr, (caches["L3"] // 2) // (kc * itemsize) // nr * nr)
    return {"mc": int(mc), "kc": int(kc), "nc": int(nc), "mr": mr, "nr": nr}


def pack_a(a_block: np.ndarray, mr: int) -> np.ndarray:
    """``(mc, kc) -> (ceil(mc/mr), kc, mr)``: row micro-panels, each stored k-major and contiguous, zero-padded."""
    mc, kc = a_block.shape
    panels = -(-mc // mr)
    buf = np.zeros((panels * mr, kc), dtype=a_block.dtype)
    buf[:mc] = a_block
    return np.ascontiguousarray(buf.reshape(panels, mr, kc).transpose(0, 2, 1))  # (panels, kc, mr)


def pack_b(b_block: np.ndarray, nr: int) -> np.ndarray:
    """``(kc, nc) -> (ceil(nc/nr), kc, nr)``: column micro-panels, each contiguous, zero-padded."""
    kc, nc = b_block.shape
    panels = -(-nc // nr)
    buf = np.zeros((kc, panels * nr), dtype=b_block.dtype)
    buf[:, :nc] = b_block
    return np.ascontiguousarray(buf.reshape(kc, panels, nr).transpose(1, 0, 2))  # (panels, kc, nr)


def blocked_matmul(a: np.ndarray, b: np.ndarray, mc: int = 64, kc: int = 256, nc: int = 1024,
                   mr: int = 8, nr: int = 8) -> np.ndarray:
    """Goto's five loops around a micro-kernel, in NumPy so the structure is visible (rung 4).

    Loop order: ``jc`` (nc columns of B, L3) > ``pc`` (kc-deep slice, packs B) > ``ic`` (mc rows of A,
    L2, packs A) > ``jr`` (nr columns, a B micro-panel in L1) > ``ir`` (mr rows): the micro-kernel
    updates one ``mr x nr`` tile of C, which a compiled kernel keeps in registers.
    """
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    c = np.zeros((m, n), dtype=np.result_type(a, b))
    for jc in range(0, n, nc):
        ncur = min(nc, n - jc)
        for pc in range(0, k, kc):
            b_packed = pack_b(b[pc:pc + kc, jc:jc + ncur], nr)  # (nc/nr, kc, nr)
            for ic in range(0, m, mc):
                mcur = min(mc, m - ic)
                a_packed = pack_a(a[ic:ic + mcur, pc:pc + kc], mr)  # (mc/mr, kc, mr)
                c_block = np.zeros((a_packed.shape[0] * mr, b_packed.shape[0] * nr), dtype=c.dtype)
                for jr in range(b_packed.shape[0]):
                    b_panel = b_packed[jr]  # (kc, nr)
                    for ir in range(a_packed.shape[0]):
                        # micro-kernel: sum over p of outer(a_panel[p], b_panel[p]) into an mr x nr tile
                        c_block[ir * mr:(ir + 1) * mr, jr * nr:(jr + 1) * nr] += a_packed[ir].T @ b_panel
                c[ic:ic + mcur, jc:jc + ncur] += c_block[:mcur, :ncur]
    return c


def conv2d_blocked(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
                   **blocks: int) -> np.ndarray:
    """Rung 4: im2col, then :func:`blocked_matmul` with the given ``mc, kc, nc, mr, nr``."""
    return conv2d_im2col(x, w, stride, padding, dilation, matmul=lambda a, b: blocked_matmul(a, b, **blocks))


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
        # GEMM view (eq. 6): rows m = (n, oh, ow), columns = c_out, reduction k = (c_in, kh, kw).
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
        raise RuntimeError("triton is not installed")
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


# ================================================================ problem-set checks
def _torch_conv(x, w, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d on NumPy arrays, returning a NumPy array of x's dtype."""
    out = F.conv2d(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(w)),
                   stride=stride, padding=padding, dilation=dilation, groups=groups)
    return out.numpy()


def _flip(w):
    return np.ascontiguousarray(w[..., ::-1, ::-1])


# ---------------------------------------------------------------- exercise 1: output shape
def _reference_output_shape(hw, kernel, stride, padding, dilation):
    return tuple(conv_output_size(hw[a], kernel[a], stride[a], padding[a], dilation[a]) for a in range(2))


def check_conv_output_shape(conv_output_shape: Callable, *, trials: int = 6, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 1: ``(hw, kernel, stride, padding, dilation)``, each an ``(H-axis, W-axis)`` pair -> ``(H_out, W_out)``."""

    def make_inputs(rng):
        pair = lambda lo, hi: (int(rng.integers(lo, hi)), int(rng.integers(lo, hi)))  # noqa: E731
        while True:  # draw until the reference and every mistake disagree, so each mistake is named exactly
            stride = pair(2, 4)
            if stride[0] == stride[1]:
                stride = (stride[0], stride[0] + 1)  # different per axis, so swapped axes show
            args = (pair(20, 40), pair(2, 6), stride, pair(1, 3), pair(2, 4))
            answers = [_reference_output_shape(*args)] + [m.fn(*args) for m in mistakes]
            if len(set(answers)) == len(answers):
                return args

    def size_with(formula, swap=False):
        def fn(hw, k, s, p, d):
            b = (1, 0) if swap else (0, 1)
            return tuple(formula(hw[a], k[a], s[b[a]], p[a], d[a]) for a in range(2))
        return fn

    right = lambda n, k, s, p, d: (n + 2 * p - d * (k - 1) - 1) // s + 1  # noqa: E731
    mistakes = [
        Mistake("no_dilation", "you forgot the dilation: a dilated kernel spans d*(K-1)+1 pixels, so subtract "
                "d*(K-1)+1, not K.", size_with(lambda n, k, s, p, d: (n + 2 * p - k) // s + 1)),
        Mistake("one_side", "you padded one side only: padding adds p pixels at both ends, so use n + 2*p.",
                size_with(lambda n, k, s, p, d: (n + p - d * (k - 1) - 1) // s + 1)),
        Mistake("no_plus_one", "off by one: count the first window too, (n + 2p - d(K-1) - 1) // s + 1.",
                size_with(lambda n, k, s, p, d: (n + 2 * p - d * (k - 1) - 1) // s)),
        Mistake("ceil", "you rounded up: a window that would run past the padded input is dropped, so use floor "
                "division //.", size_with(lambda n, k, s, p, d: -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1)),
        Mistake("swapped", "you mixed up the axes: use stride[0], padding[0], ... for H and index 1 for W.",
                size_with(right, swap=True)),
    ]

    def as_tuple(*args):
        got = conv_output_shape(*args)
        if isinstance(got, (list, np.ndarray, torch.Size)):
            got = tuple(got)
        if isinstance(got, tuple):
            if any(isinstance(v, (float, np.floating)) for v in got):
                raise CheckFailed("conv_output_shape: sizes must be ints; use floor division // instead of / "
                                  "(np.floor returns a float too), or convert with int().")
            got = tuple(int(v) if isinstance(v, (int, np.integer)) else v for v in got)
        return got

    check_function(as_tuple, _reference_output_shape, make_inputs, name="conv_output_shape", trials=trials,
                   seed=seed, mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 2: channels-last im2col
def _reference_im2col_nhwc(x, kh, kw, stride, padding):
    """``(N, H, W, C) -> (N*OH*OW, KH*KW*C)``, rows (n, oh, ow), columns (kh, kw, c)."""
    cols = im2col(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), kh, kw, stride, padding)  # (C*KH*KW, N*OH*OW)
    c = x.shape[3]
    return np.ascontiguousarray(cols.reshape(c, kh, kw, -1).transpose(3, 1, 2, 0).reshape(-1, kh * kw * c))


def check_im2col_nhwc(im2col_nhwc: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 2: channels-last im2col, the layout of implicit-GEMM kernels on NHWC tensors."""

    def make_inputs(rng):
        n, c = int(rng.integers(1, 3)), int(rng.integers(2, 5))
        h, w = int(rng.integers(6, 10)), int(rng.integers(6, 10))
        kh, kw = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        stride, padding = int(rng.integers(2, 3)), int(rng.integers(1, 3))
        return rng.standard_normal((n, h, w, c)).astype(np.float32), kh, kw, stride, padding

    def channel_major(x, kh, kw, s, p):  # columns ordered (c, kh, kw): the NCHW order of the lesson
        return im2col(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), kh, kw, s, p).T.copy()

    def one_side(x, kh, kw, s, p):
        xp = np.pad(x, ((0, 0), (p, 0), (p, 0), (0, 0)))
        return _reference_im2col_nhwc(xp, kh, kw, s, 0)

    def one_side_end(x, kh, kw, s, p):
        xp = np.pad(x, ((0, 0), (0, p), (0, p), (0, 0)))
        return _reference_im2col_nhwc(xp, kh, kw, s, 0)

    mistakes = [
        Mistake("channel_order", "wrong channel order in the column matrix: channels-last columns run (kh, kw, c) "
                "with c fastest, not (c, kh, kw).", channel_major),
        Mistake("transposed", "your matrix is transposed: rows are output pixels (n, oh, ow), columns are "
                "(kh, kw, c).", lambda *a: _reference_im2col_nhwc(*a).T.copy()),
        Mistake("no_stride", "you ignored the stride: consecutive output pixels start `stride` input pixels apart.",
                lambda x, kh, kw, s, p: _reference_im2col_nhwc(x, kh, kw, 1, p)),
        Mistake("one_side", "off-by-one padding: you padded only the top/left; pad p pixels on both sides of H and W.",
                one_side),
        Mistake("one_side_end", "off-by-one padding: you padded only the bottom/right; pad p pixels on both sides.",
                one_side_end),
        Mistake("no_padding", "you forgot the zero padding: pad H and W by p on both sides before taking windows.",
                lambda x, kh, kw, s, p: _reference_im2col_nhwc(x, kh, kw, s, 0)),
    ]
    check_function(im2col_nhwc, _reference_im2col_nhwc, make_inputs, name="im2col_nhwc", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 3: grouped convolution
def _reference_grouped(x, w, stride, padding, groups):
    return _torch_conv(x, w, stride, padding, 1, groups)


def check_conv2d_grouped(conv2d_grouped: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 3: ``groups``-way grouped convolution as one batched GEMM (depthwise when groups == C_in)."""

    def make_inputs(rng):
        groups = int(rng.choice([2, 3]))
        cig, cog = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        if rng.random() < 0.34:
            groups, cig, cog = 4, 1, 2  # depthwise with channel multiplier 2
        n, h = int(rng.integers(1, 3)), int(rng.integers(6, 10))
        x = rng.standard_normal((n, groups * cig, h, h + 1)).astype(np.float32)
        w = rng.standard_normal((groups * cog, cig, 3, 3)).astype(np.float32)
        return x, w, int(rng.integers(1, 3)), 1, groups

    def first_group_input(x, w, s, p, g):  # every group reads input group 0
        cig = x.shape[1] // g
        return _torch_conv(np.tile(x[:, :cig], (1, g, 1, 1)), w, s, p, 1, g)

    def interleaved(x, w, s, p, g):  # input channels dealt round-robin to groups
        cig = x.shape[1] // g
        order = np.arange(x.shape[1]).reshape(cig, g).T.reshape(-1)
        return _torch_conv(x[:, order], w, s, p, 1, g)

    def rows_interleaved(x, w, s, p, g):  # column-matrix rows dealt round-robin to groups
        kh, kw = w.shape[2:]
        cols = im2col(x, kh, kw, s, p)  # (C_in*KH*KW, N*OH*OW)
        out = np.matmul(w.reshape(g, w.shape[0] // g, -1), cols.reshape(-1, g, cols.shape[1]).transpose(1, 0, 2))
        oh, ow = conv_output_size(x.shape[2], kh, s, p), conv_output_size(x.shape[3], kw, s, p)
        return np.ascontiguousarray(out.reshape(w.shape[0], x.shape[0], oh, ow).transpose(1, 0, 2, 3))

    mistakes = [
        Mistake("flipped", "you flipped the kernel (true convolution); conv2d is a cross-correlation: use w as is.",
                lambda x, w, s, p, g: _reference_grouped(x, _flip(w), s, p, g)),
        Mistake("rows_interleaved", "wrong channel order in the column matrix: its rows run (c, kh, kw), so group k "
                "owns the contiguous rows k*R .. (k+1)*R - 1 with R = C_in/groups*KH*KW; reshape to (groups, R, -1).",
                rows_interleaved),
        Mistake("group0", "every group reads the first group's input channels: group g uses input channels "
                "g*C_in/groups to (g+1)*C_in/groups - 1.", first_group_input),
        Mistake("interleaved", "input channels are split round-robin; groups take contiguous blocks of "
                "C_in/groups channels (reshape (N, groups, C_in/groups, H, W)).", interleaved),
        Mistake("no_padding", "you forgot the padding: pad H and W by `padding` on both sides.",
                lambda x, w, s, p, g: _reference_grouped(x, w, s, 0, g)),
    ]
    # atol: fp32 sums of up to 18 products of size ~1 in another order than torch's; outputs near 0
    # cannot meet a relative tolerance. Every mistake above changes outputs by O(1).
    check_function(conv2d_grouped, _reference_grouped, make_inputs, name="conv2d_grouped", trials=trials, seed=seed,
                   atol=1e-4, mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercises 4 and 5: backward
def _autograd_grads(x, w, grad_out, stride, padding):
    xt = torch.from_numpy(np.ascontiguousarray(x)).requires_grad_(True)
    wt = torch.from_numpy(np.ascontiguousarray(w)).requires_grad_(True)
    out = F.conv2d(xt, wt, stride=stride, padding=padding)
    out.backward(torch.from_numpy(np.ascontiguousarray(grad_out)))
    return xt.grad.numpy(), wt.grad.numpy()


def _backward_inputs(rng, *, stride_choices=(1, 2)):
    n, c_in, c_out = int(rng.integers(1, 3)), int(rng.integers(2, 4)), int(rng.integers(2, 4))
    k = int(rng.choice([3, 5]))
    stride, padding = int(rng.choice(stride_choices)), int(rng.integers(1, 3))
    h, wd = int(rng.integers(8, 12)), int(rng.integers(8, 12))
    oh, ow = conv_output_size(h, k, stride, padding), conv_output_size(wd, k, stride, padding)
    x = rng.standard_normal((n, c_in, h, wd))
    w = rng.standard_normal((c_out, c_in, k, k))
    grad_out = rng.standard_normal((n, c_out, oh, ow))
    return x, w, grad_out, stride, padding


def check_conv2d_grad_weight(conv2d_grad_weight: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 4: ``dL/dW`` from ``x`` and ``dL/dout`` (float64), checked against autograd."""

    def make_inputs(rng):
        x, w, grad_out, s, p = _backward_inputs(rng)
        return x, grad_out, w.shape[2], s, p

    def reference(x, grad_out, k, s, p):
        w = np.zeros((grad_out.shape[1], x.shape[1], k, k))
        return _autograd_grads(x, w, grad_out, s, p)[1]

    mistakes = [
        Mistake("flipped", "your gradient is flipped in kh and kw: dW[co, ci, p, q] pairs dout[i, j] with "
                "x[i*s + p, j*s + q] (no flip for a cross-correlation).", lambda *a: _flip(reference(*a))),
        Mistake("first_sample", "you kept only the first sample: dW sums over the batch (and all output pixels).",
                lambda x, g, k, s, p: reference(x[:1], g[:1], k, s, p)),
        Mistake("mean_batch", "you averaged over the batch: dW is the sum over samples, not the mean.",
                lambda x, g, k, s, p: reference(x, g, k, s, p) / x.shape[0]),
        Mistake("no_padding", "you took windows of the unpadded x: pad x by `padding` on both sides before im2col.",
                lambda x, g, k, s, p: _grad_weight_unpadded(x, g, k, s, p)),
    ]
    check_function(conv2d_grad_weight, reference, make_inputs, name="conv2d_grad_weight", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


def _grad_weight_unpadded(x, grad_out, k, s, p):
    """dout @ cols^T with the windows taken from the unpadded x, cropped/extended to dout's size."""
    n, c_out, oh, ow = grad_out.shape
    view = im2col_view(x, k, k, s, 0)  # (N, C_in, K, K, oh', ow')
    oh2, ow2 = min(oh, view.shape[4]), min(ow, view.shape[5])
    return np.einsum("ncpqij,noij->ocpq", view[..., :oh2, :ow2], grad_out[:, :, :oh2, :ow2])


def check_conv2d_grad_input(conv2d_grad_input: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 5: ``dL/dx`` from ``W`` and ``dL/dout`` (float64): a transposed convolution, checked against autograd."""

    def make_inputs(rng):
        x, w, grad_out, s, p = _backward_inputs(rng, stride_choices=(2,))
        return grad_out, w, (x.shape[2], x.shape[3]), s, p

    def reference(grad_out, w, hw, s, p):
        x = np.zeros((grad_out.shape[0], w.shape[1]) + tuple(hw))
        return _autograd_grads(x, w, grad_out, s, p)[0]

    def not_flipped(grad_out, w, hw, s, p):  # the adjoint with the kernel used as is: a correlation, not its transpose
        return reference(grad_out, _flip(w), hw, s, p)

    def ignore_stride(grad_out, w, hw, s, p):  # full correlation of dout with the flipped kernel, no zero insertion
        k = w.shape[2]
        full = F.conv2d(torch.from_numpy(grad_out), torch.from_numpy(_flip(w)).transpose(0, 1).contiguous(),
                        padding=k - 1).numpy()
        out = np.zeros((grad_out.shape[0], w.shape[1]) + tuple(hw))
        hh, ww = min(hw[0], full.shape[2] - p), min(hw[1], full.shape[3] - p)
        out[:, :, :hh, :ww] = full[:, :, p:p + hh, p:p + ww]
        return out

    def crop_off_by_one(grad_out, w, hw, s, p):  # crop the padded gradient starting at p - 1
        h, wd = hw
        big = reference(grad_out, w, (h + 2 * p, wd + 2 * p), s, 0)  # gradient wrt the padded input
        return np.ascontiguousarray(big[:, :, max(p - 1, 0):max(p - 1, 0) + h, max(p - 1, 0):max(p - 1, 0) + wd])

    mistakes = [
        Mistake("not_flipped", "kernel not flipped: dx is a *transposed* convolution, so each tap w[co, ci, p, q] "
                "scatters dout[i, j] to x[i*s + p, j*s + q] (or correlate with the flipped, transposed kernel).",
                not_flipped),
        Mistake("no_stride", "you ignored the stride: dout[i, j] belongs at padded-input row i*stride + u, so scatter "
                "with step `stride` (or insert stride - 1 zeros between dout entries before correlating).",
                ignore_stride),
        Mistake("crop", "off-by-one padding: the gradient wrt the padded input must be cropped as [p:p+H, p:p+W].",
                crop_off_by_one),
    ]
    check_function(conv2d_grad_input, reference, make_inputs, name="conv2d_grad_input", trials=trials, seed=seed,
                   mistakes=mistakes, quiet=quiet)


# ---------------------------------------------------------------- exercise 6: 1x1 convolution
def _reference_conv1x1(x, w):
    return torch.einsum("nchw,oc->nohw", x, w).contiguous()


def check_conv1x1(conv1x1: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise 6: a 1x1 convolution of NCHW ``x`` with ``w (C_out, C_in)`` as one matmul, no loops (torch)."""

    def make_inputs(rng):
        n, c, h, wd = int(rng.integers(1, 3)), int(rng.integers(3, 6)), int(rng.integers(3, 6)), int(rng.integers(3, 6))
        c_out = c if rng.random() < 0.5 else int(rng.integers(2, 6))
        x = torch.from_numpy(rng.standard_normal((n, c, h, wd)).astype(np.float32))
        w = torch.from_numpy(rng.standard_normal((c_out, c)).astype(np.float32))
        return x, w

    def bad_reshape(x, w):  # (N, C, H, W) reshaped straight to (N*H*W, C), without moving C last
        n, c, h, wd = x.shape
        rows = x.reshape(n * h * wd, c) @ w.T  # (N*H*W, C_out)
        return rows.reshape(n, h, wd, -1).permute(0, 3, 1, 2).contiguous()

    def no_permute_back(x, w):  # right product, wrong memory order on the way back
        n, c, h, wd = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, c) @ w.T  # (N*H*W, C_out)
        return rows.reshape(n, -1, h, wd).contiguous()

    mistakes = [
        Mistake("transposed_w", "you used w transposed: out[n, o] = sum_c w[o, c] x[n, c], i.e. W @ x_(C, HW), not "
                "W.T.", lambda x, w: _reference_conv1x1(x, w.T.contiguous())),
        Mistake("bad_reshape", "your reshape mixes channels and pixels: x.reshape(N*H*W, C) is not channels-last; "
                "permute to (N, H, W, C) first, or compute W @ x.reshape(N, C, H*W).", bad_reshape),
        Mistake("no_permute_back", "the result has the right numbers in the wrong order: reshape to (N, H, W, C_out) "
                "and permute to (N, C_out, H, W).", no_permute_back),
    ]
    check_function(conv1x1, _reference_conv1x1, make_inputs, name="conv1x1", trials=trials, seed=seed,
                   atol=1e-5, mistakes=mistakes, quiet=quiet)  # atol: fp32 sums of <= 5 terms, another order


# ---------------------------------------------------------------- exercise 7: the column matrix's size
def column_matrix_bytes(n, c_in, h, w, kh, kw, stride=1, padding=0, dilation=1, itemsize=4) -> int:
    """Bytes of the im2col matrix ``(C_in*KH*KW, N*OH*OW)`` (eq. 7)."""
    oh, ow = conv_output_size(h, kh, stride, padding, dilation), conv_output_size(w, kw, stride, padding, dilation)
    return c_in * kh * kw * n * oh * ow * itemsize


def check_column_bytes(answer: Any, *, quiet: bool = False) -> None:
    """Exercise 7: MiB of fp32 im2col columns for ResNet-50's stem (7x7, stride 2, pad 3, 3->64) on 32 224x224 images."""
    want = column_matrix_bytes(32, 3, 224, 224, 7, 7, 2, 3) / 2 ** 20
    mistakes = {
        column_matrix_bytes(32, 3, 224, 224, 7, 7, 1, 3) / 2 ** 20: "that is the stride-1 size: with stride 2 there "
        "are 4x fewer output pixels, hence 4x fewer columns.",
        column_matrix_bytes(32, 3, 224, 224, 7, 7, 2, 0) / 2 ** 20: "you forgot the padding of 3 in the output size.",
        column_matrix_bytes(32, 3, 224, 224, 7, 7, 2, 3) / 1e6: "that is in MB (1e6 bytes); the question asks for "
        "MiB (2**20 bytes).",
        column_matrix_bytes(32, 3, 224, 224, 7, 7, 2, 3, itemsize=8) / 2 ** 20: "fp32 is 4 bytes per element, not 8.",
        column_matrix_bytes(32, 64, 224, 224, 7, 7, 2, 3) / 2 ** 20: "rows count *input* channels (3) times KH*KW, "
        "not output channels.",
        column_matrix_bytes(1, 3, 224, 224, 7, 7, 2, 3) / 2 ** 20: "that is one image; the batch holds 32.",
    }
    check_value(answer, want, name="column_bytes", rtol=1e-3, mistakes=mistakes, quiet=quiet)
