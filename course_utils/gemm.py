r"""Topic 05 (GEMM in Triton): the launchers of the library's kernels, and which rungs exist.

Used by:

* ``notebooks/05_gemm_triton.ipynb`` -- writes each kernel and launcher by hand, then asserts that
  it agrees with the launchers here on fresh inputs;
* ``benchmarks/gemm_gpu.py`` -- every entry of :data:`VARIANTS` against ``torch.matmul`` (cuBLAS)
  on a CUDA device, or under the interpreter at tiny sizes with ``--dry-run``.

A launcher computes the grid and strides, picks a :class:`Config` (tile shape, grouping, pipeline
depth, warps) and launches a kernel of :mod:`course_utils.gemm_kernels`. The NumPy models are in
:mod:`course_utils.gemm_models`; the problem set's checks in :mod:`course_utils.grading.gemm`.

The tier comes from :func:`course_utils.env.detect_tier` (the one that ``setup()`` reports): on
the ``cpu`` tier Triton runs in its interpreter (fp32, tiny sizes); warp specialization needs ``sm90``.
Only torch, triton and NumPy are needed (the GPU benchmark imports this module on a bare machine).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from .env import detect_tier, import_triton, simulated
from .gemm_kernels import (
    matmul_descriptor_kernel,
    matmul_descriptor_persistent_kernel,
    matmul_kernel,
    matmul_persistent_kernel,
)

triton, tl = import_triton(stub=True)   # stand-ins where Triton is not installed: a launch says so
HAS_TRITON = import_triton()[0] is not None

__all__ = [
    "Config", "CPU_CONFIG", "GPU_CONFIG", "WS_CONFIG", "GPU_CONFIGS", "gpu_configs", "T4_CONFIG", "TIER", "HAS_TRITON", "interpreted",
    "matmul_tiled", "matmul_persistent", "matmul_descriptor", "matmul_descriptor_persistent", "matmul_warp_specialized",
    "set_descriptor_allocator", "warp_specialize_available", "wgmma_in_ptx", "VARIANTS",
]

TIER = detect_tier()  # "cpu", "cuda" or "sm90": course_utils.env decides, as setup() does


def interpreted() -> bool:
    """True on the CPU tier and under a simulated GPU tier (``COURSE_TIER_SIMULATE``), where Triton runs in its
    interpreter (``env.import_triton`` switched it on)."""
    return TIER == "cpu" or simulated() is not None


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
# Warp specialization: Triton (3.9) splits the K loop into producer and consumer partitions only at
# num_warps=4 (4 consumer warps + its own worker warps, 384 threads; setmaxnreg moves registers); at
# num_warps=8 it silently compiles the plain multistage descriptor kernel. tests/test_compile_kernels.py
# asserts the split (setmaxnreg in the PTX) for every configuration below.
WS_CONFIG = Config(block_m=128, block_n=256, block_k=64, group_m=8, num_stages=3, num_warps=4)
T4_CONFIG = Config(block_m=32, block_n=32, block_k=32, group_m=8, num_stages=2, num_warps=4)
# (sm_75: Triton 3.9 emits no tensor-core MMA for a T4, only FMAs; 64x64 tiles at 4 warps spill there.)

# What benchmarks/gemm_gpu.py tries per variant (each checked on a ragged shape first), by GPU
# generation, and what tests/test_compile_kernels.py compiles: no spills, shared memory within 227 KiB
# (H100/H200) or 163 KiB (A100) per block. The persistent kernels hold their tile loop's state on top
# of the accumulator: on sm_80 they spill at 128x256 (8 warps) and 128x128 (4 warps), so they get
# 128x128 at 8 warps there. The persistent descriptor kernel keeps a C tile for its TMA store next to
# the stage buffers: at 128x256x64 four stages need 256 KiB, so it stays at three (208 KiB).
# All of them also compile cleanly with Triton 3.6 (the version on the course's H200 machines).
_SQUARE4, _SQUARE8, _TALL = Config(128, 128, 64, 8, 4, 4), Config(128, 128, 64, 8, 3, 8), Config(256, 128, 64, 8, 3, 8)
GPU_CONFIGS: dict[int, dict[str, list[Config]]] = {
    90: {
        "tiled row-major": [GPU_CONFIG, _SQUARE4, _TALL],
        "tiled grouped": [GPU_CONFIG, _SQUARE4, _TALL],
        "persistent": [GPU_CONFIG, _SQUARE4, _TALL],
        "descriptor (TMA)": [GPU_CONFIG, _SQUARE4, _TALL],
        "descriptor persistent": [GPU_CONFIG, _SQUARE4],
        "warp-specialized": [WS_CONFIG, _SQUARE4],
    },
    80: {   # 128x128 at 4 warps sits at 253-255 registers on sm_80 (Triton 3.6 spills it in the descriptor kernel)
        "tiled row-major": [GPU_CONFIG, _SQUARE8],
        "tiled grouped": [GPU_CONFIG, _SQUARE8],
        "persistent": [_SQUARE8],
        "descriptor (TMA)": [GPU_CONFIG, _SQUARE8],
        "descriptor persistent": [_SQUARE8],
    },
    75: {   # a T4: fp16 (no bf16), 64 KiB of shared memory; 128x256 spills about 31 KB per thread there
        "tiled row-major": [T4_CONFIG],
        "tiled grouped": [T4_CONFIG],
        "persistent": [T4_CONFIG],
    },
}


def gpu_configs(variant: str, arch: int) -> list[Config]:
    """The configurations the benchmark tries for ``variant`` on ``sm_<arch>`` (the generation at or below it)."""
    return GPU_CONFIGS[90 if arch >= 90 else 80 if arch >= 80 else 75].get(variant, [])


def _default_config(x: torch.Tensor, warp_specialize: bool = False) -> Config:
    if x.device.type == "cpu":
        return CPU_CONFIG
    if torch.cuda.get_device_capability(x.device)[0] < 8:
        return T4_CONFIG                      # sm_75: GPU_CONFIG's 128x256 tiles spill and overflow 64 KiB
    return WS_CONFIG if warp_specialize else GPU_CONFIG


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


def _alloc(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def set_descriptor_allocator() -> None:
    """On a GPU, device-side tensor descriptors need scratch memory: give Triton a torch allocator.

    Called before every descriptor launch, not once per process: Triton keeps the allocator in a
    context variable, which some ipykernel versions do not carry from one cell to the next."""
    if interpreted():
        return
    triton.set_allocator(_alloc)


def _descriptor_launch(a, b, cfg, warp_specialize: bool, return_kernel: bool = False, persistent: bool = False):
    cfg = cfg or _default_config(a, warp_specialize)
    if warp_specialize and cfg.num_warps != 4:   # checked on every tier, so a simulated sm90 run catches it
        raise ValueError(f"num_warps={cfg.num_warps}: Triton splits a warp-specialized loop only at num_warps=4 "
                         "(at 8 it compiles the plain descriptor kernel); use G.WS_CONFIG")
    _check_inputs(a, b, cfg)
    a, b = a.contiguous(), b.contiguous()
    (m, k), n = a.shape, b.shape[1]
    for name, extent in (("K", k), ("N", n)):
        if (extent * a.element_size()) % 16:
            raise ValueError(
                f"{name}={extent}: a tensor descriptor needs row strides that are multiples of 16 bytes "
                f"({16 // a.element_size()} elements of {a.dtype}); pad the matrix or use matmul_tiled"
            )
    set_descriptor_allocator()
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
    if not HAS_TRITON:
        return False, "triton is not installed"
    if "warp_specialize" not in inspect.signature(tl.range.__init__).parameters:
        return False, f"triton {triton.__version__} has no tl.range(..., warp_specialize=...)"
    if interpreted():
        return True, "interpreter: the flag is accepted and the loop runs sequentially (correctness only)"
    if TIER != "sm90":
        return False, f"tier {TIER}: warp specialization needs a Hopper GPU (sm90)"
    return True, f"tier sm90 with triton {triton.__version__}"


def matmul_warp_specialized(a: torch.Tensor, b: torch.Tensor, cfg: Config | None = None, *, return_kernel: bool = False):
    """Rung 6: :func:`matmul_descriptor` with a warp-specialized K loop (producer/consumer warps),
    at ``num_warps=4`` (:data:`WS_CONFIG` by default): the only warp count where Triton splits the loop.

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
