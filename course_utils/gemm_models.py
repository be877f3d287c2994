r"""Topic 05 (GEMM in Triton): the NumPy models behind the kernels.

Used by ``notebooks/05_gemm_triton.ipynb``, which derives each piece by hand (``*_by_hand``,
``*_numpy``) and asserts it equals the copy here, and by ``course_utils.grading.gemm`` (the
problem set's references). Lesson equations:

* (1) FLOPs :math:`=2MNK`; (2) minimum bytes :math:`=(MK+KN+MN)\,s` for element size :math:`s`;
  (3) intensity = (1)/(2);
* (4) the grouped program order (:func:`grouped_tile`);
* (5) the pipeline model's steady-state step time :math:`\max(C, L, (L+\lambda+C)/S)` (:func:`pipeline_timeline`);
* (6) the swizzle: 16-byte chunk bits ``[4, 4+b)`` XOR address bits ``[7, 7+b)`` with
  :math:`b=\log_2(\text{mode}/16)` (:func:`swizzle`).

NumPy only (and ``course_utils.bench``'s counters): no torch, no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bench import matmul_bytes, matmul_flops

__all__ = [
    "gemm_flops", "gemm_min_bytes", "gemm_intensity", "roofline_bound",
    "matmul_naive", "matmul_tiled_numpy",
    "grouped_tile", "tile_order", "panel_loads",
    "Event", "pipeline_timeline",
    "SWIZZLE_MODES", "swizzle", "smem_layout_addresses", "wavefronts", "conflict_table",
]

# ================================================================ the two numbers
# eq. (1) and (2) are course_utils.bench's counters (one copy for the course), under the lesson's names
gemm_flops = matmul_flops        # 2 m n k
gemm_min_bytes = matmul_bytes    # (m k + k n + m n) * itemsize: read A and B once, write C once


def gemm_intensity(m: int, n: int, k: int, itemsize: int) -> float:
    """Eq. (3): FLOPs per byte of compulsory traffic."""
    return gemm_flops(m, n, k) / gemm_min_bytes(m, n, k, itemsize)


def roofline_bound(m: int, n: int, k: int, itemsize: int, peak_flops: float, bandwidth: float) -> tuple[float, str]:
    """Attainable FLOP/s ``min(peak, intensity * bandwidth)`` and which roof binds (``"memory"``/``"compute"``)."""
    memory_roof = gemm_intensity(m, n, k, itemsize) * bandwidth
    return (memory_roof, "memory") if memory_roof < peak_flops else (float(peak_flops), "compute")


# ================================================================ rung 1: NumPy
def matmul_naive(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Three loops, one multiply-add per innermost step (tiny sizes only)."""
    m, k = a.shape
    n = b.shape[1]
    c = np.zeros((m, n), dtype=a.dtype)
    for i in range(m):
        for j in range(n):
            s = 0.0
            for p in range(k):
                s += a[i, p] * b[p, j]
            c[i, j] = s
    return c


def matmul_tiled_numpy(a: np.ndarray, b: np.ndarray, block_m: int = 32, block_n: int = 32, block_k: int = 16) -> np.ndarray:
    """The Triton kernel's structure in NumPy: one (block_m, block_n) tile per "program", a K loop,
    and ragged edges handled by slicing (what the kernel's masks do). Accumulates in fp32."""
    m, k = a.shape
    n = b.shape[1]
    c = np.empty((m, n), dtype=a.dtype)
    for i0 in range(0, m, block_m):          # program id along M
        for j0 in range(0, n, block_n):      # program id along N
            acc = np.zeros((min(block_m, m - i0), min(block_n, n - j0)), dtype=np.float32)
            for p0 in range(0, k, block_k):  # the K loop; the last block may be short
                acc += a[i0:i0 + block_m, p0:p0 + block_k].astype(np.float32) @ b[p0:p0 + block_k, j0:j0 + block_n].astype(np.float32)
            c[i0:i0 + block_m, j0:j0 + block_n] = acc
    return c


# ================================================================ rung 3: program order and its model
def grouped_tile(pid, num_pid_m: int, num_pid_n: int, group_m: int):
    """Eq. (4): program id -> (pid_m, pid_n) in grouped order (NumPy or int; the kernel does the same).

    Programs walk down ``group_m`` tile rows before moving one tile column right; the last group
    may be shorter. ``group_m = 1`` is plain row-major order.
    """
    per_group = group_m * num_pid_n
    group = pid // per_group
    first_m = group * group_m
    size_m = np.minimum(num_pid_m - first_m, group_m)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


def tile_order(num_pid_m: int, num_pid_n: int, group_m: int) -> np.ndarray:
    """``(num_pid_m, num_pid_n)`` array: the program id that computes each output tile."""
    pid = np.arange(num_pid_m * num_pid_n)
    pm, pn = grouped_tile(pid, num_pid_m, num_pid_n, group_m)
    order = np.full((num_pid_m, num_pid_n), -1)
    order[pm, pn] = pid
    return order


