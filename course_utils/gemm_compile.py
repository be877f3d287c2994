r"""Compile a course kernel for sm_75/80/90 on any machine: one :class:`Case` per kernel and configuration.

Used by lesson 05's CPU-tier cells (:func:`gemm_case`, :func:`compile_cases`, :func:`require`) and by
:mod:`course_utils.devtools.compile_matrix`, which lists every course kernel at the configurations its
benchmark launches (the compile tests, ``benchmarks/compile_facts.py``).

A :class:`Case` carries the signature and divisibility a real launch would have: 16-byte aligned
pointers, sizes and leading strides that are multiples of 16 (``tt.divisibility``), unit strides
specialized to the constant 1, as Triton's JIT does. :func:`compile_cases` compiles them in fresh
processes (Triton's compiler on, whatever this process runs), in parallel, cached on disk by source hash,
and returns :class:`course_utils.gpu_compile.Compiled` records; :func:`compile_problems` says what is wrong
with one (a spill, shared memory over the device's limit, a missing ``wgmma``/TMA/``setmaxnreg``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .paths import ROOT

__all__ = ["Case", "GEMM_KERNELS", "gemm_case", "compile_cases", "compile_problems", "require"]

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
        _cache_dir().mkdir(parents=True, exist_ok=True)
        errors = []
        batch = max(1, processes) * 8     # kept on disk batch by batch: an interrupted run keeps what it compiled
        for start in range(0, len(missing), batch):
            part = missing[start:start + batch]
            for i, data in zip(part, _compile_raw([todo[i] for i in part], processes, keep_ptx, timeout)):
                if "error" in data:
                    errors.append(f"{todo[i].label} sm_{todo[i].arch}: {data['error']}")
                    continue
                tmp = _cache_dir() / f"{keys[i]}.{os.getpid()}.tmp"
                tmp.write_text(json.dumps(data))
                tmp.replace(_cache_dir() / f"{keys[i]}.json")
                found[i] = data
        if errors:
            raise CompileError("; ".join(errors))
        return [Compiled(**found[i]) for i in range(len(todo))]
    results = _compile_raw(todo, processes, keep_ptx, timeout)
    errors = [f"{todo[i].label} sm_{todo[i].arch}: {r['error']}" for i, r in enumerate(results) if "error" in r]
    if errors:
        raise CompileError("; ".join(errors))
    return [Compiled(**r) for r in results]


def _compile_raw(todo: list, processes: int, keep_ptx: bool, timeout: int) -> list[dict]:
    """Each case compiled in one of ``processes`` fresh processes: its Compiled fields, or ``{"error": ...}``."""
    from .gpu_compile import CompileError

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
    return results


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


# Old addresses of the compile matrix (now course_utils.devtools.compile_matrix), resolved on first use.
_MOVED = {"compile_matrix", "attention_configs", "ATTENTION_HEAD_DIMS", "T4_BACKWARD_HEAD_DIMS"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from .devtools import compile_matrix

        return getattr(compile_matrix, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
