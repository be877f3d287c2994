r"""Topic 05 (GEMM in Triton): tiled, grouped, pipelined, persistent, tensor-descriptor and
warp-specialized matrix multiplication, plus the models behind them.

Used by:

* ``notebooks/05_gemm_triton.ipynb`` -- derives each piece (NumPy tiles, the Triton kernels, the
  tile-order re-read model, the pipelining timeline, the shared-memory swizzle and its bank
  conflicts), then imports them from here;
* ``solutions/05_gemm_triton.ipynb`` -- the ``check_*`` functions of its exercises;
* ``benchmarks/gemm_gpu.py`` -- every kernel against ``torch.matmul`` (cuBLAS) on a CUDA device, or
  under the interpreter at tiny sizes with ``--dry-run``.

Conventions: ``C = A @ B`` with ``A`` of shape ``(M, K)``, ``B`` of shape ``(K, N)``, ``C`` of shape
``(M, N)``; every kernel accumulates in fp32 and stores ``C`` in its own dtype. Lesson equations:

* (1) FLOPs :math:`=2MNK`; (2) minimum bytes :math:`=(MK+KN+MN)\,s` for element size :math:`s`;
  (3) intensity = (1)/(2);
* (4) the grouped program order (``grouped_tile``);
* (5) the swizzle: 16-byte chunk bits ``[4, 4+b)`` XOR address bits ``[7, 7+b)`` with
  :math:`b=\log_2(\text{mode}/16)` (``swizzle``);
* (6) the pipeline model's steady-state step time :math:`\max(C, L, (L+\lambda+C)/S)` (``pipeline_timeline``).

The problem set's kernels compute a linear layer's product ``C = X @ W.T`` with ``W`` stored
``(N, K)``; its checks launch them on strided, ragged fp32 views into padded buffers, so reads
past an edge and stores outside ``C`` are visible and named.

Only torch, triton and NumPy are needed (the GPU benchmark imports this module on a bare machine).
On a CPU, Triton runs in its interpreter (fp32, tiny sizes): ``setup()`` switches it on before
Triton is imported, and importing this module first does the same.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .bench import matmul_bytes, matmul_flops
from .checks import CheckFailed, Mistake, call_learner, check_function
from .env import import_triton

# Triton picks interpreter or compiler when imported: env.import_triton() switches to the
# interpreter on the CPU tier first, as setup() does.
triton, tl = import_triton()

__all__ = [
    "gemm_flops", "gemm_min_bytes", "gemm_intensity", "roofline_bound",
    "matmul_naive", "matmul_tiled_numpy",
    "grouped_tile", "tile_order", "panel_loads",
    "pipeline_timeline",
    "swizzle", "smem_layout_addresses", "wavefronts", "conflict_table", "SWIZZLE_MODES",
    "matmul_tiled", "matmul_persistent", "matmul_descriptor", "matmul_descriptor_persistent", "matmul_warp_specialized",
    "interpreted", "warp_specialize_available", "wgmma_in_ptx", "VARIANTS", "Config",
    "check_linear_kernel", "check_linear_bias_leaky_kernel", "check_grouped_tile_n", "check_smem_address",
    "check_wavefronts", "check_roofline_bound", "launch_exercise_kernel", "grouped_tile_n",
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
    """Eq. (5): Hopper's shared-memory swizzle of a byte address (vectorized).

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


