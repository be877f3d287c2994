r"""Topic 03 (convolution), section 6: the CPU model a compiled GEMM is tuned to, read from this machine.

Used by ``notebooks/03_convolution.ipynb`` (section 6 derives the peak, the register tile and the cache blocks
from these), :mod:`course_utils.convolution_compiled` and ``benchmarks/conv_cpu.py``.

* :func:`vector_isa`: SIMD width, vector-register count and FMA units from ``/proc/cpuinfo`` flags;
* :func:`measure_clock_ghz`: the clock, measured with a chain of dependent 1-cycle integer adds;
* :func:`derived_peak_gflops`: cores x lanes x FMA units x 2 x clock (lesson eq. 7);
* :func:`fma_throughput_gflops`: the peak measured: independent FMA chains in registers, timed (lesson section 6);
* :func:`register_tile_shape`: the largest ``mr x nr`` tile that fits the vector registers (lesson eq. 8);
* :func:`sane_caches`: the sysfs cache sizes with a plausibility check on the last level (a virtual
  machine may report its host socket's whole L3);
* :func:`prefer_wide_vectors`, :func:`prefer_workqueue_threads`, :func:`register_tile` and :func:`prefetch`: four Numba
  details (let LLVM use 512-bit vectors; keep Numba's threads off torch's OpenMP pool; a small array on the stack,
  which the compiler can keep in registers; a software prefetch, which Numba has no function for). The first two live in :mod:`course_utils.env`: :func:`~course_utils.env.setup` runs
  them (``env.configure_numba()``) before Numba compiles anything; importing this module changes nothing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from .env import prefer_wide_vectors, prefer_workqueue_threads

__all__ = ["cpu_flags", "vector_isa", "measure_clock_ghz", "derived_peak_gflops", "fma_throughput_gflops",
           "register_tile_shape",
           "sane_caches", "MAX_L3_PER_CORE", "prefer_wide_vectors", "prefer_workqueue_threads", "register_tile",
           "prefetch"]

# The largest last-level cache per core any shipping x86 server part has (AMD's 3D V-Cache EPYCs: 1152 MiB over
# 96 cores = 12 MiB); Intel Xeons have 1.5 to 5 MiB per core. A per-core share above this is the host's, not ours.
MAX_L3_PER_CORE = 12 * 2**20


def cpu_flags(path: str | os.PathLike = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux), or an empty set where /proc/cpuinfo does not exist."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def vector_isa(flags: set[str] | None = None) -> dict:
    """SIMD facts from the flags: ``{"isa", "bits", "fp32_lanes", "registers", "fma_units", "why_fma_units"}``.

    The FMA-unit count is not a flag: Intel server cores with AVX-512 and AMX (Sapphire Rapids and later) have two
    512-bit FMA units per core, client AVX-512 cores one; AVX2 cores with FMA have two 256-bit units.
    """
    flags = cpu_flags() if flags is None else flags
    if "avx512f" in flags:
        units = 2 if ("amx_tile" in flags or "avx512_fp16" in flags) else 1
        why = "server core with AMX: two 512-bit FMA ports" if units == 2 else "assumed one 512-bit FMA port"
        return dict(isa="AVX-512", bits=512, fp32_lanes=16, registers=32, fma_units=units, why_fma_units=why)
    if "avx2" in flags and "fma" in flags:
        return dict(isa="AVX2+FMA", bits=256, fp32_lanes=8, registers=16, fma_units=2, why_fma_units="two 256-bit FMA ports")
    if "asimd" in flags or "neon" in flags:
        return dict(isa="NEON", bits=128, fp32_lanes=4, registers=32, fma_units=2, why_fma_units="assumed two 128-bit pipes")
    return dict(isa="SSE", bits=128, fp32_lanes=4, registers=16, fma_units=1, why_fma_units="no FMA: mul and add separate")


def _add_chain(n: int, seed: int) -> int:
    x = seed
    for _ in range(n):       # each iteration: x depends on x through two 1-cycle operations (shift, add)
        x += x >> 7
    return x


def measure_clock_ghz(n: int = 5_000_000, repeats: int = 10) -> float:
    """The core clock in GHz: a compiled chain of ``n`` x (shift + add), 2 cycles per iteration, timed.

    Integer add and shift have a latency of one cycle on every x86 and Arm core, and the chain forbids overlap,
    so ``2 n / seconds`` is cycles per second (under turbo, the turbo clock; in a VM, the host core's). Short runs,
    best of several: on a shared machine a run that was descheduled halfway reads as a slow clock.
    """
    import numba

    chain = numba.njit(cache=True)(_add_chain)
    chain(10, 3)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        chain(n, 3)
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best / 1e9


def derived_peak_gflops(cores: int, fp32_lanes: int, fma_units: int, clock_ghz: float) -> float:
    """Eq. (7): cores x lanes x FMA units x 2 FLOPs per FMA x clock."""
    return cores * fp32_lanes * fma_units * 2 * clock_ghz


_FMA_LOOPS: dict = {}


def _fma_loop(n_vectors: int, lanes: int):
    """A compiled loop of ``n_vectors`` independent chains ``acc = acc * a + b``, each ``lanes`` wide, in registers."""
    key = (n_vectors, lanes)
    if key not in _FMA_LOOPS:
        import numba
        import numpy as np

        size = n_vectors * lanes

        @numba.njit(fastmath={"contract"})
        def loop(n, a, b):
            acc = register_tile(size)                 # on the stack: LLVM keeps it in vector registers
            for t in range(size):
                acc[t] = np.float32(t) * np.float32(1e-3)
            for _ in range(n):
                for t in range(size):                 # n_vectors vector FMAs, each depending on its own last value
                    acc[t] = acc[t] * a + b
            total = np.float32(0.0)
            for t in range(size):
                total += acc[t]
            return total

        _FMA_LOOPS[key] = loop
    return _FMA_LOOPS[key]


def fma_throughput_gflops(n_vectors: int, lanes: int, *, flops: float = 2e8, repeats: int = 5) -> tuple[float, str]:
    """Measured fp32 GFLOP/s of one core running ``n_vectors`` independent vector FMA chains (best of ``repeats``).

    Each chain waits for its previous FMA (latency ``lat`` cycles), so with ``U`` FMA units the core is busy only
    when ``n_vectors >= lat * U``: below that the rate grows with ``n_vectors``, above it stays at the peak.
    Returns ``(gflops, first_fma)``, the second the first FMA instruction of the machine code (to check it is a
    full-width vector FMA, e.g. ``vfmadd213ps ... %zmm``). Below 4 chains LLVM may emit scalar FMAs instead.
    """
    import re

    import numpy as np

    loop = _fma_loop(n_vectors, lanes)
    a, b = np.float32(0.999), np.float32(1e-3)
    loop(10, a, b)
    asm = loop.inspect_asm(loop.signatures[0])
    first = next(iter(re.findall(r"vfmadd\w+\s+[^\n]*", asm)), "no FMA instruction")
    n = max(1, int(flops / (2 * n_vectors * lanes)))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loop(n, a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_vectors * lanes * n / best / 1e9, first


def register_tile_shape(registers: int, lanes: int, nr_vectors: int = 4) -> tuple[int, int]:
    """Eq. (8): with ``nr = nr_vectors * lanes``, the largest ``mr`` with mr*nr_vectors + nr_vectors + 1 <= registers.

    The C tile takes ``mr * nr / lanes`` registers, one row of the B micro-panel ``nr / lanes``, and the broadcast
    element of A one more.
    """
    mr = (registers - nr_vectors - 1) // nr_vectors
    return mr, nr_vectors * lanes


def sane_caches(caches: dict, cores: int | None = None, max_l3_per_core: int = MAX_L3_PER_CORE) -> dict:
    """``caches`` (from ``convolution_blocking.cache_sizes``) with an implausible L3 replaced by a per-core bound.

    A virtual machine reports its host's whole last-level cache (on this course's VM: 480 MiB for 2 vCPUs), which
    every core of the socket and every other guest shares. Returns the caches with ``L3`` at most
    ``cores x max_l3_per_core`` and ``L3_note`` saying what was changed.
    """
    cores = cores or os.cpu_count() or 1
    out = dict(caches)
    bound = cores * max_l3_per_core
    if caches["L3"] > bound:
        out["L3"] = bound
        out["L3_note"] = (f"reported {caches['L3'] >> 20} MiB for {cores} cores = {caches['L3'] / cores / 2**20:.0f} MiB per "
                          f"core, above any real core's share ({max_l3_per_core >> 20} MiB): the host's shared L3; "
                          f"using {bound >> 20} MiB")
    else:
        out["L3_note"] = "as reported"
    return out


def _make_register_tile():
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _stack_pointer(typingctx, size):
        if not isinstance(size, types.IntegerLiteral):
            return None

        def codegen(context, builder, signature, args):
            return cgutils.alloca_once(builder, context.get_value_type(types.float32), size=size.literal_value)

        return types.CPointer(types.float32)(size), codegen

    import numba

    @numba.njit(inline="always")
    def register_tile(size):
        """A float32 array of ``size`` (a compile-time constant) on the stack, uninitialized.

        A NumPy array lives on the heap, where the compiler must assume other pointers may alias it; a stack array
        that does not escape can be split into scalars and kept in registers (LLVM's SROA).
        """
        return numba.carray(_stack_pointer(size), (size,))

    return register_tile


register_tile = _make_register_tile()


def _make_prefetch():
    import llvmlite.binding as llvm
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    # LLVM's prefetch intrinsic is overloaded on the pointer type: "p0" since opaque pointers (LLVM 15), "p0i8" before
    name = "llvm.prefetch.p0" if llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"

    @intrinsic
    def prefetch(typingctx, array, i, j):
        """Ask the core to bring the cache line holding ``array[i, j]`` (2-D, in bounds) into L1; no effect on results.

        Emits LLVM's ``llvm.prefetch`` (read, keep in all levels: ``prefetcht0`` on x86), which Numba has no
        function for. A prefetch never faults and is only a hint, so a wrong address costs a wasted load, no error.
        """
        if not (isinstance(array, types.Array) and array.ndim == 2 and isinstance(i, types.Integer)
                and isinstance(j, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], args[2]], wraparound=False)
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name)
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])   # read, locality 3 (all levels), data
            return context.get_dummy_value()

        return types.void(array, i, j), codegen

    return prefetch


prefetch = _make_prefetch()
