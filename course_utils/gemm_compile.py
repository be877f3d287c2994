r"""Every course kernel at its GPU configurations, compiled for sm_75/80/90 on any machine.

Used by ``tests/test_compile_kernels.py`` (fails on a spill, on shared memory over the device's
limit, on a Hopper GEMM without ``wgmma``, on a descriptor kernel without TMA, on a warp-specialized
rung without its producer/consumer split), by ``benchmarks/compile_facts.py`` (the table of
registers, spills, shared memory and features) and by lesson 05's CPU-tier cells.

:func:`compile_matrix` lists what to compile: the GEMM kernels of :mod:`course_utils.gemm_kernels` at every
configuration that ``benchmarks/gemm_gpu.py`` launches (:data:`course_utils.gemm.GPU_CONFIGS`), lesson
03's implicit-GEMM convolution (:mod:`course_utils.convolution`) and lesson 06's attention forward
(:mod:`course_utils.attention_triton`) at the attention benchmark's configurations. Each case carries the
signature and divisibility a real launch would have: 16-byte aligned pointers, sizes and leading strides
that are multiples of 16 (``tt.divisibility``), unit strides specialized to the constant 1, as Triton's
JIT does. :func:`compile_cases` compiles them in fresh processes (Triton's compiler on, whatever this
process runs), in parallel, and returns :class:`course_utils.gpu_compile.Compiled` records.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Case", "attention_configs", "compile_matrix", "compile_cases", "gemm_case", "compile_problems"]

ROOT = Path(__file__).resolve().parent.parent
# The attention configurations are course_utils.attention_triton.ATTENTION_GPU_CONFIGS (forward and backward, per
# GPU generation), compiled for both head dims, GROUP 1 and 4, causal and not.
ATTENTION_HEAD_DIMS = (64, 128)
# A T4 (sm_75, FMAs instead of tensor-core MMAs) spills in the d=128 backward even at 16x16 tiles (dK/dV 2.6 KB,
# dQ 0.5 KB with Triton 3.9): the T4 path covers the backward at d=64 only; d=128 there is an open problem.
T4_BACKWARD_HEAD_DIMS = (64,)


@dataclass(frozen=True)
class Case:
    """One kernel at one configuration for one GPU, with what its compiled code must show."""

    label: str                     # "gemm tiled 128x256x64 w8 s3"
    kernel: str                    # "module:attribute" ("module:function()" calls it: a lazily jitted kernel)
    arch: int
    signature: dict
    constexprs: dict
    divisible: tuple
    num_warps: int
    num_stages: int
    expect: tuple = ()             # features the PTX must contain, e.g. ("wgmma", "tma")
    absent: tuple = ()             # features it must not contain
    extra: dict = field(default_factory=dict)   # what the case stands for (variant, config) for tables


def _gemm_signature(params, dtype, descriptor):
    sig = {p: f"*{dtype}" for p in ("a_ptr", "b_ptr", "c_ptr")}
    sig.update(M="i32", N="i32", K="i32")
    if not descriptor:
        sig.update({s: "i32" for s in ("stride_am", "stride_bk", "stride_cm")})
        sig.update({s: "constexpr" for s in ("stride_ak", "stride_bn", "stride_cn")})   # unit strides: constant 1
    sig.update({p: "constexpr" for p in params if p not in sig})
    return sig


GEMM_KERNELS = {  # variant of course_utils.gemm.VARIANTS -> (kernel, descriptor?, persistent?, warp-specialized?)
    "tiled row-major": ("matmul_kernel", False, False, False),
    "tiled grouped": ("matmul_kernel", False, False, False),
    "persistent": ("matmul_persistent_kernel", False, True, False),
    "descriptor (TMA)": ("matmul_descriptor_kernel", True, False, False),
    "descriptor persistent": ("matmul_descriptor_persistent_kernel", True, True, False),
    "warp-specialized": ("matmul_descriptor_kernel", True, False, True),
}
_GEMM_PARAMS = {
    "matmul_kernel": ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "DOT_PRECISION"],
    "matmul_persistent_kernel": ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "NUM_PROGRAMS", "DOT_PRECISION"],
    "matmul_descriptor_kernel": ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "WARP_SPECIALIZE", "DOT_PRECISION"],
    "matmul_descriptor_persistent_kernel": ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "NUM_PROGRAMS", "DOT_PRECISION"],
}


def gemm_case(variant: str, cfg, arch: int, dtype: str = "bf16", sms: int = 132, kernel: str | None = None) -> Case:
    """The GEMM ``variant`` (a key of ``course_utils.gemm.VARIANTS``) at launch configuration ``cfg`` for ``sm_<arch>``.

    ``kernel`` names another kernel with the same parameters (a lesson's ``*_by_hand`` copy, as ``module:name``).
    """
    name, descriptor, persistent, ws = GEMM_KERNELS[variant]
    constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                  "GROUP_M": 1 if variant == "tiled row-major" else cfg.group_m, "DOT_PRECISION": "tf32"}
    if persistent:
        constexprs["NUM_PROGRAMS"] = sms
    if name == "matmul_descriptor_kernel":
        constexprs["WARP_SPECIALIZE"] = ws
    divisible = ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K"]
    if not descriptor:
        constexprs.update(stride_ak=1, stride_bn=1, stride_cn=1)
        divisible += ["stride_am", "stride_bk", "stride_cm"]
    expect = ["wgmma" if arch >= 90 else "mma.sync"] if arch >= 80 else []   # sm_75: Triton 3.9 emits FMAs
    if descriptor and arch >= 90:
        expect.append("tma")
    if not descriptor and arch >= 80:
        expect.append("cp.async")                   # pointer loads pipelined with cp.async, Hopper included
    if ws and arch >= 90:
        expect.append("setmaxnreg")                 # the producer/consumer split really happened
    absent = () if descriptor else ("tma",)
    label = f"gemm {variant} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} {dtype}"
    return Case(label, kernel or f"course_utils.gemm_kernels:{name}", arch, _gemm_signature(_GEMM_PARAMS[name], dtype, descriptor),
                constexprs, tuple(divisible), cfg.num_warps, cfg.num_stages, tuple(expect), absent,
                {"variant": variant, "config": asdict(cfg) if hasattr(cfg, "__dataclass_fields__") else dict(cfg.__dict__)})


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
    from .attention_triton import _signature

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
    from .attention_triton import attention_configs as configs

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
    from .gemm import T4_CONFIG, gpu_configs

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


def compile_problems(compiled, case: Case) -> list[str]:
    """What is wrong with one compiled case (empty when it is fine)."""
    from .gpu_compile import ARCH_LIMITS

    found = []
    if compiled.spills or compiled.stack_bytes:
        found.append(f"spills ({compiled.spill_stores} B stores, {compiled.spill_loads} B loads, {compiled.stack_bytes} B stack)")
    if compiled.shared_bytes > ARCH_LIMITS[case.arch]["smem_per_block"]:
        found.append(f"{compiled.shared_bytes / 1024:.0f} KiB shared memory > {ARCH_LIMITS[case.arch]['smem_per_block'] // 1024} KiB per block")
    found += [f"no {f} in the PTX" for f in case.expect if not compiled.has(f)]
    found += [f"unexpected {f} in the PTX" for f in case.absent if compiled.has(f)]
    return found


def _resolve(spec: str):
    import importlib

    module, attr = spec.split(":")
    obj = getattr(importlib.import_module(module), attr.rstrip("()"))
    return obj() if attr.endswith("()") else obj


def _compile_here(case: dict, keep_ptx: bool) -> dict:
    from .gpu_compile import CompileError, compile_for

    try:
        c = compile_for(_resolve(case["kernel"]), arch=case["arch"], signature=case["signature"], constexprs=case["constexprs"],
                        divisible=case["divisible"], num_warps=case["num_warps"], num_stages=case["num_stages"], sass=False)
    except CompileError as exc:
        return {"error": str(exc)}
    out = asdict(c)
    if not keep_ptx:
        out["ptx"] = ""
    out["sass"] = ""
    return out


def _cache_dir() -> Path:
    return Path(os.environ.get("COURSE_COMPILE_CACHE") or Path.home() / ".cache" / "course_utils" / "compile")


def _cache_key(case: Case, keep_ptx: bool) -> str:
    """Changes with the case, the kernel's module source, ``gpu_compile``'s source and the Triton version."""
    import hashlib
    import importlib.util

    import triton

    module = case.kernel.split(":")[0]
    sources = [importlib.util.find_spec(module).origin, str(Path(__file__).with_name("gpu_compile.py"))]
    h = hashlib.sha256(json.dumps([asdict(case), keep_ptx, triton.__version__], sort_keys=True).encode())
    for path in sources:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:32]


def compile_cases(todo: list[Case], *, processes: int = 2, keep_ptx: bool = False, timeout: int = 1200,
                  cache: bool = True) -> list:
    """Compile every case in ``processes`` fresh processes with Triton's compiler on; returns, per case,
    a :class:`~course_utils.gpu_compile.Compiled` (PTX kept only with ``keep_ptx``) or raises ``CompileError``
    naming the cases that did not compile.

    With ``cache`` (the default) each result is kept on disk (``$COURSE_COMPILE_CACHE``, else
    ``~/.cache/course_utils/compile``) under a key of the case, the kernel module's source, ``gpu_compile``'s
    source and the Triton version, so only what changed is compiled again."""
    from .gpu_compile import CompileError, Compiled, _require_triton

    _require_triton()  # without Triton: TritonUnavailable, which a lesson's env.needs_triton turns into a notice
    if cache:
        keys = [_cache_key(c, keep_ptx) for c in todo]
        found = {}
        for i, key in enumerate(keys):
            path = _cache_dir() / f"{key}.json"
            if path.exists():
                try:
                    found[i] = json.loads(path.read_text())
                except ValueError:
                    pass
        missing = [i for i in range(len(todo)) if i not in found]
        fresh = compile_cases([todo[i] for i in missing], processes=processes, keep_ptx=keep_ptx, timeout=timeout,
                              cache=False) if missing else []
        _cache_dir().mkdir(parents=True, exist_ok=True)
        for i, c in zip(missing, fresh):
            tmp = _cache_dir() / f"{keys[i]}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(asdict(c)))
            tmp.replace(_cache_dir() / f"{keys[i]}.json")
            found[i] = asdict(c)
        return [Compiled(**found[i]) for i in range(len(todo))]
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    chunks = [list(range(len(todo)))[i::processes] for i in range(max(1, processes))]
    procs = []
    for chunk in chunks:
        if not chunk:
            continue
        request = json.dumps({"keep_ptx": keep_ptx, "cases": [asdict(todo[i]) for i in chunk]})
        p = subprocess.Popen([sys.executable, "-m", "course_utils.gemm_compile"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
        p.stdin.write(request)  # every process gets its whole request now, so they compile at the same time
        p.stdin.close()
        p.stdin = None          # (communicate() below only reads)
        procs.append((chunk, p))
    results: list = [None] * len(todo)
    for chunk, p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise CompileError(f"compile process failed: {(err.strip().splitlines() or ['no output'])[-1]}")
        for i, data in zip(chunk, json.loads(out)):
            results[i] = data
    errors = [f"{todo[i].label} sm_{todo[i].arch}: {r['error']}" for i, r in enumerate(results) if "error" in r]
    if errors:
        raise CompileError("; ".join(errors))
    return [Compiled(**r) for r in results]


def _main() -> int:
    request = json.loads(sys.stdin.read())
    print(json.dumps([_compile_here(case, request["keep_ptx"]) for case in request["cases"]]))
    return 0


if __name__ == "__main__":
    sys.exit(_main())


def require(built: dict) -> dict:
    """``built`` itself, or :class:`~course_utils.env.TritonUnavailable` when nothing could be compiled
    (a lesson's later cells then print the same one-line notice as the cell that compiled)."""
    if not built:
        from .env import TRITON_MISSING, TritonUnavailable

        raise TritonUnavailable(TRITON_MISSING.format(what="compiling for a GPU"))
    return built