# ================================================================ Triton kernels
def interpreted() -> bool:
    """True when Triton runs in its interpreter (the CPU tier)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
        # eq. (4), the same arithmetic as grouped_tile()
        per_group = GROUP_M * num_pid_n
        group = tile_id // per_group
        first_m = group * GROUP_M
        size_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile_id % per_group) % size_m
        pid_n = (tile_id % per_group) // size_m
        return pid_m, pid_n

    @triton.jit
    def matmul_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        """Rungs 2-4: one program per (BLOCK_M, BLOCK_N) tile of C, a K loop, masks on ragged edges,
        grouped program order (GROUP_M = 1: row-major); num_stages at launch pipelines the K loop."""
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        pid_m, pid_n = _grouped_pid(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of C
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) columns of C
        offs_k = tl.arange(0, BLOCK_K)                    # (BLOCK_K,)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 accumulator, whatever the inputs
        for k0 in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k0 * BLOCK_K                          # the last step may be short
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def matmul_persistent_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        """Rung 5b: NUM_PROGRAMS programs (one per SM) each loop over tiles
        pid, pid + NUM_PROGRAMS, ... in grouped order."""
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS):
            pid_m, pid_n = _grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + offs_k
                a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                            mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)   # (BLOCK_M, BLOCK_K)
                b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                            mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)   # (BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    @triton.jit
    def matmul_descriptor_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        WARP_SPECIALIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        """Rungs 5a and 6: tensor descriptors (TMA on Hopper) load whole tiles; out-of-bounds parts
        read as zero and are not stored, so no masks. WARP_SPECIALIZE splits the K loop into a
        producer (loads) and consumer (MMA) warp group where the compiler supports it."""
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        pid_m, pid_n = _grouped_pid(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])  # (BLOCK_M, BLOCK_K)
            b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])  # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))

    @triton.jit
    def matmul_descriptor_persistent_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        """Rung 5c: tensor descriptors in a persistent grid (one program per SM looping over tiles)."""
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS):
            pid_m, pid_n = _grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, tl.cdiv(K, BLOCK_K)):
                a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])  # (BLOCK_M, BLOCK_K)
                b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])  # (BLOCK_K, BLOCK_N)
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


@dataclass(frozen=True)
class Config:
    """Launch parameters of one kernel: tile shape, program grouping, pipeline depth, warps."""

    block_m: int = 32   # rows of C per program
    block_n: int = 32   # columns of C per program
    block_k: int = 16   # depth of one K step (tl.dot needs >= 16)
    group_m: int = 8    # tile rows walked before moving right (1 = row-major)
    num_stages: int = 2  # pipeline depth (buffers in shared memory); ignored by the interpreter
    num_warps: int = 4   # warps per program; ignored by the interpreter


CPU_CONFIG = Config()
GPU_CONFIG = Config(block_m=128, block_n=256, block_k=64, group_m=8, num_stages=3, num_warps=8)


def _default_config(x: torch.Tensor) -> Config:
    return CPU_CONFIG if x.device.type == "cpu" else GPU_CONFIG


def _check_inputs(a: torch.Tensor, b: torch.Tensor, cfg: Config) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"expected (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if interpreted() and a.dtype in (torch.bfloat16, torch.float16):
        raise TypeError("the Triton interpreter computes 16-bit dots wrongly: pass float32 on the CPU")
    for name, v in (("block_m", cfg.block_m), ("block_n", cfg.block_n), ("block_k", cfg.block_k)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name}={v}: use a power of two >= 16 (tl.dot's minimum on a GPU)")


def _launch_opts(cfg: Config, dtype: torch.dtype) -> dict:
    # fp32 inputs: exact IEEE products (the CPU tier's reference tolerance); 16-bit inputs: the default
    precision = "ieee" if dtype == torch.float32 else "tf32"  # ("tf32" only affects fp32 inputs)
    opts = {"DOT_PRECISION": precision}
    if not interpreted():
        opts.update(num_stages=cfg.num_stages, num_warps=cfg.num_warps)
    return opts


def matmul_tiled(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None, *, return_kernel: bool = False):
    """Rungs 2-4: :func:`matmul_kernel` on any strides; ``cfg.group_m=1`` gives row-major order."""
    cfg = cfg or _default_config(a)
    _check_inputs(a, b, cfg)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    handle = matmul_kernel[grid](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, **_launch_opts(cfg, a.dtype),
    )
    return (c, handle) if return_kernel else c


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # on the CPU: a pretend 4-SM machine, so the interpreter runs few programs


def matmul_persistent(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None, num_programs: int | None = None) -> torch.Tensor:
    """Rung 5b: at most one program per SM, each looping over tiles (grouped order)."""
    cfg = cfg or _default_config(a)
    _check_inputs(a, b, cfg)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    programs = min(tiles, num_programs or _num_sms(a.device))
    matmul_persistent_kernel[(programs,)](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_PROGRAMS=programs, **_launch_opts(cfg, a.dtype),
    )
    return c


_ALLOCATOR_SET = []


def _ensure_allocator() -> None:
    """On a GPU, device-side tensor descriptors need scratch memory: give Triton a torch allocator."""
    if interpreted() or _ALLOCATOR_SET:
        return

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)
    _ALLOCATOR_SET.append(alloc)


def _descriptor_launch(a, b, cfg, warp_specialize: bool, return_kernel: bool = False, persistent: bool = False):
    cfg = cfg or _default_config(a)
    _check_inputs(a, b, cfg)
    a, b = a.contiguous(), b.contiguous()
    (m, k), n = a.shape, b.shape[1]
    for name, extent in (("K", k), ("N", n)):
        if (extent * a.element_size()) % 16:
            raise ValueError(
                f"{name}={extent}: a tensor descriptor needs row strides that are multiples of 16 bytes "
                f"({16 // a.element_size()} elements of {a.dtype}); pad the matrix or use matmul_tiled"
            )
    _ensure_allocator()
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    blocks = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, **_launch_opts(cfg, a.dtype))
    if persistent:
        programs = min(tiles, _num_sms(a.device))
        handle = matmul_descriptor_persistent_kernel[(programs,)](a, b, c, m, n, k, NUM_PROGRAMS=programs, **blocks)
    else:
        handle = matmul_descriptor_kernel[(tiles,)](a, b, c, m, n, k, WARP_SPECIALIZE=warp_specialize, **blocks)
    return (c, handle) if return_kernel else c


def matmul_descriptor(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None, *, return_kernel: bool = False):
    """Rung 5a: tile loads through ``tl.make_tensor_descriptor`` (TMA on Hopper). Contiguous inputs,
    row strides a multiple of 16 bytes."""
    return _descriptor_launch(a, b, cfg, False, return_kernel)


def matmul_descriptor_persistent(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None) -> torch.Tensor:
    """Rung 5c: tensor descriptors and a persistent grid together (same alignment rules as :func:`matmul_descriptor`)."""
    return _descriptor_launch(a, b, cfg, False, persistent=True)


def warp_specialize_available() -> tuple[bool, str]:
    """Whether ``tl.range(..., warp_specialize=True)`` can be used here, and why not."""
    if triton is None:
        return False, "triton is not installed"
    if "warp_specialize" not in inspect.signature(tl.range.__init__).parameters:
        return False, f"triton {triton.__version__} has no tl.range(..., warp_specialize=...)"
    if interpreted():
        return True, "interpreter: the flag is accepted and the loop runs sequentially (correctness only)"
    major, _ = torch.cuda.get_device_capability()
    if major < 9:
        return False, f"compute capability {major}.x: warp specialization needs Hopper (9.x) or newer"
    return True, f"compute capability {major}.x with triton {triton.__version__}"


def matmul_warp_specialized(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None, *, return_kernel: bool = False):
    """Rung 6: :func:`matmul_descriptor` with a warp-specialized K loop (producer/consumer warps).

    Raises ``RuntimeError`` where :func:`warp_specialize_available` says no, or where the compiler
    rejects it (the message carries the compiler's reason)."""
    ok, why = warp_specialize_available()
    if not ok:
        raise RuntimeError(f"warp specialization unavailable: {why}")
    try:
        return _descriptor_launch(a, b, cfg, True, return_kernel)
    except (ValueError, TypeError):
        raise
    except Exception as exc:  # a compiler that cannot warp-specialize this loop
        raise RuntimeError(f"warp specialization failed to compile: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc


VARIANTS: dict[str, Callable] = {
    "tiled row-major": lambda a, b, cfg=None: matmul_tiled(a, b, _with(cfg or _default_config(a), group_m=1)),
    "tiled grouped": lambda a, b, cfg=None: matmul_tiled(a, b, cfg),
    "persistent": lambda a, b, cfg=None: matmul_persistent(a, b, cfg),
    "descriptor (TMA)": lambda a, b, cfg=None: matmul_descriptor(a, b, cfg),
    "descriptor persistent": lambda a, b, cfg=None: matmul_descriptor_persistent(a, b, cfg),
    "warp-specialized": lambda a, b, cfg=None: matmul_warp_specialized(a, b, cfg),
}


def _with(cfg: Config, **changes) -> Config:
    return Config(**{**cfg.__dict__, **changes})


def wgmma_in_ptx(handle) -> bool | None:
    """True/False: does the compiled kernel's PTX contain ``wgmma.mma_async``? None in the interpreter."""
    asm = getattr(handle, "asm", None)
    if not asm or "ptx" not in asm:
        return None
    return "wgmma.mma_async" in asm["ptx"]


# ================================================================ problem-set checks
# The kernel exercises compute a linear layer's product, C = X @ W^T with W stored (N, K) as in
# torch.nn.Linear, on strided fp32 views into padded buffers (interpreter on a CPU).
C_FILL = -777.0  # what C and the memory around it hold before the kernel runs: unstored places keep it
PAD = 64  # padding around every input: reads past an edge land here (a loud 1e3), never outside memory


def _padded(rng, rows, cols, fill=1.0e3):
    """A (rows, cols) fp32 view into a (rows + PAD, cols + PAD) buffer whose padding holds ``fill``:
    reads past the edges pick up a loud, finite value, and the row stride differs from the width."""
    buf = torch.full((rows + PAD, cols + PAD), fill, dtype=torch.float32)
    buf[:rows, :cols] = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32))
    return buf, buf[:rows, :cols]


