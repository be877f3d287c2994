r"""Topic 03 (convolution), rungs 4c and 4d: Goto's blocked GEMM compiled with Numba, and a direct (implicit-GEMM) conv.

Used by ``notebooks/03_convolution.ipynb`` (section 6 writes ``pack_a_by_hand``, ``pack_b_by_hand``,
``micro_kernel_by_hand`` and ``gemm_compiled_by_hand`` and asserts they equal :func:`gemm_compiled`; section 7
writes the direct convolution and asserts it equals :func:`conv2d_direct_compiled`) and ``benchmarks/conv_cpu.py``.
The machine model these are tuned to (vector registers, lanes, FMA units, clock, caches) is in
:mod:`course_utils.convolution_machine`.

Every FLOP is in this file: the packing copies (no arithmetic), the ``MR x NR`` micro-kernel does all the
multiply-adds, and no BLAS is called. Loop order as in the lesson's table: ``jc`` (``nc`` columns of B) >
``pc`` (``kc``-deep slice, packs B) > ``ic`` (``mc`` rows of A, packs A) > ``jr`` (one ``kc x NR`` B
micro-panel) > ``ir`` (one ``MR x kc`` A micro-panel): the micro-kernel keeps an ``MR x NR`` tile of C in
vector registers. ``MR x NR`` comes from this CPU's vector registers (lesson eq. 8): 6 x 64 with AVX-512
(24 accumulators + 4 B vectors + 1 broadcast <= 32 registers); Numba bakes the module-level ``MR``/``NR`` in at
compile time.

Two details found by reading the assembly and timing (lesson section 6): an index computed at run time, such as
``c[i0 + i, j0 + j]``, may be negative as far as the compiler knows, so Numba adds a wrap-around fix-up to it and
LLVM then works element by element; through a row view (``c[i0 + i, j0:j0 + cols]``) indexed by a loop counter it
emits 512-bit vector moves, which the C write-back and ``pack_b_into`` use. And the micro-kernel prefetches its C
tile (:func:`~course_utils.convolution_machine.prefetch`) before the k loop, so the tile's 24 cache lines, evicted
since the last ``pc`` pass, arrive while the FMAs run instead of stalling the write-back.
"""
from __future__ import annotations

import numpy as np

from .convolution import conv_output_size
from .convolution_machine import prefetch, register_tile, register_tile_shape, vector_isa

import numba  # noqa: E402  (Numba's options: env.configure_numba(), which setup() calls before this import)

__all__ = ["MR", "NR", "BLOCKS", "pack_a_into", "pack_b_into", "micro_kernel", "gemm_compiled", "gemm_compiled_parallel",
           "conv2d_im2col_compiled", "conv2d_direct_compiled", "pack_b_from_image", "aligned_empty", "workspace"]

_ISA = vector_isa()
MR, NR = register_tile_shape(_ISA["registers"], _ISA["fp32_lanes"])   # lesson eq. (8): 6 x 64 with AVX-512
# cache blocks: kc = 512 from the kc sweep of lesson section 6 (deeper than eq. (6)'s L1 rule: the B micro-panel streams
# from L2), then eq. (6) for mc and nc on this course's VM (1 MiB L2, 24 MiB of L3 after sane_caches): half of L2 holds
# the mc x kc block of A, half of L3 the kc x nc panel of B
BLOCKS = dict(mc=252, kc=512, nc=6144)
_TILE = MR * NR
# fastmath: "contract" lets LLVM fuse a*b+c into one FMA; no "reassoc", so it cannot reorder the k-sum, which is
# what keeps it vectorizing the j-loop of the micro-kernel (the register tile) instead of the k-loop.
_FLAGS = dict(fastmath={"contract"}, boundscheck=False, cache=True)


