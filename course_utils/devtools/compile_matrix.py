r"""The compile matrix: every course kernel at every configuration its benchmark launches, per GPU arch.

Used by ``tests/test_compile_kernels.py`` (fails on a spill, on shared memory over the device's limit,
on a Hopper GEMM without ``wgmma``, on a descriptor kernel without TMA, on a warp-specialized rung
without its producer/consumer split) and by ``benchmarks/compile_facts.py`` (the table of registers,
spills, shared memory and features).

:func:`compile_matrix` lists the GEMM kernels of :mod:`course_utils.gemm_kernels` at every configuration
that ``benchmarks/gemm_gpu.py`` launches (:data:`course_utils.gemm.GPU_CONFIGS`), lesson 03's
implicit-GEMM convolution (:mod:`course_utils.convolution`) and lesson 06's attention forward
(:mod:`course_utils.attention_triton`) at the attention benchmark's configurations, as
:class:`course_utils.gemm_compile.Case` records that :func:`course_utils.gemm_compile.compile_cases` compiles.
"""
from __future__ import annotations

from ..gemm_compile import GEMM_KERNELS, Case, gemm_case
from ..paths import BENCHMARKS

__all__ = ["compile_matrix", "attention_configs", "ATTENTION_CONFIGS", "ATTENTION_CONFIGS_SM80", "ATTENTION_HEAD_DIMS"]

# benchmarks/attention_gpu.py's configurations are read from it (attention_configs); these are the ones
# expected there once the spilling (128, 64, 4, 3) is gone: (block_m, block_n, num_warps, num_stages).
ATTENTION_CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]
# On sm_80 the d=128 forward spills at 128x64 (8 warps, 8 B) and 128x128 (72 B): an A100 gets 64x64 at 4 warps.
ATTENTION_CONFIGS_SM80 = [(64, 64, 4, 3)]
ATTENTION_HEAD_DIMS = (64, 128)


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
                    causal: bool = True) -> Case:
    args = ["q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "stride_qh", "stride_qm", "stride_kh", "stride_kn",
            "stride_vh", "stride_vn", "stride_oh", "stride_om", "seqlen_q", "seqlen_k", "scale_log2e"]
    sig = dict(zip(args, [f"*{dtype}"] * 4 + ["*fp32"] + ["i32"] * 10 + ["fp32"]))
    ce = {"CAUSAL": causal, "HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "DOT_PRECISION": "tf32", "GROUP": 1}
    sig.update(dict.fromkeys(ce, "constexpr"))
    expect = ("wgmma" if arch >= 90 else "mma.sync",) if arch >= 80 else ()
    return Case(f"attention fwd d={head_dim} {bm}x{bn} w{warps} s{stages} {dtype}{' causal' if causal else ''}",
                "course_utils.attention_triton:flash_attention_fwd_kernel", arch, sig, ce, tuple(args[:15]), warps, stages,
                expect, (), {"variant": f"attention forward d={head_dim}",
                             "config": {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}})


def attention_configs() -> list[tuple]:
    """The forward ``FWD_CONFIGS`` of ``benchmarks/attention_gpu.py`` (read from its source: importing it would pick a tier)."""
    import ast

    path = BENCHMARKS / "attention_gpu.py"
    if path.exists():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in ("FWD_CONFIGS", "CONFIGS"):
                return [tuple(c) for c in ast.literal_eval(node.value)]
    return list(ATTENTION_CONFIGS)


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
            for d in ATTENTION_HEAD_DIMS:
                for bm, bn, warps, stages in (attention_configs() if arch >= 90 else ATTENTION_CONFIGS_SM80):
                    out.append(_attention_case(arch, d, bm, bn, warps, stages))
    if t4:                                                    # a T4: fp16 (no bf16), FMAs (no tensor-core MMA)
        if gemm:
            for variant in ("tiled grouped", "persistent"):
                out.append(gemm_case(variant, T4_CONFIG, 75, dtype="fp16", sms=40))
        if attention:
            out.append(_attention_case(75, 64, 32, 32, 4, 2, dtype="fp16"))
        if conv:
            out.append(_conv_case(75, 32, 16, 16, 4, 2))
    return out