def panel_loads(num_pid_m: int, num_pid_n: int, group_m: int, wave: int) -> tuple[int, int]:
    """Model of DRAM traffic: programs run in waves of ``wave`` (one per SM); within a wave each
    distinct A row-panel and B column-panel is read from DRAM once (the others hit L2); nothing
    survives from one wave to the next. Returns (A panel loads, B panel loads).

    The ideal (everything reused) is ``(num_pid_m, num_pid_n)``; one load per tile is ``num_pid_m*num_pid_n`` each.
    """
    pid = np.arange(num_pid_m * num_pid_n)
    pm, pn = grouped_tile(pid, num_pid_m, num_pid_n, group_m)
    a = b = 0
    for start in range(0, pid.size, wave):
        a += np.unique(pm[start:start + wave]).size
        b += np.unique(pn[start:start + wave]).size
    return int(a), int(b)


# ================================================================ rung 4: pipelining model
@dataclass(frozen=True)
class Event:
    kind: str   # "load" or "mma"
    k: int      # which K step
    start: float
    end: float


def pipeline_timeline(n_k: int, load_time: float, mma_time: float, stages: int, latency: float = 0.0) -> list[Event]:
    """A schematic model of a ``num_stages`` software pipeline (not a measurement).

    One copy engine starts K-tile loads one after another, each occupying it for ``load_time``
    (bandwidth); a tile arrives ``latency`` after that. The tensor cores run one MMA per K tile
    (``mma_time`` each) once its tile has arrived. Shared memory holds ``stages`` buffers, so the
    load of step ``k`` cannot start before the MMA of step ``k - stages`` has freed buffer
    ``k % stages``. ``stages = 1``: load, compute, load, compute (nothing overlaps).
    A load event spans issue to arrival.
    """
    if stages < 1:
        raise ValueError("stages must be >= 1")
    engine_free = 0.0
    arrive: list[float] = []
    mma_end: list[float] = []
    events: list[Event] = []
    for k in range(n_k):
        start = engine_free                                   # the copy engine is free
        if k >= stages:
            start = max(start, mma_end[k - stages])           # ... and a buffer is free
        engine_free = start + load_time
        arrive.append(engine_free + latency)
        events.append(Event("load", k, start, arrive[-1]))
        start = max(arrive[k], mma_end[-1] if mma_end else 0.0)  # tile k arrived, tensor cores free
        mma_end.append(start + mma_time)
        events.append(Event("mma", k, start, mma_end[-1]))
    return events


# ================================================================ WGMMA shared-memory swizzle model
SWIZZLE_MODES = (0, 32, 64, 128)  # bytes; 0 = no swizzle ("interleave": 8x16-byte core matrices)


def swizzle(byte_addr, mode: int):
    """Eq. (6): Hopper's shared-memory swizzle of a byte address (vectorized).

    Bits ``[4, 4+b)`` (which 16-byte chunk in a row) are XORed with bits ``[7, 7+b)`` (which
    128-byte line), ``b = log2(mode / 16)``: 32 B -> 1 bit, 64 B -> 2, 128 B -> 3; 0 -> unchanged.
    """
    if mode not in SWIZZLE_MODES:
        raise ValueError(f"mode must be one of {SWIZZLE_MODES}")
    addr = np.asarray(byte_addr)
    if mode == 0:
        return addr.copy()
    mask = (mode // 16) - 1
    return addr ^ (((addr >> 7) & mask) << 4)


def smem_layout_addresses(rows: int, row_bytes: int, mode: int | str) -> np.ndarray:
    """Byte address of each 16-byte chunk of a ``rows x row_bytes`` tile in shared memory.

    ``mode="rowmajor"``: plain row-major, row pitch ``row_bytes``. ``mode`` in 32/64/128: the tile is
    cut into column atoms ``mode`` bytes wide (each ``rows x mode`` block stored row-major, atom after
    atom) and each address swizzled. ``mode=0``: no swizzle, atoms 16 bytes wide (core matrices of
    8 rows x 16 bytes stored contiguously). Returns shape ``(rows, row_bytes // 16)``.
    """
    chunks = row_bytes // 16
    r = np.arange(rows)[:, None]
    c = np.arange(chunks)[None, :]
    if mode == "rowmajor":
        return r * row_bytes + c * 16
    width = 16 if mode == 0 else mode
    per_atom = width // 16
    addr = (c // per_atom) * (rows * width) + r * width + (c % per_atom) * 16
    return swizzle(addr, mode)


def wavefronts(byte_addrs, access_bytes: int = 16) -> int:
    """Shared-memory passes ("wavefronts") to serve one request of ``access_bytes``-wide accesses.

    32 banks of 4 bytes: word ``w`` lives in bank ``w % 32``. Distinct words in the same bank need
    separate passes, so the count is the largest number of distinct words any bank must deliver.
    """
    addrs = np.asarray(byte_addrs).ravel()
    words = np.unique((addrs[:, None] // 4 + np.arange(access_bytes // 4)[None, :]).ravel())
    return int(np.bincount(words % 32, minlength=32).max())


def conflict_table(rows: int = 64, row_bytes: int = 128) -> dict:
    """Wavefronts for a row read (8 threads x 16 B along one row, like a global->shared copy) and a
    column read (8 threads x 16 B down 8 rows, like an MMA operand fragment), per layout. Ideal: 1."""
    out = {}
    for mode in ("rowmajor", 0, 32, 64, 128):
        addr = smem_layout_addresses(rows, row_bytes, mode)
        row = max(wavefronts(addr[r, :8]) for r in range(0, rows))
        col = max(wavefronts(addr[r0:r0 + 8, c]) for r0 in range(0, rows, 8) for c in range(addr.shape[1]))
        out[mode] = {"row": row, "column": col}
    return out
