r"""The compile matrix: every course kernel at every configuration its benchmark launches, per GPU arch.

Used by ``tests/test_compile_kernels.py`` (fails on a spill, on shared memory over the device's limit,
on a Hopper GEMM without ``wgmma``, on a descriptor kernel without TMA, on a warp-specialized rung
without its producer/consumer split) and by ``benchmarks/compile_facts.py`` (the table of registers,
spills, shared memory and features).

:func:`compile_matrix` lists the GEMM kernels of :mod:`course_utils.gemm_kernels` at every configuration
that ``benchmarks/gemm_gpu.py`` launches (:data:`course_utils.gemm.GPU_CONFIGS`), lesson 03's
implicit-GEMM convolution (:mod:`course_utils.convolution`) and lesson 06's attention forward and both
backward kernels (:mod:`course_utils.attention_triton`, ``attention_triton_backward``) at the attention
benchmark's configurations, × GROUP {1, 4} × causal, as :class:`course_utils.gemm_compile.Case` records that
:func:`course_utils.gemm_compile.compile_cases` compiles.
"""
from __future__ import annotations

from ..gemm_compile import GEMM_KERNELS, Case, gemm_case

__all__ = ["compile_matrix", "attention_configs", "ATTENTION_HEAD_DIMS", "T4_BACKWARD_HEAD_DIMS"]

# The attention configurations are course_utils.attention_triton.ATTENTION_GPU_CONFIGS (forward and backward, per
# GPU generation), compiled for both head dims, GROUP 1 and 4, causal and not.
ATTENTION_HEAD_DIMS = (64, 128)
# A T4 (sm_75, FMAs instead of tensor-core MMAs) spilled in the d=128 backward at 16x16 tiles with 4 warps; with 8
# warps it does not (course_utils.attention_triton), so the T4 backward is compile-tested at both head dims.
T4_BACKWARD_HEAD_DIMS = ATTENTION_HEAD_DIMS



def _conv_case(arch: int, bm: int, bn: int, bk: int, warps: int, stages: int) -> Case:
    ints = ["N", "C_IN", "H", "W", "C_OUT", "OH", "OW", "stride", "padding", "dilation"]
    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", **dict.fromkeys(ints, "i32"),
           **dict.fromkeys(["KH", "KW", "BLOCK_M", "BLOCK_N", "BLOCK_K"], "constexpr")}
    ce = {"KH": 3, "KW": 3, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    # fp32 with input_precision="ieee": exact products on the FMA units, no tensor cores on any GPU
    return Case(f"conv2d implicit GEMM {bm}x{bn}x{bk} w{warps} s{stages} fp32 3x3", "course_utils.convolution:_jitted_kernel()",
                arch, sig, ce, ("x_ptr", "w_ptr", "out_ptr", "C_IN", "C_OUT"), warps, stages, (), ("wgmma", "mma.sync"),
                {"variant": "conv2d implicit GEMM", "config": {"block_m": bm, "block_n": bn, "block_k": bk,
                                                               "num_warps": warps, "num_stages": stages}})


def _attention_case(arch: int, head_dim: int, bm: int, bn: int, warps: int, stages: int, dtype: str = "bf16",
                    causal: bool = True, group: int = 1, kernel: str = "fwd") -> Case:
    """Lesson 06's forward (``kernel="fwd"``) or backward kernel (``"dkdv"``, ``"dq"``) at one launch configuration."""
    from ..attention_triton import _signature

    names, sig = _signature(kernel, dtype)
    ce = {"CAUSAL": causal, "HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn,
          "DOT_PRECISION": "ieee" if dtype in ("fp32", "fp64") else "tf32", "GROUP": group}
    sig.update(dict.fromkeys(ce, "constexpr"))
    divisible = tuple(n for n in names if n.endswith("_ptr") or n.startswith("stride"))
    expect = ("wgmma" if arch >= 90 else "mma.sync",) if arch >= 80 else ()
    module = "attention_triton" if kernel == "fwd" else "attention_triton_backward"
    name = {"fwd": "flash_attention_fwd_kernel", "dkdv": "flash_attention_bwd_dkdv_kernel",
            "dq": "flash_attention_bwd_dq_kernel"}[kernel]
    what = {"fwd": "forward", "dkdv": "backward dK/dV", "dq": "backward dQ"}[kernel]
    return Case(f"attention {what} d={head_dim} G={group} {bm}x{bn} w{warps} s{stages} {dtype}{' causal' if causal else ''}",
                f"course_utils.{module}:{name}", arch, sig, ce, divisible, warps, stages, expect, (),
                {"variant": f"attention {'forward' if kernel == 'fwd' else 'backward'} d={head_dim}", "kernel": kernel,
                 "group": group, "causal": causal,
                 "config": {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}})


def attention_configs(arch: int = 90, kind: str = "fwd") -> list[tuple]:
    """The configurations ``benchmarks/attention_gpu.py`` tries on ``sm_<arch>`` (``course_utils.attention_triton``)."""
    from ..attention_triton import attention_configs as configs

    return configs(arch, kind)


def _attention_cases(arch: int, dtype: str) -> list[Case]:
    out = []
    for kind, kernels in (("fwd", ("fwd",)), ("bwd", ("dkdv", "dq"))):
        for bm, bn, warps, stages in attention_configs(arch, kind):
            for d in ATTENTION_HEAD_DIMS if arch >= 80 or kind == "fwd" else T4_BACKWARD_HEAD_DIMS:
                for group in (1, 4):
                    for causal in (True, False):
                        out += [_attention_case(arch, d, bm, bn, warps, stages, dtype, causal, group, k) for k in kernels]
    return out


def compile_matrix(archs=(80, 90), *, gemm: bool = True, conv: bool = True, attention: bool = True, t4: bool = True,
          full: bool = False) -> list[Case]:
    """The compile matrix: every kernel at every configuration its benchmark launches, per arch.

    sm_75 (T4, no bf16 tensor cores, 64 KiB shared memory) gets fp16 variants at T4-sized tiles.
    """
    from ..gemm import T4_CONFIG, gpu_configs

    out = []
    for arch in archs:
        if gemm:
            for variant in GEMM_KERNELS:
                if variant == "tiled row-major" and not full:
                    continue                                  # the grouped kernel with GROUP_M = 1: same code
                for cfg in gpu_configs(variant, arch):        # none for warp-specialized below Hopper
                    out.append(gemm_case(variant, cfg, arch))
        if conv:
            out.append(_conv_case(arch, 32, 16, 16, 4, 3))   # conv2d_triton's launch: its default blocks
        if attention:
            out += _attention_cases(arch, "bf16")
    if t4:                                                    # a T4: fp16 (no bf16), FMAs (no tensor-core MMA)
        if gemm:
            for variant in ("tiled grouped", "persistent"):
                out.append(gemm_case(variant, T4_CONFIG, 75, dtype="fp16", sms=40))
        if attention:
            out += _attention_cases(75, "fp16")
        if conv:
            out.append(_conv_case(75, 32, 16, 16, 4, 2))
    return out