def _linear_inputs(rng, block_k):
    """Ragged M, N (not multiples of 32) and K with a short last K step; every side below PAD + 16."""
    m, n = int(rng.integers(17, 72)), int(rng.integers(17, 72))
    k = int(rng.integers(1, 4)) * block_k + int(rng.integers(1, block_k))
    x_buf, x = _padded(rng, m, k)
    w_buf, w = _padded(rng, n, k)
    return x_buf, x, w_buf, w


def _read(buf: torch.Tensor, rows: int, cols: int, stride_r: int, stride_c: int) -> torch.Tensor:
    """``buf.flat[r*stride_r + c*stride_c]`` for r < rows, c < cols: what a kernel with these strides reads."""
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    return buf.reshape(-1)[r * stride_r + c * stride_c]


def _wrong_linears(x_buf, x, w_buf, w, block_k):
    """Plausible wrong kernels for X @ W^T, emulated on the host: (hint, C) pairs, at fp32 tolerance."""
    m, k = x.shape
    n = w.shape[0]
    k_floor = k // block_k * block_k
    k_ceil = -(-k // block_k) * block_k
    ldx, ldw = x.stride(0), w.stride(0)
    ref = x @ w.T
    store_ok = (torch.arange(m)[:, None] < n) & (torch.arange(n)[None, :] < m)
    return [
        ("the K remainder was dropped: loop over tl.cdiv(K, BLOCK_K) steps, not K // BLOCK_K, "
         "and mask the last, short step.", x[:, :k_floor] @ w[:, :k_floor].T),
        ("the last K step read past K (values from beyond the matrix leaked in): mask the K axis "
         "with offs_k < K in both loads, other=0.0.", _read(x_buf, m, k_ceil, ldx, 1) @ _read(w_buf, n, k_ceil, ldw, 1).T),
        ("X's strides are swapped: the row offset multiplies stride_xm and the K offset stride_xk.",
         _read(x_buf, m, k, 1, ldx) @ w.T),
        ("W's strides are swapped: W is stored (N, K), so its tile (k, n) is at offs_n * stride_wn + offs_k * stride_wk.",
         x @ _read(w_buf, k, n, ldw, 1)),
        ("the kernel assumed contiguous inputs: use the strides passed in, not the matrix widths.",
         _read(x_buf, m, k, k, 1) @ _read(w_buf, n, k, k, 1).T),
        ("the store mask is on the wrong axes: rows (offs_m) compare with M and columns (offs_n) with N.",
         torch.where(store_ok, ref, torch.full((), C_FILL))),
    ]


def _low_precision_linear(x, w, block_k, dtype):
    """X @ W^T accumulated in ``dtype``: each K step's product added to a rounded accumulator."""
    acc = torch.zeros((x.shape[0], w.shape[0]), dtype=dtype)
    for p in range(0, x.shape[1], block_k):
        part = x[:, p:p + block_k].to(dtype).float() @ w[:, p:p + block_k].to(dtype).float().T
        acc = (acc.float() + part).to(dtype)
    return acc.float()


def _accumulator_mistakes(x, w, block_k):
    """(hint, C, rtol, atol): compared loosely, as the learner's rounding order differs from ours."""
    hint = ("the accumulator is in low precision ({}): create it with tl.zeros(..., dtype=tl.float32) and "
            "convert only when storing.")
    return [(hint.format("fp16"), _low_precision_linear(x, w, block_k, torch.float16), 2e-3, 2e-2),
            (hint.format("bf16"), _low_precision_linear(x, w, block_k, torch.bfloat16), 1.6e-2, 1e-1)]


def _unwrap_interpreter_error(fn: Callable) -> Callable:
    """A stub raising NotImplementedError inside an interpreted kernel reaches us wrapped in an
    InterpreterError: unwrap it, so the check reports "not attempted"."""
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as exc:
            cause = exc
            while cause is not None:
                if isinstance(cause, NotImplementedError) or "NotImplementedError" in str(cause):
                    raise NotImplementedError("stub") from None
                cause = cause.__cause__ or cause.__context__
            raise
    return run


def _launch_padded(kernel, x, w, block_m, block_n, block_k, extra, constexprs):
    (m, k), n = x.shape, w.shape[0]
    buf = torch.full((m + PAD, n + PAD), C_FILL, dtype=torch.float32, device=x.device)
    c = buf[:m, :n]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    kernel[grid](x, w, c, *extra, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1), c.stride(0), c.stride(1),
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **constexprs)
    buf = buf.cpu()
    outside = buf.clone()
    outside[:m, :n] = C_FILL
    return buf[:m, :n].clone(), bool((outside != C_FILL).any())


