r"""Topic 05's problem set (``solutions/05_gemm_triton.ipynb``): checks, named mistakes, references.

* ex. 1 :func:`check_grouped_tile_n` -- grouped program order along N (NumPy);
* ex. 2 :func:`check_linear` -- a linear layer's GEMM ``out = X @ W.T`` (W stored ``(N, K)``) as a
  Triton kernel and its launcher ``linear(x, w, out, block_m, block_n, block_k)``;
* ex. 3 :func:`check_smem_address` -- the swizzled shared-memory address of a chunk;
* ex. 4 :func:`check_passes` -- bank-conflict passes for 4-, 8- and 16-byte accesses;
* ex. 5 :func:`check_linear_bias_leaky` -- ex. 2 with a fused bias + leaky-ReLU epilogue;
* ex. 6 :func:`check_roofline` -- the roofline bound of a GEMM.

Every check draws fresh inputs (``seed=None``; a failure names the seed that reproduces it) and
calls only the learner's function (for the kernels: the launcher, never ``kernel[grid]``). The
kernel checks launch on fp32 **strided views into padded buffers**: reads past an edge pick up a
loud value, stores outside ``out`` land in its padding, and both are named. The Triton helpers
are in :mod:`course_utils.grading.gemm_kernels`.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand
from ..gemm_models import gemm_intensity, gemm_min_bytes, grouped_tile, roofline_bound, smem_layout_addresses, swizzle, wavefronts
from .gemm_kernels import check_linear, check_linear_bias_leaky

__all__ = ["check_grouped_tile_n", "check_linear", "check_smem_address", "check_passes", "check_linear_bias_leaky",
           "check_roofline"]


# ================================================================ ex. 1: grouped order along N
def _reference_grouped_tile_n(pid, num_pid_m: int, num_pid_n: int, group_n: int):
    """Grouped order along N (the exercise's variant of eq. 4): walk ``group_n`` tile columns across
    before moving one tile row down; the last group may be narrower. Eq. (4) with M and N exchanged."""
    pid_n, pid_m = grouped_tile(pid, num_pid_n, num_pid_m, group_n)
    return pid_m, pid_n


def _grouped_inputs():
    """A grid of tiles and a group width; in turn: a last group narrower than the others (every other
    trial), one tile row, a group at least as wide as the grid."""
    calls = itertools.count()

    def make(rng):
        return _grouped_problem(rng, next(calls))
    return make


def _grouped_problem(rng, trial):
    kind = (2, 0, 2, 1)[trial % 4]
    group_n = int(rng.integers(2, 5))
    if kind == 2:    # several bands, the last narrower; more tile rows than group_n and a grid that is not square
        num_pid_m = int(rng.integers(group_n + 1, 10))
        num_pid_n = int(rng.integers(group_n + 1, 12))
        num_pid_n += int(num_pid_n % group_n == 0)
        num_pid_n += int(num_pid_n == num_pid_m) * (1 + int((num_pid_n + 1) % group_n == 0))
    elif kind == 0:  # one tile row
        num_pid_m, num_pid_n = 1, int(rng.integers(3, 12))
    else:            # one band holds every column
        num_pid_m, num_pid_n = int(rng.integers(2, 9)), int(rng.integers(2, 6))
        group_n = num_pid_n + int(rng.integers(0, 3))
    pid = rng.permutation(num_pid_m * num_pid_n)            # program ids in any order, element-wise
    return pid, num_pid_m, num_pid_n, group_n


def check_grouped_tile_n(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 1: ``fn(pid, num_pid_m, num_pid_n, group_n) -> (pid_m, pid_n)`` on NumPy arrays of program ids."""
    def unclamped(pid, pm, pn, g):  # the last group treated as full
        per = g * pm
        return (pid % per) // g, (pid // per) * g + (pid % per) % g

    check_function(
        fn, _reference_grouped_tile_n, _grouped_inputs(), name="grouped order along N", trials=trials,
        seed=seed, quiet=quiet, forbidden=("course_utils.grading.gemm._reference_grouped_tile_n",),
        mistakes=[
            Mistake("row-major", "that is plain row-major order: walk group_n tile columns across before moving one row down.",
                    lambda pid, pm, pn, g: (pid // pn, pid % pn)),
            Mistake("column-major", "that is plain column-major order: only group_n columns at a time, then the next band of columns.",
                    lambda pid, pm, pn, g: (pid % pm, pid // pm)),
            Mistake("grouped along M", "that groups along M (the lesson's eq. 4); here the groups are bands of group_n tile columns.",
                    lambda pid, pm, pn, g: grouped_tile(pid, pm, pn, g)),
            Mistake("unclamped", "the last group is narrower when num_pid_n is not a multiple of group_n: use min(num_pid_n - first_n, group_n).",
                    unclamped),
            Mistake("swapped", "pid_m and pid_n are swapped: return (row of tiles, column of tiles).",
                    lambda pid, pm, pn, g: _reference_grouped_tile_n(pid, pm, pn, g)[::-1]),
        ],
    )


# ================================================================ ex. 3: swizzled shared-memory address
def _reference_smem_address(row, chunk, rows: int, mode: int):
    """Byte address of 16-byte ``chunk`` of ``row`` in a ``rows x 128``-byte tile stored in ``mode``-byte atoms."""
    return smem_layout_addresses(rows, 128, mode)[row, chunk]


def _smem_inputs():
    """Tiles of 8 to 128 rows, a shuffled subset of their chunks; the modes 32, 64, 128 in turn (128 is a
    single atom column, where atom mistakes cannot show)."""
    calls = itertools.count()

    def make(rng):
        rows = 8 * int(rng.integers(2, 17))                         # 16 to 128 rows
        r, c = np.meshgrid(np.arange(rows), np.arange(8), indexing="ij")
        keep = rng.permutation(r.size)[: int(rng.integers(16, r.size + 1))]   # a shuffled subset of the chunks
        return r.ravel()[keep], c.ravel()[keep], rows, (32, 64, 128)[next(calls) % 3]
    return make


def check_smem_address(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``fn(row, chunk, rows, mode)`` = byte address of 16-byte ``chunk`` of ``row`` in a
    ``rows x 128``-byte tile stored in ``mode``-byte swizzle atoms, derived by hand."""
    def no_swizzle(r, c, rows, mode):
        return (c // (mode // 16)) * rows * mode + r * mode + (c % (mode // 16)) * 16

    def atoms_of_8_rows(r, c, rows, mode):  # atom column j stacked every 8 rows instead of after all rows
        return swizzle((c // (mode // 16)) * 8 * mode + r * mode + (c % (mode // 16)) * 16, mode)

    check_function(
        fn, _reference_smem_address, _smem_inputs(), name="swizzled shared-memory address", trials=trials, seed=seed, quiet=quiet,
        forbidden=("course_utils.gemm_models.smem_layout_addresses", "course_utils.grading.gemm._reference_smem_address"),
        by_hand=ByHand(allow=("course_utils.gemm_models.swizzle",)),  # eq. (6) is the lesson's; the atoms are the exercise
        mistakes=[
            Mistake("no swizzle", "the atoms are right but the swizzle is missing: apply eq. (6) to the final address.", no_swizzle),
            Mistake("no atoms", "the tile is not cut into atoms: with a mode narrower than 128 bytes, atom j = chunk // (mode // 16) holds all rows, mode bytes each.",
                    lambda r, c, rows, mode: swizzle(r * 128 + c * 16, mode)),
            Mistake("128 swizzle", "the swizzle must use the same mode as the atoms (b = log2(mode / 16) bits).",
                    lambda r, c, rows, mode: swizzle(no_swizzle(r, c, rows, mode), 128)),
            Mistake("8-row atoms", "in this model an atom column holds all `rows` rows: atom j starts at j * rows * mode.", atoms_of_8_rows),
            Mistake("row pitch 128", "inside an atom the row pitch is the atom's width (mode bytes), not the tile's 128.",
                    lambda r, c, rows, mode: swizzle((c // (mode // 16)) * rows * mode + r * 128 + (c % (mode // 16)) * 16, mode)),
        ],
    )


# ================================================================ ex. 4: bank-conflict passes
def _passes_inputs():
    """One 128-byte request at a random base and stride; every other trial half the threads repeat the
    others' addresses (a broadcast), so that a missing broadcast and other mistakes are told apart; the
    trials without one use small odd or even strides, where 4-byte banks and byte-wide banks differ."""
    calls = itertools.count()

    def make(rng):
        access = int(rng.choice([4, 8, 16]))
        threads = 128 // access                       # one 128-byte request: 32, 16 or 8 threads
        broadcast = next(calls) % 2 == 1
        stride = access * int(rng.choice([1, 2, 3, 4, 8, 9, 16, 32] if broadcast else [1, 2, 3, 5, 9]))
        lanes = np.arange(threads)
        if broadcast:
            lanes[threads // 2:] = lanes[:threads // 2]
        return (int(rng.integers(0, 64)) * access + stride * rng.permutation(lanes)).astype(np.int64), access
    return make


def check_passes(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: ``fn(byte_addrs, access_bytes)`` = passes to serve one access of ``access_bytes``
    (4, 8 or 16) per thread at those addresses (32 banks x 4 B; threads sharing a word are served together)."""
    def words(addrs, access):
        return (np.asarray(addrs)[:, None] // 4 + np.arange(access // 4)).ravel()

    check_function(
        fn, wavefronts, _passes_inputs(), name="bank-conflict passes", trials=trials, seed=seed, quiet=quiet,
        forbidden=("course_utils.gemm_models.wavefronts", "course_utils.gemm_models.conflict_table"),
        mistakes=[
            Mistake("distinct banks", "counted distinct banks touched; count instead the most distinct words any one bank must serve.",
                    lambda a, acc: int(np.unique(words(a, acc) % 32).size)),
            Mistake("no broadcast", "threads reading the same word are served in one pass (a broadcast): count distinct words per bank.",
                    lambda a, acc: int(np.bincount(words(a, acc) % 32, minlength=32).max())),
            Mistake("bytes", "banks are 4 bytes wide: bank = (byte_address // 4) % 32.",
                    lambda a, acc: int(np.bincount(np.unique((np.asarray(a)[:, None] + 4 * np.arange(acc // 4)).ravel()) % 32, minlength=32).max())),
        ],
    )


# ================================================================ ex. 6: the roofline bound
def _roofline_inputs():
    """From a decode step (M = 1) to a large square GEMM, on a made-up accelerator (continuous values):
    trials 1 and 2 memory-bound, trial 3 compute-bound, and so on."""
    calls = itertools.count()

    def make(rng):
        peak, bandwidth = float(rng.uniform(1e15, 3e15)), float(rng.uniform(5e11, 4e12))
        if next(calls) % 3 == 2:     # every third trial compute-bound (its memory roof 1.5x to 4x above the peak)
            m = n = k = int(rng.integers(4096, 16385))
            s = int(rng.choice([1, 2, 4]))
            return m, n, k, s, peak, peak / gemm_intensity(m, n, k, s) * float(rng.uniform(1.5, 4.0))
        m, n, k = int(rng.integers(1, 49)), int(rng.integers(512, 8193)), int(rng.integers(512, 8193))
        return m, n, k, int(rng.choice([2, 4])), peak, bandwidth
    return make


def _reference_attainable(m, n, k, s, p, bw):
    return float(roofline_bound(m, n, k, s, p, bw)[0])


def check_roofline(fn: Callable, *, trials: int = 5, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 6: ``fn(m, n, k, itemsize, peak_flops, bandwidth) -> attainable FLOP/s`` by eq. (1)-(3)."""
    check_function(
        fn, _reference_attainable, _roofline_inputs(), name="roofline bound", trials=trials, seed=seed, quiet=quiet,
        rtol=1e-6, atol=0.0,
        forbidden=("course_utils.gemm_models.roofline_bound", "course_utils.grading.gemm._reference_attainable"),
        mistakes=[
            Mistake("no 2", "a multiply-add is 2 FLOPs: the GEMM does 2*M*N*K.",
                    lambda m, n, k, s, p, bw: float(min(p, m * n * k / gemm_min_bytes(m, n, k, s) * bw))),
            Mistake("no peak", "the roof is min(peak, intensity * bandwidth): compute-bound shapes cannot beat the peak.",
                    lambda m, n, k, s, p, bw: float(gemm_intensity(m, n, k, s) * bw)),
            Mistake("no itemsize", "bytes = elements * itemsize.",
                    lambda m, n, k, s, p, bw: float(min(p, 2 * m * n * k / (m * k + k * n + m * n) * bw))),
            Mistake("no C", "C must be written too: bytes = (M*K + K*N + M*N) * itemsize.",
                    lambda m, n, k, s, p, bw: float(min(p, 2 * m * n * k / ((m * k + k * n) * s) * bw))),
            Mistake("C twice", "with beta = 0 C is only written, not read: count M*N once.",
                    lambda m, n, k, s, p, bw: float(min(p, 2 * m * n * k / ((m * k + k * n + 2 * m * n) * s) * bw))),
            Mistake("max", "the bound is the smaller of the two roofs, min(peak, I * W), not the larger.",
                    lambda m, n, k, s, p, bw: float(max(p, gemm_intensity(m, n, k, s) * bw))),
        ],
    )