@numba.njit(**_FLAGS)
def pack_a_into(a, ic, pc, mc, kc, out):
    """A[ic:ic+mc, pc:pc+kc] -> out[panel, p, i]: MR-row micro-panels, k-major, zero-padded past row mc."""
    for panel in range((mc + MR - 1) // MR):
        for p in range(kc):
            for i in range(MR):
                row = panel * MR + i
                out[panel, p, i] = a[ic + row, pc + p] if row < mc else 0.0


@numba.njit(**_FLAGS)
def pack_b_into(b, pc, jc, kc, nc, out):
    """B[pc:pc+kc, jc:jc+nc] -> out[panel, p, j]: NR-column micro-panels, k-major, zero-padded past column nc."""
    for panel in range((nc + NR - 1) // NR):
        src = b[pc:pc + kc, jc + panel * NR:jc + min(nc, panel * NR + NR)]   # a view: row copies become vector moves
        width = src.shape[1]
        for p in range(kc):
            for j in range(width):
                out[panel, p, j] = src[p, j]
            for j in range(width, NR):
                out[panel, p, j] = 0.0


@numba.njit(inline="always", **_FLAGS)
def micro_kernel(kc, a_panel, b_panel, c, i0, j0, m_edge, n_edge):
    """C[i0:i0+MR, j0:j0+NR] += a_panel.T @ b_panel, the MR x NR tile accumulated in registers (eq. 8)."""
    rows, cols = min(MR, m_edge), min(NR, n_edge)    # the part of the tile inside C
    for i in range(rows):                            # ask for C's tile now: it arrives during the k loop
        for j in range(0, cols, 16):                 # one prefetch per 64-byte line (16 fp32)
            prefetch(c, i0 + i, j0 + j)
    acc = register_tile(_TILE)                       # (MR*NR,) on the stack: the compiler keeps it in registers
    for t in range(_TILE):
        acc[t] = 0.0
    for p in range(kc):                              # one rank-1 update per p: MR broadcasts x NR/16 vectors
        for i in range(MR):
            a = a_panel[p, i]
            for j in range(NR):
                acc[i * NR + j] += a * b_panel[p, j]
    for i in range(rows):                            # write back through a row view: vector adds (module docstring)
        c_row = c[i0 + i, j0:j0 + cols]
        for j in range(cols):
            c_row[j] += acc[i * NR + j]


@numba.njit(**_FLAGS)
def _gemm_loops(a, b, c, mc, kc, nc, a_buf, b_buf):
    m, k = a.shape
    n = b.shape[1]
    for jc in range(0, n, nc):                                   # B panel (kc x nc)
        ncur = min(nc, n - jc)
        for pc in range(0, k, kc):
            kcur = min(kc, k - pc)
            pack_b_into(b, pc, jc, kcur, ncur, b_buf)
            for ic in range(0, m, mc):                           # A block (mc x kc)
                mcur = min(mc, m - ic)
                pack_a_into(a, ic, pc, mcur, kcur, a_buf)
                for jr in range((ncur + NR - 1) // NR):          # B micro-panel (kc x NR)
                    for ir in range((mcur + MR - 1) // MR):      # A micro-panel (MR x kc), C tile (MR x NR)
                        micro_kernel(kcur, a_buf[ir], b_buf[jr], c, ic + ir * MR, jc + jr * NR,
                                     mcur - ir * MR, ncur - jr * NR)


def aligned_empty(shape, align=64):
    """An uninitialized float32 array whose data starts on an ``align``-byte boundary (a cache line).

    NumPy only promises 16 bytes; a 64-byte vector load from a packed panel that straddles two cache lines
    costs two loads, and whether it does would change from call to call with the allocation.
    """
    count = int(np.prod(shape))
    raw = np.empty(count + align // 4, np.float32)
    start = (-raw.ctypes.data % align) // 4
    return raw[start:start + count].reshape(shape)


_WORKSPACE: dict = {}


def workspace(name, shape):
    """A packing buffer kept between calls, as BLAS libraries keep theirs: a fresh multi-MiB buffer per call costs a
    page fault per 4 KiB on first touch, which at the lesson's realistic layer is a visible share of a 3 ms GEMM.
    Not thread-safe across Python threads (each call of the parallel versions is one Python call)."""
    buf = _WORKSPACE.get(name)
    if buf is None or buf.shape != tuple(shape):
        buf = _WORKSPACE[name] = aligned_empty(tuple(shape))
    return buf


def _check(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need (m, k) @ (k, n), got {a.shape} @ {b.shape}")
    return np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32)


def _clamp(m, k, n, mc, kc, nc):
    """Block sizes no larger than the matrix (so the packing buffers are no larger than needed)."""
    return min(mc, -(-m // MR) * MR), min(kc, k), min(nc, -(-n // NR) * NR)


def gemm_compiled(a, b, mc=BLOCKS["mc"], kc=BLOCKS["kc"], nc=BLOCKS["nc"]):
    """``a @ b`` in fp32 by Goto's loops compiled with Numba, single-threaded (rung 4c)."""
    a, b = _check(a, b)
    mc, kc, nc = _clamp(a.shape[0], a.shape[1], b.shape[1], mc, kc, nc)
    c = aligned_empty((a.shape[0], b.shape[1]))
    c[:] = 0.0
    a_buf = workspace("a", (-(-mc // MR), kc, MR))         # the packed A block, reused
    b_buf = workspace("b", (-(-nc // NR), kc, NR))         # the packed B panel, reused
    _gemm_loops(a, b, c, mc, kc, nc, a_buf, b_buf)
    return c


@numba.njit(parallel=True, **_FLAGS)
def _gemm_loops_parallel(a, b, c, mc, kc, nc, a_buf, b_buf):
    m, k = a.shape
    n = b.shape[1]
    for jc in range(0, n, nc):
        ncur = min(nc, n - jc)
        for pc in range(0, k, kc):
            kcur = min(kc, k - pc)
            for panel in numba.prange((ncur + NR - 1) // NR):   # pack B's micro-panels in parallel
                pack_b_into(b, pc, jc + panel * NR, kcur, min(NR, ncur - panel * NR), b_buf[panel:panel + 1])
            for ic in range(0, m, mc):
                mcur = min(mc, m - ic)
                pack_a_into(a, ic, pc, mcur, kcur, a_buf)
                for jr in numba.prange((ncur + NR - 1) // NR):   # threads split the jr loop: disjoint columns of C
                    for ir in range((mcur + MR - 1) // MR):
                        micro_kernel(kcur, a_buf[ir], b_buf[jr], c, ic + ir * MR, jc + jr * NR,
                                     mcur - ir * MR, ncur - jr * NR)


def gemm_compiled_parallel(a, b, mc=BLOCKS["mc"], kc=BLOCKS["kc"], nc=BLOCKS["nc"]):
    """Like :func:`gemm_compiled`, with the ``jr`` loop (and B's packing) split over Numba's threads."""
    a, b = _check(a, b)
    mc, kc, nc = _clamp(a.shape[0], a.shape[1], b.shape[1], mc, kc, nc)
    c = aligned_empty((a.shape[0], b.shape[1]))
    c[:] = 0.0
    a_buf = workspace("a", (-(-mc // MR), kc, MR))
    b_buf = workspace("b", (-(-nc // NR), kc, NR))
    _gemm_loops_parallel(a, b, c, mc, kc, nc, a_buf, b_buf)
    return c


def conv2d_im2col_compiled(x, w, stride=1, padding=0, dilation=1, parallel=False):
    """Rung 4c: the column matrix (``convolution.im2col``), then :func:`gemm_compiled` (eq. 3)."""
    from .convolution import im2col

    c_out, c_in, kh, kw = w.shape
    n = x.shape[0]
    oh = conv_output_size(x.shape[2], kh, stride, padding, dilation)
    ow = conv_output_size(x.shape[3], kw, stride, padding, dilation)
    cols = im2col(x, kh, kw, stride, padding, dilation)                    # (K, N*OH*OW)
    gemm = gemm_compiled_parallel if parallel else gemm_compiled
    out = gemm(w.reshape(c_out, -1), cols)                                 # (C_out, N*OH*OW)
    return np.ascontiguousarray(out.reshape(c_out, n, oh, ow).transpose(1, 0, 2, 3))


@numba.njit(**_FLAGS)
def pack_b_from_image(xp, pc, jc, kc, nc, kh, kw, stride, dilation, oh, ow, out):
    """The B panel of eq. (3) gathered straight from the padded input ``xp`` (N, C_in, Hp, Wp): implicit im2col.

    Row ``k = pc + p`` of the column matrix is tap ``(c, u, v)``; column ``m = jc + col`` is pixel ``(n, i, j)``
    (eqs. 4 and 9). Only this ``kc x nc`` panel ever exists, never the whole column matrix. The pixel of each
    column is decoded once per micro-panel (integer division is slow), then reused for all ``kc`` taps.
    """
    m_total = xp.shape[0] * oh * ow
    img = np.empty(NR, np.int64)
    row = np.empty(NR, np.int64)
    col = np.empty(NR, np.int64)
    for panel in range((nc + NR - 1) // NR):
        width = min(NR, nc - panel * NR, m_total - jc - panel * NR)      # columns inside the matrix
        for j in range(width):                                           # eq. (9): m -> (n, i, j)
            m = jc + panel * NR + j
            img[j], row[j], col[j] = m // (oh * ow), (m // ow) % oh * stride, m % ow * stride
        for p in range(kc):
            k = pc + p
            c, u, v = k // (kh * kw), (k // kw) % kh * dilation, k % kw * dilation
            for j in range(width):
                out[panel, p, j] = xp[img[j], c, row[j] + u, col[j] + v]
            for j in range(width, NR):
                out[panel, p, j] = 0.0


@numba.njit(parallel=True, **_FLAGS)
def _direct_loops(wmat, xp, c, kh, kw, stride, dilation, oh, ow, mc, kc, nc, a_buf, b_buf):
    m, k = wmat.shape
    n = c.shape[1]
    for jc in range(0, n, nc):
        ncur = min(nc, n - jc)
        for pc in range(0, k, kc):
            kcur = min(kc, k - pc)
            for panel in numba.prange((ncur + NR - 1) // NR):   # implicit im2col: gather B's micro-panels
                pack_b_from_image(xp, pc, jc + panel * NR, kcur, min(NR, ncur - panel * NR), kh, kw, stride,
                                  dilation, oh, ow, b_buf[panel:panel + 1])
            for ic in range(0, m, mc):
                mcur = min(mc, m - ic)
                pack_a_into(wmat, ic, pc, mcur, kcur, a_buf)
                for jr in numba.prange((ncur + NR - 1) // NR):
                    for ir in range((mcur + MR - 1) // MR):
                        micro_kernel(kcur, a_buf[ir], b_buf[jr], c, ic + ir * MR, jc + jr * NR,
                                     mcur - ir * MR, ncur - jr * NR)


def conv2d_direct_compiled(x, w, stride=1, padding=0, dilation=1, threads=None,
                           mc=BLOCKS["mc"], kc=BLOCKS["kc"], nc=BLOCKS["nc"]):
    """Rung 4d: the convolution as Goto's loops whose B packing gathers from the image (no column matrix).

    Runs on ``threads`` of Numba's threads (default: all of them).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    c_out, c_in, kh, kw = w.shape
    n = x.shape[0]
    oh = conv_output_size(x.shape[2], kh, stride, padding, dilation)
    ow = conv_output_size(x.shape[3], kw, stride, padding, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))   # (N, C_in, H+2p, W+2p)
    wmat = np.ascontiguousarray(w.reshape(c_out, -1), dtype=np.float32)         # (C_out, K)
    mc, kc, nc = _clamp(c_out, wmat.shape[1], n * oh * ow, mc, kc, nc)
    c = np.zeros((c_out, n * oh * ow), np.float32)                             # (C_out, N*OH*OW)
    a_buf = workspace("a", (-(-mc // MR), kc, MR))
    b_buf = workspace("b", (-(-nc // NR), kc, NR))
    before = numba.get_num_threads()
    numba.set_num_threads(threads or numba.config.NUMBA_NUM_THREADS)
    try:
        _direct_loops(wmat, xp, c, kh, kw, stride, dilation, oh, ow, mc, kc, nc, a_buf, b_buf)
    finally:
        numba.set_num_threads(before)
    return np.ascontiguousarray(c.reshape(c_out, n, oh, ow).transpose(1, 0, 2, 3))