def launch_exercise_kernel(kernel, x: torch.Tensor, w: torch.Tensor, *, block_m: int = 32, block_n: int = 32,
                           block_k: int = 16, extra: tuple = (), **constexprs) -> torch.Tensor:
    """Launch a learner's kernel with the exercises' signature
    ``(x_ptr, w_ptr, c_ptr, *extra, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
    BLOCK_M, BLOCK_N, BLOCK_K)`` on a 2-D grid ``(pid_m, pid_n)``; C is a view into a padded
    buffer filled with ``C_FILL``, so a wrong store mask cannot touch other memory. Returns C (on the CPU)."""
    return _launch_padded(kernel, x, w, block_m, block_n, block_k, extra, constexprs)[0]


def _diagnose(name, got, want, wrongs, loose, rtol=1e-5):
    """Raise CheckFailed naming the first wrong variant ``got`` matches (``loose`` at their own tolerances)."""
    if tuple(got.shape) != tuple(want.shape):
        raise CheckFailed(f"{name}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}.")
    for hint, wrong in wrongs:
        if torch.allclose(got, wrong, rtol=10 * rtol, atol=10 * rtol):
            raise CheckFailed(f"{name}: {hint}")
    for hint, wrong, r_loose, a_loose in loose:
        if torch.allclose(got, wrong, rtol=r_loose, atol=a_loose):
            raise CheckFailed(f"{name}: {hint}")
    if not torch.isfinite(got).all():
        raise CheckFailed(f"{name}: the output holds NaN or Inf; print one tile of it next to the reference.")
    err = (got - want).abs().max().item()
    raise CheckFailed(f"{name}: values differ from the reference by up to {err:.3g}; compare one tile by hand with torch.")


