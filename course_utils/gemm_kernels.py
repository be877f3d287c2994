r"""Topic 05 (GEMM in Triton): the library's Triton kernels, which benchmarks and later lessons use.

``notebooks/05_gemm_triton.ipynb`` writes each of them by hand in a cell (``*_kernel_by_hand``) and
asserts that its kernel agrees with the one here; the launchers (grid, strides, configuration) are
in :mod:`course_utils.gemm`.

* :func:`matmul_kernel` -- rungs 2 to 4: one program per output tile, K loop, masks, grouped order
  (eq. 4; ``GROUP_M = 1`` is row-major), ``num_stages`` at launch pipelines the K loop;
* :func:`matmul_persistent_kernel` -- rung 5b: one program per SM looping over tiles;
* :func:`matmul_descriptor_kernel` -- rungs 5a and 6: tensor descriptors (TMA on Hopper), optionally
  a warp-specialized K loop;
* :func:`matmul_descriptor_persistent_kernel` -- rung 5c: both.

``C = A @ B`` with ``A`` of shape ``(M, K)``, ``B`` of shape ``(K, N)``; every kernel accumulates in
fp32 and stores ``C`` in its own dtype. On the CPU tier Triton runs in its interpreter:
:func:`course_utils.env.import_triton` switches it on before Triton is imported. Where Triton is not
installed, the kernels are stand-ins whose launch raises :class:`course_utils.env.TritonUnavailable`.
"""
from __future__ import annotations

from .env import import_triton

triton, tl = import_triton(stub=True)  # without Triton: stand-ins, so the module imports and a launch says why not

__all__ = ["grouped_pid", "matmul_kernel", "matmul_persistent_kernel", "matmul_descriptor_kernel",
           "matmul_descriptor_persistent_kernel"]


@triton.jit
def grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
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
    pid_m, pid_n = grouped_pid(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
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
        pid_m, pid_n = grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M)
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
    pid_m, pid_n = grouped_pid(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
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
        pid_m, pid_n = grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])  # (BLOCK_M, BLOCK_K)
            b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])  # (BLOCK_K, BLOCK_N)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