def _kernel_trials(name, kernel, trials, seed, make_want, make_wrongs, block_k=16, extra_inputs=None):
    if not hasattr(kernel, "__getitem__"):
        raise CheckFailed(f"{name}: expected a @triton.jit kernel, got {type(kernel).__name__}; decorate it with @triton.jit.")
    # CPU: the interpreter, exact fp32 products. GPU: compiled, where tl.dot on fp32 defaults to TF32
    # (10-bit mantissa products), so the tolerance there is TF32's.
    on_gpu = not interpreted() and torch.cuda.is_available()
    rtol = 2e-3 if on_gpu else 1e-5
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        x_buf, x, w_buf, w = _linear_inputs(rng, block_k)
        extra = extra_inputs(rng, w.shape[0]) if extra_inputs else ()
        if on_gpu:  # same strides: views into the buffers moved to the GPU
            xd, wd = x_buf.cuda()[:x.shape[0], :x.shape[1]], w_buf.cuda()[:w.shape[0], :w.shape[1]]
            extra_d = tuple(e.cuda() for e in extra)
        else:
            xd, wd, extra_d = x, w, extra
        run = _unwrap_interpreter_error(lambda: _launch_padded(kernel, xd, wd, 32, 32, block_k, extra_d, {}))
        got, wrote_outside = call_learner(name, run)
        want = make_want(x, w, *extra)
        # the sqrt(K) scale of lesson 05: outputs near zero carry the rounding of the whole K-term sum
        if torch.allclose(got, want, rtol=rtol, atol=rtol * x.shape[1] ** 0.5):
            if wrote_outside:
                raise CheckFailed(f"{name}: C is right, but the kernel also stored outside it (past row M or column N): "
                                  "mask the store with (offs_m < M) and (offs_n < N).")
            continue
        wrongs, loose = make_wrongs(x_buf, x, w_buf, w, *extra)
        _diagnose(name, got, want, wrongs, loose, rtol)


def check_linear_kernel(kernel, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise: ``C = X @ W^T`` (W stored (N, K)) as a tiled Triton kernel with masks, on ragged strided inputs."""
    name = "linear kernel"

    def wrongs(x_buf, x, w_buf, w):
        return _wrong_linears(x_buf, x, w_buf, w, 16), _accumulator_mistakes(x, w, 16)

    _kernel_trials(name, kernel, trials, seed, lambda x, w: x @ w.T, wrongs)
    if not quiet:
        print(f"✅ {name}: matches X @ W.T on {trials} ragged, strided inputs.")


def _bias_inputs(rng, n):
    return (torch.from_numpy(rng.standard_normal(n).astype(np.float32)),)


def _leaky(x, slope=0.1):
    return torch.where(x > 0, x, slope * x)


def check_linear_bias_leaky_kernel(kernel, *, trials: int = 3, seed: int = 1, quiet: bool = False) -> None:
    """Exercise: ``leaky_relu(X @ W^T + bias)`` (slope 0.1, one bias per output column) fused into the epilogue."""
    name = "fused bias + leaky ReLU kernel"

    def want(x, w, bias):
        return _leaky(x @ w.T + bias[None, :])

    def wrongs(x_buf, x, w_buf, w, bias):
        k_steps = -(-x.shape[1] // 16)
        ref = x @ w.T
        rows = [
            ("the bias was added inside the K loop (once per K step): add it once, after the loop.",
             _leaky(ref + k_steps * bias[None, :])),
            ("the activation ran before the bias: compute acc + bias first, then leaky ReLU.", _leaky(ref) + bias[None, :]),
            ("the bias is missing: load bias[offs_n] (mask offs_n < N) and add it to each column.", _leaky(ref)),
            ("the activation is missing: apply tl.where(x > 0, x, 0.1 * x) before storing.", ref + bias[None, :]),
            ("that is a plain ReLU: leaky ReLU keeps 0.1 * x for negative x.", torch.relu(ref + bias[None, :])),
        ]
        return rows + _wrong_linears(x_buf, x, w_buf, w, 16)[:1], _accumulator_mistakes(x, w, 16)

    _kernel_trials(name, kernel, trials, seed, want, wrongs, extra_inputs=_bias_inputs)
    if not quiet:
        print(f"✅ {name}: matches leaky_relu(X @ W.T + bias) on {trials} ragged inputs.")


def grouped_tile_n(pid, num_pid_m: int, num_pid_n: int, group_n: int):
    """Grouped order along N (the exercise's variant of eq. 4): walk ``group_n`` tile columns across
    before moving one tile row down; the last group may be narrower."""
    pid_n, pid_m = grouped_tile(pid, num_pid_n, num_pid_m, group_n)
    return pid_m, pid_n


def check_grouped_tile_n(fn: Callable, *, trials: int = 4, seed: int = 0, quiet: bool = False) -> None:
    """Exercise: ``fn(pid, num_pid_m, num_pid_n, group_n) -> (pid_m, pid_n)`` on NumPy arrays of program ids."""
    def make_inputs(rng):
        num_pid_m, num_pid_n = int(rng.integers(2, 9)), int(rng.integers(3, 12))
        group_n = int(rng.integers(2, 5))
        if num_pid_n % group_n == 0:
            num_pid_n += 1  # so the last group is narrower
        return np.arange(num_pid_m * num_pid_n), num_pid_m, num_pid_n, group_n

    def stack(fn_):
        return lambda *args: np.stack([np.asarray(v) for v in fn_(*args)])

    def unclamped(pid, pm, pn, g):  # the last group treated as full
        per = g * pm
        return (pid % per) // g, (pid // per) * g + (pid % per) % g

    check_function(
        stack(fn), stack(grouped_tile_n), make_inputs, name="grouped order along N", trials=trials, seed=seed, quiet=quiet,
        mistakes=[
            Mistake("row-major", "that is plain row-major order: walk group_n tile columns across before moving one row down.",
                    stack(lambda pid, pm, pn, g: (pid // pn, pid % pn))),
            Mistake("column-major", "that is plain column-major order: only group_n columns at a time, then the next band of columns.",
                    stack(lambda pid, pm, pn, g: (pid % pm, pid // pm))),
            Mistake("grouped along M", "that groups along M (the lesson's eq. 4); here the groups are bands of group_n tile columns.",
                    stack(lambda pid, pm, pn, g: grouped_tile(pid, pm, pn, g))),
            Mistake("unclamped", "the last group is narrower when num_pid_n is not a multiple of group_n: use min(num_pid_n - first_n, group_n).",
                    stack(unclamped)),
            Mistake("swapped", "pid_m and pid_n are swapped: return (row of tiles, column of tiles).",
                    stack(lambda pid, pm, pn, g: grouped_tile_n(pid, pm, pn, g)[::-1])),
        ],
    )


def check_smem_address(fn: Callable, *, trials: int = 3, seed: int = 0, quiet: bool = False) -> None:
    """Exercise: ``fn(row, chunk, rows, mode)`` = byte address of 16-byte ``chunk`` of ``row`` in a
    ``rows x 128``-byte tile stored in ``mode``-byte swizzle atoms (:func:`smem_layout_addresses`)."""
    def make_inputs(rng):
        rows = int(rng.choice([16, 32, 64]))
        r, c = np.meshgrid(np.arange(rows), np.arange(8), indexing="ij")  # (rows, 8) every chunk
        return r, c, rows, int(rng.choice([32, 64, 128], p=[0.4, 0.4, 0.2]))

    def ref(r, c, rows, mode):
        return smem_layout_addresses(rows, 128, mode)[r, c]

    def no_swizzle(r, c, rows, mode):
        width = mode
        return (c // (width // 16)) * rows * width + r * width + (c % (width // 16)) * 16

    def no_atoms(r, c, rows, mode):
        return swizzle(r * 128 + c * 16, mode)

    def atoms_of_8_rows(r, c, rows, mode):  # atom column j stacked every 8 rows instead of after all rows
        width, per = mode, mode // 16
        return swizzle((c // per) * 8 * width + r * width + (c % per) * 16, mode)

    def swizzle_128(r, c, rows, mode):
        width, per = mode, mode // 16
        return swizzle((c // per) * rows * width + r * width + (c % per) * 16, 128)

    check_function(
        fn, ref, make_inputs, name="swizzled shared-memory address", trials=trials, seed=seed, quiet=quiet,
        mistakes=[
            Mistake("no swizzle", "the atoms are right but the swizzle is missing: apply eq. (5) to the final address.", no_swizzle),
            Mistake("no atoms", "the tile is not cut into atoms: with a mode narrower than 128 bytes, atom j = chunk // (mode // 16) holds all rows, mode bytes each.", no_atoms),
            Mistake("128 swizzle", "the swizzle must use the same mode as the atoms (b = log2(mode / 16) bits).", swizzle_128),
            Mistake("8-row atoms", "in this model an atom column holds all `rows` rows: atom j starts at j * rows * mode.", atoms_of_8_rows),
        ],
    )


def check_wavefronts(fn: Callable, *, trials: int = 6, seed: int = 0, quiet: bool = False) -> None:
    """Exercise: ``fn(byte_addrs, access_bytes)`` = passes to serve one access of ``access_bytes``
    (4, 8 or 16) per thread at those addresses (32 banks x 4 B; threads sharing a word are served together)."""
    def make_inputs(rng):
        access = int(rng.choice([4, 8, 16]))
        threads = 128 // access                       # one 128-byte request: 32, 16 or 8 threads
        stride = access * int(rng.choice([1, 2, 4, 8, 9, 16]))
        lanes = np.arange(threads)
        if rng.random() < 0.5:
            lanes[threads // 2:] = lanes[:threads // 2]  # half the threads repeat the others (a broadcast)
        return (int(rng.integers(0, 64)) * access + stride * lanes).astype(np.int64), access

    def bytes_as_banks(addrs, access):
        words = np.unique((np.asarray(addrs)[:, None] + 4 * np.arange(access // 4)).ravel())
        return int(np.bincount(words % 32, minlength=32).max())

    def no_broadcast(addrs, access):
        words = (np.asarray(addrs)[:, None] // 4 + np.arange(access // 4)).ravel()
        return int(np.bincount(words % 32, minlength=32).max())

    def distinct_banks(addrs, access):
        words = (np.asarray(addrs)[:, None] // 4 + np.arange(access // 4)).ravel()
        return int(np.unique(words % 32).size)

    check_function(
        fn, wavefronts, make_inputs, name="bank-conflict passes", trials=trials, seed=seed, quiet=quiet,
        mistakes=[
            Mistake("distinct banks", "counted distinct banks touched; count instead the most distinct words any one bank must serve.", distinct_banks),
            Mistake("bytes", "banks are 4 bytes wide: bank = (byte_address // 4) % 32.", bytes_as_banks),
            Mistake("no broadcast", "threads reading the same word are served in one pass (a broadcast): count distinct words per bank.", no_broadcast),
        ],
    )


def check_roofline_bound(fn: Callable, *, trials: int = 4, seed: int = 0, quiet: bool = False) -> None:
    """Exercise: ``fn(m, n, k, itemsize, peak_flops, bandwidth) -> attainable FLOP/s`` by eq. (1)-(3)."""
    def make_inputs(rng):  # memory-bound shapes (far below the peak) and, sometimes, a square compute-bound one
        if rng.random() < 0.25:
            m = n = k = 8192
        else:
            m, n, k = int(rng.choice([1, 16, 128])), int(rng.choice([1024, 4096])), int(rng.choice([1024, 4096]))
        return m, n, k, int(rng.choice([2, 4])), float(rng.choice([1e15, 2e15])), float(rng.choice([1e12, 2e12]))

    def ref(m, n, k, s, p, bw):
        return float(roofline_bound(m, n, k, s, p, bw)[0])

    check_function(
        fn, ref, make_inputs, name="roofline bound", trials=trials, seed=seed, quiet=quiet, rtol=1e-6, atol=0.0,
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
        ],
    )
